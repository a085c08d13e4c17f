//! THE per-job generation logic, shared by every backend: a [`Sequence`] per job (sample →
//! stream-decode → stop checks → events, cancel and deadline), stepped by the
//! [`Scheduler`] together with every other running job.
//!
//! A sequence sends `token` and `metrics` events through an [`EventSink`] and ends with
//! [`Finished`] or a [`GenerateError`]; the caller turns that into the stream's one terminal
//! event. [`generate`] runs one job alone, for the terminal tools and the tests.

mod prompt;
mod sequence;
pub mod speculation;
mod stop;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

pub use prompt::{CHAT_TEMPLATE_KEY, PromptError, PromptFormatter, TemplateRendering};
pub use sequence::{Sequence, StepContext};
pub use speculation::Speculation;
pub use stop::{Released, StopMatcher};

use crate::backend::{BackendError, InferenceBackend, PAGE_SIZE};
use crate::grammar::{Constraint, GrammarError};
use crate::sampling::SamplingParams;
use crate::schedule::{Scheduler, SchedulerConfig};
use crate::tokenizer::Tokenizer;

/// How often a `metrics` event is sent while decoding.
pub const METRICS_INTERVAL: Duration = Duration::from_millis(500);

/// A job's cancellation flag, shared by the HTTP side (cancel, disconnect) and the engine.
#[derive(Debug, Clone, Default)]
pub struct CancelToken(Arc<AtomicBool>);

impl CancelToken {
    /// A token not yet cancelled.
    pub fn new() -> Self {
        Self::default()
    }

    /// Asks the job to stop; idempotent.
    pub fn cancel(&self) {
        self.0.store(true, Ordering::Release);
    }

    /// Whether [`cancel`](Self::cancel) was called.
    pub fn is_cancelled(&self) -> bool {
        self.0.load(Ordering::Acquire)
    }
}

/// One generation job, prompt already tokenized.
#[derive(Debug, Clone)]
pub struct GenerateRequest {
    /// Prompt token ids (template applied, BOS included).
    pub prompt_tokens: Vec<u32>,
    /// Generated tokens at most (≥ 1).
    pub max_tokens: usize,
    /// Sampler settings, seed included.
    pub sampling: SamplingParams,
    /// Stop strings, matched on the decoded text.
    pub stop: Vec<String>,
    /// When the job must end with [`GenerateError::Timeout`].
    pub deadline: Option<Instant>,
    /// An end-of-generation token does not end the job: it is streamed as text like any other
    /// (benchmarks that need exactly `max_tokens`).
    pub ignore_eos: bool,
    /// The grammar the output must follow, compiled for this job.
    pub grammar: Option<Constraint>,
    /// Whether the scheduler may draft tokens for this job when the worker speculates
    /// (specs/SPECULATIVE.md); `false` is the request's opt-out.
    pub speculative: bool,
}

/// A streamed event of a running job.
#[derive(Debug, Clone, PartialEq)]
pub enum GenerateEvent {
    /// New text; `index` counts token events from 0, contiguously.
    Token {
        /// UTF-8 text, never a partial code point, never part of a stop string.
        text: String,
        /// Event index.
        index: usize,
        /// With `logprobs` asked: one entry per token sampled since the previous event, in
        /// order (a token whose text is held back rides with the event that releases it).
        logprobs: Vec<TokenLogprob>,
    },
    /// Progress while decoding, about every [`METRICS_INTERVAL`].
    Metrics {
        /// Tokens generated so far.
        tokens_out: usize,
        /// Time spent decoding so far.
        decode_time_ms: u64,
        /// `tokens_out` per second of decode time.
        tokens_per_sec: f64,
        /// Memory the backend holds (weights + KV + scratch).
        memory_bytes: u64,
    },
}

/// One token and its log-probability.
#[derive(Debug, Clone, PartialEq)]
pub struct LogprobEntry {
    /// The token id.
    pub id: u32,
    /// Its bytes (possibly part of a UTF-8 character).
    pub bytes: Vec<u8>,
    /// Its log-probability after logit bias and penalties, before temperature and truncation.
    pub logprob: f64,
}

/// A generated token's log-probability and the most probable alternatives at its step.
#[derive(Debug, Clone, PartialEq)]
pub struct TokenLogprob {
    /// The token that was chosen.
    pub chosen: LogprobEntry,
    /// The most probable tokens, most probable first (`logprobs` of them).
    pub top: Vec<LogprobEntry>,
}

/// Where events go; `false` from `send` means nobody listens any more (the client left), which
/// cancels the job.
pub trait EventSink {
    /// Delivers one event.
    fn send(&mut self, event: GenerateEvent) -> bool;
}

impl<F: FnMut(GenerateEvent) -> bool> EventSink for F {
    fn send(&mut self, event: GenerateEvent) -> bool {
        self(event)
    }
}

