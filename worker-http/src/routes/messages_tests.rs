//! Anthropic's Messages route in process over the scripted backend: whole and streamed
//! replies, a tool round trip, `x-api-key`, and errors in Anthropic's shape.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::{Arc, Mutex};

use axum::body::Body;
use axum::http::{Request, StatusCode};
use serde_json::{Value, json};
use worker_common::generate::{PromptFormatter, TemplateRendering};
use worker_common::testing::{ScriptedBackend, ascii_tokenizer};
use worker_common::tokenizer::Tokenizer;

use super::tests::{counting, send, send_request, settings, start_with_tokenizer, worker_with};
use crate::state::Shared;

/// A template that writes each message as `[role:content<tool_calls as JSON>#<tool_call_id>]`,
/// `T` when tools are offered, and `|` as the generation prompt; its comment holds
/// `<tool_call>`, so calls are read in the Hermes format.
pub(super) const TEMPLATE: &str = "{# <tool_call> #}{% for m in messages %}[{{ m.role }}:{{ m.content }}\
{% if m.tool_calls %}{{ m.tool_calls | tojson }}{% endif %}\
{% if m.tool_call_id %}#{{ m.tool_call_id }}{% endif %}]{% endfor %}\
{% if tools %}T{% endif %}{% if add_generation_prompt %}|{% endif %}";

/// The model's call: Hermes-style, as Qwen writes it.
pub(super) const CALL: &str = "Let me check.<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>";

/// The model's answer once the prompt holds a tool's result.
pub(super) const ANSWER: &str = "It is 18 C.";

/// The prompts the scripted model saw, rendered back to text.
pub(super) type Prompts = Arc<Mutex<Vec<String>>>;

/// A model over the ASCII vocabulary that writes `reply` after the generation prompt, or
/// [`ANSWER`] when the prompt holds a tool result (`#`); then the end of generation.
pub(super) fn scripted(reply: &'static str) -> (ScriptedBackend, Prompts) {
    let tokenizer = ascii_tokenizer();
    let ids = |text: &str| tokenizer.encode(text, false, false).unwrap();
    let (bar, hash) = (ids("|")[0], ids("#")[0]);
    let (reply, answer) = (ids(reply), ids(ANSWER));
    let prompts = Prompts::default();
    let seen = prompts.clone();
    let decoder: Tokenizer = ascii_tokenizer();
    let script = move |h: &[u32]| {
        let start = h.iter().rposition(|&id| id == bar).map_or(0, |at| at + 1);
        let (prompt, written) = h.split_at(start);
        if written.is_empty() {
            seen.lock().unwrap().push(decoder.decode(prompt));
        }
        let text = if prompt.contains(&hash) {
            &answer
        } else {
            &reply
        };
        text.get(written.len()).copied().unwrap_or(0)
    };
    let backend = ScriptedBackend::new(64, tokenizer.vocab().len(), Arc::new(script));
    (backend, prompts)
}

/// A worker over `backend` with [`TEMPLATE`] and `access`.
pub(super) fn start(backend: ScriptedBackend, access: crate::Access) -> Arc<Shared> {
    let tokenizer = ascii_tokenizer();
    let formatter =
        PromptFormatter::from_template(TEMPLATE, &tokenizer, TemplateRendering::InProcess).unwrap();
    let settings = crate::state::Settings {
        access,
        ..settings(1)
    };
    start_with_tokenizer(backend, 1, settings, formatter, tokenizer).0
}

/// A worker whose model writes `reply` ([`scripted`]), and the prompts it saw.
fn worker(reply: &'static str, access: crate::Access) -> (Arc<Shared>, Prompts) {
    let (backend, prompts) = scripted(reply);
    (start(backend, access), prompts)
}

fn open_worker(reply: &'static str) -> (Arc<Shared>, Prompts) {
    worker(reply, crate::Access::default())
}

/// Anthropic's SSE events: `(event name, data)`, every `event:` line followed by its `data:`.
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
    json!({"name": "get_weather", "description": "Weather in a city.",
        "input_schema": {"type": "object", "properties": {"city": {"type": "string"}},
            "required": ["city"]}})
}

fn question(extra: Value) -> Value {
    let mut body = json!({"model": "any", "max_tokens": 100, "temperature": 0,
        "messages": [{"role": "user", "content": "Weather in Paris?"}]});
    for (key, value) in extra.as_object().unwrap() {
        body[key] = value.clone();
    }
    body
}

async fn post(shared: &Arc<Shared>, body: Value) -> (StatusCode, String) {
    send(shared, "POST", "/v1/messages", Some(body)).await
}

fn parsed(text: &str) -> Value {
    serde_json::from_str(text).unwrap_or_else(|err| panic!("{err}: {text}"))
}

