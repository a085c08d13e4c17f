"""OpenAI's Responses API (/v1/responses) driven through OpenAI's official Python SDK, as its
users drive it, on a model whose template renders tools (Qwen2.5-Coder-1.5B).

Run by tests/tests/http_openai.rs against a real worker:

    PYTHONPATH=$ASSETS/python/sdk python3 tests/openai/responses_check.py http://127.0.0.1:PORT

Checks `responses.create` (instructions and a string input, usage, `max_output_tokens` cutting
the reply), `responses.parse` with a pydantic model as `text.format`, a forced function call
answered by its `function_call_output` both by resending the items and through
`previous_response_id`, `responses.stream` (the same text as a whole greedy run, every event in
order, a function call's arguments streamed), and errors (a prompt over the context, an unknown
`previous_response_id`). Every response and every stream event is validated against the SDK's own
types (pydantic in strict mode, not the SDK's lenient construction). Asserts on structure, never
on the model's wording, except that a stream and a whole run at T = 0 say the same. Exits
non-zero, naming the failed check, on the first failure.
"""

import json
import os
import sys

import jsonschema
import openai
import pydantic
from openai.types import ErrorObject
from openai.types.responses import Response, ResponseStreamEvent

# The worker's API key (tests/tests/http_openai.rs sets it when the worker has one).
API_KEY = os.environ.get("LLORCH_TEST_API_KEY", "none")

EVENTS = pydantic.TypeAdapter(ResponseStreamEvent)

WEATHER = {
    "type": "object",
    "properties": {
        "city": {"type": "string"},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
    },
    "required": ["city"],
}
TOOLS = [
    {"type": "function", "name": "get_weather", "description": "Get the current weather in a city.",
     "parameters": WEATHER, "strict": False},
    {"type": "function", "name": "get_time", "description": "Get the current time in a timezone.",
     "parameters": {"type": "object", "properties": {"timezone": {"type": "string"}},
                    "required": ["timezone"]},
     "strict": False},
]
FORCED = {"type": "function", "name": "get_weather"}
QUESTION = [{"role": "user", "content": "What is the weather like in Paris today, in celsius?"}]
GREEDY = {"temperature": 0, "extra_body": {"seed": 7}}


class Capital(pydantic.BaseModel):
    city: str
    country: str
    population: int


def check(condition, what):
    if not condition:
        raise SystemExit(f"FAILED: {what}")
    print(f"ok: {what}")


def create(client, **request):
    """`responses.create`, its raw JSON validated as a `Response`."""
    raw = client.responses.with_raw_response.create(**request)
    Response.model_validate(raw.http_response.json(), strict=True)
    return raw.parse()


def streamed(client, **request):
    """`responses.stream`: its final response and its events, each validated as a stream event
    (the helper adds `snapshot` to deltas, which the SDK's models allow as an extra), numbered
    and in order."""
    events = []
    with client.responses.stream(**request) as stream:
        for event in stream:
            events.append(EVENTS.validate_python(event.to_dict(warnings=False), strict=True))
        # The helper keeps only a `response.completed` event's response as the final one.
        if events and events[-1].type == "response.incomplete":
            stream.until_done()
            final = events[-1].response
        else:
            final = stream.get_final_response()
    Response.model_validate(final.to_dict(warnings=False), strict=True)
    # (The helper turns the last event's items into parsed ones, `parsed: None` added.)
    done = [event.item.to_dict(exclude_none=True, warnings=False) for event in events
            if event.type == "response.output_item.done"]
    last = events[-1].response.output
    check(done == [item.to_dict(exclude_none=True, warnings=False) for item in last],
          f"the {len(done)} items output_item.done sent are the last event's response's")
    check([event.sequence_number for event in events] == list(range(len(events))),
          f"the stream's {len(events)} events are numbered from 0")
    check_order(events)
    return final, events


def check_order(events):
    """created, in_progress, then each output item opened, filled and closed before the next,
    then completed or incomplete, whose response is the final one."""
    names = [event.type for event in events]
    check(names[:2] == ["response.created", "response.in_progress"]
          and names[-1] in ("response.completed", "response.incomplete")
          and names.count(names[-1]) == 1,
          f"the stream opens with created and in_progress and ends with {names[-1]}")
    check(all(event.response.status == "in_progress" and event.response.output == []
              for event in events[:2]), "created and in_progress carry an empty response")
    open_item = None
    for event in events[2:-1]:
        if event.type == "response.output_item.added":
            ok = open_item is None
            open_item = event.output_index
        elif event.type == "response.output_item.done":
            ok = open_item == event.output_index
            open_item = None
        else:
            ok = open_item is not None and getattr(event, "output_index", open_item) == open_item
        if not ok:
            check(False, f"the events come in the Responses API's order: {names}")
    check(open_item is None, "every output item opened is closed")


