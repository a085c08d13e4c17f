//! OpenAI's routes in process over the scripted backend: the same jobs as `/execute`, in
//! OpenAI's shapes, errors included.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use axum::body::Body;
use axum::http::{Request, StatusCode};
use serde_json::{Value, json};
use worker_common::generate::{PromptFormatter, TemplateRendering};
use worker_common::testing::tiny_tokenizer;

use super::tests::{
    counting, send, send_request, settings, start_with_formatter, worker, worker_with,
};

/// The `data:` payloads of a stream: JSON objects, and `[DONE]` as a string.
fn chunks(body: &str) -> Vec<Value> {
    body.lines()
        .filter_map(|line| line.strip_prefix("data: "))
        .map(|data| serde_json::from_str(data).unwrap_or_else(|_| json!(data)))
        .collect()
}

/// A worker whose template writes each message's content, then a space as the generation
/// prompt (the tiny vocabulary has no room for real chat markup).
fn chat_worker() -> std::sync::Arc<crate::state::Shared> {
    let source = "{% for m in messages %}{{ m.content }}{% endfor %}{% if add_generation_prompt %} {% endif %}";
    let formatter =
        PromptFormatter::from_template(source, &tiny_tokenizer(), TemplateRendering::InProcess)
            .unwrap();
    start_with_formatter(counting(), 2, settings(2), formatter).0
}

#[tokio::test]
async fn models_lists_the_loaded_model() {
    let shared = worker(counting(), 1);
    let (status, body) = send(&shared, "GET", "/v1/models", None).await;
    assert_eq!(status, StatusCode::OK);
    let list: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(list["object"], "list");
    let model = &list["data"][0];
    assert_eq!(
        (model["id"].as_str(), model["object"].as_str()),
        (Some("scripted"), Some("model"))
    );
    assert_eq!(model["owned_by"], "llama-orch");
    assert_eq!(model["meta"]["context_length"], 256);
    assert_eq!(model["meta"]["chat_template"], false);
}

#[tokio::test]
async fn a_model_is_retrieved_by_its_id_and_others_are_404() {
    let shared = worker(counting(), 1);
    let (status, body) = send(&shared, "GET", "/v1/models/scripted", None).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let model: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(
        (model["id"].as_str(), model["object"].as_str()),
        (Some("scripted"), Some("model"))
    );
    assert_eq!(model["meta"]["context_length"], 256);
    let (status, body) = send(&shared, "GET", "/v1/models/org/other", None).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{body}");
    let error = &serde_json::from_str::<Value>(&body).unwrap()["error"];
    assert_eq!(error["type"], "not_found_error", "{body}");
    assert!(
        error["message"]
            .as_str()
            .unwrap()
            .contains("'org/other' does not exist"),
        "{body}"
    );
}

#[tokio::test]
async fn a_prompt_over_the_context_is_openais_context_length_exceeded() {
    let shared = worker(counting(), 1);
    // One token a character: 300 tokens in a context of 256.
    let body = json!({"model": "x", "prompt": "a".repeat(300), "max_tokens": 5});
    let (status, text) = send(&shared, "POST", "/v1/completions", Some(body)).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{text}");
    let error = &serde_json::from_str::<Value>(&text).unwrap()["error"];
    assert_eq!(error["code"], "context_length_exceeded", "{text}");
    assert_eq!(error["type"], "invalid_request_error", "{text}");
    assert_eq!(error["param"], "prompt", "{text}");
    let message = error["message"].as_str().unwrap();
    assert!(
        message.contains("This model's maximum context length is 256 tokens"),
        "{message}"
    );
    // langchain-openai's match on OpenAI's newer wording: with `openai` 3 the message is all it
    // sees (the `code` is no longer in the error's text).
    assert!(
        message.contains("Input tokens exceed the configured limit of 251 tokens"),
        "{message}"
    );
    // /execute keeps the contract's code and constraint.
    let body = json!({"job_id": "j", "prompt": "a".repeat(300), "max_tokens": 5});
    let (status, text) = send(&shared, "POST", "/execute", Some(body)).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{text}");
    let reply: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(reply["error"]["code"], "INVALID_REQUEST", "{text}");
    assert_eq!(
        reply["errors"][0]["constraint"], "context_length(251)",
        "{text}"
    );
}

