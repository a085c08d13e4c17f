//! OpenAI's Responses route, `POST /v1/responses`: the request is validated into the same job
//! as `/v1/chat/completions`' and submitted the same way, its text cut by the same parsers
//! (reasoning, tool calls, `routes::reply`); only the answer's shape differs (a response
//! object).

use std::sync::Arc;

use axum::extract::State;
use axum::extract::rejection::BytesRejection;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use bytes::Bytes;

use super::openai::unix_now;
use super::reply::{TextParser, collect, reasoning_format, tool_format};
use super::{body_or_error, content_type};
use crate::api::openai::responses::{ResponseEvents, ResponseHead, ResponsesRequest};
use crate::api::{ApiError, Limits};
use crate::connections::Connection;
use crate::correlation::CorrelationId;
use crate::state::Shared;
use crate::submit::{Origin, submit};

/// `POST /v1/responses`.
pub async fn responses(
    State(shared): State<Arc<Shared>>,
    CorrelationId(correlation_id): CorrelationId,
    connection: Option<Extension<Arc<Connection>>>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let mut request = parse(&shared, &correlation_id, &headers, body)?;
    if request.stream {
        let message = "streamed responses are not served yet".into();
        let error = ApiError::invalid_field("stream", "unsupported", message, &correlation_id);
        return Err(error);
    }
    let tools = request.tools.as_ref();
    let format = tool_format(&shared, tools, &mut request.job, &correlation_id)?;
    let reasoning = reasoning_format(&shared, &correlation_id)?;
    let parser = TextParser::new(reasoning, format, tools, request.stream);
    let id = format!("resp_{}", uuid::Uuid::new_v4().simple());
    let origin = Origin {
        job_id: id.clone(),
        correlation_id: correlation_id.clone(),
        connection: connection.map(|Extension(connection)| connection),
    };
    let accepted = submit(&shared, origin, request.job).await?;
    let head = ResponseHead {
        id,
        created_at: unix_now(),
        model: accepted.started.model.clone(),
        echo: request.echo,
    };
    let whole = collect(accepted.events, parser, &correlation_id).await?;
    let (object, _) = ResponseEvents::whole(head, whole.pieces, &whole.done);
    Ok(Json(object).into_response())
}

/// The body, validated; 400 (413) with every violation otherwise (no response is kept yet: a
/// `previous_response_id` is not found).
fn parse(
    shared: &Shared,
    correlation_id: &str,
    headers: &HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<ResponsesRequest, ApiError> {
    let body = body_or_error(shared, body, correlation_id)?;
    let limits = Limits {
        max_tokens_out: shared.settings.max_tokens_out,
    };
    let previous = |_: &str| None;
    ResponsesRequest::parse(content_type(headers), &body, limits, &previous)
        .map_err(|errors| ApiError::invalid(errors, correlation_id))
}