def text_of(response):
    return "".join(part.text for item in response.output if item.type == "message"
                   for part in item.content if part.type == "output_text")


def calls_of(response):
    return [item for item in response.output if item.type == "function_call"]


def valid_weather(call):
    if call.name != "get_weather":
        return False
    try:
        jsonschema.validate(json.loads(call.arguments), WEATHER)
    except (json.JSONDecodeError, jsonschema.ValidationError):
        return False
    return True


def check_text(client, model):
    request = dict(model=model, instructions="You are a terse assistant.",
                   input="In one sentence, what is the capital of France?",
                   max_output_tokens=48, **GREEDY)
    whole = create(client, **request)
    check(whole.object == "response" and whole.id.startswith("resp_")
          and whole.status == "completed" and whole.incomplete_details is None
          and whole.error is None,
          f"responses.create answers a completed response ({whole.id})")
    check(len(whole.output) == 1 and whole.output[0].type == "message"
          and whole.output[0].role == "assistant" and whole.output[0].status == "completed"
          and whole.output_text == text_of(whole) and whole.output_text.strip(),
          f"its output is one assistant message: {whole.output_text!r}")
    check(whole.instructions == request["instructions"] and whole.max_output_tokens == 48
          and whole.temperature == 0,
          "the response repeats the request's instructions, budget and temperature")
    usage = whole.usage
    check(usage.input_tokens > 10 and 0 < usage.output_tokens < 48
          and usage.total_tokens == usage.input_tokens + usage.output_tokens
          and usage.input_tokens_details.cached_tokens <= usage.input_tokens
          and usage.output_tokens_details.reasoning_tokens == 0,
          f"usage counts tokens: {usage}")

    final, events = streamed(client, **request)
    pieces = [event.delta for event in events if event.type == "response.output_text.delta"]
    check(len(pieces) > 1 and "".join(pieces) == text_of(final) == whole.output_text,
          f"responses.stream sends the same text in {len(pieces)} pieces")
    done = [event.text for event in events if event.type == "response.output_text.done"]
    check(done == [whole.output_text], "output_text.done carries the whole text")
    names = [event.type for event in events]
    check(names[2:4] == ["response.output_item.added", "response.content_part.added"]
          and names[-4:] == ["response.output_text.done", "response.content_part.done",
                             "response.output_item.done", "response.completed"],
          f"a message's events come in order ({len(events)} events)")
    check(final.status == "completed" and final.id == events[-1].response.id
          and final.usage.output_tokens == usage.output_tokens
          and final.usage.input_tokens == usage.input_tokens,
          f"the stream's final response has the same status and usage: {final.usage}")

    cut = create(client, model=model, input="Count from 1 to 50, separated by commas.",
                 max_output_tokens=5, **GREEDY)
    check(cut.status == "incomplete" and cut.incomplete_details is not None
          and cut.incomplete_details.reason == "max_output_tokens"
          and cut.usage.output_tokens == 5
          and [item.status for item in cut.output] == ["incomplete"],
          f"max_output_tokens cuts the reply, its item incomplete: {cut.output_text!r} "
          f"({cut.status}, {cut.incomplete_details})")
    final, events = streamed(client, model=model, input="Count from 1 to 50, separated by commas.",
                             max_output_tokens=5, **GREEDY)
    check(events[-1].type == "response.incomplete" and final.status == "incomplete"
          and final.incomplete_details.reason == "max_output_tokens"
          and text_of(final) == cut.output_text
          and [item.status for item in final.output] == ["incomplete"],
          "a stream cut by max_output_tokens ends with response.incomplete")


def check_structured(client, model):
    request = dict(model=model, max_output_tokens=80, **GREEDY,
                   input="Give the capital of France, its country and its population as JSON.")
    raw = client.responses.with_raw_response.parse(text_format=Capital, **request)
    Response.model_validate(raw.http_response.json(), strict=True)
    parsed = raw.parse()
    check(parsed.status == "completed" and isinstance(parsed.output_parsed, Capital),
          f"responses.parse with a pydantic text_format: {parsed.output_parsed!r}")
    check(parsed.text.format.type == "json_schema" and parsed.text.format.name == "Capital",
          f"the response repeats text.format: {parsed.text.format.type} {parsed.text.format.name}")
    jsonschema.validate(json.loads(parsed.output_text), Capital.model_json_schema())
    check(True, f"the output is JSON valid against the schema: {parsed.output_text!r}")


