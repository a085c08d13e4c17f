//! [`Sequence`]: one job's generation state, stepped by the scheduler. Everything a job does
//! between its prompt and its end (sampling, end-of-generation, stop strings with UTF-8 and
//! stop-string hold-back, `max_tokens`, token and metrics events, cancel and deadline) happens
//! here, once, whatever the number of sequences running beside it.
//!
//! A sequence is its token history (prompt, then each generated token) and how many of those
//! positions have keys and values in its pages (`computed`). The next input is always
//! `history[computed..]`: the prompt at first (in chunks), then one token per step. A sequence
//! preempted for pages starts again from `computed = 0` and re-runs its whole history, which
//! gives the same logits (batch invariance) and so the same tokens, without a gap or a repeat.
//!
//! While decoding, the scheduler may append drafted tokens to the history for one step
//! ([`Sequence::propose`]); the step verifies them and [`Sequence::accept`] keeps the run the
//! model agrees with, then the model's own next token, and forgets the rest
//! (specs/SPECULATIVE.md).

use std::time::{Duration, Instant};

use super::stop::{Released, StopMatcher};
use super::{
    CancelToken, EventSink, Finished, GenerateError, GenerateEvent, GenerateRequest, LogprobEntry,
    METRICS_INTERVAL, StopReason, TokenLogprob,
};
use crate::backend::{BackendError, ChunkOutput, Want};
use crate::grammar::{Constraint, Guide};
use crate::sampling::{Choice, Context, Logprobs, Sampler};
use crate::tokenizer::Tokenizer;
use crate::tokenizer::stream::StreamDecoder;

use super::speculation::{Agreement, Speculation};

/// What [`Sequence::accept`] needs from the step beside the chunk's output.
pub struct StepContext<'a> {
    /// Token text and end-of-generation ids.
    pub tokenizer: &'a Tokenizer,
    /// The backend's memory, for `metrics` events (asked only when one is due: a GPU backend
    /// reads it from the driver).
    pub memory_bytes: &'a dyn Fn() -> u64,
    /// How long the step took.
    pub step_time: Duration,
}

/// One job's state between steps.
pub struct Sequence {
    request: GenerateRequest,
    cancel: CancelToken,
    sampler: Sampler,
    /// The grammar the output follows, if any.
    grammar: Option<Guide>,
    /// The prompt, then every generated token (an end-of-generation token excluded), then
    /// the `drafted` tokens proposed for the step being run.
    history: Vec<u32>,
    drafted: usize,
    /// Tokens drafted and drafts the model agreed with, since the start.
    speculation: Speculation,
    /// How often the model agreed with this sequence's drafts lately.
    agreement: Agreement,
    /// A verify pass's choice was refused by the grammar: the next step takes that position's
    /// choice with the mask, without drafts.
    needs_mask: bool,
    /// Positions of `history` whose keys and values are stored.
    computed: usize,
    /// Prompt tokens whose pages came from the prefix cache.
    cached_tokens: usize,
    generated: usize,
    text: TextStream,
    /// Log-probabilities of tokens whose text is not sent yet (held back, or empty).
    pending_logprobs: Vec<TokenLogprob>,
    started: Instant,
    first_chunk_at: Option<Instant>,
    first_token_at: Option<Instant>,
    prefill_time_ms: f64,
    decode_steps: Duration,
    last_metrics: Instant,
}

