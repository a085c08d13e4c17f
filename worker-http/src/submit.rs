//! Submitting a validated job, whichever API it came through: template and tokenize off the
//! async threads, apply the context rules, enqueue, and hand back the job's events. Every
//! route that starts a job goes through [`submit`]; only how the events are rendered differs.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::SystemTime;

use futures_util::Stream;
use tokio::sync::mpsc;
use worker_common::generate::{CancelToken, GenerateRequest, PromptError};
use worker_common::grammar::{Constraint, GrammarError};

use crate::api::{
    ApiError, ContextOverflow, ErrorCode, FieldError, Grammar, JobSpec, Prompt, StartedEvent,
};
use crate::clock::rfc3339;
use crate::connections::Connection;
use crate::job_end::{JobEnd, JobEvent, end_job};
use crate::queue::{Job, Rejected, Submitted, Ticket};
use crate::state::{Lifecycle, Loaded, Shared};

/// A job in the queue or running: what `started` says, and its events to come.
pub struct Accepted {
    /// The `started` event (its facts also fill OpenAI's replies).
    pub started: StartedEvent,
    /// The job's events, until its one terminal event.
    pub events: JobEvents,
}

/// Where a job is submitted from: the request's ids and the connection it came on.
pub struct Origin {
    /// The job id (the caller's, or one made for an OpenAI request).
    pub job_id: String,
    /// The request's correlation id.
    pub correlation_id: String,
    /// The connection the answer goes out on (absent in in-process tests).
    pub connection: Option<Arc<Connection>>,
}

/// Tokenizes `job`, checks it against the context and enqueues it.
pub async fn submit(
    shared: &Arc<Shared>,
    origin: Origin,
    job: JobSpec,
) -> Result<Accepted, ApiError> {
    let Origin {
        job_id,
        correlation_id,
        connection,
    } = origin;
    let loaded = accepting(shared, &correlation_id)?;
    check_logit_bias(&job, loaded.vocab_size, &correlation_id)?;
    let prompt_tokens = tokenize(&loaded, &job.prompt, &correlation_id).await?;
    let max_tokens = max_tokens(shared, &loaded, &job, prompt_tokens.len(), &correlation_id)?;
    let grammar = compile(shared, &loaded, job.grammar.clone(), &correlation_id).await?;
    // Generated seeds stay below 2^53 so JavaScript clients can send them back exactly.
    let seed = job
        .seed
        .unwrap_or_else(|| uuid::Uuid::new_v4().as_u64_pair().0 >> 11);
    let (events, receiver) = mpsc::unbounded_channel();
    let cancel = CancelToken::new();
    let prompt_summary = prompt_summary(&job.prompt);
    let request = GenerateRequest {
        prompt_tokens,
        max_tokens,
        sampling: worker_common::sampling::SamplingParams {
            seed,
            ..job.sampling
        },
        stop: job.stop,
        deadline: None,
        ignore_eos: job.ignore_eos,
        grammar,
        speculative: job.speculative,
    };
    let queued_job = Job {
        id: job_id.clone(),
        correlation_id: correlation_id.clone(),
        request,
        cancel: cancel.clone(),
        prompt_summary,
        events,
    };
    let prompt_tokens = queued_job.request.prompt_tokens.len();
    let cached_tokens = loaded.prefix_index.cached_tokens(
        &queued_job.request.prompt_tokens,
        prompt_tokens.saturating_sub(1),
    );
    let (queue_position, ticket) = enqueue(shared, &loaded, queued_job, &correlation_id)?;
    shared.metrics.add_tokens_in(prompt_tokens);
    let started = StartedEvent {
        job_id: job_id.clone(),
        model: loaded.model_name.clone(),
        started_at: rfc3339(SystemTime::now()),
        seed,
        prompt_tokens,
        cached_tokens,
        queue_position,
        correlation_id: correlation_id.clone(),
    };
    let events = JobEvents {
        job_id,
        worker_id: shared.settings.worker_id.clone(),
        correlation_id,
        receiver,
        cancel,
        ended: false,
        queued: ticket.map(|ticket| (shared.clone(), ticket)),
        connection,
    };
    Ok(Accepted { started, events })
}

/// The tokens `prompt` has as a job's prompt (templated, tools rendered), without a job.
pub async fn prompt_tokens(
    shared: &Shared,
    prompt: &Prompt,
    correlation_id: &str,
) -> Result<usize, ApiError> {
    let loaded = accepting(shared, correlation_id)?;
    Ok(tokenize(&loaded, prompt, correlation_id).await?.len())
}