#[tokio::test]
async fn a_whole_message_carries_the_text_stop_reason_and_usage() {
    let (shared, prompts) = open_worker("Sunny.");
    let body = question(json!({"system": [{"type": "text", "text": "Be brief."}]}));
    let (status, text) = post(&shared, body).await;
    assert_eq!(status, StatusCode::OK, "{text}");
    let message = parsed(&text);
    assert!(
        message["id"].as_str().unwrap().starts_with("msg_"),
        "{text}"
    );
    assert_eq!(
        (&message["type"], &message["role"], &message["model"]),
        (&json!("message"), &json!("assistant"), &json!("scripted"))
    );
    assert_eq!(
        message["content"],
        json!([{"type": "text", "text": "Sunny."}])
    );
    assert_eq!(
        (&message["stop_reason"], &message["stop_sequence"]),
        (&json!("end_turn"), &Value::Null)
    );
    let prompt = "[system:Be brief.][user:Weather in Paris?]|";
    assert_eq!(prompts.lock().unwrap().as_slice(), [prompt]);
    let usage = &message["usage"];
    assert_eq!(usage["input_tokens"], prompt.len(), "one token a character");
    assert_eq!(usage["output_tokens"], "Sunny.".len());

    let (_, text) = post(&shared, question(json!({"max_tokens": 3}))).await;
    let cut = parsed(&text);
    assert_eq!(
        (&cut["stop_reason"], &cut["content"][0]["text"]),
        (&json!("max_tokens"), &json!("Sun"))
    );
    let (_, text) = post(&shared, question(json!({"stop_sequences": ["ny"]}))).await;
    let stopped = parsed(&text);
    assert_eq!(
        (&stopped["stop_reason"], &stopped["stop_sequence"]),
        (&json!("stop_sequence"), &json!("ny"))
    );
    assert_eq!(stopped["content"][0]["text"], "Sun");
}

#[tokio::test]
async fn a_streamed_message_sends_anthropics_events_in_order() {
    let (shared, _) = open_worker("Sunny.");
    let (status, body) = post(&shared, question(json!({"stream": true}))).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let events = events(&body);
    let names: Vec<&str> = events.iter().map(|(name, _)| name.as_str()).collect();
    assert_eq!(
        names[..3],
        ["message_start", "ping", "content_block_start"],
        "{body}"
    );
    assert_eq!(
        names[names.len() - 3..],
        ["content_block_stop", "message_delta", "message_stop"]
    );
    let start = &events[0].1["message"];
    assert!(start["id"].as_str().unwrap().starts_with("msg_"));
    assert_eq!(
        (&start["content"], &start["stop_reason"]),
        (&json!([]), &Value::Null)
    );
    assert_eq!(
        events[2].1["content_block"],
        json!({"type": "text", "text": ""})
    );
    let text: String = events
        .iter()
        .filter(|(name, _)| name == "content_block_delta")
        .map(|(_, data)| data["delta"]["text"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(text, "Sunny.");
    let delta = &events[events.len() - 2].1;
    assert_eq!(delta["delta"]["stop_reason"], "end_turn");
    assert_eq!(delta["usage"]["output_tokens"], "Sunny.".len());
}

#[tokio::test]
async fn a_tool_round_trip_uses_tool_use_and_tool_result_blocks() {
    let (shared, prompts) = open_worker(CALL);
    let tools = json!({"tools": [weather_tool()]});
    let (status, text) = post(&shared, question(tools.clone())).await;
    assert_eq!(status, StatusCode::OK, "{text}");
    let message = parsed(&text);
    assert_eq!(message["stop_reason"], "tool_use", "{text}");
    let content = message["content"].as_array().unwrap();
    assert_eq!(content[0], json!({"type": "text", "text": "Let me check."}));
    let call = &content[1];
    assert_eq!(
        (&call["type"], &call["name"], &call["input"]),
        (
            &json!("tool_use"),
            &json!("get_weather"),
            &json!({"city": "Paris"})
        )
    );
    let id = call["id"].as_str().unwrap();
    assert!(id.starts_with("toolu_") && id.len() == 30, "{id}");

    let mut followup = question(tools);
    followup["max_tokens"] = json!(20);
    followup["messages"] = json!([
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": message["content"]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": id, "content": "18 C"}]},
    ]);
    let (status, text) = post(&shared, followup).await;
    assert_eq!(status, StatusCode::OK, "{text}");
    let answer = parsed(&text);
    assert_eq!(answer["content"], json!([{"type": "text", "text": ANSWER}]));
    assert_eq!(answer["stop_reason"], "end_turn");
    let rendered = prompts.lock().unwrap().last().cloned().unwrap();
    let calls = format!(
        r#"[{{"id": "{id}", "type": "function", "function": {{"name": "get_weather", "arguments": {{"city": "Paris"}}}}}}]"#
    );
    assert_eq!(
        rendered,
        format!("[user:Weather in Paris?][assistant:Let me check.{calls}][tool:18 C#{id}]T|")
    );
}

