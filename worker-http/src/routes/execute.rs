//! `POST /execute`: validate (before anything else), submit, stream the contract's events.

use std::convert::Infallible;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::Extension;
use axum::extract::State;
use axum::extract::rejection::BytesRejection;
use axum::http::HeaderMap;
use axum::response::sse::{Event, KeepAlive, KeepAliveStream, Sse};
use bytes::Bytes;
use futures_util::Stream;

use super::{body_or_error, content_type};
use crate::api::{ApiError, ExecuteRequest, Limits, StreamEvent};
use crate::connections::Connection;
use crate::correlation::CorrelationId;
use crate::job_end::render;
use crate::state::Shared;
use crate::submit::{JobEvents, Origin, submit};

/// Interval of the SSE keep-alive comment.
pub const KEEP_ALIVE: Duration = Duration::from_secs(15);

/// The handler.
pub async fn execute(
    State(shared): State<Arc<Shared>>,
    CorrelationId(correlation_id): CorrelationId,
    connection: Option<Extension<Arc<Connection>>>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Sse<KeepAliveStream<JobStream>>, ApiError> {
    let body = body_or_error(&shared, body, &correlation_id)?;
    let limits = Limits {
        max_tokens_out: shared.settings.max_tokens_out,
    };
    let request = ExecuteRequest::parse(content_type(&headers), &body, limits)
        .map_err(|errors| ApiError::invalid(errors, &correlation_id))?;
    let (job_id, job) = request.into_job();
    let origin = Origin {
        job_id,
        correlation_id,
        connection: connection.map(|Extension(connection)| connection),
    };
    let accepted = submit(&shared, origin, job).await?;
    let stream = JobStream {
        started: Some(StreamEvent::Started(accepted.started)),
        events: accepted.events,
    };
    Ok(Sse::new(stream).keep_alive(KeepAlive::new().interval(KEEP_ALIVE)))
}

/// A job's SSE stream: `started`, then the engine's events rendered for the wire, until the
/// terminal event. Dropping it before the end cancels the job ([`JobEvents`]).
pub struct JobStream {
    started: Option<StreamEvent>,
    events: JobEvents,
}

impl Stream for JobStream {
    type Item = Result<Event, Infallible>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        if let Some(started) = self.started.take() {
            return Poll::Ready(Some(Ok(sse_event(&started))));
        }
        let event = std::task::ready!(Pin::new(&mut self.events).poll_next(cx));
        let rendered = event.map(|event| render(event, self.events.job_id()));
        Poll::Ready(rendered.map(|event| Ok(sse_event(&event))))
    }
}

fn sse_event(event: &StreamEvent) -> Event {
    let data = serde_json::to_string(event).unwrap_or_else(|err| {
        format!(r#"{{"type":"error","code":"INTERNAL","message":"{err}","retriable":false}}"#)
    });
    Event::default().event(event.name()).data(data)
}
