//! OpenAI's Responses route, `POST /v1/responses`: the request is validated into the same job
//! as `/v1/chat/completions`' and submitted the same way, its text cut by the same parsers
//! (reasoning, tool calls, `routes::reply`); only the answer's shape differs (a response object,
//! or the typed SSE events). A finished response is kept for `previous_response_id` unless the
//! request said `store: false` (`crate::response_store`).

use std::sync::Arc;

use axum::extract::State;
use axum::extract::rejection::BytesRejection;
use axum::http::HeaderMap;
use axum::response::sse::{KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use bytes::Bytes;
use serde_json::Value;
use worker_common::generate::Finished;

use super::execute::KEEP_ALIVE;
use super::named_stream::{Named, NamedEvents, NamedStream};
use super::openai::unix_now;
use super::reply::{TextParser, collect, reasoning_format, tool_format};
use super::{body_or_error, content_type};
use crate::api::openai::Piece;
use crate::api::openai::responses::{ResponseEvents, ResponseHead, ResponsesRequest};
use crate::api::{ApiError, ErrorCode, Limits};
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
    // The prompt's errors (over the context, a template that fails) name the Responses API's
    // fields, not chat's.
    let accepted = submit(&shared, origin, request.job)
        .await
        .map_err(|err| err.prompt_in("input", "max_output_tokens"))?;
    let head = ResponseHead {
        id: id.clone(),
        created_at: unix_now(),
        model: accepted.started.model.clone(),
        echo: request.echo,
    };
    let keep = request.store.then(|| Keep {
        shared: shared.clone(),
        id,
        items: request.items,
    });
    if request.stream {
        let (items, first) = ResponseEvents::start(head);
        let stream = NamedStream::new(
            ResponseItems { items, keep },
            accepted.events,
            parser,
            first,
        );
        let sse = Sse::new(stream).keep_alive(KeepAlive::new().interval(KEEP_ALIVE));
        return Ok(sse.into_response());
    }
    let whole = collect(accepted.events, parser, &correlation_id).await?;
    let (object, output) = ResponseEvents::whole(head, whole.pieces, &whole.done);
    if let Some(keep) = keep {
        keep.store(&output);
    }
    Ok(Json(object).into_response())
}

/// The body, validated (with the conversation a `previous_response_id` left); 400 (413) with
/// every violation otherwise.
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
    let previous = |id: &str| shared.responses.get(id);
    ResponsesRequest::parse(content_type(headers), &body, limits, &previous)
        .map_err(|errors| ApiError::invalid(errors, correlation_id))
}

/// A response to keep once it has finished: its id and conversation so far.
struct Keep {
    shared: Arc<Shared>,
    id: String,
    items: Vec<Value>,
}

impl Keep {
    /// Stores the conversation followed by the response's `output` items.
    fn store(self, output: &[Value]) {
        let mut items = self.items;
        items.extend_from_slice(output);
        self.shared.responses.insert(self.id, items);
    }
}

/// A job's events as the Responses API's: `response.created` and `response.in_progress`, the
/// output items as the text comes, then `response.completed` (or `response.incomplete`); a
/// failed job sends `response.failed` instead.
struct ResponseItems {
    items: ResponseEvents,
    /// Where the finished response is kept (`None` with `store: false`).
    keep: Option<Keep>,
}

impl NamedEvents for ResponseItems {
    fn piece(&mut self, piece: Piece) -> Vec<Named> {
        self.items.piece(piece)
    }

    fn finish(&mut self, done: &Finished) -> Vec<Named> {
        let end = self.items.finish(done);
        if let Some(keep) = self.keep.take() {
            keep.store(self.items.output());
        }
        end
    }

    fn fail(&mut self, _code: ErrorCode, message: &str) -> Vec<Named> {
        self.items.fail(message)
    }
}
