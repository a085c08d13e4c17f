//! `POST /execute`: validate (before anything else), tokenize, enqueue, stream.

use std::convert::Infallible;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, SystemTime};

use axum::Extension;
use axum::extract::State;
use axum::extract::rejection::BytesRejection;
use axum::http::HeaderMap;
use axum::response::sse::{Event, KeepAlive, KeepAliveStream, Sse};
use bytes::Bytes;
use futures_util::Stream;
use tokio::sync::mpsc;
use worker_common::generate::{CancelToken, GenerateRequest};
use worker_common::sampling::SamplingParams;

use super::{body_or_error, content_type};
use crate::api::{
    ApiError, ErrorCode, ExecuteRequest, FieldError, Limits, StartedEvent, StreamEvent,
};
use crate::clock::rfc3339;
use crate::connections::Connection;
use crate::correlation::CorrelationId;
use crate::job_end::{JobEnd, JobEvent, end_job, render};
use crate::queue::{Job, Rejected, Submitted, Ticket};
use crate::state::{Lifecycle, Loaded, Shared};

/// Interval of the SSE keep-alive comment.
const KEEP_ALIVE: Duration = Duration::from_secs(15);

/// The handler.
pub async fn execute(
    State(shared): State<Arc<Shared>>,
    CorrelationId(correlation_id): CorrelationId,
    connection: Option<Extension<Arc<Connection>>>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Sse<KeepAliveStream<JobStream>>, ApiError> {
    let body = body_or_error(body, &correlation_id)?;
    let limits = Limits {
        max_tokens_out: shared.settings.max_tokens_out,
    };
    let request = ExecuteRequest::parse(content_type(&headers), &body, limits)
        .map_err(|errors| ApiError::invalid(errors, &correlation_id))?;
    let loaded = accepting(&shared, &correlation_id)?;
    let budget = shared.settings.max_prompt_tokens;
    let prompt_tokens = tokenize(&loaded, &request, budget, &correlation_id).await?;
    // Generated seeds stay below 2^53 so JavaScript clients can send them back exactly.
    let seed = request
        .seed
        .unwrap_or_else(|| uuid::Uuid::new_v4().as_u64_pair().0 >> 11);
    let (events, receiver) = mpsc::unbounded_channel();
    let cancel = CancelToken::new();
    let job = Job {
        id: request.job_id.clone(),
        correlation_id: correlation_id.clone(),
        request: generate_request(&request, prompt_tokens, seed),
        cancel: cancel.clone(),
        prompt_summary: (
            request.prompt.chars().count(),
            fnv1a(request.prompt.as_bytes()),
        ),
        events,
    };
    let prompt_tokens = job.request.prompt_tokens.len();
    let cached_tokens = loaded
        .prefix_index
        .cached_tokens(&job.request.prompt_tokens, prompt_tokens.saturating_sub(1));
    let submitted = shared
        .queue
        .submit(job, loaded.slots)
        .map_err(|why| match why {
            Rejected::Full => ApiError::new(
                ErrorCode::WorkerBusy,
                format!(
                    "{} jobs are already waiting; retry later",
                    shared.queue.len()
                ),
                &correlation_id,
            ),
            Rejected::Closed => closed(&shared, &correlation_id),
        })?;
    let (queue_position, ticket) = match submitted {
        Submitted::Queued { position, ticket } => (position, Some(ticket)),
        Submitted::CancelledOnArrival(job) => {
            let end = JobEnd::failed(ErrorCode::Cancelled, "cancelled before it arrived");
            end_job(&shared, *job, end, 0.0);
            (0, None)
        }
    };
    shared.metrics.add_tokens_in(prompt_tokens);
    let job_id = request.job_id.clone();
    let started = StreamEvent::Started(StartedEvent {
        job_id: request.job_id,
        model: loaded.model_name.clone(),
        started_at: rfc3339(SystemTime::now()),
        seed,
        prompt_tokens,
        cached_tokens,
        queue_position,
        correlation_id,
    });
    let stream = JobStream {
        started: Some(started),
        job_id,
        receiver,
        cancel,
        ended: false,
        queued: ticket.map(|ticket| (shared.clone(), ticket)),
        connection: connection.map(|Extension(connection)| connection),
    };
    Ok(Sse::new(stream).keep_alive(KeepAlive::new().interval(KEEP_ALIVE)))
}

/// The loaded model, when the worker takes jobs.
fn accepting(shared: &Shared, correlation_id: &str) -> Result<Arc<Loaded>, ApiError> {
    match (shared.lifecycle(), shared.loaded()) {
        (Lifecycle::Ready, Some(loaded)) => Ok(loaded.clone()),
        (Lifecycle::Draining, _) => Err(draining(correlation_id)),
        (Lifecycle::Failed, _) => Err(failed(shared, correlation_id)),
        _ => Err(ApiError::new(
            ErrorCode::WorkerNotReady,
            "the model is not loaded yet; retry when /health says ready",
            correlation_id,
        )),
    }
}

/// A closed queue: the worker is draining, or it failed.
fn closed(shared: &Shared, correlation_id: &str) -> ApiError {
    match shared.lifecycle() {
        Lifecycle::Failed => failed(shared, correlation_id),
        _ => draining(correlation_id),
    }
}

/// A failed worker takes no job (`WORKER_NOT_READY`, retriable elsewhere): it exits soon.
fn failed(shared: &Shared, correlation_id: &str) -> ApiError {
    let why = shared.failure().map_or_else(
        || "failed".to_owned(),
        |failure| format!("{}: {}", failure.code, failure.message),
    );
    ApiError::new(
        ErrorCode::WorkerNotReady,
        format!("the worker failed ({why}) and is exiting; send the job to another worker"),
        correlation_id,
    )
}

fn draining(correlation_id: &str) -> ApiError {
    ApiError::new(
        ErrorCode::WorkerDraining,
        "the worker is shutting down; send the job to another worker",
        correlation_id,
    )
}

/// Template + tokenize off the async threads, then the context-length rule.
async fn tokenize(
    loaded: &Arc<Loaded>,
    request: &ExecuteRequest,
    budget: Option<u32>,
    correlation_id: &str,
) -> Result<Vec<u32>, ApiError> {
    let (model, prompt, raw) = (loaded.clone(), request.prompt.clone(), request.raw);
    let tokens = tokio::task::spawn_blocking(move || {
        model.formatter.tokenize(&model.tokenizer, &prompt, raw)
    })
    .await
    .map_err(|err| ApiError::new(ErrorCode::Internal, err.to_string(), correlation_id))?
    .map_err(|err| {
        let error = FieldError {
            field: "prompt".into(),
            constraint: "tokenizable".into(),
            message: err.to_string(),
            value: None,
        };
        ApiError::invalid(vec![error], correlation_id)
    })?;
    if let Some(budget) = budget
        && tokens.len() > budget as usize
    {
        let error = FieldError {
            field: "prompt".into(),
            constraint: format!("max_prompt_tokens({budget})"),
            message: format!(
                "the prompt is {} tokens; this worker takes at most {budget} per job (--max-prompt-tokens)",
                tokens.len()
            ),
            value: None,
        };
        return Err(ApiError::invalid(vec![error], correlation_id));
    }
    let context = loaded.context_length;
    let allowed = context.saturating_sub(request.max_tokens as usize);
    if tokens.len() > allowed {
        let error = FieldError {
            field: "prompt".into(),
            constraint: format!("context_length({allowed})"),
            message: format!(
                "the prompt is {} tokens; with max_tokens {} the context of {context} leaves room for {allowed}",
                tokens.len(),
                request.max_tokens
            ),
            value: None,
        };
        return Err(ApiError::invalid(vec![error], correlation_id));
    }
    Ok(tokens)
}

fn generate_request(
    request: &ExecuteRequest,
    prompt_tokens: Vec<u32>,
    seed: u64,
) -> GenerateRequest {
    GenerateRequest {
        prompt_tokens,
        max_tokens: request.max_tokens as usize,
        sampling: SamplingParams {
            temperature: request.temperature,
            top_k: request.top_k,
            top_p: request.top_p,
            min_p: request.min_p,
            repetition_penalty: request.repetition_penalty,
            seed,
        },
        stop: request.stop.clone(),
        deadline: None,
        ignore_eos: request.ignore_eos,
    }
}

/// FNV-1a: a stable hash to log instead of the prompt.
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |hash, &byte| {
        (hash ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// A job's SSE stream: `started`, then what the engine sends until the terminal event, rendered
/// for the wire here. Dropping it before the end (the client went away) cancels the job, queued
/// or running.
pub struct JobStream {
    started: Option<StreamEvent>,
    job_id: String,
    receiver: mpsc::UnboundedReceiver<JobEvent>,
    cancel: CancelToken,
    ended: bool,
    /// The queue and the job's ticket, to take the job out at once if the client leaves while
    /// it waits.
    queued: Option<(Arc<Shared>, Ticket)>,
    /// The connection the stream is sent on (absent in in-process tests).
    connection: Option<Arc<Connection>>,
}

impl Stream for JobStream {
    type Item = Result<Event, Infallible>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        if self.ended {
            return Poll::Ready(None);
        }
        let event = match self.started.take() {
            Some(started) => started,
            None => match self.receiver.poll_recv(cx) {
                Poll::Ready(Some(event)) => render(event, &self.job_id),
                Poll::Ready(None) => return Poll::Ready(None),
                Poll::Pending => return Poll::Pending,
            },
        };
        self.ended = event.is_terminal();
        Poll::Ready(Some(Ok(sse_event(&event))))
    }
}

impl Drop for JobStream {
    /// The client left: a waiting job leaves the queue now, a running one at the next step.
    fn drop(&mut self) {
        if self.ended {
            return;
        }
        self.cancel.cancel();
        if self.connection.as_ref().is_some_and(|c| c.stalled()) {
            tracing::info!(
                event = "cancel",
                job_id = %self.job_id,
                reason = "client_stalled",
                "the client stopped reading its stream; cancelling the job"
            );
        }
        if let Some((shared, ticket)) = &self.queued
            && let Some(job) = shared.queue.abandon(*ticket)
        {
            let end = JobEnd::failed(ErrorCode::Cancelled, "the client left before it started");
            end_job(shared, job, end, 0.0);
        }
    }
}

fn sse_event(event: &StreamEvent) -> Event {
    let data = serde_json::to_string(event).unwrap_or_else(|err| {
        format!(r#"{{"type":"error","code":"INTERNAL","message":"{err}","retriable":false}}"#)
    });
    Event::default().event(event.name()).data(data)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fnv1a_matches_the_reference_values() {
        assert_eq!(fnv1a(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a(b"a"), 0xaf63_dc4c_8601_ec8c);
    }
}
