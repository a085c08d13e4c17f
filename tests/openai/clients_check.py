"""The worker's OpenAI API driven through three third-party clients, as their users drive it, on
a model whose template renders tools (Qwen2.5-Coder-1.5B) with a small context (2,048 tokens).

Run by tests/tests/http_openai.rs against a real worker on a real model:

    PYTHONPATH=$ASSETS/python/sdk python3 tests/openai/clients_check.py http://127.0.0.1:PORT

- LangChain (`langchain-openai`'s `ChatOpenAI`): `invoke` and `stream` answer with usage, and a
  prompt over the context raises LangChain's context-overflow error
  (`langchain_core.exceptions.ContextOverflowError`, which `langchain-openai` raises as
  `OpenAIContextOverflowError` on OpenAI's `context_length_exceeded`).
- LiteLLM (`litellm.completion` on `openai/<model>`): whole and streamed answers with usage, and
  a prompt over the context raises `litellm.ContextWindowExceededError`, not a bare
  `BadRequestError`.
- instructor (`instructor.from_openai`, its default TOOLS mode): `create` returns a validated
  pydantic model with a nested model (and its streaming parser rebuilds it from the call's
  arguments in pieces), `create_iterable` a list of them.

Each client runs offline: LiteLLM is told to use its bundled model map, and every socket
connection or name lookup outside the loopback range fails the check. Exits non-zero, naming
the failed check, on the first failure.
"""

import concurrent.futures
import ipaddress
import os
import socket
import sys

# Before any client is imported: LiteLLM fetches its model cost map (and other catalogs) at
# import unless told not to, and LangSmith traces only when asked.
os.environ["LITELLM_LOCAL_MODEL_COST_MAP"] = "True"
os.environ["LITELLM_OFFLINE_MODE"] = "true"
os.environ["LANGSMITH_TRACING"] = "false"
os.environ["LANGCHAIN_TRACING_V2"] = "false"
os.environ["HF_HUB_OFFLINE"] = "1"
for proxy in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"):
    os.environ.pop(proxy, None)

OUTSIDE = []  # every attempt to reach past the loopback range


def loopback(host):
    if host in ("localhost", "", None):
        return True
    try:
        return ipaddress.ip_address(host.split("%")[0]).is_loopback
    except ValueError:
        return False


_connect, _connect_ex, _getaddrinfo = socket.socket.connect, socket.socket.connect_ex, socket.getaddrinfo


def guarded_connect(self, address, *rest):
    if self.family in (socket.AF_INET, socket.AF_INET6) and not loopback(address[0]):
        OUTSIDE.append(f"connect {address}")
        raise OSError(f"clients_check: no network past loopback ({address})")
    return _connect(self, address, *rest)


def guarded_connect_ex(self, address, *rest):
    if self.family in (socket.AF_INET, socket.AF_INET6) and not loopback(address[0]):
        OUTSIDE.append(f"connect {address}")
        raise OSError(f"clients_check: no network past loopback ({address})")
    return _connect_ex(self, address, *rest)


def guarded_getaddrinfo(host, *rest, **named):
    name = host.decode() if isinstance(host, bytes) else host
    if not loopback(name):
        OUTSIDE.append(f"getaddrinfo {name!r}")
        raise socket.gaierror(f"clients_check: no name lookups past loopback ({name!r})")
    return _getaddrinfo(host, *rest, **named)


socket.socket.connect = guarded_connect
socket.socket.connect_ex = guarded_connect_ex
socket.getaddrinfo = guarded_getaddrinfo

import instructor  # noqa: E402
import langchain_core  # noqa: E402
import langchain_openai  # noqa: E402
import litellm  # noqa: E402
import openai  # noqa: E402
import pydantic  # noqa: E402
from langchain_core.exceptions import ContextOverflowError  # noqa: E402
from langchain_core.messages import AIMessage, AIMessageChunk  # noqa: E402
from langchain_openai import ChatOpenAI  # noqa: E402

# The worker's API key (tests/tests/http_openai.rs sets it when the worker has one).
API_KEY = os.environ.get("LLORCH_TEST_API_KEY", "none")

OVER_THE_CONTEXT = "word " * 3000  # about 3,000 tokens, over the worker's 2,048
QUESTION = "In one sentence, what is the capital of France?"


def check(condition, what):
    if not condition:
        raise SystemExit(f"FAILED: {what}")
    print(f"ok: {what}")


def offline(what):
    check(not OUTSIDE, f"{what} reached nothing past loopback {OUTSIDE}")


def check_langchain(base, model):
    llm = ChatOpenAI(base_url=base + "/v1", api_key=API_KEY, model=model, temperature=0,
                     max_tokens=24, max_retries=0, timeout=300)
    reply = llm.invoke(QUESTION)
    check(isinstance(reply, AIMessage) and isinstance(reply.content, str) and reply.content.strip(),
          f"ChatOpenAI.invoke answers: {reply.content!r}")
    usage = reply.usage_metadata
    check(usage is not None and usage["input_tokens"] > 0 and 0 < usage["output_tokens"] <= 24
          and usage["total_tokens"] == usage["input_tokens"] + usage["output_tokens"],
          f"the answer carries usage_metadata {usage}")
    check(reply.response_metadata.get("finish_reason") in ("stop", "length")
          and reply.response_metadata.get("model_name"),
          f"and response_metadata {reply.response_metadata.get('finish_reason')!r}")

    chunks = list(llm.stream(QUESTION, stream_usage=True))
    text = "".join(chunk.content for chunk in chunks)
    merged = chunks[0]
    for chunk in chunks[1:]:
        merged = merged + chunk
    check(all(isinstance(chunk, AIMessageChunk) for chunk in chunks) and len(chunks) > 2
          and text == reply.content,
          f"ChatOpenAI.stream sends the same text in {len(chunks)} chunks")
    check(merged.usage_metadata is not None
          and merged.usage_metadata["output_tokens"] == usage["output_tokens"],
          f"with the same usage {merged.usage_metadata}")

    try:
        llm.invoke(OVER_THE_CONTEXT)
        check(False, "LangChain: a prompt over the context is refused")
    except ContextOverflowError as error:
        check(isinstance(error, openai.BadRequestError)
              and type(error).__name__ == "OpenAIContextOverflowError",
              f"LangChain: a prompt over the context raises {type(error).__module__}."
              f"{type(error).__name__} (a ContextOverflowError)")
    offline("LangChain")


