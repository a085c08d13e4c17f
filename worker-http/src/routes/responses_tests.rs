//! OpenAI's Responses route in process over the scripted backend of `messages_tests` (its
//! template writes `[role:content<tool_calls>#<tool_call_id>]`, its model answers after `|`):
//! whole and streamed responses, structured output, a tool round trip, `previous_response_id`,
//! a harmony model's reasoning, and refusals in OpenAI's error shape.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;

use axum::http::StatusCode;
use serde_json::{Value, json};

use super::messages_tests::{ANSWER, CALL, Prompts, scripted, start};
use super::tests::send;
use crate::response_store::StoreLimits;
use crate::state::Shared;

fn worker(reply: &'static str) -> (Arc<Shared>, Prompts) {
    let (backend, prompts) = scripted(reply);
    (start(backend, crate::Access::default()), prompts)
}

fn question(extra: Value) -> Value {
    let mut body = json!({"model": "any", "input": "Weather in Paris?", "temperature": 0});
    for (key, value) in extra.as_object().unwrap() {
        body[key] = value.clone();
    }
    body
}

async fn post(shared: &Arc<Shared>, body: Value) -> (StatusCode, String) {
    send(shared, "POST", "/v1/responses", Some(body)).await
}

fn parsed(text: &str) -> Value {
    serde_json::from_str(text).unwrap_or_else(|err| panic!("{err}: {text}"))
}

/// A response that must be answered 200.
async fn respond(shared: &Arc<Shared>, body: Value) -> Value {
    let (status, text) = post(shared, body).await;
    assert_eq!(status, StatusCode::OK, "{text}");
    parsed(&text)
}

/// A request that must be refused 400; its OpenAI error object.
async fn refused(shared: &Arc<Shared>, body: Value) -> Value {
    let (status, text) = post(shared, body).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{text}");
    let error = parsed(&text)["error"].clone();
    assert_eq!(error["type"], "invalid_request_error", "{text}");
    error
}

/// The SSE events: `(event name, data)`, every `event:` line followed by its `data:`.
fn events(body: &str) -> Vec<(String, Value)> {
    let mut out = Vec::new();
    let mut name = None;
    for line in body.lines() {
        if let Some(event) = line.strip_prefix("event: ") {
            name = Some(event.to_owned());
        } else if let Some(data) = line.strip_prefix("data: ") {
            let name = name.take().expect("a data line without its event line");
            let data: Value = serde_json::from_str(data).unwrap();
            assert_eq!(data["type"], name, "{body}");
            out.push((name, data));
        }
    }
    out
}

fn weather_tool() -> Value {
    json!({"type": "function", "name": "get_weather", "description": "Weather in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
            "required": ["city"]}})
}

/// The output items' texts, joined.
fn output_text(response: &Value) -> String {
    let items = response["output"].as_array().unwrap();
    let messages = items.iter().filter(|item| item["type"] == "message");
    let parts = messages.flat_map(|item| item["content"].as_array().unwrap().iter());
    parts.map(|part| part["text"].as_str().unwrap()).collect()
}

#[tokio::test]
async fn a_whole_response_carries_the_message_status_and_usage() {
    let (shared, prompts) = worker("Sunny.");
    let response = respond(&shared, question(json!({"instructions": "Be brief."}))).await;
    let id = response["id"].as_str().unwrap();
    assert!(id.starts_with("resp_") && id.len() == 37, "{id}");
    assert_eq!(
        (&response["object"], &response["status"], &response["model"]),
        (&json!("response"), &json!("completed"), &json!("scripted"))
    );
    let output = response["output"].as_array().unwrap();
    assert_eq!(output.len(), 1, "{response}");
    let message = &output[0];
    assert!(message["id"].as_str().unwrap().starts_with("msg_"));
    assert_eq!(
        (&message["type"], &message["role"], &message["status"]),
        (&json!("message"), &json!("assistant"), &json!("completed"))
    );
    assert_eq!(
        message["content"],
        json!([{"type": "output_text", "text": "Sunny.", "annotations": []}])
    );
    let prompt = "[system:Be brief.][user:Weather in Paris?]|";
    assert_eq!(prompts.lock().unwrap().as_slice(), [prompt]);
    let usage = &response["usage"];
    assert_eq!(usage["input_tokens"], prompt.len(), "one token a character");
    assert_eq!(usage["output_tokens"], "Sunny.".len());
    assert_eq!(usage["total_tokens"], prompt.len() + "Sunny.".len());
    assert_eq!(usage["output_tokens_details"]["reasoning_tokens"], 0);
    assert!(usage["input_tokens_details"]["cached_tokens"].is_u64());
    // What the SDK's Response type requires, repeated from the request.
    assert_eq!(
        (
            &response["instructions"],
            &response["temperature"],
            &response["top_p"]
        ),
        (&json!("Be brief."), &json!(0), &json!(1.0))
    );
    assert_eq!(
        (
            &response["tool_choice"],
            &response["tools"],
            &response["parallel_tool_calls"]
        ),
        (&json!("auto"), &json!([]), &json!(true))
    );
    assert_eq!(response["text"], json!({"format": {"type": "text"}}));
    for key in [
        "error",
        "incomplete_details",
        "previous_response_id",
        "metadata",
    ] {
        assert!(response[key].is_null(), "{key}: {response}");
    }
    assert!(response["created_at"].as_u64().unwrap() > 1_600_000_000);

    let cut = respond(&shared, question(json!({"max_output_tokens": 3}))).await;
    assert_eq!(cut["status"], "incomplete");
    assert_eq!(
        cut["incomplete_details"],
        json!({"reason": "max_output_tokens"})
    );
    assert_eq!(
        (output_text(&cut), &cut["max_output_tokens"]),
        ("Sun".into(), &json!(3))
    );
}