#[tokio::test]
async fn a_streamed_call_sends_a_tool_use_block_and_its_input_in_pieces() {
    let (shared, _) = open_worker(CALL);
    let body = question(json!({"tools": [weather_tool()], "stream": true}));
    let (status, body) = post(&shared, body).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let events = events(&body);
    let starts: Vec<&Value> = events
        .iter()
        .filter(|(name, _)| name == "content_block_start")
        .map(|(_, data)| &data["content_block"])
        .collect();
    assert_eq!(starts[0]["type"], "text");
    assert_eq!(
        (&starts[1]["type"], &starts[1]["name"], &starts[1]["input"]),
        (&json!("tool_use"), &json!("get_weather"), &json!({}))
    );
    let pieces: Vec<&str> = events
        .iter()
        .filter(|(_, data)| data["delta"]["type"] == "input_json_delta")
        .map(|(_, data)| data["delta"]["partial_json"].as_str().unwrap())
        .collect();
    assert!(pieces.len() > 1, "the input streams in pieces: {pieces:?}");
    assert_eq!(pieces.concat(), r#"{"city": "Paris"}"#);
    let delta = &events[events.len() - 2].1;
    assert_eq!(delta["delta"]["stop_reason"], "tool_use");
}

#[tokio::test]
async fn a_forced_call_follows_the_grammar() {
    // The model wants to write text; tool_choice `tool` makes it call get_weather anyway (a
    // schema with one answer: where the grammar overrules it, the scripted model has no
    // preference among the allowed tokens).
    let (shared, _) = open_worker("Sunny.");
    let paris = json!({"name": "get_weather", "input_schema": {"type": "object",
        "properties": {"city": {"enum": ["Paris"]}}, "required": ["city"],
        "additionalProperties": false}});
    let body = question(json!({"tools": [paris],
        "tool_choice": {"type": "tool", "name": "get_weather"}}));
    let (status, text) = post(&shared, body).await;
    assert_eq!(status, StatusCode::OK, "{text}");
    let message = parsed(&text);
    assert_eq!(message["stop_reason"], "tool_use", "{text}");
    let call = &message["content"][0];
    assert_eq!(
        (&call["type"], &call["name"]),
        (&json!("tool_use"), &json!("get_weather"))
    );
    assert_eq!(call["input"], json!({"city": "Paris"}), "{text}");
}

#[tokio::test]
async fn x_api_key_is_accepted_and_errors_are_anthropics() {
    let key: crate::ApiKey = "k3y".parse().unwrap();
    let access = crate::Access::new(Some(key), [127, 0, 0, 1].into(), None);
    let (shared, _) = worker("Sunny.", access);
    let (status, text) = post(&shared, question(json!({}))).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    let error = parsed(&text);
    assert_eq!(error["type"], "error", "{text}");
    assert_eq!(error["error"]["type"], "authentication_error", "{text}");
    assert!(error["request_id"].is_string(), "{text}");
    let keyed = |name: &str, value: &str| {
        Request::post("/v1/messages")
            .header("content-type", "application/json")
            .header(name, value)
            .body(Body::from(question(json!({})).to_string()))
            .unwrap()
    };
    let (status, text) = send_request(&shared, keyed("x-api-key", "k3y")).await;
    assert_eq!(status, StatusCode::OK, "{text}");
    assert_eq!(parsed(&text)["content"][0]["text"], "Sunny.");
    let (status, _) = send_request(&shared, keyed("authorization", "Bearer k3y")).await;
    assert_eq!(status, StatusCode::OK);
    let (status, _) = send_request(&shared, keyed("x-api-key", "wrong")).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
}

#[tokio::test]
async fn invalid_requests_and_long_prompts_are_invalid_request_errors() {
    let (shared, _) = open_worker("Sunny.");
    let image =
        json!({"type": "image", "source": {"type": "url", "url": "https://example.invalid/a.png"}});
    let body = question(json!({"messages": [{"role": "user", "content": [image]}]}));
    let (status, text) = post(&shared, body).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{text}");
    let error = &parsed(&text)["error"];
    assert_eq!(error["type"], "invalid_request_error", "{text}");
    let message = error["message"].as_str().unwrap();
    assert!(
        message.contains("messages[0].content[0].type") && message.contains("image"),
        "{message}"
    );
    let (status, text) = post(&shared, json!({"model": "m", "messages": []})).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{text}");
    assert_eq!(parsed(&text)["error"]["type"], "invalid_request_error");

    // One token a character: 300 in a context of 256.
    let long = question(json!({"messages": [{"role": "user", "content": "a".repeat(300)}]}));
    let (status, text) = post(&shared, long).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{text}");
    let error = &parsed(&text)["error"];
    assert_eq!(error["type"], "invalid_request_error", "{text}");
    let message = error["message"].as_str().unwrap();
    assert!(
        message.starts_with("prompt is too long: 308 tokens > 256 maximum"),
        "{message}"
    );
    let room = question(json!({"max_tokens": 250}));
    let (status, text) = post(&shared, room).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{text}");
    let message = parsed(&text)["error"]["message"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(
        message.starts_with("prompt is too long: 25 tokens > 6 maximum"),
        "{message}"
    );

    let (status, text) = send(&shared, "GET", "/v1/messages", None).await;
    assert_eq!(status, StatusCode::METHOD_NOT_ALLOWED, "{text}");
    assert_eq!(parsed(&text)["type"], "error");
    let (status, text) = send(&shared, "POST", "/v1/messages/batches", Some(json!({}))).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{text}");
    assert_eq!(parsed(&text)["error"]["type"], "not_found_error");
}

#[tokio::test]
async fn a_model_without_tools_in_its_template_refuses_them() {
    let shared = worker_with(counting(), 1, crate::Access::default());
    let (status, text) = post(&shared, question(json!({"tools": [weather_tool()]}))).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{text}");
    let message = parsed(&text)["error"]["message"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(message.contains("does not render tools"), "{message}");
}

#[tokio::test]
async fn a_job_that_fails_mid_stream_sends_an_error_event() {
    let (mut backend, _) = scripted("Sunny.");
    backend.fail_at_step = Some(3);
    let shared = start(backend, crate::Access::default());
    let (status, body) = post(&shared, question(json!({"stream": true}))).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let events = events(&body);
    let (name, error) = events.last().unwrap();
    assert_eq!(name, "error", "{body}");
    assert_eq!(error["error"]["type"], "api_error", "{body}");
    assert!(error["request_id"].is_string(), "{body}");
    assert!(
        !events.iter().any(|(name, _)| name == "message_stop"),
        "{body}"
    );
}

#[tokio::test]
async fn count_tokens_counts_the_prompt_a_message_would_have() {
    let (shared, _) = open_worker("Sunny.");
    let count = |body: Value| {
        let shared = shared.clone();
        async move { send(&shared, "POST", "/v1/messages/count_tokens", Some(body)).await }
    };
    let plain =
        json!({"model": "m", "messages": [{"role": "user", "content": "Weather in Paris?"}]});
    let (status, text) = count(plain.clone()).await;
    assert_eq!(status, StatusCode::OK, "{text}");
    let expected = "[user:Weather in Paris?]|".len();
    assert_eq!(parsed(&text), json!({"input_tokens": expected}));
    let mut with_tools = plain;
    with_tools["tools"] = json!([weather_tool()]);
    let (_, text) = count(with_tools).await;
    assert_eq!(
        parsed(&text)["input_tokens"],
        expected + 1,
        "the template's T"
    );
    let (status, text) = count(json!({"model": "m"})).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{text}");
    assert_eq!(parsed(&text)["error"]["type"], "invalid_request_error");
}

#[tokio::test]
async fn models_answer_in_both_apis_shapes() {
    let (shared, _) = open_worker("Sunny.");
    let (status, text) = send(&shared, "GET", "/v1/models", None).await;
    assert_eq!(status, StatusCode::OK, "{text}");
    let list = parsed(&text);
    assert_eq!(
        (&list["has_more"], &list["first_id"], &list["last_id"]),
        (&json!(false), &json!("scripted"), &json!("scripted"))
    );
    let model = &list["data"][0];
    assert_eq!(
        (&model["object"], &model["type"], &model["display_name"]),
        (&json!("model"), &json!("model"), &json!("scripted"))
    );
    let created_at = model["created_at"].as_str().unwrap();
    assert!(
        created_at.len() == 24 && created_at.ends_with('Z'),
        "{created_at}"
    );
    assert_eq!(model["max_input_tokens"], 256);
}

#[tokio::test]
async fn a_final_assistant_message_is_continued() {
    // The prefill ends with `|`, where the scripted model starts writing.
    let (shared, prompts) = open_worker("Sunny.");
    let body = question(json!({"messages": [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": "It is|"},
    ]}));
    let (status, text) = post(&shared, body).await;
    assert_eq!(status, StatusCode::OK, "{text}");
    assert_eq!(
        prompts.lock().unwrap().last().map(String::as_str),
        Some("[user:Weather in Paris?][assistant:It is|"),
        "rendered without the turn's end or a generation prompt"
    );
    let message = parsed(&text);
    assert_eq!(
        message["content"],
        json!([{"type": "text", "text": "Sunny."}]),
        "only the continuation"
    );
}
