"""Anthropic's Messages API (/v1/messages) driven through Anthropic's official Python SDK, as its
users drive it, on a model whose template renders tools (Qwen2.5-Coder-1.5B).

Run by tests/tests/http_openai.rs against a real worker started with `--api-key KEY`:

    PYTHONPATH=$ASSETS/python/sdk python3 tests/openai/messages_check.py http://127.0.0.1:PORT KEY

Checks `models.list` and `models.retrieve`, `messages.create` and `messages.stream` (same text,
same usage), `messages.count_tokens`, a prefill continued, stop sequences and `max_tokens`, a tool round trip (a `tool_use` block whose input validates, the same call
streamed, a forced call, the `tool_result` answered in text), the key sent as `x-api-key`, and
errors (a prompt over the context, an image block, a wrong key). Every reply and every stream
event is validated against the SDK's own types (pydantic, not the SDK's lenient construction).
Exits non-zero, naming the failed check, on the first failure.
"""

import json
import sys

import anthropic
import jsonschema
import pydantic
from anthropic.types import ErrorResponse, Message, MessageTokensCount, ModelInfo, RawMessageStreamEvent

EVENTS = pydantic.TypeAdapter(RawMessageStreamEvent)

WEATHER = {
    "type": "object",
    "properties": {
        "city": {"type": "string"},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
    },
    "required": ["city"],
}
TOOLS = [
    {"name": "get_weather", "description": "Get the current weather in a city.",
     "input_schema": WEATHER},
    {"name": "get_time", "description": "Get the current time in a timezone.",
     "input_schema": {"type": "object", "properties": {"timezone": {"type": "string"}},
                      "required": ["timezone"]}},
]
QUESTION = [{"role": "user", "content": "What is the weather like in Paris today, in celsius?"}]
GREEDY = {"temperature": 0}


def check(condition, what):
    if not condition:
        raise SystemExit(f"FAILED: {what}")
    print(f"ok: {what}")


def create(client, **request):
    """`messages.create`, its raw JSON validated as a `Message`."""
    raw = client.messages.with_raw_response.create(**request)
    Message.model_validate(raw.http_response.json())
    return raw.parse()


RAW_EVENTS = ("message_start", "content_block_start", "content_block_delta",
              "content_block_stop", "message_delta", "message_stop")


def streamed(client, **request):
    """`messages.stream`: its final message and its raw events (the SDK's own derived events
    left out), each validated as a stream event."""
    events = []
    with client.messages.stream(**request) as stream:
        for event in stream:
            if event.type in RAW_EVENTS:
                events.append(EVENTS.validate_python(event.to_dict()))
        final = stream.get_final_message()
    return final, events


def deltas(events, kind):
    return [e.delta for e in events if e.type == "content_block_delta" and e.delta.type == kind]


def text_of(message):
    return "".join(block.text for block in message.content if block.type == "text")


def valid_weather(block):
    if block.type != "tool_use" or block.name != "get_weather":
        return False
    try:
        jsonschema.validate(block.input, WEATHER)
    except jsonschema.ValidationError:
        return False
    return True


def check_text(client, model):
    request = dict(model=model, max_tokens=48, system="You are a terse assistant.",
                   messages=[{"role": "user", "content": "In one sentence, what is the capital of France?"}],
                   extra_body=GREEDY)
    whole = create(client, **request)
    check(whole.type == "message" and whole.role == "assistant" and whole.id.startswith("msg_"),
          f"messages.create answers a message ({whole.id})")
    check(whole.stop_reason == "end_turn" and "Paris" in text_of(whole),
          f"the answer is text ending its turn: {text_of(whole)!r} ({whole.stop_reason})")
    check(whole.usage.input_tokens > 10 and whole.usage.output_tokens > 0,
          f"usage counts tokens: {whole.usage}")
    counted = client.messages.with_raw_response.count_tokens(
        model=model, system=request["system"], messages=request["messages"])
    MessageTokensCount.model_validate(counted.http_response.json())
    prompt = whole.usage.input_tokens + whole.usage.cache_read_input_tokens
    check(counted.parse().input_tokens == prompt,
          f"messages.count_tokens counts the prompt's {prompt} tokens")

    final, events = streamed(client, **request)
    pieces = [delta.text for delta in deltas(events, "text_delta")]
    check(len(pieces) > 1 and "".join(pieces) == text_of(whole) == text_of(final),
          f"messages.stream sends the same text in {len(pieces)} pieces")
    check(final.stop_reason == whole.stop_reason
          and final.usage.output_tokens == whole.usage.output_tokens,
          f"the stream's final message has the same stop reason and usage: {final.usage}")
    names = [event.type for event in events]
    check(names[0] == "message_start" and names[1:3] == ["content_block_start", "content_block_delta"]
          and names[-3:] == ["content_block_stop", "message_delta", "message_stop"],
          f"the events come in Anthropic's order ({len(events)} events; the SDK skips ping)")

    prefill = create(client, model=model, max_tokens=8, extra_body=GREEDY, messages=[
        {"role": "user", "content": "What is the Greek name for the Sun? (A) Sol (B) Helios (C) Sun"},
        {"role": "assistant", "content": "The best answer is ("}])
    check(text_of(prefill)[:1] in ("A", "B", "C"),
          f"a final assistant message is continued: {text_of(prefill)!r}")

    count = dict(model=model, max_tokens=40, extra_body=GREEDY,
                 messages=[{"role": "user", "content": "Count from 1 to 9, separated by commas."}])
    stopped = create(client, stop_sequences=["5"], **count)
    check(stopped.stop_reason == "stop_sequence" and stopped.stop_sequence == "5"
          and "5" not in text_of(stopped),
          f"a stop sequence stops the reply: {text_of(stopped)!r} ({stopped.stop_reason})")
    cut = create(client, **{**count, "max_tokens": 3})
    check(cut.stop_reason == "max_tokens" and cut.usage.output_tokens == 3,
          f"max_tokens cuts the reply: {text_of(cut)!r}")