impl Sequence {
    /// A sequence for `request`, started now; refuses an empty prompt or `max_tokens` 0.
    pub fn new(mut request: GenerateRequest, cancel: CancelToken) -> Result<Self, GenerateError> {
        let prompt_tokens = request.prompt_tokens.len();
        if prompt_tokens == 0 || request.max_tokens == 0 {
            return Err(GenerateError::InvalidRequest(format!(
                "{prompt_tokens} prompt tokens and max_tokens {} (both must be ≥ 1)",
                request.max_tokens
            )));
        }
        let now = Instant::now();
        let mut history = Vec::with_capacity(prompt_tokens + request.max_tokens);
        history.extend_from_slice(&request.prompt_tokens);
        Ok(Self {
            sampler: Sampler::new(request.sampling.clone()),
            grammar: request.grammar.take().map(Constraint::start),
            text: TextStream::new(&request.stop),
            pending_logprobs: Vec::new(),
            history,
            drafted: 0,
            speculation: Speculation::default(),
            agreement: Agreement::default(),
            needs_mask: false,
            computed: 0,
            cached_tokens: 0,
            generated: 0,
            started: now,
            first_chunk_at: None,
            first_token_at: None,
            prefill_time_ms: 0.0,
            decode_steps: Duration::ZERO,
            last_metrics: now,
            request,
            cancel,
        })
    }

    /// Positions this sequence can reach: prompt plus `max_tokens`.
    pub fn max_len(&self) -> usize {
        self.request.prompt_tokens.len() + self.request.max_tokens
    }

    /// Tokens of the prompt (the first of [`Sequence::history`]).
    pub fn prompt_len(&self) -> usize {
        self.request.prompt_tokens.len()
    }

    /// The tokens run so far or next: the prompt, then the generated tokens, then the drafted
    /// ones while a step verifies them.
    pub fn history(&self) -> &[u32] {
        &self.history
    }

    /// Positions whose keys and values are stored.
    pub fn computed(&self) -> usize {
        self.computed
    }

    /// Tokens still to run before the next token can be chosen (1 while decoding), drafts not
    /// counted.
    pub fn pending(&self) -> usize {
        self.history.len() - self.drafted - self.computed
    }

    /// Tokens drafted for the next step (0 when the sequence does not speculate in it).
    pub fn drafted(&self) -> usize {
        self.drafted
    }

    /// Tokens drafted and drafts accepted since the start.
    pub fn speculation(&self) -> Speculation {
        self.speculation
    }

    /// Most tokens worth drafting now: 0 unless the sequence is decoding and did not opt out;
    /// else one less than the tokens it may still generate (a verify pass emits up to one more
    /// than it drafts).
    pub fn draft_room(&self) -> usize {
        let ready = self.pending() == 1 && self.drafted == 0 && !self.needs_mask;
        if !self.request.speculative || !ready {
            return 0;
        }
        (self.request.max_tokens - self.generated).saturating_sub(1)
    }

    /// How many tokens to draft: at most `max` and [`draft_room`](Self::draft_room), and only
    /// those whose chance of agreement, by this sequence's agreement so far, exceeds `cost`
    /// (the chance at which a draft pays for the compute it takes).
    pub fn draft_len(&mut self, cost: f64, max: usize) -> usize {
        let room = max.min(self.draft_room());
        self.agreement.worth(cost, room)
    }

    /// Appends `drafts` (at most [`draft_room`](Self::draft_room), and only as many as its
    /// grammar allows in a row) for the next step: its chunk is then the next input and the
    /// drafts, and it wants the greedy choice after each.
    pub fn propose(&mut self, drafts: &[u32]) {
        let mut take = drafts.len().min(self.draft_room());
        if let Some(grammar) = &self.grammar {
            // A grammar that fails here fails again, and is reported, where the job takes its
            // next token.
            take = grammar
                .allowed_prefix(&drafts[..take])
                .unwrap_or(0)
                .min(take);
        }
        self.history.extend_from_slice(&drafts[..take]);
        self.drafted = take;
        self.speculation.drafted += take as u64;
    }

    /// Forgets the drafts of a step that did not run.
    pub fn clear_drafts(&mut self) {
        self.history.truncate(self.history.len() - self.drafted);
        self.drafted = 0;
    }

    /// Prompt tokens taken from the prefix cache.
    pub fn cached_tokens(&self) -> usize {
        self.cached_tokens
    }

