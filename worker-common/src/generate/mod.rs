//! THE generation loop, shared by every backend: chunked prefill → sample → stream-decode →
//! stop checks → events, with a cancel and deadline check between chunks and every step.
//!
//! [`generate`] sends `token` and `metrics` events through an [`EventSink`] and returns how the
//! job ended ([`Finished`] or [`GenerateError`]); the caller turns that into the stream's one
//! terminal event.

mod prompt;
mod stop;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

pub use prompt::{CHAT_TEMPLATE_KEY, PromptError, PromptFormatter};
pub use stop::{Released, StopMatcher};

use crate::backend::{BackendError, InferenceBackend};
use crate::sampling::{Sampler, SamplingParams};
use crate::tokenizer::Tokenizer;
use crate::tokenizer::stream::StreamDecoder;

/// Prompt tokens per prefill `forward` call; the cancel check runs between chunks.
pub const PREFILL_CHUNK: usize = 256;

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
    /// Time of the prefill `forward` calls and the first token's choice.
    pub prefill_time_ms: f64,
    /// From the start of the job to the first sampled token.
    pub time_to_first_token_ms: f64,
    /// From the first sampled token to the end.
    pub decode_time_ms: f64,
    /// Of the decode time, the steps: the backend's `forward` calls and the tokens' choice
    /// (the rest is detokenizing, stop checks and sending events).
    pub decode_steps_ms: f64,
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
}

/// Runs one job on `backend` and streams its text to `sink`. The backend's sequence is always
/// ended (KV and scratch released), whatever the outcome.
pub fn generate<B: InferenceBackend>(
    backend: &mut B,
    tokenizer: &Tokenizer,
    context: usize,
    request: &GenerateRequest,
    cancel: &CancelToken,
    sink: &mut dyn EventSink,
) -> Result<Finished, GenerateError> {
    let prompt_tokens = request.prompt_tokens.len();
    if prompt_tokens == 0 || request.max_tokens == 0 {
        return Err(GenerateError::InvalidRequest(format!(
            "{prompt_tokens} prompt tokens and max_tokens {} (both must be ≥ 1)",
            request.max_tokens
        )));
    }
    let max_len = prompt_tokens + request.max_tokens;
    if max_len > context {
        return Err(GenerateError::ContextLength {
            prompt_tokens,
            max_tokens: request.max_tokens,
            context,
        });
    }
    let start = Instant::now();
    backend.begin_sequence(max_len)?;
    let mut job = Job {
        backend: &mut *backend,
        tokenizer,
        request,
        cancel,
        sink,
        start,
        decode: Duration::ZERO,
    };
    let outcome = job.run();
    backend.end_sequence();
    outcome
}

/// The state of one running job.
struct Job<'a, B> {
    backend: &'a mut B,
    tokenizer: &'a Tokenizer,
    request: &'a GenerateRequest,
    cancel: &'a CancelToken,
    sink: &'a mut dyn EventSink,
    start: Instant,
    /// Time in decode steps (`forward` and the token's choice) so far.
    decode: Duration,
}

/// Milliseconds since `since`, fractional.
fn ms_since(since: Instant) -> f64 {
    since.elapsed().as_secs_f64() * 1e3
}