/// Puts the job in the queue: its position and ticket (no ticket when it was cancelled on
/// arrival, and has its end already).
fn enqueue(
    shared: &Shared,
    loaded: &Loaded,
    job: Job,
    correlation_id: &str,
) -> Result<(usize, Option<Ticket>), ApiError> {
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
                correlation_id,
            ),
            Rejected::Closed => closed(shared, correlation_id),
        })?;
    Ok(match submitted {
        Submitted::Queued { position, ticket } => (position, Some(ticket)),
        Submitted::CancelledOnArrival(job) => {
            let end = JobEnd::failed(ErrorCode::Cancelled, "cancelled before it arrived");
            end_job(shared, *job, end, 0.0);
            (0, None)
        }
    })
}

/// The loaded model, when the worker takes jobs.
pub fn accepting(shared: &Shared, correlation_id: &str) -> Result<Arc<Loaded>, ApiError> {
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

/// `logit_bias` names only ids of the vocabulary.
fn check_logit_bias(
    job: &JobSpec,
    vocab_size: usize,
    correlation_id: &str,
) -> Result<(), ApiError> {
    match job
        .sampling
        .logit_bias
        .iter()
        .find(|(id, _)| *id as usize >= vocab_size)
    {
        None => Ok(()),
        Some((id, _)) => Err(invalid(
            &format!("logit_bias.{id}"),
            format!("token_id(<{vocab_size})"),
            format!("token {id} is not in the vocabulary of {vocab_size} tokens"),
            correlation_id,
        )),
    }
}

/// The job's grammar compiled for the model (off the async threads: a large schema takes a
/// while); a grammar that does not compile, admits no output or is over the compile budget
/// (`constraint` `grammar_budget`) is the request's fault, refused under the field it came in.
async fn compile(
    shared: &Shared,
    loaded: &Arc<Loaded>,
    grammar: Option<Grammar>,
    correlation_id: &str,
) -> Result<Option<Constraint>, ApiError> {
    let Some(Grammar { spec, field }) = grammar else {
        return Ok(None);
    };
    let (loaded, worker_id) = (loaded.clone(), shared.settings.worker_id.clone());
    let compiled = tokio::task::spawn_blocking(move || {
        let grammars = loaded.grammars.get(&worker_id, &loaded.tokenizer)?;
        Ok::<_, String>(grammars.compile(&spec))
    })
    .await
    .map_err(|err| ApiError::new(ErrorCode::Internal, err.to_string(), correlation_id))?;
    match compiled {
        Ok(Ok(constraint)) => Ok(Some(constraint)),
        Ok(Err(err)) => {
            let constraint = match err {
                GrammarError::OverBudget(_) => "grammar_budget",
                _ => "grammar",
            };
            Err(invalid(
                field,
                constraint.into(),
                err.to_string(),
                correlation_id,
            ))
        }
        Err(why) => {
            let message = format!("structured output is unavailable for this model: {why}");
            Err(invalid(field, "available".into(), message, correlation_id))
        }
    }
}

/// The request field a prompt came in.
fn prompt_field(prompt: &Prompt) -> &'static str {
    match prompt {
        Prompt::Text { .. } => "prompt",
        Prompt::Chat { .. } => "messages",
    }
}

fn invalid(field: &str, constraint: String, message: String, correlation_id: &str) -> ApiError {
    let error = FieldError {
        field: field.into(),
        constraint,
        message,
        value: None,
    };
    ApiError::invalid(vec![error], correlation_id)
}

/// Template + tokenize off the async threads.
async fn tokenize(
    loaded: &Arc<Loaded>,
    prompt: &Prompt,
    correlation_id: &str,
) -> Result<Vec<u32>, ApiError> {
    let (model, owned) = (loaded.clone(), prompt.clone());
    let tokens = tokio::task::spawn_blocking(move || match &owned {
        Prompt::Text { text, raw } => model.formatter.tokenize(&model.tokenizer, text, *raw),
        Prompt::Chat {
            messages,
            tools,
            continue_final,
        } => {
            let (formatter, tools) = (&model.formatter, tools.as_deref());
            match continue_final {
                true => formatter.tokenize_continuation(&model.tokenizer, messages, tools),
                false => formatter.tokenize_chat(&model.tokenizer, messages, tools),
            }
        }
    })
    .await
    .map_err(|err| ApiError::new(ErrorCode::Internal, err.to_string(), correlation_id))?;
    tokens.map_err(|err| {
        let constraint = match err {
            PromptError::NoTemplate => "chat_template",
            PromptError::NotContinuable => "prefill",
            _ => "tokenizable",
        };
        invalid(
            prompt_field(prompt),
            constraint.into(),
            err.to_string(),
            correlation_id,
        )
    })
}

