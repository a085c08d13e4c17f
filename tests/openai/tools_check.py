"""Tool calls through OpenAI's SDK on a model whose template renders tools (Qwen2.5-Coder-1.5B):
with two functions, a weather question gets a parsed `tool_calls` entry whose arguments validate
against the function's schema, whole and streamed; a forced call (`tool_choice` named) always
validates; a follow-up turn with the `tool` message (and `tool_choice: none`) gets a text answer.

    PYTHONPATH=$ASSETS/python/sdk python3 tests/openai/tools_check.py http://127.0.0.1:PORT
"""

import json
import os
import sys

import jsonschema
import openai

# The worker's API key (tests/tests/http_openai.rs sets it when the worker has one).
API_KEY = os.environ.get("LLORCH_TEST_API_KEY", "none")

WEATHER = {
    "type": "object",
    "properties": {
        "city": {"type": "string"},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
    },
    "required": ["city"],
}
TIME = {
    "type": "object",
    "properties": {"timezone": {"type": "string"}},
    "required": ["timezone"],
}
TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "Get the current weather in a city.",
        "parameters": WEATHER}},
    {"type": "function", "function": {
        "name": "get_time", "description": "Get the current time in a timezone.",
        "parameters": TIME}},
]
QUESTION = [{"role": "user", "content": "What is the weather like in Paris today, in celsius?"}]


def check(condition, what):
    if not condition:
        raise SystemExit(f"FAILED: {what}")
    print(f"ok: {what}")


def valid_weather_call(name, arguments):
    if name != "get_weather":
        return False
    try:
        jsonschema.validate(json.loads(arguments), WEATHER)
    except (json.JSONDecodeError, jsonschema.ValidationError):
        return False
    return True


def streamed(client, model, **request):
    calls, content, finish = {}, [], None
    for chunk in client.chat.completions.create(model=model, stream=True, **request):
        for choice in chunk.choices:
            delta = choice.delta
            if delta.content:
                content.append(delta.content)
            for call in delta.tool_calls or []:
                entry = calls.setdefault(call.index,
                                         {"id": None, "name": "", "arguments": "", "pieces": 0})
                entry["id"] = call.id or entry["id"]
                entry["name"] += call.function.name or ""
                entry["arguments"] += call.function.arguments or ""
                entry["pieces"] += bool(call.function.arguments)
            finish = choice.finish_reason or finish
    return [calls[i] for i in sorted(calls)], "".join(content), finish


def main():
    base = sys.argv[1].rstrip("/")
    client = openai.OpenAI(base_url=base + "/v1", api_key=API_KEY, max_retries=0, timeout=600)
    model = client.models.list().data[0].id
    request = dict(messages=QUESTION, tools=TOOLS, temperature=0, max_tokens=80)

    whole = client.chat.completions.create(model=model, **request)
    choice = whole.choices[0]
    calls = choice.message.tool_calls or []
    check(choice.finish_reason == "tool_calls" and len(calls) >= 1,
          f"a weather question gets a tool call ({choice.finish_reason}, {choice.message.content!r})")
    call = calls[0]
    check(call.type == "function" and call.id.startswith("call_")
          and valid_weather_call(call.function.name, call.function.arguments),
          f"get_weather with valid arguments: {call.function.name}({call.function.arguments})")

    stream_calls, _, finish = streamed(client, model, **request)
    check(finish == "tool_calls" and stream_calls
          and stream_calls[0]["name"] == call.function.name
          and stream_calls[0]["arguments"] == call.function.arguments,
          f"the stream makes the same call: {stream_calls}")
    check(stream_calls[0]["pieces"] > 1,
          f"the call's arguments stream in pieces: {stream_calls[0]['pieces']}")

    forced = client.chat.completions.create(
        model=model, messages=QUESTION, tools=TOOLS, temperature=0.8, seed=3, max_tokens=80,
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
    )
    forced_call = (forced.choices[0].message.tool_calls or [None])[0]
    check(forced_call is not None
          and valid_weather_call(forced_call.function.name, forced_call.function.arguments),
          f"a named tool_choice at T = 0.8 calls it with valid arguments: {forced_call}")

    followup = QUESTION + [
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": call.id, "type": "function",
             "function": {"name": call.function.name, "arguments": call.function.arguments}}]},
        {"role": "tool", "tool_call_id": call.id, "content": json.dumps(
            {"city": "Paris", "temperature": 18, "unit": "celsius", "sky": "sunny"})},
    ]
    # With the tools still offered, Qwen2.5-Coder-1.5B calls get_weather again at T = 0 (on the
    # same prompt Hugging Face's renderer writes, 328 tokens); `tool_choice: none` lets it answer.
    answer = client.chat.completions.create(
        model=model, messages=followup, tools=TOOLS, tool_choice="none", temperature=0,
        max_tokens=60,
    )
    text = answer.choices[0].message.content or ""
    check(answer.choices[0].finish_reason in ("stop", "length") and not answer.choices[0].message.tool_calls
          and "18" in text,
          f"the tool's answer becomes text: {text!r}")
    print(f"tools_check: every check passed ({model!r})")


if __name__ == "__main__":
    main()
