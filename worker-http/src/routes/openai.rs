//! OpenAI's routes: `GET /v1/models` (and `/v1/models/{model}`), `POST /v1/chat/completions`,
//! `POST /v1/completions`. A
//! request is validated into the same job as `/execute`'s and submitted the same way; only the
//! answer's shape differs (streamed `data:` chunks ending with `[DONE]`, or one JSON reply).

use std::collections::VecDeque;
use std::convert::Infallible;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{SystemTime, UNIX_EPOCH};

use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, State};
use axum::http::HeaderMap;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use bytes::Bytes;
use futures_util::Stream;
use serde_json::{Value, json};
use worker_common::generate::{Finished, GenerateEvent, TokenLogprob};

use super::execute::KEEP_ALIVE;
use super::reply::{TextParser, collect, reasoning_format, tool_format};
use super::{body_or_error, content_type};
use crate::api::openai::{Endpoint, Logprobs, OpenAiRequest, Piece, Reply, error_body};
use crate::api::{ApiError, ErrorCode, JobSpec, Limits};
use crate::connections::Connection;
use crate::correlation::CorrelationId;
use crate::job_end::{JobEnd, JobEvent};
use crate::state::Shared;
use crate::submit::{JobEvents, Origin, accepting, submit};

/// Seconds since the Unix epoch.
pub(super) fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |since| since.as_secs())
}

/// `GET /v1/models`: the loaded model, with what `/health` advertises about it.
pub async fn models(
    State(shared): State<Arc<Shared>>,
    CorrelationId(correlation_id): CorrelationId,
) -> Result<Json<Value>, ApiError> {
    let loaded = accepting(&shared, &correlation_id)?;
    let id = &loaded.model_name;
    // Anthropic's page keys beside OpenAI's list (its SDKs' models.list reads them).
    Ok(Json(json!({
        "object": "list",
        "data": [model_object(&shared, &loaded)],
        "has_more": false,
        "first_id": id,
        "last_id": id,
    })))
}

/// `GET /v1/models/{model}` (the SDKs' `models.retrieve`): the loaded model's object when
/// `model` is its id, else 404.
pub async fn model(
    State(shared): State<Arc<Shared>>,
    CorrelationId(correlation_id): CorrelationId,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    let loaded = accepting(&shared, &correlation_id)?;
    if id != loaded.model_name {
        let message = format!(
            "The model '{id}' does not exist: this worker serves '{}'",
            loaded.model_name
        );
        return Err(ApiError::not_found(message, &correlation_id));
    }
    Ok(Json(model_object(&shared, &loaded)))
}

/// The model object of `/v1/models`: OpenAI's keys, then Anthropic's (`type`,
/// `display_name`, `created_at`, `lifecycle`, `max_input_tokens`, `max_tokens`), so both SDKs'
/// `models.list` and `models.retrieve` read it.
fn model_object(shared: &Shared, loaded: &crate::state::Loaded) -> Value {
    let settings = &shared.settings;
    let started = SystemTime::now()
        .checked_sub(shared.uptime())
        .unwrap_or(UNIX_EPOCH);
    json!({
        "id": loaded.model_name,
        "object": "model",
        "created": unix_now().saturating_sub(shared.uptime().as_secs()),
        "owned_by": "llama-orch",
        "type": "model",
        "display_name": loaded.model_name,
        "created_at": crate::clock::rfc3339(started),
        "lifecycle": "active",
        "max_input_tokens": loaded.context_length,
        "max_tokens": settings.max_tokens_out,
        "meta": {
            "worker_id": settings.worker_id,
            "worker_type": settings.worker_type,
            "context_length": loaded.context_length,
            "vocab_size": loaded.vocab_size,
            "quant_kind": loaded.quant_kind,
            "tokenizer_kind": loaded.tokenizer_kind,
            "chat_template": loaded.formatter.has_template(),
            "slots": loaded.slots,
            "max_tokens_out": settings.max_tokens_out,
            "capabilities": loaded.capabilities,
        },
    })
}

/// `POST /v1/chat/completions`.
pub async fn chat_completions(
    State(shared): State<Arc<Shared>>,
    CorrelationId(correlation_id): CorrelationId,
    connection: Option<Extension<Arc<Connection>>>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let connection = connection.map(|Extension(connection)| connection);
    let request = parse(Endpoint::Chat, &shared, &correlation_id, &headers, body)?;
    answer(Endpoint::Chat, &shared, correlation_id, connection, request).await
}

/// `POST /v1/completions`.
pub async fn completions(
    State(shared): State<Arc<Shared>>,
    CorrelationId(correlation_id): CorrelationId,
    connection: Option<Extension<Arc<Connection>>>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let connection = connection.map(|Extension(connection)| connection);
    let request = parse(
        Endpoint::Completions,
        &shared,
        &correlation_id,
        &headers,
        body,
    )?;
    answer(
        Endpoint::Completions,
        &shared,
        correlation_id,
        connection,
        request,
    )
    .await
}