#[tokio::test]
async fn a_completion_whole_and_streamed_carries_the_same_text_and_usage() {
    let shared = worker(counting(), 2);
    let body = json!({"model": "x", "prompt": "abc", "max_tokens": 5, "temperature": 0});
    let (status, whole) = send(&shared, "POST", "/v1/completions", Some(body.clone())).await;
    assert_eq!(status, StatusCode::OK, "{whole}");
    let whole: Value = serde_json::from_str(&whole).unwrap();
    assert!(whole["id"].as_str().unwrap().starts_with("cmpl-"));
    assert_eq!(whole["object"], "text_completion");
    assert_eq!(whole["model"], "scripted");
    assert_eq!(whole["choices"][0]["text"], "abcxy");
    assert_eq!(whole["choices"][0]["finish_reason"], "length");
    let usage = json!({"prompt_tokens": 3, "completion_tokens": 5, "total_tokens": 8,
        "prompt_tokens_details": {"cached_tokens": 0}});
    assert_eq!(whole["usage"], usage);

    let mut streamed = body;
    streamed["stream"] = json!(true);
    streamed["stream_options"] = json!({"include_usage": true});
    let (status, stream) = send(&shared, "POST", "/v1/completions", Some(streamed)).await;
    assert_eq!(status, StatusCode::OK);
    let chunks = chunks(&stream);
    assert_eq!(chunks.last().unwrap(), "[DONE]");
    let text: String = chunks
        .iter()
        .filter_map(|chunk| chunk["choices"][0]["text"].as_str())
        .collect();
    assert_eq!(text, "abcxy");
    let finish = &chunks[chunks.len() - 3];
    assert_eq!(finish["choices"][0]["finish_reason"], "length");
    let last = &chunks[chunks.len() - 2];
    assert_eq!((&last["choices"], &last["usage"]), (&json!([]), &usage));
}

#[tokio::test]
async fn n_choices_are_jobs_of_their_own_whole_and_streamed() {
    let shared = worker(counting(), 4);
    let body = json!({"model": "x", "prompt": "abc", "max_tokens": 5, "temperature": 0, "n": 3});
    let (status, whole) = send(&shared, "POST", "/v1/completions", Some(body.clone())).await;
    assert_eq!(status, StatusCode::OK, "{whole}");
    let whole: Value = serde_json::from_str(&whole).unwrap();
    let choices = whole["choices"].as_array().unwrap();
    let indices: Vec<u64> = choices
        .iter()
        .map(|c| c["index"].as_u64().unwrap())
        .collect();
    assert_eq!(indices, [0, 1, 2]);
    assert!(choices.iter().all(|c| c["text"] == "abcxy"), "{whole}");
    // The prompt is counted once, the generated tokens of every choice.
    let usage = json!({"prompt_tokens": 3, "completion_tokens": 15, "total_tokens": 18,
        "prompt_tokens_details": {"cached_tokens": 0}});
    assert_eq!(whole["usage"], usage);

    let mut streamed = body;
    streamed["stream"] = json!(true);
    streamed["stream_options"] = json!({"include_usage": true});
    let (status, stream) = send(&shared, "POST", "/v1/completions", Some(streamed)).await;
    assert_eq!(status, StatusCode::OK);
    let chunks = chunks(&stream);
    assert_eq!(chunks.last().unwrap(), "[DONE]");
    assert_eq!(chunks.iter().filter(|c| *c == "[DONE]").count(), 1);
    for index in 0..3 {
        let mine = |c: &&Value| c["choices"][0]["index"] == index;
        let text: String = chunks
            .iter()
            .filter(mine)
            .filter_map(|c| c["choices"][0]["text"].as_str())
            .collect();
        assert_eq!(text, "abcxy", "choice {index}: {stream}");
        let finishes = chunks
            .iter()
            .filter(mine)
            .filter(|c| !c["choices"][0]["finish_reason"].is_null());
        assert_eq!(finishes.count(), 1, "choice {index}");
    }
    let usages: Vec<&Value> = chunks.iter().filter(|c| !c["usage"].is_null()).collect();
    assert_eq!(usages.len(), 1);
    assert_eq!(usages[0]["usage"], usage);
    assert_eq!(&chunks[chunks.len() - 2], usages[0]);
}