    /// Records that the first `tokens` positions' keys and values came from the prefix cache.
    pub fn start_from_cache(&mut self, tokens: usize) {
        self.computed = tokens.min(self.history.len().saturating_sub(1));
        if self.first_token_at.is_none() {
            self.cached_tokens = self.computed;
        }
    }

    /// Forgets every stored position (its pages were taken back): the history runs again.
    pub fn preempt(&mut self) {
        self.clear_drafts();
        self.computed = 0;
    }

    /// Whether the job must end now: cancelled, or past its deadline.
    pub fn check(&self) -> Result<(), GenerateError> {
        if self.cancel.is_cancelled() {
            return Err(GenerateError::Cancelled);
        }
        match self.request.deadline {
            Some(deadline) if Instant::now() >= deadline => Err(GenerateError::Timeout),
            _ => Ok(()),
        }
    }

    /// What a chunk of the next `len` pending tokens asks the backend for: nothing before the
    /// end of the history, else the greedy id (among the grammar's allowed ids) when that is
    /// all the sampler would compute; with drafts, that after every position.
    pub fn want(&self, len: usize) -> Want<'_> {
        if self.drafted > 0 {
            return match self.sampler.is_plain_greedy() {
                true => Want::GreedyEach,
                false => Want::LogitsEach,
            };
        }
        if self.computed + len < self.history.len() {
            return Want::Nothing;
        }
        match &self.grammar {
            _ if !self.sampler.is_plain_greedy() => Want::Logits,
            Some(grammar) => Want::GreedyAmong(grammar),
            None => Want::Greedy,
        }
    }

    /// Whether the sequence's next token waits for a grammar mask that is late
    /// ([`Guide::is_late`]): a step now would hold every other sequence until it is there.
    pub fn waits_for_mask(&self) -> bool {
        self.pending() == 1 && self.grammar.as_ref().is_some_and(Guide::is_late)
    }

    /// Marks a chunk of this sequence as being run now (the prefill clock starts at the first).
    pub fn chunk_started(&mut self, at: Instant) {
        self.first_chunk_at.get_or_insert(at);
    }

    /// Takes a step's result for the sequence's chunk of `len` tokens: stores the progress and,
    /// at the end of the history, chooses the next token and streams it to `sink`. Returns how
    /// the job ended, or `None` while it goes on.
    pub fn accept(
        &mut self,
        len: usize,
        output: ChunkOutput<'_>,
        step: &StepContext<'_>,
        sink: &mut dyn EventSink,
    ) -> Result<Option<Finished>, GenerateError> {
        let verified = matches!(
            output,
            ChunkOutput::GreedyEach(_) | ChunkOutput::LogitsEach(_)
        );
        if self.drafted > 0 && !verified {
            return Err(GenerateError::Backend(BackendError::InvalidInput(format!(
                "no choice per position for a chunk with {} drafts",
                self.drafted
            ))));
        }
        // A draft's position counts once the model agrees with it (`accept_verified`).
        self.computed += len.saturating_sub(self.drafted);
        let tokenizer = step.tokenizer;
        let choice = match output {
            ChunkOutput::Nothing => return Ok(None),
            ChunkOutput::GreedyEach(choices) => {
                return self.accept_verified(Verified::Greedy(choices), step, sink);
            }
            ChunkOutput::LogitsEach(rows) => {
                return self.accept_verified(Verified::Rows(rows), step, sink);
            }
            ChunkOutput::Greedy(token) => Choice {
                token,
                logprobs: None,
            },
            ChunkOutput::Logits(logits) => self.sample(logits, tokenizer)?,
        };
        self.count_step(step);
        self.take(choice, step, sink)
    }

    /// The sampler's choice from `logits` after the history so far, under the grammar's mask.
    fn sample(&mut self, logits: &[f32], tokenizer: &Tokenizer) -> Result<Choice, GenerateError> {
        let allowed = match &self.grammar {
            Some(grammar) => Some(grammar.allowed()?),
            None => None,
        };
        let context = Context {
            history: &self.history,
            prompt_len: self.request.prompt_tokens.len(),
            end_of_generation: tokenizer.vocab().end_of_generation(),
            allowed,
        };
        Ok(self.sampler.choose(logits, &context))
    }

    /// Takes a verify pass's outputs, one after the next input and each draft: the token
    /// chosen at each position, up to and including the first that differs from its draft, is
    /// the model's next token, exactly as one step each would have chosen it (greedy, or the
    /// sampler with the same draw from the sequence's stream, since a token is drawn for each
    /// position taken and no other); the positions of the drafts after that one are forgotten
    /// (their keys and values are overwritten by later steps).
    fn accept_verified(
        &mut self,
        outputs: Verified<'_>,
        step: &StepContext<'_>,
        sink: &mut dyn EventSink,
    ) -> Result<Option<Finished>, GenerateError> {
        let drafts = self.history.split_off(self.history.len() - self.drafted);
        self.drafted = 0;
        let positions = drafts.len() + 1;
        let width = match outputs {
            Verified::Greedy(choices) => usize::from(choices.len() == positions),
            Verified::Rows(rows) => rows.len() / positions,
        };
        if width == 0 || outputs.len() != width * positions {
            return Err(GenerateError::Backend(BackendError::InvalidInput(format!(
                "{} outputs for a verify pass of {} drafts",
                outputs.len(),
                drafts.len()
            ))));
        }
        self.count_step(step);
        let mut agreed = 0;
        for i in 0..positions {
            let choice = match outputs {
                Verified::Rows(rows) => {
                    self.sample(&rows[i * width..(i + 1) * width], step.tokenizer)?
                }
                Verified::Greedy(choices) => {
                    let token = choices[i];
                    // The pass chose without a mask: where its choice is allowed it is the
                    // masked choice too; where not, the position runs again in the next step,
                    // with the mask.
                    if let Some(grammar) = &self.grammar
                        && !grammar.allows(token)?
                    {
                        self.computed -= 1;
                        self.needs_mask = true;
                        break;
                    }
                    Choice {
                        token,
                        logprobs: None,
                    }
                }
            };
            let token = choice.token;
            if let Some(done) = self.take(choice, step, sink)? {
                return Ok(Some(done));
            }
            if drafts.get(i) != Some(&token) {
                break;
            }
            // The draft is the token just taken: its keys and values are the right ones.
            self.computed += 1;
            agreed += 1;
        }
        self.speculation.accepted += agreed as u64;
        self.agreement.observe(agreed, drafts.len());
        Ok(None)
    }

    /// Starts the clocks at the first token, or counts a decode step's time.
    fn count_step(&mut self, step: &StepContext<'_>) {
        let now = Instant::now();
        match self.first_token_at {
            None => {
                self.first_token_at = Some(now);
                let since = self.first_chunk_at.unwrap_or(self.started);
                self.prefill_time_ms = ms_between(since, now);
                self.last_metrics = now;
            }
            Some(_) => self.decode_steps += step.step_time,
        }
    }

    /// Takes the next token: ends at end-of-generation, a stop string or `max_tokens`, else
    /// streams its text.
    fn take(
        &mut self,
        Choice { token, logprobs }: Choice,
        step: &StepContext<'_>,
        sink: &mut dyn EventSink,
    ) -> Result<Option<Finished>, GenerateError> {
        let tokenizer = step.tokenizer;
        self.needs_mask = false;
        if tokenizer.is_end_of_generation(token) && !self.request.ignore_eos {
            return self.finish(StopReason::Eos, None, sink).map(Some);
        }
        if let Some(grammar) = &mut self.grammar {
            grammar.accept(token)?;
        }
        self.history.push(token);
        self.generated += 1;
        if let Some(logprobs) = logprobs {
            let entry = token_logprob(tokenizer, token, logprobs);
            self.pending_logprobs.push(entry);
        }
        let released = self.text.push(&tokenizer.token_bytes(token));
        self.emit(released.text, sink)?;
        if let Some(stop) = released.matched {
            return self
                .finish(StopReason::StopSequence, Some(stop), sink)
                .map(Some);
        }
        if self.generated == self.request.max_tokens {
            return self.finish(StopReason::MaxTokens, None, sink).map(Some);
        }
        if self.last_metrics.elapsed() >= METRICS_INTERVAL {
            self.last_metrics = Instant::now();
            self.metrics((step.memory_bytes)(), sink)?;
        }
        Ok(None)
    }

    fn finish(
        &mut self,
        stop_reason: StopReason,
        matched: Option<String>,
        sink: &mut dyn EventSink,
    ) -> Result<Finished, GenerateError> {
        if matched.is_none() {
            let rest = self.text.finish();
            self.emit(rest, sink)?;
        }
        let prompt_tokens = self.request.prompt_tokens.len();
        let first_token_at = self.first_token_at.unwrap_or_else(Instant::now);
        Ok(Finished {
            stop_reason,
            stop_sequence_matched: matched,
            tokens: self.history[prompt_tokens..].to_vec(),
            prompt_tokens,
            cached_tokens: self.cached_tokens,
            prefill_time_ms: self.prefill_time_ms,
            time_to_first_token_ms: ms_between(self.started, first_token_at),
            decode_time_ms: ms_between(first_token_at, Instant::now()),
            decode_steps_ms: self.decode_steps.as_secs_f64() * 1e3,
            speculation: self.speculation,
        })
    }

    fn emit(&mut self, piece: String, sink: &mut dyn EventSink) -> Result<(), GenerateError> {
        if piece.is_empty() {
            return Ok(());
        }
        let index = self.text.events;
        self.text.events += 1;
        let logprobs = std::mem::take(&mut self.pending_logprobs);
        send(
            sink,
            GenerateEvent::Token {
                text: piece,
                index,
                logprobs,
            },
        )
    }

    fn metrics(
        &mut self,
        memory_bytes: u64,
        sink: &mut dyn EventSink,
    ) -> Result<(), GenerateError> {
        let since = self.first_token_at.unwrap_or(self.started);
        let seconds = since.elapsed().as_secs_f64();
        let tokens_out = self.generated;
        send(
            sink,
            GenerateEvent::Metrics {
                tokens_out,
                decode_time_ms: (seconds * 1e3) as u64,
                tokens_per_sec: if seconds > 0.0 {
                    tokens_out as f64 / seconds
                } else {
                    0.0
                },
                memory_bytes,
            },
        )
    }
}

