//! Anthropic's Messages routes, `POST /v1/messages` and its token counter: the request is validated into the same job
//! as `/v1/chat/completions`' and submitted the same way, its text cut by the same parsers
//! (reasoning, tool calls); only the answer's shape differs (a message object, or Anthropic's
//! named SSE events).

use std::collections::VecDeque;
use std::convert::Infallible;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use axum::extract::State;
use axum::extract::rejection::BytesRejection;
use axum::http::HeaderMap;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use bytes::Bytes;
use futures_util::Stream;
use serde_json::{Value, json};
use worker_common::generate::GenerateEvent;

use super::execute::KEEP_ALIVE;
use super::reply::{TextParser, collect, reasoning_format, tool_format};
use super::{body_or_error, content_type};
use crate::api::anthropic::{
    BlockEvents, Message, MessagesRequest, NamedEvent, Purpose, error_body,
};
use crate::api::openai::Piece;
use crate::api::{ApiError, Limits};
use crate::connections::Connection;
use crate::correlation::CorrelationId;
use crate::job_end::{JobEnd, JobEvent};
use crate::state::Shared;
use crate::submit::{JobEvents, Origin, prompt_tokens, submit};

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
        let stream = MessageStream {
            blocks,
            events: accepted.events,
            parser,
            correlation_id,
            ready: first.into_iter().map(named).collect(),
            ended: false,
        };
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
/// the end. Dropping it cancels the job ([`JobEvents`]).
struct MessageStream {
    blocks: BlockEvents,
    events: JobEvents,
    /// Cuts reasoning and tool calls out of the text.
    parser: TextParser,
    correlation_id: String,
    ready: VecDeque<Event>,
    ended: bool,
}

impl MessageStream {
    /// Queues what `event` sends; true when it was the last.
    fn push(&mut self, event: JobEvent) -> bool {
        match event {
            JobEvent::Generate(GenerateEvent::Token { text, .. }) => {
                let pieces = self.parser.push(text);
                self.send(pieces);
                false
            }
            JobEvent::Generate(GenerateEvent::Metrics { .. }) => false,
            JobEvent::End(JobEnd::Finished(done)) => {
                let rest = self.parser.finish();
                self.send(rest);
                let end = self.blocks.finish(&done);
                self.ready.extend(end.into_iter().map(named));
                true
            }
            JobEvent::End(JobEnd::Failed { code, message, .. }) => {
                let error = error_body(code.status(), &message, Some(&self.correlation_id));
                self.ready.push_back(named(("error", error)));
                true
            }
        }
    }

    fn send(&mut self, pieces: Vec<Piece>) {
        for piece in pieces {
            let events = self.blocks.piece(piece);
            self.ready.extend(events.into_iter().map(named));
        }
    }
}

/// `event: <name>` then `data: <json>`.
fn named((name, data): NamedEvent) -> Event {
    Event::default().event(name).data(data.to_string())
}

impl Stream for MessageStream {
    type Item = Result<Event, Infallible>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        loop {
            if let Some(event) = self.ready.pop_front() {
                return Poll::Ready(Some(Ok(event)));
            }
            if self.ended {
                return Poll::Ready(None);
            }
            match std::task::ready!(Pin::new(&mut self.events).poll_next(cx)) {
                Some(event) => self.ended = self.push(event),
                None => self.ended = true,
            }
        }
    }
}
