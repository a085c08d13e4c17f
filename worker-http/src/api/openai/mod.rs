//! OpenAI's API (`/v1/models`, `/v1/chat/completions`, `/v1/completions`, `/v1/responses`):
//! requests validated into the same [`JobSpec`](super::JobSpec) as `/execute`, answers and errors
//! rendered in OpenAI's shapes. specs/OPENAI.md states every field and decision.

mod reasoning;
mod request;
mod response;
pub mod responses;
mod tool_calls;
mod tools;

pub use reasoning::{ReasoningFormat, ReasoningParser};
pub use request::{Endpoint, OpenAiRequest};
pub use response::{Logprobs, Reply, finish_reason, usage};
pub use tool_calls::{Piece, ToolCall, ToolCallParser};
pub(in crate::api) use tools::{Function, message_extra};
pub use tools::{ToolChoice, ToolFormat, Tools};

use axum::body::Body;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::Response;
use serde_json::{Value, json};

use super::{ErrorCode, ErrorParts};

/// OpenAI's error `type` for a response status (the names llama-server uses).
fn error_type(status: StatusCode) -> &'static str {
    match status.as_u16() {
        401 => "authentication_error",
        404 => "not_found_error",
        503 => "unavailable_error",
        400..=499 => "invalid_request_error",
        _ => "server_error",
    }
}

/// `{"error": {message, type, param, code}}`; `code` is the contract's code in lower case.
pub fn error_body(
    code: ErrorCode,
    status: StatusCode,
    message: &str,
    param: Option<&str>,
) -> Value {
    json!({
        "error": {
            "message": message,
            "type": error_type(status),
            "param": param,
            "code": code.as_str().to_ascii_lowercase(),
        }
    })
}

/// A contract-shaped error response ([`ErrorParts`] in its extensions) in OpenAI's shape, same
/// status and headers; any other response unchanged. A prompt that does not fit the context
/// (constraint `context_length(N)`) gets OpenAI's own code, `context_length_exceeded`, which the
/// SDKs and frameworks built on them (LangChain, LiteLLM) turn into their context-overflow
/// errors; its message already says "maximum context length" as OpenAI's does. An unknown
/// `previous_response_id` gets OpenAI's `previous_response_not_found`.
pub fn reshape_error(response: Response) -> Response {
    let Some(parts) = response.extensions().get::<ErrorParts>().cloned() else {
        return response;
    };
    let (mut head, _) = response.into_parts();
    let mut body = error_body(
        parts.code,
        head.status,
        &parts.message,
        parts.field.as_deref(),
    );
    if parts.overflow.is_some() {
        body["error"]["code"] = json!("context_length_exceeded");
    }
    // OpenAI's own code for a `previous_response_id` that is not kept.
    if parts.constraint.as_deref() == Some(responses::PREVIOUS_RESPONSE_NOT_FOUND) {
        body["error"]["code"] = json!(responses::PREVIOUS_RESPONSE_NOT_FOUND);
    }
    head.headers.remove(header::CONTENT_LENGTH);
    let json = HeaderValue::from_static("application/json");
    head.headers.insert(header::CONTENT_TYPE, json);
    Response::from_parts(head, Body::from(body.to_string()))
}