/// The context rules: `--max-prompt-tokens`, and room for `max_tokens` after the prompt. An
/// absent `max_tokens` becomes what the context leaves, at most `--max-tokens-out`.
fn max_tokens(
    shared: &Shared,
    loaded: &Loaded,
    job: &JobSpec,
    prompt_tokens: usize,
    correlation_id: &str,
) -> Result<usize, ApiError> {
    let field = prompt_field(&job.prompt);
    if let Some(budget) = shared.settings.max_prompt_tokens
        && prompt_tokens > budget as usize
    {
        let message = format!(
            "the prompt is {prompt_tokens} tokens; this worker takes at most {budget} per job (--max-prompt-tokens)"
        );
        let constraint = format!("max_prompt_tokens({budget})");
        return Err(invalid(field, constraint, message, correlation_id));
    }
    let context = loaded.context_length;
    let cap = shared.settings.max_tokens_out as usize;
    let wanted = match job.max_tokens {
        Some(max_tokens) => max_tokens as usize,
        None => cap.min(context.saturating_sub(prompt_tokens)).max(1),
    };
    if prompt_tokens > context.saturating_sub(wanted) {
        let overflow = ContextOverflow {
            prompt_tokens,
            max_tokens: wanted,
            context,
        };
        return Err(ApiError::context_overflow(field, overflow, correlation_id));
    }
    Ok(wanted)
}

/// What the log says of a prompt instead of its text: its length in characters and a hash.
fn prompt_summary(prompt: &Prompt) -> (usize, u64) {
    match prompt {
        Prompt::Text { text, .. } => (text.chars().count(), fnv1a(text.as_bytes())),
        Prompt::Chat { messages, .. } => {
            messages.iter().fold((0, fnv1a(b"")), |(chars, hash), m| {
                let bytes = [m.role.as_bytes(), b"\0", m.content.as_bytes(), b"\0"].concat();
                (chars + m.content.chars().count(), fnv1a_from(hash, &bytes))
            })
        }
    }
}

/// FNV-1a: a stable hash to log instead of the prompt.
fn fnv1a(bytes: &[u8]) -> u64 {
    fnv1a_from(0xcbf2_9ce4_8422_2325, bytes)
}

/// FNV-1a continued from `hash`.
fn fnv1a_from(hash: u64, bytes: &[u8]) -> u64 {
    bytes.iter().fold(hash, |hash, &byte| {
        (hash ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// A job's events as the engine sends them, ending after the terminal one (one `INTERNAL` end
/// if the sender goes away without one). Dropping it before the end (the client went away)
/// cancels the job, queued or running.
pub struct JobEvents {
    job_id: String,
    /// For the log line of a cancel on the client's stall.
    worker_id: String,
    correlation_id: String,
    receiver: mpsc::UnboundedReceiver<JobEvent>,
    cancel: CancelToken,
    ended: bool,
    /// The queue and the job's ticket, to take the job out at once if the client leaves while
    /// it waits.
    queued: Option<(Arc<Shared>, Ticket)>,
    /// The connection the answer is sent on (absent in in-process tests).
    connection: Option<Arc<Connection>>,
}

impl JobEvents {
    /// The job's id.
    pub fn job_id(&self) -> &str {
        &self.job_id
    }
}

impl Stream for JobEvents {
    type Item = JobEvent;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<JobEvent>> {
        if self.ended {
            return Poll::Ready(None);
        }
        let event = std::task::ready!(self.receiver.poll_recv(cx)).unwrap_or_else(lost);
        self.ended = matches!(event, JobEvent::End(_));
        Poll::Ready(Some(event))
    }
}

/// The end of a job whose events' sender went away before its end: the engine thread died with
/// it (the engine ends every job it holds, so this is the last line of defence).
fn lost() -> JobEvent {
    JobEvent::End(JobEnd::worker_failed(
        ErrorCode::Internal,
        "the worker lost this job without ending it; send it to another worker",
    ))
}

impl Drop for JobEvents {
    /// The client left: a waiting job leaves the queue now, a running one at the next step.
    fn drop(&mut self) {
        if self.ended {
            return;
        }
        self.cancel.cancel();
        if self.connection.as_ref().is_some_and(|c| c.stalled()) {
            tracing::info!(
                event = "cancel",
                worker_id = %self.worker_id,
                job_id = %self.job_id,
                correlation_id = %self.correlation_id,
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

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_stream_whose_sender_goes_away_ends_once_with_internal() {
        use futures_util::StreamExt;
        let (sender, receiver) = mpsc::unbounded_channel();
        let mut events = JobEvents {
            job_id: "j".into(),
            worker_id: "w".into(),
            correlation_id: "c".into(),
            receiver,
            cancel: CancelToken::new(),
            ended: false,
            queued: None,
            connection: None,
        };
        drop(sender);
        let end = events.next().await;
        assert!(
            matches!(
                end,
                Some(JobEvent::End(JobEnd::Failed {
                    code: ErrorCode::Internal,
                    retriable: true,
                    ..
                }))
            ),
            "{end:?}"
        );
        assert!(events.next().await.is_none());
        drop(events);
    }

    #[test]
    fn fnv1a_matches_the_reference_values() {
        assert_eq!(fnv1a(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a(b"a"), 0xaf63_dc4c_8601_ec8c);
    }
}