impl EventSink for std::sync::mpsc::Sender<GenerateEvent> {
    fn send(&mut self, event: GenerateEvent) -> bool {
        std::sync::mpsc::Sender::send(self, event).is_ok()
    }
}

/// Why generation stopped normally.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopReason {
    /// `max_tokens` were generated.
    MaxTokens,
    /// An end-of-generation token was sampled (not emitted).
    Eos,
    /// A stop string appeared in the text (not emitted).
    StopSequence,
}

impl StopReason {
    /// The contract's spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            StopReason::MaxTokens => "MAX_TOKENS",
            StopReason::Eos => "EOS",
            StopReason::StopSequence => "STOP_SEQUENCE",
        }
    }
}

/// A job that ended normally, with its timings.
#[derive(Debug, Clone, PartialEq)]
pub struct Finished {
    /// Why it stopped.
    pub stop_reason: StopReason,
    /// The stop string, for [`StopReason::StopSequence`].
    pub stop_sequence_matched: Option<String>,
    /// Generated token ids (an end-of-generation token excluded).
    pub tokens: Vec<u32>,
    /// Prompt tokens processed.
    pub prompt_tokens: usize,
    /// Of those, the tokens whose keys and values came from the prefix cache.
    pub cached_tokens: usize,
    /// From the first prefill step to the first token's choice.
    pub prefill_time_ms: f64,
    /// From the start of the job (its admission) to the first sampled token.
    pub time_to_first_token_ms: f64,
    /// From the first sampled token to the end.
    pub decode_time_ms: f64,
    /// Of the decode time, the steps this job was in (shared with the jobs beside it; the rest
    /// is detokenizing, stop checks, sending events and other jobs' work).
    pub decode_steps_ms: f64,
    /// Tokens drafted for the job and drafts the model agreed with (speculation).
    pub speculation: Speculation,
}

/// Why a job ended abnormally.
#[derive(Debug, thiserror::Error)]
pub enum GenerateError {
    /// The cancel token was set or the event receiver went away.
    #[error("the job was cancelled")]
    Cancelled,
    /// The deadline passed.
    #[error("the job exceeded its inference timeout")]
    Timeout,
    /// Prompt plus `max_tokens` exceed the context.
    #[error(
        "{prompt_tokens} prompt tokens + {max_tokens} max_tokens exceed the context of {context}"
    )]
    ContextLength {
        /// Prompt length in tokens.
        prompt_tokens: usize,
        /// Requested generation length.
        max_tokens: usize,
        /// Context size of the worker.
        context: usize,
    },
    /// The request is unusable (empty prompt, max_tokens 0).
    #[error("invalid request: {0}")]
    InvalidRequest(String),
    /// The backend failed.
    #[error(transparent)]
    Backend(#[from] BackendError),
    /// The job's grammar parser failed.
    #[error(transparent)]
    Grammar(#[from] GrammarError),
}

/// Runs one job alone on `backend` and streams its text to `sink`: the scheduler with one
/// sequence, so exactly what the worker computes for the job under any load.
pub fn generate<B: InferenceBackend>(
    backend: &mut B,
    tokenizer: &Tokenizer,
    context: usize,
    request: &GenerateRequest,
    cancel: &CancelToken,
    sink: &mut dyn EventSink,
) -> Result<Finished, GenerateError> {
    check_context(request, context)?;
    let sequence = Sequence::new(request.clone(), cancel.clone())?;
    let config = SchedulerConfig {
        max_running: 1,
        step_tokens: backend.prefill_chunk(),
        prefill_chunk: backend.prefill_chunk(),
        prefix_cache: false,
        // Alone, no decode waits for its prompt.
        paced_prefill: false,
        draft_max: 0,
    };
    let needed = sequence.max_len().div_ceil(PAGE_SIZE);
    if needed > backend.kv_pages() {
        return Err(GenerateError::Backend(BackendError::InvalidInput(format!(
            "the sequence needs {needed} KV pages, the pool has {}",
            backend.kv_pages()
        ))));
    }
    let mut scheduler = Scheduler::new(config, backend.kv_pages(), backend.vocab_size());
    scheduler.admit(Borrowed(sink), sequence);
    loop {
        if let Some(ended) = scheduler.step(backend, tokenizer).pop() {
            return ended.result;
        }
    }
}

/// Refuses a job whose prompt and `max_tokens` exceed `context` positions.
pub fn check_context(request: &GenerateRequest, context: usize) -> Result<(), GenerateError> {
    let prompt_tokens = request.prompt_tokens.len();
    if prompt_tokens + request.max_tokens > context {
        return Err(GenerateError::ContextLength {
            prompt_tokens,
            max_tokens: request.max_tokens,
            context,
        });
    }
    Ok(())
}

/// A borrowed sink as the scheduler's job.
struct Borrowed<'a>(&'a mut dyn EventSink);

impl EventSink for Borrowed<'_> {
    fn send(&mut self, event: GenerateEvent) -> bool {
        self.0.send(event)
    }
}
