//! The chat route over a harmony model (gpt-oss's format) in process: the scripted model writes
//! an `analysis` message and a `final` one; the reply carries them as `reasoning_content` and
//! `content`, whole and streamed. Other routes and templates keep the raw text.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;

use axum::http::StatusCode;
use serde_json::{Value, json};
use worker_common::generate::{PromptFormatter, TemplateRendering};
use worker_common::testing::{ScriptedBackend, harmony_tokenizer};

use super::tests::{send, settings, start_with_tokenizer};
use crate::state::Shared;

/// The prompt every request here renders to: its user message `abc` (3 tokens; the template
/// writes only the messages' content, the tiny vocabulary has no room for the real markup).
const PROMPT_TOKENS: usize = 3;

/// `<|channel|>analysis<|message|>xy<|end|><|start|>assistant<|channel|>final<|message|>abc`,
/// then `<|return|>` (ids of [`harmony_tokenizer`]).
pub(super) const HARMONY_REPLY: [u32; 15] = [10, 15, 11, 7, 8, 13, 12, 17, 10, 16, 11, 1, 2, 3, 0];

/// A reply that is not harmony: `zz<|channel|>` then `<|return|>`.
const PLAIN_REPLY: [u32; 4] = [9, 9, 10, 0];

/// A backend that writes `reply` after the prompt (then only `<|return|>`).
fn scripted(reply: &'static [u32]) -> ScriptedBackend {
    let script = move |h: &[u32]| {
        let at = h.len().saturating_sub(PROMPT_TOKENS);
        reply.get(at).copied().unwrap_or(0)
    };
    ScriptedBackend::new(64, 18, Arc::new(script))
}

/// A worker over the harmony vocabulary whose template has harmony's markers (`harmony`) or
/// not.
pub(super) fn worker(reply: &'static [u32], harmony: bool) -> Arc<Shared> {
    let markers = if harmony {
        "{# <|start|>assistant<|channel|>final<|message|> #}"
    } else {
        ""
    };
    let source = format!("{markers}{{% for m in messages %}}{{{{ m.content }}}}{{% endfor %}}");
    let tokenizer = harmony_tokenizer();
    let formatter =
        PromptFormatter::from_template(&source, &tokenizer, TemplateRendering::InProcess).unwrap();
    start_with_tokenizer(scripted(reply), 1, settings(1), formatter, tokenizer).0
}

fn chat(stream: bool) -> Value {
    json!({"messages": [{"role": "user", "content": "abc"}], "max_tokens": 32,
        "temperature": 0, "stream": stream})
}

/// The `data:` JSON objects of a stream (`[DONE]` left out).
fn chunks(body: &str) -> Vec<Value> {
    body.lines()
        .filter_map(|line| line.strip_prefix("data: "))
        .filter_map(|data| serde_json::from_str(data).ok())
        .collect()
}

/// The concatenated `key` of a stream's deltas, and how many chunks carried it.
fn deltas(chunks: &[Value], key: &str) -> (String, usize) {
    let texts: Vec<&str> = chunks
        .iter()
        .filter_map(|chunk| chunk["choices"][0]["delta"][key].as_str())
        .collect();
    (texts.concat(), texts.len())
}

async fn whole_message(shared: &Arc<Shared>, body: Value) -> Value {
    let (status, whole) = send(shared, "POST", "/v1/chat/completions", Some(body)).await;
    assert_eq!(status, StatusCode::OK, "{whole}");
    let whole: Value = serde_json::from_str(&whole).unwrap();
    assert_eq!(whole["choices"][0]["finish_reason"], "stop", "{whole}");
    whole["choices"][0]["message"].clone()
}

#[tokio::test]
async fn a_whole_chat_reply_splits_reasoning_from_content() {
    let shared = worker(&HARMONY_REPLY, true);
    let message = whole_message(&shared, chat(false)).await;
    assert_eq!(message["content"], "abc", "{message}");
    assert_eq!(message["reasoning_content"], "xy", "{message}");
}

#[tokio::test]
async fn a_streamed_chat_reply_sends_reasoning_deltas_then_content() {
    let shared = worker(&HARMONY_REPLY, true);
    let mut body = chat(true);
    body["logprobs"] = json!(true);
    let (status, stream) = send(&shared, "POST", "/v1/chat/completions", Some(body)).await;
    assert_eq!(status, StatusCode::OK, "{stream}");
    let chunks = chunks(&stream);
    assert_eq!(deltas(&chunks, "reasoning_content"), ("xy".into(), 2));
    // The role chunk's empty content, then one chunk per answer token.
    assert_eq!(deltas(&chunks, "content"), ("abc".into(), 4));
    for chunk in &chunks {
        let delta = &chunk["choices"][0]["delta"];
        if delta.get("reasoning_content").is_some() {
            assert!(delta.get("content").is_none(), "{chunk}");
            assert!(chunk["choices"][0]["logprobs"].is_null(), "{chunk}");
        }
    }
    // Log-probabilities ride with the content: one entry per answer token.
    let entries: usize = chunks
        .iter()
        .filter_map(|chunk| chunk["choices"][0]["logprobs"]["content"].as_array())
        .map(Vec::len)
        .sum();
    assert_eq!(entries, 3, "{stream}");
    let finish = chunks.last().unwrap();
    assert_eq!(finish["choices"][0]["finish_reason"], "stop");
}

#[tokio::test]
async fn a_reply_cut_in_its_analysis_is_all_reasoning() {
    let shared = worker(&HARMONY_REPLY, true);
    let mut body = chat(false);
    body["max_tokens"] = json!(4);
    let (status, whole) = send(&shared, "POST", "/v1/chat/completions", Some(body)).await;
    assert_eq!(status, StatusCode::OK, "{whole}");
    let whole: Value = serde_json::from_str(&whole).unwrap();
    let message = &whole["choices"][0]["message"];
    assert_eq!(
        (
            message["content"].as_str(),
            message["reasoning_content"].as_str()
        ),
        (Some(""), Some("x"))
    );
    assert_eq!(whole["choices"][0]["finish_reason"], "length");
}

#[tokio::test]
async fn text_that_is_not_harmony_stays_content() {
    let shared = worker(&PLAIN_REPLY, true);
    let message = whole_message(&shared, chat(false)).await;
    assert_eq!(message["content"], "zz<|channel|>");
    assert!(message.get("reasoning_content").is_none(), "{message}");
}

#[tokio::test]
async fn other_templates_and_completions_keep_the_raw_text() {
    let raw =
        "<|channel|>analysis<|message|>xy<|end|><|start|>assistant<|channel|>final<|message|>abc";
    let plain = worker(&HARMONY_REPLY, false);
    let message = whole_message(&plain, chat(false)).await;
    assert_eq!(message["content"], raw);
    assert!(message.get("reasoning_content").is_none(), "{message}");

    let harmony = worker(&HARMONY_REPLY, true);
    let body = json!({"prompt": "abc", "max_tokens": 32, "temperature": 0});
    let (status, whole) = send(&harmony, "POST", "/v1/completions", Some(body)).await;
    assert_eq!(status, StatusCode::OK, "{whole}");
    let whole: Value = serde_json::from_str(&whole).unwrap();
    assert_eq!(whole["choices"][0]["text"], raw);
}