#[tokio::test]
async fn each_streamed_chat_choice_opens_with_its_role() {
    let shared = chat_worker();
    let body = json!({"messages": [{"role": "user", "content": "ab"}], "max_tokens": 3,
        "temperature": 0, "n": 2, "stream": true});
    let (status, stream) = send(&shared, "POST", "/v1/chat/completions", Some(body)).await;
    assert_eq!(status, StatusCode::OK, "{stream}");
    let chunks = chunks(&stream);
    let roles: Vec<&Value> = chunks
        .iter()
        .filter(|c| c["choices"][0]["delta"]["role"] == "assistant")
        .map(|c| &c["choices"][0]["index"])
        .collect();
    assert_eq!(roles, [&json!(0), &json!(1)], "{stream}");
}

#[test]
fn a_seeded_requests_choices_take_the_seed_advanced_by_their_index() {
    use crate::api::Limits;
    use crate::api::openai::{Endpoint, OpenAiRequest};
    let job = |body: Value| {
        let body = body.to_string();
        let limits = Limits { max_tokens_out: 64 };
        OpenAiRequest::parse(
            Endpoint::Completions,
            Some("application/json"),
            body.as_bytes(),
            limits,
        )
        .unwrap()
        .job
    };
    let seeded = job(json!({"prompt": "a", "seed": u64::MAX - 1, "n": 3}));
    let seeds: Vec<Option<u64>> = (0..3)
        .map(|i| super::openai::choice_job(&seeded, i).seed)
        .collect();
    assert_eq!(seeds, [Some(u64::MAX - 1), Some(u64::MAX), Some(0)]);
    let unseeded = job(json!({"prompt": "a", "n": 3}));
    assert_eq!(super::openai::choice_job(&unseeded, 2).seed, None);
}

#[tokio::test]
async fn a_chat_renders_its_messages_with_the_template() {
    let shared = chat_worker();
    let body = json!({"messages": [{"role": "system", "content": "ab"}, {"role": "user", "content": "c"}],
        "max_completion_tokens": 3, "temperature": 0});
    let (status, whole) = send(&shared, "POST", "/v1/chat/completions", Some(body.clone())).await;
    assert_eq!(status, StatusCode::OK, "{whole}");
    let whole: Value = serde_json::from_str(&whole).unwrap();
    assert!(whole["id"].as_str().unwrap().starts_with("chatcmpl-"));
    assert_eq!(whole["object"], "chat.completion");
    assert_eq!(whole["usage"]["prompt_tokens"], 4, "\"abc \": 4 tokens");
    let message = &whole["choices"][0]["message"];
    assert_eq!(
        (message["role"].as_str(), message["content"].as_str()),
        (Some("assistant"), Some("bcx"))
    );

    let mut streamed = body;
    streamed["stream"] = json!(true);
    let (_, stream) = send(&shared, "POST", "/v1/chat/completions", Some(streamed)).await;
    let chunks = chunks(&stream);
    assert_eq!(chunks[0]["object"], "chat.completion.chunk");
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    let text: String = chunks
        .iter()
        .filter_map(|chunk| chunk["choices"][0]["delta"]["content"].as_str())
        .collect();
    assert_eq!(text, "bcx");
    let finish = &chunks[chunks.len() - 2];
    assert_eq!(finish["choices"][0]["finish_reason"], "length");
    assert!(finish.get("usage").is_none(), "no usage unless asked");
    assert_eq!(chunks.last().unwrap(), "[DONE]");
}