impl<B: InferenceBackend> Job<'_, B> {
    fn check(&self) -> Result<(), GenerateError> {
        if self.cancel.is_cancelled() {
            return Err(GenerateError::Cancelled);
        }
        match self.request.deadline {
            Some(deadline) if Instant::now() >= deadline => Err(GenerateError::Timeout),
            _ => Ok(()),
        }
    }

    /// Prefills the prompt chunk by chunk and picks the first token; returns it with the time
    /// the prefill took (the `forward` calls and that choice).
    fn prefill(&mut self, sampler: &mut Sampler) -> Result<(u32, f64), GenerateError> {
        let prompt = &self.request.prompt_tokens;
        let start = Instant::now();
        let chunks = prompt.len().div_ceil(PREFILL_CHUNK);
        let mut token = 0;
        for (i, chunk) in prompt.chunks(PREFILL_CHUNK).enumerate() {
            self.check()?;
            if i + 1 < chunks {
                self.backend.forward(chunk, i * PREFILL_CHUNK)?;
            } else {
                token = self.step(sampler, chunk, i * PREFILL_CHUNK, prompt)?;
            }
        }
        Ok((token, ms_since(start)))
    }

    /// Runs `tokens` at `start_pos..` and picks the next token: the backend's own greedy
    /// choice when it computes one and the request is plain greedy, else the sampler's.
    fn step(
        &mut self,
        sampler: &mut Sampler,
        tokens: &[u32],
        start_pos: usize,
        history: &[u32],
    ) -> Result<u32, GenerateError> {
        if B::COMPUTES_GREEDY && sampler.is_plain_greedy() {
            return Ok(self.backend.forward_greedy(tokens, start_pos)?);
        }
        let logits = self.backend.forward(tokens, start_pos)?;
        Ok(sampler.sample(logits, history))
    }

    fn run(&mut self) -> Result<Finished, GenerateError> {
        let mut sampler = Sampler::new(self.request.sampling);
        let mut history = self.request.prompt_tokens.clone();
        let (mut token, prefill_time_ms) = self.prefill(&mut sampler)?;
        let first_token_at = Instant::now();
        let mut text = TextStream::new(&self.request.stop);
        let mut tokens = Vec::with_capacity(self.request.max_tokens);
        let mut last_metrics = first_token_at;
        let (stop_reason, matched) = loop {
            if self.tokenizer.is_end_of_generation(token) {
                break (StopReason::Eos, None);
            }
            tokens.push(token);
            history.push(token);
            let released = text.push(&self.tokenizer.token_bytes(token));
            self.emit(&mut text, released.text)?;
            if let Some(stop) = released.matched {
                break (StopReason::StopSequence, Some(stop));
            }
            if tokens.len() == self.request.max_tokens {
                break (StopReason::MaxTokens, None);
            }
            self.check()?;
            if last_metrics.elapsed() >= METRICS_INTERVAL {
                last_metrics = Instant::now();
                self.metrics(tokens.len(), first_token_at)?;
            }
            let step = Instant::now();
            token = self.step(&mut sampler, &[token], history.len() - 1, &history)?;
            self.decode += step.elapsed();
        };
        if matched.is_none() {
            let rest = text.finish();
            self.emit(&mut text, rest)?;
        }
        Ok(Finished {
            stop_reason,
            stop_sequence_matched: matched,
            tokens,
            prompt_tokens: self.request.prompt_tokens.len(),
            prefill_time_ms,
            time_to_first_token_ms: first_token_at.duration_since(self.start).as_secs_f64() * 1e3,
            decode_time_ms: ms_since(first_token_at),
            decode_steps_ms: self.decode.as_secs_f64() * 1e3,
        })
    }

    fn emit(&mut self, text: &mut TextStream, piece: String) -> Result<(), GenerateError> {
        if piece.is_empty() {
            return Ok(());
        }
        let index = text.events;
        text.events += 1;
        let event = GenerateEvent::Token { text: piece, index };
        if self.sink.send(event) {
            Ok(())
        } else {
            Err(GenerateError::Cancelled)
        }
    }

    fn metrics(&mut self, tokens_out: usize, since: Instant) -> Result<(), GenerateError> {
        let seconds = since.elapsed().as_secs_f64();
        let event = GenerateEvent::Metrics {
            tokens_out,
            decode_time_ms: (seconds * 1e3) as u64,
            tokens_per_sec: if seconds > 0.0 {
                tokens_out as f64 / seconds
            } else {
                0.0
            },
            memory_bytes: self.backend.info().memory.total(),
        };
        if self.sink.send(event) {
            Ok(())
        } else {
            Err(GenerateError::Cancelled)
        }
    }
}

/// Token bytes → UTF-8 fragments → stop-string hold-back.
struct TextStream {
    decoder: StreamDecoder,
    stops: StopMatcher,
    events: usize,
}

impl TextStream {
    fn new(stops: &[String]) -> Self {
        Self {
            decoder: StreamDecoder::new(),
            stops: StopMatcher::new(stops),
            events: 0,
        }
    }

    fn push(&mut self, piece: &[u8]) -> Released {
        match self.decoder.push(piece) {
            Some(text) => self.stops.push(&text),
            None => Released {
                text: String::new(),
                matched: None,
            },
        }
    }

    /// Text still held when generation ends without a stop string.
    fn finish(&mut self) -> String {
        let tail = std::mem::take(&mut self.decoder)
            .finish()
            .unwrap_or_default();
        let mut released = self.stops.push(&tail);
        if released.matched.is_none() {
            released.text.push_str(&self.stops.finish());
        }
        released.text
    }
}