def check_litellm(base, model):
    litellm.suppress_debug_info = True
    request = dict(model=f"openai/{model}", api_base=base + "/v1", api_key=API_KEY,
                   messages=[{"role": "user", "content": QUESTION}], max_tokens=24,
                   temperature=0, num_retries=0, timeout=300)
    whole = litellm.completion(**request)
    text = whole.choices[0].message.content
    check(isinstance(whole, litellm.ModelResponse) and whole.choices[0].message.role == "assistant"
          and text and text.strip(),
          f"litellm.completion answers: {text!r}")
    check(whole.choices[0].finish_reason in ("stop", "length")
          and whole.usage.prompt_tokens > 0 and 0 < whole.usage.completion_tokens <= 24,
          f"with a finish reason and usage {whole.usage}")

    pieces, finish = [], None
    for chunk in litellm.completion(stream=True, **request):
        for choice in chunk.choices:
            if choice.delta.content:
                pieces.append(choice.delta.content)
            finish = choice.finish_reason or finish
    check(len(pieces) > 1 and "".join(pieces) == text and finish == whole.choices[0].finish_reason,
          f"litellm.completion(stream=True) sends the same text in {len(pieces)} pieces")

    try:
        litellm.completion(**{**request, "messages": [{"role": "user", "content": OVER_THE_CONTEXT}]})
        check(False, "LiteLLM: a prompt over the context is refused")
    except litellm.ContextWindowExceededError as error:
        check(error.status_code == 400 and error.llm_provider == "openai",
              "LiteLLM: a prompt over the context raises litellm.ContextWindowExceededError")
    offline("LiteLLM")


class Address(pydantic.BaseModel):
    city: str
    country: str


class Person(pydantic.BaseModel):
    name: str
    age: int = pydantic.Field(ge=0, le=150)
    address: Address


def start_instructor(pool, base, model):
    """instructor's `create` and `create_iterable`, started side by side on `pool` (the worker
    batches them: half the wall time): the futures of their results."""
    client = instructor.from_openai(openai.OpenAI(base_url=base + "/v1", api_key=API_KEY,
                                                  max_retries=0, timeout=300))
    check(client.mode == instructor.Mode.TOOLS, f"instructor's default mode is {client.mode}")
    text = "Ada is 36 years old and lives in London, in the United Kingdom."
    request = dict(model=model, response_model=Person, max_retries=0, temperature=0,
                   max_tokens=200)
    one = pool.submit(
        client.chat.completions.create_with_completion,
        messages=[{"role": "user", "content": f"Extract the person: {text}"}], **request)
    many = pool.submit(lambda: list(client.chat.completions.create_iterable(
        messages=[{"role": "user", "content": "Extract every person: " + text
                   + " Bob is 41 years old and lives in Paris, in France."}], **request)))
    return one, many


def check_instructor(one, many):
    person, completion = one.result()
    check(isinstance(person, Person) and isinstance(person.address, Address),
          f"instructor's create returns a validated Person with an Address: {person!r}")
    calls = completion.choices[0].message.tool_calls
    check(calls and calls[0].function.name == "Person",
          f"from the worker's forced {calls[0].function.name if calls else None!r} tool call"
          f" ({completion.usage.prompt_tokens} + {completion.usage.completion_tokens} tokens)")
    # instructor's streaming parser (on jiter's partial mode: instructor 1.17.0 declares an
    # older jiter than openai's, see requirements-sdk.txt) on the call's arguments in pieces.
    arguments = calls[0].function.arguments
    partials = list(instructor.Partial[Person].model_from_chunks(
        arguments[i:i + 7] for i in range(0, len(arguments), 7)))
    check(len(partials) > 2 and partials[-1].model_dump() == person.model_dump(),
          f"instructor's partial parser rebuilds it from {len(partials)} pieces of the arguments")
    people = many.result()
    check(len(people) >= 1 and all(isinstance(p, Person) and isinstance(p.address, Address)
                                   for p in people),
          f"instructor's create_iterable returns validated Persons: {people!r}")
    offline("instructor")


def main():
    base = sys.argv[1].rstrip("/")
    model = openai.OpenAI(base_url=base + "/v1", api_key=API_KEY).models.list().data[0].id
    check_langchain(base, model)
    check_litellm(base, model)
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        check_instructor(*start_instructor(pool, base, model))
    print(f"clients_check: every check passed (langchain-openai {langchain_openai.__version__}"
          f" langchain-core {langchain_core.__version__}, litellm {litellm_version()},"
          f" instructor {instructor.__version__})")


def litellm_version():
    from importlib.metadata import version
    return version("litellm")


if __name__ == "__main__":
    main()