#[tokio::test]
async fn without_max_tokens_a_job_fills_the_context() {
    let shared = worker(counting(), 1);
    let body = json!({"prompt": "abc", "temperature": 0});
    let (status, whole) = send(&shared, "POST", "/v1/completions", Some(body)).await;
    assert_eq!(status, StatusCode::OK, "{whole}");
    let whole: Value = serde_json::from_str(&whole).unwrap();
    assert_eq!(whole["usage"]["completion_tokens"], 256 - 3);
    assert_eq!(whole["choices"][0]["finish_reason"], "length");
}

/// The `error` object of an OpenAI error body.
fn openai_error(body: &str) -> Value {
    let value: Value = serde_json::from_str(body).unwrap();
    value["error"].clone()
}

#[tokio::test]
async fn errors_on_v1_paths_come_in_openai_shape() {
    let shared = worker(counting(), 1);
    let chat = json!({"messages": [{"role": "user", "content": "hi"}]});
    let (status, body) = send(&shared, "POST", "/v1/chat/completions", Some(chat)).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    let error = openai_error(&body);
    assert_eq!(error["type"], "invalid_request_error");
    assert_eq!(
        (error["param"].as_str(), error["code"].as_str()),
        (Some("messages"), Some("invalid_request"))
    );
    assert!(
        error["message"]
            .as_str()
            .unwrap()
            .contains("no chat template"),
        "{error}"
    );

    let unsupported = json!({"prompt": "a", "tools": [{"type": "function"}]});
    let (status, body) = send(&shared, "POST", "/v1/completions", Some(unsupported)).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(openai_error(&body)["param"], "tools");
    let outside = json!({"prompt": "a", "logit_bias": {"12": 5}});
    let (status, body) = send(&shared, "POST", "/v1/completions", Some(outside)).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    let error = openai_error(&body);
    assert_eq!(error["param"], "logit_bias.12", "{error}");

    let (status, body) = send(&shared, "GET", "/v1/nothing", None).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_eq!(openai_error(&body)["type"], "not_found_error");
    let (status, body) = send(&shared, "POST", "/v1/models", Some(json!({}))).await;
    assert_eq!(status, StatusCode::METHOD_NOT_ALLOWED);
    assert_eq!(openai_error(&body)["code"], "invalid_request");
    let (status, body) = send(&shared, "GET", "/nothing", None).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert!(
        body.contains("\"errors\""),
        "the contract's shape elsewhere: {body}"
    );
}

#[tokio::test]
async fn the_api_key_guards_v1_too() {
    let key: crate::ApiKey = "k3y".parse().unwrap();
    let access = crate::Access::new(Some(key), [127, 0, 0, 1].into(), None);
    let shared = worker_with(counting(), 1, access);
    let (status, body) = send(&shared, "GET", "/v1/models", None).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert_eq!(openai_error(&body)["type"], "authentication_error");
    let keyed = Request::get("/v1/models")
        .header("authorization", "Bearer k3y")
        .body(Body::empty())
        .unwrap();
    assert_eq!(send_request(&shared, keyed).await.0, StatusCode::OK);
}

