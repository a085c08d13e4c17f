//! Anthropic's Messages API (`/v1/messages`): requests validated into the same
//! [`JobSpec`](super::JobSpec) as `/execute` and `/v1/chat/completions` (the same chat template,
//! tool rendering, forced-call grammar and tool-call parser), answers and errors rendered in
//! Anthropic's shapes. specs/MESSAGES.md states every field and decision.

mod content;
mod request;
mod response;

pub use request::{MessagesRequest, Purpose};
pub use response::{BlockEvents, Message, NamedEvent};

use axum::body::Body;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::Response;
use serde_json::{Value, json};

use super::{ContextOverflow, ErrorParts};
use crate::correlation::CORRELATION_HEADER;

/// Whether `path` is served in Anthropic's shapes (errors included).
pub fn is_messages_path(path: &str) -> bool {
    path == "/v1/messages" || path.starts_with("/v1/messages/")
}

/// Anthropic's error `type` for a response status.
fn error_type(status: StatusCode) -> &'static str {
    match status.as_u16() {
        401 => "authentication_error",
        403 => "permission_error",
        404 => "not_found_error",
        413 => "request_too_large",
        429 => "rate_limit_error",
        503 | 529 => "overloaded_error",
        504 => "timeout_error",
        400..=499 => "invalid_request_error",
        _ => "api_error",
    }
}

/// `{"type": "error", "error": {type, message}, "request_id"}`; the request id is the
/// correlation id, when known.
pub fn error_body(status: StatusCode, message: &str, request_id: Option<&str>) -> Value {
    json!({
        "type": "error",
        "error": {"type": error_type(status), "message": message},
        "request_id": request_id,
    })
}

/// A prompt over the context in Anthropic's wordings, which its clients match on: "prompt is
/// too long: N tokens > M maximum" (M the context, or with `max_tokens` the room it leaves, and
/// then Anthropic's "input length and `max_tokens` exceed context limit" as well).
fn overflow_message(overflow: &ContextOverflow) -> String {
    let ContextOverflow {
        prompt_tokens,
        max_tokens,
        context,
    } = *overflow;
    if prompt_tokens > context {
        return format!("prompt is too long: {prompt_tokens} tokens > {context} maximum");
    }
    format!(
        "prompt is too long: {prompt_tokens} tokens > {} maximum with max_tokens {max_tokens} (input length and `max_tokens` exceed context limit: {prompt_tokens} + {max_tokens} > {context}, decrease input length or `max_tokens` and try again)",
        overflow.room()
    )
}

/// A contract-shaped error response ([`ErrorParts`] in its extensions) in Anthropic's shape,
/// same status and headers; any other response unchanged.
pub fn reshape_error(response: Response) -> Response {
    let Some(parts) = response.extensions().get::<ErrorParts>().cloned() else {
        return response;
    };
    let (mut head, _) = response.into_parts();
    let message = match &parts.overflow {
        Some(overflow) => overflow_message(overflow),
        None => parts.message,
    };
    let request_id = head
        .headers
        .get(CORRELATION_HEADER)
        .and_then(|value| value.to_str().ok());
    let body = error_body(head.status, &message, request_id);
    head.headers.remove(header::CONTENT_LENGTH);
    let json = HeaderValue::from_static("application/json");
    head.headers.insert(header::CONTENT_TYPE, json);
    Response::from_parts(head, Body::from(body.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_get_anthropics_error_types() {
        let types = [
            (400, "invalid_request_error"),
            (401, "authentication_error"),
            (404, "not_found_error"),
            (405, "invalid_request_error"),
            (413, "request_too_large"),
            (499, "invalid_request_error"),
            (500, "api_error"),
            (503, "overloaded_error"),
            (504, "timeout_error"),
        ];
        for (status, kind) in types {
            let status = StatusCode::from_u16(status).unwrap_or(StatusCode::IM_A_TEAPOT);
            assert_eq!(error_type(status), kind, "{status}");
        }
    }

    #[test]
    fn a_prompt_over_the_context_is_too_long_in_anthropics_words() {
        let over = ContextOverflow {
            prompt_tokens: 300,
            max_tokens: 5,
            context: 256,
        };
        assert_eq!(
            overflow_message(&over),
            "prompt is too long: 300 tokens > 256 maximum"
        );
        let with_budget = ContextOverflow {
            prompt_tokens: 200,
            max_tokens: 100,
            context: 256,
        };
        let message = overflow_message(&with_budget);
        assert!(
            message.starts_with("prompt is too long: 200 tokens > 156 maximum"),
            "{message}"
        );
        assert!(
            message.contains("exceed context limit: 200 + 100 > 256"),
            "{message}"
        );
    }
}