def check_tools(client, model):
    request = dict(model=model, input=QUESTION, tools=TOOLS, tool_choice=FORCED,
                   max_output_tokens=80, **GREEDY)
    whole = create(client, **request)
    calls = calls_of(whole)
    check(whole.status == "completed" and len(calls) == 1
          and all(item.type == "function_call" for item in whole.output),
          f"a forced tool_choice answers one function_call item ({whole.output})")
    call = calls[0]
    check(call.call_id.startswith("call_") and call.id.startswith("fc_")
          and call.status == "completed" and valid_weather(call),
          f"get_weather with valid JSON arguments: {call.name}({call.arguments}) [{call.call_id}]")

    final, events = streamed(client, **request)
    streamed_calls = calls_of(final)
    check(len(streamed_calls) == 1
          and (streamed_calls[0].name, streamed_calls[0].arguments) == (call.name, call.arguments),
          f"the stream makes the same call: {streamed_calls}")
    pieces = [event.delta for event in events
              if event.type == "response.function_call_arguments.delta"]
    done = [event for event in events if event.type == "response.function_call_arguments.done"]
    check(len(pieces) > 1 and "".join(pieces) == call.arguments
          and len(done) == 1 and done[0].arguments == call.arguments
          and done[0].item_id == streamed_calls[0].id,
          f"the call's arguments stream in {len(pieces)} deltas, then done")
    names = [event.type for event in events]
    check(names[2] == "response.output_item.added"
          and names[-3:] == ["response.function_call_arguments.done",
                             "response.output_item.done", "response.completed"],
          "a call's events come in order")

    result = {"type": "function_call_output", "call_id": call.call_id, "output": json.dumps(
        {"city": "Paris", "temperature": 18, "unit": "celsius", "sky": "sunny"})}
    # With the tools still offered Qwen2.5-Coder-1.5B calls get_weather again at T = 0 (as on
    # /v1/chat/completions); `tool_choice: none` lets it answer.
    answer_request = dict(model=model, tools=TOOLS, tool_choice="none", max_output_tokens=60,
                          **GREEDY)
    resent = create(client, input=QUESTION + [item.model_dump(exclude_none=True)
                                              for item in whole.output] + [result],
                    **answer_request)
    check(resent.status in ("completed", "incomplete") and not calls_of(resent)
          and resent.output_text.strip() and "18" in resent.output_text,
          f"the function_call_output, items resent, becomes text: {resent.output_text!r}")
    chained = create(client, previous_response_id=whole.id, input=[result], **answer_request)
    check(chained.previous_response_id == whole.id and not calls_of(chained)
          and chained.output_text == resent.output_text
          and chained.usage.input_tokens == resent.usage.input_tokens,
          f"through previous_response_id the same prompt ({chained.usage.input_tokens} tokens) "
          "gets the same answer")


def check_errors(client, model):
    try:
        create(client, model=model, input="word " * 3000, max_output_tokens=16)
        check(False, "a prompt over the context is refused")
    except openai.BadRequestError as error:
        ErrorObject.model_validate(error.body)
        check(error.code == "context_length_exceeded" and error.type == "invalid_request_error"
              and error.param == "input" and "max_output_tokens" in error.message,
              f"a prompt over the context: {error.code} at {error.param}: {error.message!r}")
    unknown = "resp_" + "0" * 32
    try:
        create(client, model=model, input="Hello.", previous_response_id=unknown)
        check(False, "an unknown previous_response_id is refused")
    except openai.BadRequestError as error:
        ErrorObject.model_validate(error.body)
        check(error.code == "previous_response_not_found" and error.param == "previous_response_id"
              and unknown in error.message,
              f"an unknown previous_response_id: {error.code}: {error.message!r}")


def main():
    base = sys.argv[1].rstrip("/")
    client = openai.OpenAI(base_url=base + "/v1", api_key=API_KEY, max_retries=0, timeout=600)
    model = client.models.list().data[0].id
    check_text(client, model)
    check_structured(client, model)
    check_tools(client, model)
    check_errors(client, model)
    print(f"responses_check: every check passed (openai {openai.__version__}, {model!r})")


if __name__ == "__main__":
    main()