#[tokio::test]
async fn logprobs_come_with_each_token_in_both_shapes() {
    let shared = chat_worker();
    let body = json!({"prompt": "abc", "max_tokens": 3, "temperature": 0, "logprobs": 2});
    let (status, whole) = send(&shared, "POST", "/v1/completions", Some(body)).await;
    assert_eq!(status, StatusCode::OK, "{whole}");
    let whole: Value = serde_json::from_str(&whole).unwrap();
    let logprobs = &whole["choices"][0]["logprobs"];
    assert_eq!(logprobs["tokens"], json!(["a", "b", "c"]));
    assert_eq!(logprobs["text_offset"], json!([0, 1, 2]));
    // The scripted backend's logits make its token certain: log-probability 0.
    assert_eq!(logprobs["token_logprobs"][0], 0.0);
    assert_eq!(logprobs["top_logprobs"][0].as_object().unwrap().len(), 2);

    let chat = json!({"messages": [{"role": "user", "content": "abc"}], "max_tokens": 2,
        "temperature": 0, "logprobs": true, "top_logprobs": 1, "stream": true});
    let (_, stream) = send(&shared, "POST", "/v1/chat/completions", Some(chat)).await;
    let content: Vec<Value> = chunks(&stream)
        .iter()
        .filter_map(|chunk| {
            chunk["choices"][0]["logprobs"]["content"]
                .as_array()
                .cloned()
        })
        .flatten()
        .collect();
    assert_eq!(content.len(), 2, "{stream}");
    assert_eq!(content[0]["top_logprobs"].as_array().unwrap().len(), 1);
    assert_eq!(content[0]["token"], content[0]["top_logprobs"][0]["token"]);
}