#[tokio::test]
async fn structured_output_follows_text_format() {
    // The model wants to write "Sunny."; the schema has one answer, which the grammar forces.
    let (shared, _) = worker("Sunny.");
    let schema = json!({"type": "object", "properties": {"city": {"enum": ["Paris"]}},
        "required": ["city"], "additionalProperties": false});
    let format = json!({"type": "json_schema", "name": "city", "schema": schema, "strict": true});
    let response = respond(&shared, question(json!({"text": {"format": format}}))).await;
    assert_eq!(output_text(&response), r#"{"city": "Paris"}"#, "{response}");
    assert_eq!(response["text"]["format"], format);
    // A schema that can produce nothing is the request's fault, named by its field.
    let endless = json!({"type": "json_schema", "name": "x", "schema": {"$ref": "#"}});
    let error = refused(&shared, question(json!({"text": {"format": endless}}))).await;
    assert_eq!(error["param"], "text.format", "{error}");
}

#[tokio::test]
async fn a_tool_round_trip_sends_a_call_item_and_takes_its_output() {
    let (shared, prompts) = worker(CALL);
    let tools = json!({"tools": [weather_tool()]});
    let response = respond(&shared, question(tools.clone())).await;
    assert_eq!(response["status"], "completed");
    let output = response["output"].as_array().unwrap().clone();
    assert_eq!(output.len(), 2, "{response}");
    assert_eq!(output[0]["content"][0]["text"], "Let me check.");
    let call = &output[1];
    assert_eq!(
        (
            &call["type"],
            &call["name"],
            &call["arguments"],
            &call["status"]
        ),
        (
            &json!("function_call"),
            &json!("get_weather"),
            &json!(r#"{"city": "Paris"}"#),
            &json!("completed")
        )
    );
    let call_id = call["call_id"].as_str().unwrap().to_owned();
    assert!(
        call_id.starts_with("call_") && call_id.len() == 29,
        "{call_id}"
    );
    assert_eq!(call["id"], format!("fc_{}", &call_id[5..]));
    assert_eq!(response["tools"][0]["name"], "get_weather");

    // The whole conversation sent back, as a client without previous_response_id does.
    let result = json!({"type": "function_call_output", "call_id": call_id, "output": "18 C"});
    let mut input = vec![json!({"role": "user", "content": "Weather in Paris?"})];
    input.extend(output);
    input.push(result.clone());
    let mut followup = question(tools.clone());
    followup["input"] = Value::Array(input);
    let answer = respond(&shared, followup).await;
    assert_eq!(output_text(&answer), ANSWER);
    let rendered = prompts.lock().unwrap().last().cloned().unwrap();
    let calls = format!(
        r#"[{{"id": "{call_id}", "type": "function", "function": {{"name": "get_weather", "arguments": {{"city": "Paris"}}}}}}]"#
    );
    let expected =
        format!("[user:Weather in Paris?][assistant:Let me check.{calls}][tool:18 C#{call_id}]T|");
    assert_eq!(rendered, expected);

    // The same continuation through previous_response_id: only the call's output is sent.
    let mut continued = question(tools);
    continued["input"] = json!([result]);
    continued["previous_response_id"] = response["id"].clone();
    let answer = respond(&shared, continued).await;
    assert_eq!(output_text(&answer), ANSWER);
    assert_eq!(answer["previous_response_id"], response["id"]);
    assert_eq!(prompts.lock().unwrap().last().unwrap(), &expected);
}

#[tokio::test]
async fn a_named_tool_choice_forces_the_call_by_grammar() {
    // The model wants to write text; the named choice makes it call get_weather with the one
    // argument its schema allows.
    let (shared, _) = worker("Sunny.");
    let paris = json!({"type": "function", "name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"enum": ["Paris"]}}, "required": ["city"],
        "additionalProperties": false}});
    let choice = json!({"type": "function", "name": "get_weather"});
    let body = question(json!({"tools": [paris], "tool_choice": choice}));
    let response = respond(&shared, body).await;
    let output = response["output"].as_array().unwrap();
    assert_eq!(output.len(), 1, "{response}");
    assert_eq!(
        (
            &output[0]["type"],
            &output[0]["name"],
            &output[0]["arguments"]
        ),
        (
            &json!("function_call"),
            &json!("get_weather"),
            &json!(r#"{"city": "Paris"}"#)
        )
    );
    assert_eq!(response["tool_choice"], choice);
}

#[tokio::test]
async fn a_stream_sends_typed_events_in_order_with_sequence_numbers() {
    let (shared, _) = worker("Sunny.");
    let (status, body) = post(&shared, question(json!({"stream": true}))).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let events = events(&body);
    let names: Vec<&str> = events.iter().map(|(name, _)| name.as_str()).collect();
    let deltas = names
        .iter()
        .filter(|name| **name == "response.output_text.delta");
    assert_eq!(
        deltas.count(),
        "Sunny.".len(),
        "one delta a token: {names:?}"
    );
    let mut order: Vec<&str> = names.clone();
    order.dedup();
    assert_eq!(
        order,
        [
            "response.created",
            "response.in_progress",
            "response.output_item.added",
            "response.content_part.added",
            "response.output_text.delta",
            "response.output_text.done",
            "response.content_part.done",
            "response.output_item.done",
            "response.completed",
        ]
    );
    for (i, (_, data)) in events.iter().enumerate() {
        assert_eq!(data["sequence_number"], i, "{data}");
    }
    let created = &events[0].1["response"];
    assert_eq!(
        (&created["status"], &created["output"]),
        (&json!("in_progress"), &json!([]))
    );
    let text: String = events
        .iter()
        .filter(|(name, _)| name == "response.output_text.delta")
        .map(|(_, data)| data["delta"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(text, "Sunny.");
    let completed = &events.last().unwrap().1["response"];
    assert_eq!(completed["status"], "completed");
    assert_eq!(output_text(completed), "Sunny.");
    assert_eq!(completed["usage"]["output_tokens"], "Sunny.".len());
    let item_id = &events[2].1["item"]["id"];
    assert_eq!(&completed["output"][0]["id"], item_id);

    // Streamed responses are kept too.
    let followup = question(json!({"previous_response_id": completed["id"], "input": "ok"}));
    respond(&shared, followup).await;
}

#[tokio::test]
async fn a_streamed_call_sends_its_arguments_in_pieces() {
    let (shared, _) = worker(CALL);
    let body = question(json!({"tools": [weather_tool()], "stream": true}));
    let (status, body) = post(&shared, body).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let events = events(&body);
    let added: Vec<&Value> = events
        .iter()
        .filter(|(name, _)| name == "response.output_item.added")
        .map(|(_, data)| &data["item"])
        .collect();
    assert_eq!(
        (&added[0]["type"], &added[1]["type"]),
        (&json!("message"), &json!("function_call"))
    );
    assert_eq!(
        (&added[1]["name"], &added[1]["arguments"]),
        (&json!("get_weather"), &json!(""))
    );
    let pieces: Vec<&str> = events
        .iter()
        .filter(|(name, _)| name == "response.function_call_arguments.delta")
        .map(|(_, data)| data["delta"].as_str().unwrap())
        .collect();
    assert!(
        pieces.len() > 1,
        "the arguments stream in pieces: {pieces:?}"
    );
    assert_eq!(pieces.concat(), r#"{"city": "Paris"}"#);
    let done = events
        .iter()
        .find(|(name, _)| name == "response.function_call_arguments.done")
        .map(|(_, data)| data)
        .unwrap();
    assert_eq!(done["arguments"], r#"{"city": "Paris"}"#);
    let completed = &events.last().unwrap().1["response"];
    assert_eq!(completed["output"][1]["arguments"], r#"{"city": "Paris"}"#);
}

#[tokio::test]
async fn previous_responses_are_kept_unless_store_is_false_and_evicted_oldest_first() {
    let (shared, prompts) = worker("Sunny.");
    let first = respond(&shared, question(json!({"instructions": "Be brief."}))).await;
    let next = question(json!({"previous_response_id": first["id"], "input": "Sure?"}));
    let second = respond(&shared, next).await;
    assert_eq!(
        prompts.lock().unwrap().last().unwrap(),
        "[user:Weather in Paris?][assistant:Sunny.][user:Sure?]|",
        "the conversation continues; the instructions are not carried over"
    );
    let third = question(json!({"previous_response_id": second["id"], "input": "Really?"}));
    respond(&shared, third).await;
    assert_eq!(
        prompts.lock().unwrap().last().unwrap(),
        "[user:Weather in Paris?][assistant:Sunny.][user:Sure?][assistant:Sunny.][user:Really?]|"
    );

    let unstored = respond(&shared, question(json!({"store": false}))).await;
    assert_eq!(unstored["store"], false);
    let error = refused(
        &shared,
        question(json!({"previous_response_id": unstored["id"]})),
    )
    .await;
    assert_eq!(
        (&error["code"], &error["param"]),
        (
            &json!("previous_response_not_found"),
            &json!("previous_response_id")
        )
    );
    let message = error["message"].as_str().unwrap();
    assert!(
        message.contains(unstored["id"].as_str().unwrap()),
        "{message}"
    );

    shared.responses.set_limits(StoreLimits {
        responses: 2,
        ..StoreLimits::default()
    });
    let a = respond(&shared, question(json!({}))).await;
    let b = respond(&shared, question(json!({}))).await;
    let c = respond(&shared, question(json!({}))).await;
    let error = refused(&shared, question(json!({"previous_response_id": a["id"]}))).await;
    assert_eq!(error["code"], "previous_response_not_found");
    for kept in [b, c] {
        respond(
            &shared,
            question(json!({"previous_response_id": kept["id"]})),
        )
        .await;
    }
}

#[tokio::test]
async fn what_is_not_served_is_refused_in_openais_shape() {
    let (shared, _) = worker("Sunny.");
    let hosted = question(json!({"tools": [{"type": "web_search"}]}));
    let error = refused(&shared, hosted).await;
    assert_eq!(error["param"], "tools[0].type", "{error}");
    let message = error["message"].as_str().unwrap();
    assert!(
        message.contains("web_search") && message.contains("hosted tool"),
        "{message}"
    );
    let error = refused(&shared, question(json!({"background": true}))).await;
    assert_eq!(
        (&error["param"], &error["code"]),
        (&json!("background"), &json!("invalid_request"))
    );
    let image = json!({"type": "input_image", "image_url": "https://example.invalid/a.png"});
    let input = json!([{"role": "user", "content": [image]}]);
    let error = refused(&shared, question(json!({"input": input}))).await;
    assert_eq!(error["param"], "input[0].content[0].type", "{error}");
    let error = refused(
        &shared,
        question(json!({"include": ["file_search_call.results"]})),
    )
    .await;
    assert_eq!(error["param"], "include");
    let error = refused(&shared, json!({"model": "m"})).await;
    assert_eq!(error["param"], "input");
}

/// The item `max_output_tokens` cut is `incomplete`, as OpenAI marks it, in the whole response,
/// in the stream's `output_item.done` and its `response.incomplete`; an item before it stays
/// `completed`. The real worker showed every item `completed` in an incomplete response
/// (tests/openai/responses_check.py). A conversation holding the cut item goes on.
#[tokio::test]
async fn the_item_a_cut_ends_is_incomplete() {
    let (shared, _) = worker("Sunny.");
    let cut = respond(&shared, question(json!({"max_output_tokens": 3}))).await;
    assert_eq!(
        (&cut["status"], &cut["output"][0]["status"]),
        (&json!("incomplete"), &json!("incomplete")),
        "{cut}"
    );
    let whole = respond(&shared, question(json!({}))).await;
    assert_eq!(whole["output"][0]["status"], "completed", "{whole}");

    // A message, then a call cut in its arguments (at 70 of CALL's characters, one token
    // each). Whole, the call not had whole comes back as the message's text (the parser's
    // rule); streamed, the call's item was open when the cut came.
    let (shared, _) = worker(CALL);
    let cut_call = question(json!({"tools": [weather_tool()], "max_output_tokens": 70}));
    let statuses = |items: Vec<&Value>| -> Vec<(Value, Value)> {
        let status = |item: &Value| (item["type"].clone(), item["status"].clone());
        items.into_iter().map(status).collect()
    };
    let whole = respond(&shared, cut_call.clone()).await;
    let output = whole["output"].as_array().unwrap();
    assert_eq!(
        statuses(output.iter().collect()),
        [(json!("message"), json!("incomplete"))],
        "{whole}"
    );
    let mut streamed = cut_call;
    streamed["stream"] = json!(true);
    let (status, body) = post(&shared, streamed).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let events = events(&body);
    let done = events
        .iter()
        .filter(|(name, _)| name == "response.output_item.done")
        .map(|(_, data)| &data["item"]);
    let expected = [
        (json!("message"), json!("completed")),
        (json!("function_call"), json!("incomplete")),
    ];
    assert_eq!(statuses(done.collect()), expected, "{body}");
    let (name, last) = events.last().unwrap();
    assert_eq!(name, "response.incomplete");
    let output = last["response"]["output"].as_array().unwrap();
    assert_eq!(statuses(output.iter().collect()), expected, "{body}");

    let followup = question(json!({"previous_response_id": whole["id"], "input": "ok"}));
    respond(&shared, followup).await;
}

/// A prompt over the context is refused with OpenAI's code, naming the Responses API's fields
/// (`input`, `max_output_tokens`), not chat's (`messages`, `max_tokens`): the real worker
/// showed the chat route's wording here (tests/openai/responses_check.py).
#[tokio::test]
async fn a_prompt_over_the_context_names_input_and_max_output_tokens() {
    let (shared, _) = worker("Sunny.");
    for budget in [json!({}), json!({"max_output_tokens": 8})] {
        let mut long = question(json!({"input": "a".repeat(300)}));
        long.as_object_mut()
            .unwrap()
            .extend(budget.as_object().unwrap().clone());
        let error = refused(&shared, long).await;
        assert_eq!(
            (&error["code"], &error["param"]),
            (&json!("context_length_exceeded"), &json!("input")),
            "{error}"
        );
        let message = error["message"].as_str().unwrap();
        assert!(
            message.starts_with("input: This model's maximum context length is")
                && message.ends_with("lower max_output_tokens."),
            "{message}"
        );
    }
}

#[tokio::test]
async fn a_job_that_fails_mid_stream_sends_response_failed() {
    let (mut backend, _) = scripted("Sunny.");
    backend.fail_at_step = Some(3);
    let shared = start(backend, crate::Access::default());
    let (status, body) = post(&shared, question(json!({"stream": true}))).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let events = events(&body);
    let (name, failed) = events.last().unwrap();
    assert_eq!(name, "response.failed", "{body}");
    assert_eq!(failed["response"]["status"], "failed");
    assert_eq!(failed["response"]["error"]["code"], "server_error");
    assert!(failed["response"]["error"]["message"].is_string(), "{body}");
    assert!(!events.iter().any(|(name, _)| name == "response.completed"));
    let id = failed["response"]["id"].clone();
    let error = refused(&shared, question(json!({"previous_response_id": id}))).await;
    assert_eq!(
        error["code"], "previous_response_not_found",
        "a failed response is not kept"
    );
}

#[tokio::test]
async fn a_harmony_models_reasoning_is_a_reasoning_item() {
    use super::reasoning_tests::{HARMONY_REPLY, worker};
    let shared = worker(&HARMONY_REPLY, true);
    let body = json!({"input": "abc", "max_output_tokens": 32, "temperature": 0,
        "reasoning": {"effort": "high"}});
    let response = respond(&shared, body.clone()).await;
    let output = response["output"].as_array().unwrap();
    assert_eq!(output.len(), 2, "{response}");
    assert_eq!(output[0]["type"], "reasoning");
    assert_eq!(
        output[0]["content"],
        json!([{"type": "reasoning_text", "text": "xy"}])
    );
    assert_eq!(output_text(&response), "abc");
    assert_eq!(response["reasoning"], json!({"effort": "high"}));

    let mut streamed = body;
    streamed["stream"] = json!(true);
    let (status, text) = post(&shared, streamed).await;
    assert_eq!(status, StatusCode::OK, "{text}");
    let events = events(&text);
    let reasoning: String = events
        .iter()
        .filter(|(name, _)| name == "response.reasoning_text.delta")
        .map(|(_, data)| data["delta"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(reasoning, "xy");
    let completed = &events.last().unwrap().1["response"];
    assert_eq!(completed["output"][0]["type"], "reasoning");
    assert_eq!(output_text(completed), "abc");
}
