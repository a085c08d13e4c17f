//! Anthropic's Messages routes, `POST /v1/messages` and its token counter: the request is validated into the same job
//! as `/v1/chat/completions`' and submitted the same way, its text cut by the same parsers
//! (reasoning, tool calls); only the answer's shape differs (a message object, or Anthropic's
//! named SSE events).

use std::sync::Arc;

use axum::extract::State;
use axum::extract::rejection::BytesRejection;
use axum::http::HeaderMap;
use axum::response::sse::{KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use bytes::Bytes;
use serde_json::{Value, json};
use worker_common::generate::Finished;

use super::execute::KEEP_ALIVE;
use super::named_stream::{Named, NamedEvents, NamedStream};
use super::reply::{TextParser, collect, reasoning_format, tool_format};
use super::{body_or_error, content_type};
use crate::api::anthropic::{BlockEvents, Message, MessagesRequest, Purpose, error_body};
use crate::api::openai::Piece;
use crate::api::{ApiError, ErrorCode, Limits};
use crate::connections::Connection;
use crate::correlation::CorrelationId;
use crate::state::Shared;
use crate::submit::{Origin, prompt_tokens, submit};

/// `POST /v1/messages`.
pub async fn messages(
    State(shared): State<Arc<Shared>>,
    CorrelationId(correlation_id): CorrelationId,
    connection: Option<Extension<Arc<Connection>>>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let purpose = Purpose::Create;
    let mut request = parse(&shared, &correlation_id, &headers, body, purpose)?;
    let tools = request.tools.as_ref();
    let format = tool_format(&shared, tools, &mut request.job, &correlation_id)?;
    let reasoning = reasoning_format(&shared, &correlation_id)?;
    let parser = TextParser::new(reasoning, format, tools, request.stream);
    let job_id = format!("msg_{}", uuid::Uuid::new_v4().simple());
    let origin = Origin {
        job_id: job_id.clone(),
        correlation_id: correlation_id.clone(),
        connection: connection.map(|Extension(connection)| connection),
    };
    let accepted = submit(&shared, origin, request.job).await?;
    let message = Message {
        id: job_id,
        model: accepted.started.model.clone(),
    };
    if request.stream {
        let started = &accepted.started;
        let (blocks, first) =
            BlockEvents::start(&message, started.prompt_tokens, started.cached_tokens);
        let named = MessageEvents {
            blocks,
            correlation_id,
        };
        let stream = NamedStream::new(named, accepted.events, parser, first);
        let sse = Sse::new(stream).keep_alive(KeepAlive::new().interval(KEEP_ALIVE));
        return Ok(sse.into_response());
    }
    let whole = collect(accepted.events, parser, &correlation_id).await?;
    Ok(Json(message.whole(&whole.pieces, &whole.done)).into_response())
}

/// `POST /v1/messages/count_tokens` (the SDKs' `messages.count_tokens`): `{"input_tokens": N}`,
/// the tokens the same body's prompt has on `/v1/messages` (template, system and tools included).
pub async fn count_tokens(
    State(shared): State<Arc<Shared>>,
    CorrelationId(correlation_id): CorrelationId,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<Value>, ApiError> {
    let purpose = Purpose::CountTokens;
    let mut request = parse(&shared, &correlation_id, &headers, body, purpose)?;
    // Tools the template cannot render are refused as on /v1/messages.
    tool_format(
        &shared,
        request.tools.as_ref(),
        &mut request.job,
        &correlation_id,
    )?;
    let tokens = prompt_tokens(&shared, &request.job.prompt, &correlation_id).await?;
    Ok(Json(json!({"input_tokens": tokens})))
}

/// The body, validated for `purpose`; 400 (413) with every violation otherwise.
fn parse(
    shared: &Shared,
    correlation_id: &str,
    headers: &HeaderMap,
    body: Result<Bytes, BytesRejection>,
    purpose: Purpose,
) -> Result<MessagesRequest, ApiError> {
    let body = body_or_error(shared, body, correlation_id)?;
    let limits = Limits {
        max_tokens_out: shared.settings.max_tokens_out,
    };
    MessagesRequest::parse(content_type(headers), &body, limits, purpose)
        .map_err(|errors| ApiError::invalid(errors, correlation_id))
}

/// A job's events as Anthropic's: `message_start` and `ping`, the content blocks as the text
/// comes, `message_delta` and `message_stop`; a failed job sends an `error` event instead of
/// the end.
struct MessageEvents {
    blocks: BlockEvents,
    correlation_id: String,
}

impl NamedEvents for MessageEvents {
    fn piece(&mut self, piece: Piece) -> Vec<Named> {
        self.blocks.piece(piece)
    }

    fn finish(&mut self, done: &Finished) -> Vec<Named> {
        self.blocks.finish(done)
    }

    fn fail(&mut self, code: ErrorCode, message: &str) -> Vec<Named> {
        vec![(
            "error",
            error_body(code.status(), message, Some(&self.correlation_id)),
        )]
    }
}