#[tokio::test]
async fn a_grammar_overrules_what_the_model_prefers() {
    let shared = worker(counting(), 1);
    let body = json!({"job_id": "g", "prompt": "abc", "raw": true, "max_tokens": 3, "temperature": 0,
        "grammar": {"type": "regex", "pattern": "z{3}"}});
    let (status, stream) = send(&shared, "POST", "/execute", Some(body)).await;
    assert_eq!(status, StatusCode::OK, "{stream}");
    let text: String = stream
        .lines()
        .filter_map(|line| line.strip_prefix("data: "))
        .map(|data| serde_json::from_str::<Value>(data).unwrap())
        .filter(|event| event["type"] == "token")
        .map(|event| event["t"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(text, "zzz", "the model wanted a, b, c");

    let done = json!({"prompt": "abc", "max_tokens": 5, "temperature": 0,
        "response_format": {"type": "json_schema", "json_schema": {"name": "n", "schema": {"type": "nope"}}}});
    let (status, body) = send(&shared, "POST", "/v1/completions", Some(done)).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    let error = openai_error(&body);
    assert_eq!(error["param"], "response_format", "{error}");
    assert!(
        error["message"]
            .as_str()
            .unwrap()
            .contains("does not compile"),
        "{error}"
    );
    let eos =
        json!({"prompt": "abc", "ignore_eos": true, "response_format": {"type": "json_object"}});
    let (status, body) = send(&shared, "POST", "/v1/completions", Some(eos)).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(openai_error(&body)["param"], "ignore_eos");
}

#[tokio::test]
async fn grammars_that_cannot_produce_any_output_are_refused_before_the_queue() {
    let shared = chat_worker();
    // A rule with no way to end, and a pattern nothing matches: 400, not a job that ends INTERNAL.
    for grammar in [
        json!({"type": "lark", "grammar": "start: a\na: \"x\" a"}),
        json!({"type": "regex", "pattern": "[^\\s\\S]"}),
    ] {
        let body = json!({"job_id": "g", "prompt": "abc", "raw": true, "max_tokens": 3,
            "grammar": grammar});
        let (status, body) = send(&shared, "POST", "/execute", Some(body)).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
        let value: Value = serde_json::from_str(&body).unwrap();
        assert_eq!(value["error"]["code"], "INVALID_REQUEST", "{body}");
        let field = &value["errors"][0];
        assert_eq!(
            (&field["field"], &field["constraint"]),
            (&json!("grammar"), &json!("grammar"))
        );
        let message = field["message"].as_str().unwrap();
        assert!(message.contains("cannot produce any output"), "{message}");
        assert!(
            !message.contains('\n') && !message.contains("<state>"),
            "{message}"
        );
    }

    let chat = json!({"messages": [{"role": "user", "content": "abc"}], "max_tokens": 3,
        "response_format": {"type": "json_schema", "json_schema": {"name": "n", "schema": {"$ref": "#"}}}});
    let (status, body) = send(&shared, "POST", "/v1/chat/completions", Some(chat)).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    let error = openai_error(&body);
    assert_eq!(error["type"], "invalid_request_error", "{error}");
    assert_eq!(error["param"], "response_format", "{error}");
    let message = error["message"].as_str().unwrap();
    assert!(message.contains("cannot produce any output"), "{message}");
    assert!(
        !message.contains('\n') && !message.contains("<state>"),
        "{message}"
    );
    assert_eq!(shared.queue.len(), 0, "nothing was queued");
}

#[tokio::test]
async fn grammars_over_the_compile_budget_are_refused_naming_their_field() {
    use worker_common::testing::{ScriptedBackend, ascii_tokenizer};
    // The ASCII vocabulary writes JSON and tool-call markup; the template's comment holds
    // `<tool_call>`, so tools are taken in the Hermes format.
    let template = "{# <tool_call> #}{% for m in messages %}{{ m.content }}{% endfor %}|";
    let tokenizer = ascii_tokenizer();
    let formatter =
        PromptFormatter::from_template(template, &tokenizer, TemplateRendering::InProcess).unwrap();
    // A model that would end at once: the grammar picks what it writes.
    let ends = |_: &[u32]| 0;
    let backend = ScriptedBackend::new(64, tokenizer.vocab().len(), std::sync::Arc::new(ends));
    let shared =
        super::tests::start_with_tokenizer(backend, 1, settings(1), formatter, tokenizer).0;
    let costly = worker_common::testing::schemas::optional_properties(600);
    let tool = json!({"type": "function", "function": {"name": "t", "parameters": costly}});
    let forced = json!({"messages": [{"role": "user", "content": "a"}], "max_tokens": 3,
        "tools": [tool], "tool_choice": {"type": "function", "function": {"name": "t"}}});
    let format = json!({"messages": [{"role": "user", "content": "a"}], "max_tokens": 3,
        "response_format": {"type": "json_schema", "json_schema": {"name": "n", "schema": costly}}});
    // Twice each: the second refusal comes from the compiled-grammar cache, the same.
    for (body, param) in [(&forced, "tool_choice"), (&format, "response_format")] {
        for _ in 0..2 {
            let (status, reply) =
                send(&shared, "POST", "/v1/chat/completions", Some(body.clone())).await;
            assert_eq!(status, StatusCode::BAD_REQUEST, "{reply}");
            let error = openai_error(&reply);
            assert_eq!(error["type"], "invalid_request_error", "{error}");
            assert_eq!(error["param"], param, "{error}");
            let message = error["message"].as_str().unwrap();
            assert!(message.contains("over this worker's budget"), "{message}");
            assert!(!message.contains('\n'), "{message}");
        }
    }
    let execute = json!({"job_id": "g", "prompt": "abc", "raw": true, "max_tokens": 3,
        "grammar": {"type": "json_schema", "schema": costly}});
    let (status, reply) = send(&shared, "POST", "/execute", Some(execute)).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{reply}");
    let value: Value = serde_json::from_str(&reply).unwrap();
    assert_eq!(value["error"]["code"], "INVALID_REQUEST", "{reply}");
    let field = &value["errors"][0];
    assert_eq!(
        (&field["field"], &field["constraint"]),
        (&json!("grammar"), &json!("grammar_budget")),
        "{reply}"
    );
    assert_eq!(shared.queue.len(), 0, "nothing was queued");

    // An ordinary tool's forced call is taken.
    let weather = json!({"type": "object", "properties": {"city": {"type": "string"}},
        "required": ["city"]});
    let tool = json!({"type": "function", "function": {"name": "w", "parameters": weather}});
    let ordinary = json!({"messages": [{"role": "user", "content": "a"}], "max_tokens": 3,
        "tools": [tool], "tool_choice": "required"});
    let (status, reply) = send(&shared, "POST", "/v1/chat/completions", Some(ordinary)).await;
    assert_eq!(status, StatusCode::OK, "{reply}");
}