fn parse(
    endpoint: Endpoint,
    shared: &Shared,
    correlation_id: &str,
    headers: &HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<OpenAiRequest, ApiError> {
    let body = body_or_error(shared, body, correlation_id)?;
    let limits = Limits {
        max_tokens_out: shared.settings.max_tokens_out,
    };
    OpenAiRequest::parse(endpoint, content_type(headers), &body, limits)
        .map_err(|errors| ApiError::invalid(errors, correlation_id))
}

/// Submits the request's jobs (one per choice) and answers: a stream of chunks, or the whole
/// reply when every job has ended.
async fn answer(
    endpoint: Endpoint,
    shared: &Arc<Shared>,
    correlation_id: String,
    connection: Option<Arc<Connection>>,
    request: OpenAiRequest,
) -> Result<Response, ApiError> {
    let prefix = match endpoint {
        Endpoint::Chat => "chatcmpl",
        Endpoint::Completions => "cmpl",
    };
    let mut request = request;
    let tools = request.tools.as_ref();
    let tool_format = tool_format(shared, tools, &mut request.job, &correlation_id)?;
    let reasoning = match endpoint {
        Endpoint::Chat => reasoning_format(shared, &correlation_id)?,
        // The text of `/v1/completions` is the model's raw output, markers included.
        Endpoint::Completions => None,
    };
    let job_id = format!("{prefix}-{}", uuid::Uuid::new_v4().simple());
    let logprobs = request.job.sampling.logprobs.is_some();
    // Each choice is a job of its own; an error on one drops (cancels) those accepted before.
    let mut choices = Vec::with_capacity(request.choices);
    for index in 0..request.choices {
        let origin = Origin {
            job_id: choice_job_id(&job_id, index, request.choices),
            correlation_id: correlation_id.clone(),
            connection: connection.clone(),
        };
        let job = choice_job(&request.job, index);
        let accepted = submit(shared, origin, job).await?;
        let reply = Reply {
            endpoint,
            id: job_id.clone(),
            created: unix_now(),
            model: accepted.started.model.clone(),
            logprobs,
            tokens_as_ids: request.tokens_as_ids,
            index,
        };
        let parser = TextParser::new(reasoning, tool_format, tools, request.stream);
        choices.push((reply, accepted.events, parser));
    }
    if request.stream {
        let chunks = ChunkStream::new(choices, request.include_usage);
        let sse = Sse::new(chunks).keep_alive(KeepAlive::new().interval(KEEP_ALIVE));
        return Ok(sse.into_response());
    }
    let collected = choices.into_iter().map(|(reply, events, parser)| async {
        let whole = collect(events, parser, &correlation_id).await?;
        Ok::<_, ApiError>((reply, whole))
    });
    let collected = futures_util::future::try_join_all(collected).await?;
    let bodies = collected.iter().map(|(reply, whole)| {
        let (content, reasoning) = (whole.content(), whole.reasoning());
        reply.whole_choice(
            &content,
            &reasoning,
            &whole.calls(),
            &whole.tokens,
            &whole.done,
        )
    });
    let bodies: Vec<Value> = bodies.collect();
    let dones: Vec<&Finished> = collected.iter().map(|(_, whole)| &whole.done).collect();
    let (first, _) = collected.first().ok_or_else(|| {
        ApiError::new(
            ErrorCode::Internal,
            "a request of no choices",
            &correlation_id,
        )
    })?;
    Ok(Json(first.whole(bodies, &dones)).into_response())
}

/// Choice `index`'s job id: the reply's id for a request of one choice, else `<id>-<index>`.
fn choice_job_id(job_id: &str, index: usize, choices: usize) -> String {
    if choices == 1 {
        job_id.to_owned()
    } else {
        format!("{job_id}-{index}")
    }
}

/// Choice `index`'s job: the request's, its seed (when given) advanced by `index`, so that a
/// seeded request of `n` choices is reproducible and its choices differ when sampled.
pub(super) fn choice_job(job: &JobSpec, index: usize) -> JobSpec {
    let mut job = job.clone();
    job.seed = job.seed.map(|seed| seed.wrapping_add(index as u64));
    job
}

/// One choice of a stream: its reply's chunk builder, its job's events and its text parser.
struct ChoiceStream {
    reply: Reply,
    events: JobEvents,
    /// Cuts reasoning and tool calls out of the text.
    parser: TextParser,
    /// Tool calls sent so far.
    calls: usize,
    /// Characters sent so far (completions' `text_offset`).
    sent_chars: usize,
    /// The job's end, once it finished.
    finished: Option<Finished>,
    ended: bool,
}

/// A request's jobs' events as OpenAI's chunks, each choice's carrying its index: (chat) the
/// role, the text as it comes, the finish reason; when every job has ended (with
/// `include_usage`) the usage, then `[DONE]`. A failed job sends an `error` object, as vLLM
/// does. Dropping it cancels the jobs ([`JobEvents`]).
struct ChunkStream {
    choices: Vec<ChoiceStream>,
    include_usage: bool,
    ready: VecDeque<Event>,
    /// Whether a job failed (then no usage chunk).
    failed: bool,
    closed: bool,
    /// The choice polled first next time, so that no choice waits behind another.
    next: usize,
}

impl ChunkStream {
    fn new(choices: Vec<(Reply, JobEvents, TextParser)>, include_usage: bool) -> Self {
        let mut ready = VecDeque::new();
        let choices = choices
            .into_iter()
            .map(|(reply, events, parser)| {
                ready.extend(reply.role_chunk().iter().map(data));
                ChoiceStream {
                    reply,
                    events,
                    parser,
                    calls: 0,
                    sent_chars: 0,
                    finished: None,
                    ended: false,
                }
            })
            .collect();
        Self {
            choices,
            include_usage,
            ready,
            failed: false,
            closed: false,
            next: 0,
        }
    }

    /// Queues the usage (when asked and every job finished) and `[DONE]`.
    fn close(&mut self) {
        if self.include_usage && !self.failed {
            let dones: Vec<&Finished> = self
                .choices
                .iter()
                .filter_map(|c| c.finished.as_ref())
                .collect();
            if let Some(first) = self.choices.first() {
                self.ready.push_back(data(&first.reply.usage_chunk(&dones)));
            }
        }
        self.ready.push_back(Event::default().data("[DONE]"));
        self.closed = true;
    }
}

impl ChoiceStream {
    /// Queues what `event` sends into `ready`; true when it was the job's last, and whether
    /// the job failed.
    fn push(&mut self, event: JobEvent, ready: &mut VecDeque<Event>) -> (bool, bool) {
        match event {
            JobEvent::Generate(GenerateEvent::Token { text, logprobs, .. }) => {
                let released = self.parser.push(text);
                self.send_pieces(released, &logprobs, ready);
                (false, false)
            }
            JobEvent::Generate(GenerateEvent::Metrics { .. }) => (false, false),
            JobEvent::End(JobEnd::Finished(done)) => {
                let rest = self.parser.finish();
                self.send_pieces(rest, &[], ready);
                ready.push_back(data(&self.reply.finish_chunk(&done, self.calls > 0)));
                self.finished = Some(done);
                (true, false)
            }
            JobEvent::End(JobEnd::Failed { code, message, .. }) => {
                let error = error_body(code, code.status(), &message, None);
                ready.push_back(data(&error));
                (true, true)
            }
        }
    }
}

impl ChoiceStream {
    /// Queues content, reasoning and tool-call chunks; the event's log-probabilities ride with
    /// its first content chunk (a call's and the reasoning's tokens have none in a stream).
    fn send_pieces(
        &mut self,
        pieces: Vec<Piece>,
        logprobs: &[TokenLogprob],
        ready: &mut VecDeque<Event>,
    ) {
        let mut logprobs = Some(logprobs);
        for piece in pieces {
            let chunk = match piece {
                Piece::Content(text) => {
                    let offset = self.sent_chars;
                    self.sent_chars += text.chars().count();
                    let tokens = logprobs.take().unwrap_or_default();
                    self.reply.text_chunk(&text, Logprobs { tokens, offset })
                }
                Piece::Reasoning(text) => self.reply.reasoning_chunk(&text),
                Piece::Call(call) | Piece::CallStart(call) => {
                    self.calls += 1;
                    self.reply.tool_call_chunk(self.calls - 1, &call)
                }
                Piece::Arguments(text) => self
                    .reply
                    .arguments_chunk(self.calls.saturating_sub(1), &text),
            };
            ready.push_back(data(&chunk));
        }
    }
}

/// A `data:` event holding `value`.
fn data(value: &Value) -> Event {
    Event::default().data(value.to_string())
}

impl Stream for ChunkStream {
    type Item = Result<Event, Infallible>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = &mut *self;
        loop {
            if let Some(event) = this.ready.pop_front() {
                return Poll::Ready(Some(Ok(event)));
            }
            if this.closed {
                return Poll::Ready(None);
            }
            if this.choices.iter().all(|c| c.ended) {
                this.close();
                continue;
            }
            // Each open choice in turn, from the one after the last that sent.
            let count = this.choices.len();
            let mut progressed = false;
            for k in 0..count {
                let i = (this.next + k) % count;
                let choice = &mut this.choices[i];
                if choice.ended {
                    continue;
                }
                match Pin::new(&mut choice.events).poll_next(cx) {
                    Poll::Ready(Some(event)) => {
                        let (ended, failed) = choice.push(event, &mut this.ready);
                        choice.ended = ended;
                        this.failed |= failed;
                    }
                    Poll::Ready(None) => choice.ended = true,
                    Poll::Pending => continue,
                }
                this.next = (i + 1) % count;
                progressed = true;
                break;
            }
            if !progressed {
                return Poll::Pending;
            }
        }
    }
}