/// A chosen token's log-probabilities with the tokens' bytes.
fn token_logprob(tokenizer: &Tokenizer, token: u32, logprobs: Logprobs) -> TokenLogprob {
    let entry = |id: u32, logprob: f64| LogprobEntry {
        id,
        bytes: tokenizer.token_bytes(id),
        logprob,
    };
    TokenLogprob {
        chosen: entry(token, logprobs.logprob),
        top: logprobs
            .top
            .into_iter()
            .map(|(id, logprob)| entry(id, logprob))
            .collect(),
    }
}

/// Sends an event; a sink nobody listens to any more cancels the job.
fn send(sink: &mut dyn EventSink, event: GenerateEvent) -> Result<(), GenerateError> {
    if sink.send(event) {
        Ok(())
    } else {
        Err(GenerateError::Cancelled)
    }
}

/// Milliseconds from `from` to `to`, fractional.
fn ms_between(from: Instant, to: Instant) -> f64 {
    to.duration_since(from).as_secs_f64() * 1e3
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

/// A verify pass's outputs: the greedy choice after each position, or the logits rows.
#[derive(Clone, Copy)]
enum Verified<'a> {
    Greedy(&'a [u32]),
    Rows(&'a [f32]),
}

impl Verified<'_> {
    /// Values held: choices, or logits.
    fn len(&self) -> usize {
        match self {
            Verified::Greedy(choices) => choices.len(),
            Verified::Rows(rows) => rows.len(),
        }
    }
}