def check_tools(client, model):
    request = dict(model=model, max_tokens=80, messages=QUESTION, tools=TOOLS, extra_body=GREEDY)
    whole = create(client, **request)
    calls = [block for block in whole.content if block.type == "tool_use"]
    check(whole.stop_reason == "tool_use" and calls,
          f"a weather question gets a tool_use block ({whole.stop_reason}, {whole.content})")
    call = calls[0]
    check(call.id.startswith("toolu_") and valid_weather(call),
          f"get_weather with valid input: {call.name}({call.input})")

    final, events = streamed(client, **request)
    calls = [block for block in final.content if block.type == "tool_use"]
    check(final.stop_reason == "tool_use" and calls
          and (calls[0].name, calls[0].input) == (call.name, call.input),
          f"the stream makes the same call: {calls}")
    pieces = deltas(events, "input_json_delta")
    check(len(pieces) > 1, f"the call's input streams in {len(pieces)} pieces")

    forced = create(client, model=model, max_tokens=80, messages=QUESTION, tools=TOOLS,
                    tool_choice={"type": "tool", "name": "get_weather"},
                    extra_body={"temperature": 0.8, "seed": 3})
    check(forced.stop_reason == "tool_use" and valid_weather(forced.content[0]),
          f"a forced call at T = 0.8 has valid input: {forced.content}")

    followup = QUESTION + [
        {"role": "assistant", "content": [block.model_dump(exclude_none=True) for block in whole.content]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call.id, "content": json.dumps(
            {"city": "Paris", "temperature": 18, "unit": "celsius", "sky": "sunny"})}]},
    ]
    # With the tools still offered Qwen2.5-Coder-1.5B calls get_weather again at T = 0 (as on
    # /v1/chat/completions); `tool_choice: none` lets it answer.
    answer = create(client, model=model, max_tokens=60, messages=followup, tools=TOOLS,
                    tool_choice={"type": "none"}, extra_body=GREEDY)
    check(answer.stop_reason in ("end_turn", "max_tokens") and "18" in text_of(answer)
          and all(block.type == "text" for block in answer.content),
          f"the tool's result becomes text: {text_of(answer)!r}")


def check_errors(client, base, model):
    try:
        create(client, model=model, max_tokens=16,
               messages=[{"role": "user", "content": "word " * 3000}])
        check(False, "a prompt over the context is refused")
    except anthropic.BadRequestError as error:
        ErrorResponse.model_validate(error.body)
        check(error.body["error"]["type"] == "invalid_request_error"
              and "prompt is too long" in error.body["error"]["message"],
              f"a prompt over the context is too long: {error.body['error']['message'][:60]!r}")
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AAAA"}}
    try:
        create(client, model=model, max_tokens=16,
               messages=[{"role": "user", "content": [image]}])
        check(False, "an image block is refused")
    except anthropic.BadRequestError as error:
        ErrorResponse.model_validate(error.body)
        check("image" in error.body["error"]["message"],
              f"an image block is refused: {error.body['error']['message']!r}")
    wrong = anthropic.Anthropic(base_url=base, api_key="wrong", max_retries=0)
    try:
        wrong.messages.create(model=model, max_tokens=4, messages=QUESTION)
        check(False, "a wrong key is refused")
    except anthropic.AuthenticationError as error:
        ErrorResponse.model_validate(error.body)
        check(error.body["error"]["type"] == "authentication_error",
              "a wrong x-api-key is an authentication_error")


def main():
    base, key = sys.argv[1].rstrip("/"), sys.argv[2]
    client = anthropic.Anthropic(base_url=base, api_key=key, max_retries=0, timeout=600)
    page = client.models.with_raw_response.list()
    for info in page.http_response.json()["data"]:
        ModelInfo.model_validate(info)
    model = page.parse().data[0].id
    check(model and client.models.retrieve(model).id == model,
          f"models.list and models.retrieve name the loaded model ({model!r})")
    check_text(client, model)
    check_tools(client, model)
    check_errors(client, base, model)
    print(f"messages_check: every check passed (anthropic {anthropic.__version__})")


if __name__ == "__main__":
    main()
