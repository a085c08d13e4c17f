//! The response object of `/v1/responses` and its output items: `message` (with one
//! `output_text` part), `function_call` and (a harmony model's) `reasoning`.

use serde_json::{Map, Value, json};
use worker_common::generate::{Finished, StopReason};

use crate::api::openai::ToolCall;

/// What the response object and every event of one response repeat.
#[derive(Debug, Clone)]
pub struct ResponseHead {
    /// `resp_…`: the job id (so `/cancel/{id}` reaches it too).
    pub id: String,
    /// Unix seconds of acceptance.
    pub created_at: u64,
    /// The loaded model's id.
    pub model: String,
    /// The request's fields the object repeats ([`super::ResponsesRequest::echo`]).
    pub echo: Map<String, Value>,
}

/// Where a response is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status<'a> {
    /// Generating (the stream's first events).
    InProgress,
    /// Ended: an end of generation (or a forced call's grammar ended it).
    Completed,
    /// Cut by `max_output_tokens` (or the context).
    Incomplete,
    /// The job failed, as the message says.
    Failed(&'a str),
}

impl Status<'_> {
    /// How a finished job ended.
    pub fn of(done: &Finished) -> Self {
        match done.stop_reason {
            StopReason::MaxTokens => Status::Incomplete,
            StopReason::Eos | StopReason::StopSequence => Status::Completed,
        }
    }

    /// The `status` string.
    pub fn as_str(self) -> &'static str {
        match self {
            Status::InProgress => "in_progress",
            Status::Completed => "completed",
            Status::Incomplete => "incomplete",
            Status::Failed(_) => "failed",
        }
    }
}

/// `usage` of a finished job: the prompt's tokens after templating (`cached_tokens` of them
/// served by the prefix cache; nothing is written to a cache on request: `cache_write_tokens`
/// 0), the generated tokens (an end-of-generation token not counted). Reasoning tokens are not
/// counted apart: `reasoning_tokens` is 0.
pub fn usage(done: &Finished) -> Value {
    let output_tokens = done.tokens.len();
    json!({
        "input_tokens": done.prompt_tokens,
        "input_tokens_details": {"cached_tokens": done.cached_tokens, "cache_write_tokens": 0},
        "output_tokens": output_tokens,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": done.prompt_tokens + output_tokens,
    })
}

impl ResponseHead {
    /// The response object: `status`, the `output` items so far, `usage` once finished.
    pub fn object(&self, status: Status<'_>, output: &[Value], usage: Option<Value>) -> Value {
        let mut object = Map::new();
        object.insert("id".into(), json!(self.id));
        object.insert("object".into(), json!("response"));
        object.insert("created_at".into(), json!(self.created_at));
        object.insert("status".into(), json!(status.as_str()));
        object.insert("model".into(), json!(self.model));
        object.insert("output".into(), Value::Array(output.to_vec()));
        let incomplete = match status {
            Status::Incomplete => json!({"reason": "max_output_tokens"}),
            _ => Value::Null,
        };
        object.insert("incomplete_details".into(), incomplete);
        let error = match status {
            Status::Failed(message) => json!({"code": "server_error", "message": message}),
            _ => Value::Null,
        };
        object.insert("error".into(), error);
        object.insert("usage".into(), usage.unwrap_or(Value::Null));
        for (key, value) in &self.echo {
            object.insert(key.clone(), value.clone());
        }
        Value::Object(object)
    }
}

/// A fresh output item id: `prefix` and 32 hex digits.
pub(super) fn item_id(prefix: &str) -> String {
    format!("{prefix}_{}", uuid::Uuid::new_v4().simple())
}

/// A call's `function_call` item id: `fc_` and the call's own digits.
pub(super) fn call_item_id(call: &ToolCall) -> String {
    let digits = call.id.strip_prefix("call_").unwrap_or(&call.id);
    format!("fc_{digits}")
}

/// An `output_text` part.
pub(super) fn text_part(text: &str) -> Value {
    json!({"type": "output_text", "text": text, "annotations": []})
}

/// A `reasoning_text` part.
pub(super) fn reasoning_part(text: &str) -> Value {
    json!({"type": "reasoning_text", "text": text})
}

/// A `message` item; its one `output_text` part once `text` is known.
pub(super) fn message_item(id: &str, text: Option<&str>, status: &str) -> Value {
    let content: Vec<Value> = text.map(text_part).into_iter().collect();
    json!({"type": "message", "id": id, "status": status, "role": "assistant",
        "content": content})
}

/// A `reasoning` item (no summary, nothing encrypted); its one `reasoning_text` part once
/// `text` is known.
pub(super) fn reasoning_item(id: &str, text: Option<&str>, status: &str) -> Value {
    let content: Vec<Value> = text.map(reasoning_part).into_iter().collect();
    json!({"type": "reasoning", "id": id, "summary": [], "content": content,
        "encrypted_content": null, "status": status})
}

/// A `function_call` item; `arguments` is the model's text of the arguments object.
pub(super) fn call_item(call: &ToolCall, arguments: &str, status: &str) -> Value {
    json!({"type": "function_call", "id": call_item_id(call), "call_id": call.id,
        "name": call.name, "arguments": arguments, "status": status})
}
