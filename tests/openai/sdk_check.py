"""The worker driven through OpenAI's official Python SDK, as users drive it.

Run by tests/tests/http_openai.rs against a real worker on a real model:

    PYTHONPATH=$ASSETS/python/sdk python3 tests/openai/sdk_check.py http://127.0.0.1:PORT

Checks streaming and whole chat and completions, `usage`, seeds, `n` choices, errors, and that
/v1/completions samples exactly what /execute does for the same raw prompt and seed. Exits
non-zero, naming the failed check, on the first failure.
"""

import json
import sys
import urllib.request

import openai


def check(condition, what):
    if not condition:
        raise SystemExit(f"FAILED: {what}")
    print(f"ok: {what}")


def execute(base, body):
    """The text and `started`/`end` events of an /execute job."""
    request = urllib.request.Request(
        base + "/execute",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    events = []
    with urllib.request.urlopen(request, timeout=300) as response:
        for line in response:
            line = line.decode().rstrip("\n")
            if line.startswith("data: "):
                events.append(json.loads(line[len("data: "):]))
    text = "".join(e["t"] for e in events if e["type"] == "token")
    return text, events[0], events[-1], events


def streamed_chat(client, **request):
    pieces, finish, usage, roles = [], None, None, []
    for chunk in client.chat.completions.create(stream=True, **request):
        if chunk.usage is not None:
            usage = chunk.usage
        for choice in chunk.choices:
            if choice.delta.role:
                roles.append(choice.delta.role)
            if choice.delta.content:
                pieces.append(choice.delta.content)
            if choice.finish_reason:
                finish = choice.finish_reason
    return "".join(pieces), finish, usage, roles


def streamed_completion(client, **request):
    pieces, finish = [], None
    for chunk in client.completions.create(stream=True, **request):
        for choice in chunk.choices:
            pieces.append(choice.text)
            finish = choice.finish_reason or finish
    return "".join(pieces), finish


def chat(client, base, model):
    question = [{"role": "user", "content": "Name three colors."}]
    whole = client.chat.completions.create(
        model=model, messages=question, max_tokens=16, temperature=0
    )
    text = whole.choices[0].message.content
    usage = whole.usage
    check(whole.object == "chat.completion" and whole.id.startswith("chatcmpl-"), "chat reply shape")
    check(whole.choices[0].message.role == "assistant" and text, f"chat answered {text!r}")
    check(whole.choices[0].finish_reason in ("stop", "length"), "chat finish_reason")
    check(
        usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
        and 1 <= usage.completion_tokens <= 16,
        f"chat usage {usage}",
    )
    _, started, _, _ = execute(
        base, {"job_id": "sdk-chat", "prompt": question[0]["content"], "max_tokens": 1}
    )
    check(
        usage.prompt_tokens == started["prompt_tokens"],
        f"chat prompt_tokens {usage.prompt_tokens} = /execute's templated prompt {started['prompt_tokens']}",
    )

    streamed, finish, streamed_usage, roles = streamed_chat(
        client,
        model=model,
        messages=question,
        max_tokens=16,
        temperature=0,
        stream_options={"include_usage": True},
    )
    check(roles == ["assistant"], f"one role delta first, got {roles}")
    check(streamed == text, f"greedy stream {streamed!r} = whole reply {text!r}")
    check(finish == whole.choices[0].finish_reason, "stream finish_reason")
    check(
        streamed_usage is not None
        and streamed_usage.completion_tokens == usage.completion_tokens,
        f"include_usage chunk {streamed_usage}",
    )

    turns = question + [
        {"role": "assistant", "content": text},
        {"role": "user", "content": "And three animals?"},
    ]
    followup = client.chat.completions.create(
        model=model, messages=turns, max_completion_tokens=12, temperature=0
    )
    check(
        followup.usage.prompt_tokens > usage.prompt_tokens + usage.completion_tokens,
        "a multi-turn conversation renders every turn",
    )
    stopped = client.chat.completions.create(
        model=model, messages=question, max_tokens=32, temperature=0, stop=[" "]
    )
    check(
        stopped.choices[0].finish_reason == "stop" and " " not in stopped.choices[0].message.content,
        f"a stop string ends the reply: {stopped.choices[0].message.content!r}",
    )


def completions(client, base, model):
    prompt = "def fibonacci(n):"
    whole = client.completions.create(model=model, prompt=prompt, max_tokens=16, temperature=0)
    text = whole.choices[0].text
    check(whole.object == "text_completion" and whole.id.startswith("cmpl-"), "completion shape")
    check(whole.choices[0].finish_reason == "length" and whole.usage.completion_tokens == 16,
          f"16 tokens, finish_reason length: {whole.usage}")
    streamed, finish = streamed_completion(
        client, model=model, prompt=prompt, max_tokens=16, temperature=0
    )
    check(streamed == text and finish == "length", "greedy completion stream = whole reply")

    # A story, not code: many continuations are likely, so another seed gives another text.
    story = "Once upon a time, in a village by the sea,"
    sampled = dict(model=model, prompt=story, max_tokens=24, temperature=0.8, seed=1234)
    first = client.completions.create(**sampled).choices[0].text
    again = client.completions.create(**sampled).choices[0].text
    check(first == again, f"seed 1234 at T = 0.8 reproduces {first!r}")
    other = client.completions.create(**{**sampled, "seed": 99}).choices[0].text
    check(other != first, "another seed samples another text")
    executed, started, end, _ = execute(
        base,
        {"job_id": "sdk-raw", "prompt": story, "raw": True, "max_tokens": 24,
         "temperature": 0.8, "seed": 1234},
    )
    check(executed == first, f"/execute raw with the same seed samples the same text {executed!r}")
    check(end["type"] == "end", "the /execute job ended normally")

    # n choices: choice i takes seed + i, so choice 0 is the seeded text above and choice 1
    # the text of seed 1235; a stream carries the same choices by index.
    both = client.completions.create(**sampled, n=2)
    indices = [c.index for c in both.choices]
    check(indices == [0, 1], f"n = 2 gives choices 0 and 1: {indices}")
    check(both.choices[0].text == first, "choice 0 of n = 2 is the seed's own text")
    single = client.completions.create(**sampled).usage
    alone = client.completions.create(**{**sampled, "seed": 1235})
    check(both.choices[1].text == alone.choices[0].text, "choice 1 of n = 2 is the text of seed + 1")
    check(both.usage.prompt_tokens == single.prompt_tokens and both.usage.completion_tokens
          == single.completion_tokens + alone.usage.completion_tokens,
          f"usage counts the prompt once and both choices' tokens: {both.usage}")
    texts = {}
    for chunk in client.completions.create(**sampled, n=2, stream=True):
        for choice in chunk.choices:
            texts[choice.index] = texts.get(choice.index, "") + choice.text
    check(texts == {0: both.choices[0].text, 1: both.choices[1].text},
          f"a stream of n = 2 carries each choice by index: {texts}")


def logprobs(client, base, model):
    question = [{"role": "user", "content": "Count from one to five."}]
    reply = client.chat.completions.create(
        model=model, messages=question, max_tokens=8, temperature=0, logprobs=True, top_logprobs=3
    )
    content = reply.choices[0].logprobs.content
    check(len(content) == reply.usage.completion_tokens, f"one logprobs entry per token ({len(content)})")
    for entry in content:
        top = entry.top_logprobs
        check(
            len(top) == 3 and top[0].token == entry.token and top[0].logprob == entry.logprob
            and entry.logprob <= 0 and top[0].logprob >= top[1].logprob >= top[2].logprob,
            f"greedy picks the most probable token {entry.token!r} ({entry.logprob:.4f})",
        )
    joined = b"".join(bytes(entry.bytes) for entry in content).decode()
    check(joined == reply.choices[0].message.content, "the entries' bytes spell the reply")

    prompt = "Once upon a time, in a village by the sea,"
    completion = client.completions.create(
        model=model, prompt=prompt, max_tokens=12, temperature=0.8, seed=77, logprobs=0,
        extra_body={"return_tokens_as_token_ids": True},
    )
    ids = [int(token.split(":")[1]) for token in completion.choices[0].logprobs.tokens]
    _, _, _, events = execute(
        base,
        {"job_id": "sdk-ids", "prompt": prompt, "raw": True, "max_tokens": 12,
         "temperature": 0.8, "seed": 77, "logprobs": 0},
    )
    executed = [lp["id"] for e in events if e["type"] == "token" for lp in e.get("logprobs", [])]
    check(len(ids) == 12 and ids == executed,
          f"/v1/completions and /execute raw sample the same token ids {ids}")


def errors(client, model):
    try:
        client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": "hi"}], n=17
        )
    except openai.BadRequestError as err:
        body = err.body or {}
        check(body.get("param") == "n" and body.get("code") == "invalid_request",
              f"n = 17 is a 400 naming the field: {body}")
    else:
        check(False, "n = 17 was accepted")
    try:
        client.chat.completions.create(model=model, messages=[])
    except openai.BadRequestError as err:
        check((err.body or {}).get("param") == "messages", "an empty conversation is a 400")
    else:
        check(False, "an empty conversation was accepted")


def main():
    base = sys.argv[1].rstrip("/")
    client = openai.OpenAI(base_url=base + "/v1", api_key="none", max_retries=0, timeout=300)
    models = client.models.list().data
    check(len(models) == 1 and models[0].owned_by == "llama-orch", "one model listed")
    model = models[0].id
    chat(client, base, model)
    completions(client, base, model)
    logprobs(client, base, model)
    errors(client, model)
    print(f"sdk_check: every check passed (openai {openai.__version__}, model {model!r})")


if __name__ == "__main__":
    main()
