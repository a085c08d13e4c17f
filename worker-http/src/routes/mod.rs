//! The contract's endpoints: thin handlers over [`Shared`](crate::state::Shared).

mod control;
mod execute;
mod guard;
mod messages;
mod named_stream;
mod openai;
mod reply;
mod responses;
mod status;
mod tokens;

pub use guard::Access;
pub(crate) use guard::is_status_route;

use std::sync::Arc;

use axum::Router;
use axum::extract::DefaultBodyLimit;
use axum::routing::{get, post};

use crate::correlation::correlate;
use crate::state::Shared;

/// Largest request body at a context of up to 32k tokens; larger ones answer 413.
pub const MAX_BODY_BYTES: usize = 1 << 20;

/// Body bytes allowed per token of `--ctx-size` beyond [`MAX_BODY_BYTES`]: a token is about four
/// characters of English and at most a few of other scripts, and JSON may escape each character
/// as six bytes, so a prompt that fills the context fits.
pub const BODY_BYTES_PER_TOKEN: usize = 32;

/// The largest request body a worker serving a context of `ctx_size` tokens takes (the
/// default context is at most 8,192 tokens: then [`MAX_BODY_BYTES`]).
pub fn body_limit(ctx_size: Option<u32>) -> usize {
    let tokens = ctx_size.map_or(0, |tokens| tokens as usize);
    MAX_BODY_BYTES.max(tokens.saturating_mul(BODY_BYTES_PER_TOKEN))
}

/// The worker's router.
pub fn router(shared: Arc<Shared>) -> Router {
    Router::new()
        .route("/execute", post(execute::execute))
        .route("/cancel", post(control::cancel_body))
        .route("/cancel/{job_id}", post(control::cancel_path))
        .route("/shutdown", post(control::shutdown))
        .route("/tokenize", post(tokens::tokenize))
        .route("/detokenize", post(tokens::detokenize))
        .route("/health", get(status::health))
        .route("/metrics", get(status::metrics))
        .route("/v1/models", get(openai::models))
        .route("/v1/models/{*model}", get(openai::model))
        .route("/v1/chat/completions", post(openai::chat_completions))
        .route("/v1/completions", post(openai::completions))
        .route("/v1/responses", post(responses::responses))
        .route("/v1/messages", post(messages::messages))
        .route("/v1/messages/count_tokens", post(messages::count_tokens))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(DefaultBodyLimit::max(body_limit(shared.settings.ctx_size)))
        .layer(axum::middleware::from_fn_with_state(
            shared.clone(),
            guard::guard,
        ))
        .layer(axum::middleware::from_fn(v1_errors))
        .layer(axum::middleware::from_fn(correlate))
        .with_state(shared)
}

/// Middleware: errors on `/v1/…` paths (the guard's, the fallbacks', the handlers') in the
/// shape of the API the path belongs to: Anthropic's on `/v1/messages`, OpenAI's elsewhere.
async fn v1_errors(
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    use crate::api::{anthropic, openai};
    let path = request.uri().path();
    let reshape: Option<fn(axum::response::Response) -> axum::response::Response> =
        if anthropic::is_messages_path(path) {
            Some(anthropic::reshape_error)
        } else if path.starts_with("/v1/") {
            Some(openai::reshape_error)
        } else {
            None
        };
    let response = next.run(request).await;
    match reshape {
        Some(reshape) => reshape(response),
        None => response,
    }
}

/// Unknown paths and methods: 404 in the contract's error shape, not axum's empty body.
async fn not_found(
    crate::correlation::CorrelationId(correlation_id): crate::correlation::CorrelationId,
    method: axum::http::Method,
    uri: axum::http::Uri,
) -> crate::api::ApiError {
    let message = format!("no endpoint {method} {}; see specs/CONTRACT.md", uri.path());
    crate::api::ApiError::not_found(message, &correlation_id)
}

/// A known path with the wrong method: 405 in the contract's error shape.
async fn method_not_allowed(
    crate::correlation::CorrelationId(correlation_id): crate::correlation::CorrelationId,
    method: axum::http::Method,
    uri: axum::http::Uri,
) -> crate::api::ApiError {
    let message = format!(
        "{} does not take {method}; see specs/CONTRACT.md",
        uri.path()
    );
    crate::api::ApiError::new(
        crate::api::ErrorCode::InvalidRequest,
        message,
        &correlation_id,
    )
    .with_status(axum::http::StatusCode::METHOD_NOT_ALLOWED)
}

/// The request's `Content-Type`, if readable.
fn content_type(headers: &axum::http::HeaderMap) -> Option<&str> {
    headers
        .get(axum::http::header::CONTENT_TYPE)
        .and_then(|value| value.to_str().ok())
}

/// The body, or the contract's 413/400 when it could not be read.
fn body_or_error(
    shared: &Shared,
    body: Result<bytes::Bytes, axum::extract::rejection::BytesRejection>,
    correlation_id: &str,
) -> Result<bytes::Bytes, crate::api::ApiError> {
    use axum::http::StatusCode;

    use crate::api::{ApiError, FieldError};
    body.map_err(|rejection| {
        if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE {
            ApiError::too_large(body_limit(shared.settings.ctx_size), correlation_id)
        } else {
            let error = FieldError {
                field: "body".into(),
                constraint: "readable".into(),
                message: rejection.body_text(),
                value: None,
            };
            ApiError::invalid(vec![error], correlation_id)
        }
    })
}

#[cfg(test)]
mod failure_tests;
#[cfg(test)]
mod messages_tests;
#[cfg(test)]
mod openai_tests;
#[cfg(test)]
mod reasoning_tests;
#[cfg(test)]
mod responses_tests;
#[cfg(test)]
mod tests;
