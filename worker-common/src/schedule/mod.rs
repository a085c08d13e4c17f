//! THE scheduler: which sequences run in the next step, with which tokens and pages.
//!
//! Every [`Scheduler::step`]: sequences that were cancelled or ran out of time leave (their
//! pages return at once); preempted sequences come back first, oldest first, when pages allow;
//! every decoding sequence gets its one token (a decode that needs a page and finds none
//! preempts the youngest sequence); the rest of the step's token budget goes to prefill chunks,
//! oldest sequence first; one backend step runs them all; each sequence takes its output.
//!
//! Prefill chunks end on multiples of [`PREFILL_CHUNK`] positions (or at the end of the
//! history), never where a budget happened to run out, so how a prompt is cut depends on the
//! prompt alone: a backend whose numerics differ between chunk sizes still computes the same
//! keys and values for it whatever else runs. A backend whose results do not depend on the
//! cuts is paced instead ([`SchedulerConfig::paced_prefill`]): a step's prompt tokens are
//! bounded by the steps' measured times (`pacing.rs`), shortest prompt first, so a long prompt
//! neither stretches the running decodes' inter-token latency nor keeps short prompts waiting.
//!
//! With speculation on, a decoding sequence may also draft tokens (prompt lookup or a draft
//! model, `draft.rs`): its chunk is then its next input and the drafts, and the step verifies
//! them (specs/SPECULATIVE.md).
//! Drafts never delay a prompt: they run only in steps without prompt tokens, each as long as
//! the sequence's measured agreement makes it pay for its measured cost.
//!
//! New jobs are admitted by the caller, in arrival order, while [`Scheduler::can_admit`] says
//! there is room (a slot and the prompt's pages): the caller owns the waiting queue.

mod draft;
mod pacing;
mod pages;

use std::collections::VecDeque;
use std::time::{Duration, Instant};

pub use draft::{CATCH_UP, DraftModel, DraftWant, Drafter};
use pacing::PrefillPacer;
pub use pages::{PagePool, PrefixIndex, chain_hash};

use crate::backend::{BackendError, Chunk, InferenceBackend, PAGE_SIZE, PageId, StepOutputs};
use crate::generate::{EventSink, Finished, GenerateError, Sequence, StepContext};
use crate::tokenizer::Tokenizer;

/// Prefill chunks end on multiples of this many positions, unless the backend says otherwise
/// ([`InferenceBackend::prefill_chunk`]).
pub const PREFILL_CHUNK: usize = 256;

/// The scheduler's limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SchedulerConfig {
    /// Most sequences running at once (`--parallel`).
    pub max_running: usize,
    /// Most tokens in one step (`--batch-tokens`); at least `prefill_chunk` plus `max_running`,
    /// so that a prefill chunk always fits beside every running sequence's decode.
    pub step_tokens: usize,
    /// Prefill chunks end on multiples of this many positions (the backend's
    /// [`InferenceBackend::prefill_chunk`]).
    pub prefill_chunk: usize,
    /// Whether full pages are shared between sequences with the same leading tokens.
    pub prefix_cache: bool,
    /// Whether a step's prompt tokens are bounded by the steps' measured times and cut wherever
    /// that bound ends (within the grid), shortest prompt first: for a backend that asks for it
    /// ([`InferenceBackend::paces_prefill`]). Every backend's results are the same however a
    /// prompt is cut (specs/BACKEND.md), so the cuts change no token.
    pub paced_prefill: bool,
    /// Most tokens a decoding sequence drafts for one step (`--draft-max` with `--spec-ngram`
    /// or `--draft-model`); 0: no speculation. Only for a backend that
    /// [`verifies_drafts`](InferenceBackend::verifies_drafts).
    pub draft_max: usize,
}

/// A job that left the scheduler, with how it ended.
pub struct Ended<J> {
    /// The caller's job.
    pub job: J,
    /// Its result.
    pub result: Result<Finished, GenerateError>,
}

/// What the scheduler holds and has done, for `/health` and `/metrics`.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct SchedulerStats {
    /// Sequences running (admitted, not preempted).
    pub running: usize,
    /// Sequences preempted, waiting for pages.
    pub preempted: usize,
    /// Pages in the pool.
    pub kv_pages_total: usize,
    /// Pages a sequence could get now (free, or cached and unreferenced).
    pub kv_pages_free: usize,
    /// Preemptions so far.
    pub preemptions: u64,
    /// Prompt tokens taken from the prefix cache so far.
    pub cached_tokens: u64,
    /// Tokens drafted so far (speculation).
    pub drafted_tokens: u64,
    /// Drafted tokens the model agreed with so far.
    pub accepted_tokens: u64,
    /// The last step: chunks, tokens and duration.
    pub last_step: Option<StepStats>,
}

/// One step's size and duration.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StepStats {
    /// Sequences in the step.
    pub sequences: usize,
    /// Tokens in the step.
    pub tokens: usize,
    /// Wall time of the backend's step.
    pub duration: Duration,
}

/// A sequence and what the scheduler keeps for it.
struct Entry<J> {
    job: J,
    seq: Sequence,
    /// Admission order: lower is older.
    order: u64,
    pages: Vec<PageId>,
    /// Leading pages known to the prefix cache, and the chain hash of the last of them.
    registered: usize,
    parent_hash: u64,
}

/// How long a step with nothing to run (every sequence waiting for its grammar's mask) pauses
/// before the engine looks again: well under a token's time, long enough not to spin.
const MASK_POLL: Duration = Duration::from_micros(200);

/// Sequences, pages and the step loop of one backend.
pub struct Scheduler<J> {
    config: SchedulerConfig,
    pool: PagePool,
    /// Oldest first.
    running: Vec<Entry<J>>,
    /// Oldest first.
    preempted: VecDeque<Entry<J>>,
    outputs: StepOutputs,
    admitted: u64,
    stats: SchedulerStats,
    pacer: PrefillPacer,
    /// The draft model, when there is one (else drafts come from prompt lookup).
    drafter: Option<Box<dyn Drafter>>,
}

/// The next prefill chunk of `seq`: up to the next multiple of `grid` (or the end of its
/// history, generated tokens included after a preemption).
fn prefill_len(seq: &Sequence, grid: usize) -> usize {
    let to_boundary = grid - seq.computed() % grid;
    seq.pending().min(to_boundary)
}

/// Pages holding `positions` positions.
fn pages_for(positions: usize) -> usize {
    positions.div_ceil(PAGE_SIZE)
}

impl<J: EventSink> Scheduler<J> {
    /// A scheduler over a pool of `kv_pages` pages and logits of `vocab_size`.
    pub fn new(config: SchedulerConfig, kv_pages: usize, vocab_size: usize) -> Self {
        let config = SchedulerConfig {
            max_running: config.max_running.max(1),
            prefill_chunk: config.prefill_chunk.max(1),
            // One grid chunk beside every running sequence's decode, else a chunk as large as
            // the budget would wait for every other sequence to end.
            step_tokens: config
                .step_tokens
                .max(config.prefill_chunk + config.max_running.max(1)),
            ..config
        };
        Self {
            pool: PagePool::new(kv_pages, config.prefix_cache),
            config,
            running: Vec::new(),
            preempted: VecDeque::new(),
            outputs: StepOutputs::new(vocab_size),
            admitted: 0,
            stats: SchedulerStats::default(),
            pacer: PrefillPacer::default(),
            drafter: None,
        }
    }

    /// The limits in force (the step budget raised to [`PREFILL_CHUNK`] if it was lower).
    pub fn config(&self) -> SchedulerConfig {
        self.config
    }

    /// Whether no sequence is running or preempted.
    pub fn is_idle(&self) -> bool {
        self.running.is_empty() && self.preempted.is_empty()
    }

    /// Whether a job with `prompt_tokens` can start now: a free slot, pages for its prompt and
    /// first token, and no preempted sequence waiting before it.
    pub fn can_admit(&self, prompt_tokens: usize) -> bool {
        self.preempted.is_empty()
            && self.running.len() < self.config.max_running
            && self.pool.available() >= pages_for(prompt_tokens + 1)
    }

    /// Starts `seq` for `job`, taking its prompt's leading pages from the prefix cache.
    pub fn admit(&mut self, job: J, seq: Sequence) {
        self.admitted += 1;
        let mut entry = Entry {
            job,
            seq,
            order: self.admitted,
            pages: Vec::new(),
            registered: 0,
            parent_hash: 0,
        };
        self.attach_cached(&mut entry);
        self.stats.cached_tokens += entry.seq.computed() as u64;
        self.running.push(entry);
    }

    /// Drafts from `drafter` (a draft model) instead of prompt lookup.
    pub fn set_drafter(&mut self, drafter: Box<dyn Drafter>) {
        self.drafter = Some(drafter);
    }

    /// A view of the prefix cache other threads can query.
    pub fn prefix_index(&self) -> PrefixIndex {
        self.pool.index()
    }

    /// Counters and gauges.
    pub fn stats(&self) -> SchedulerStats {
        SchedulerStats {
            running: self.running.len(),
            preempted: self.preempted.len(),
            kv_pages_total: self.pool.total(),
            kv_pages_free: self.pool.available(),
            ..self.stats
        }
    }

    /// Ends every sequence with `error()` (the worker is failing or the caller gives up).
    pub fn abort_all(&mut self, error: impl Fn() -> GenerateError) -> Vec<Ended<J>> {
        let entries: Vec<Entry<J>> = self
            .running
            .drain(..)
            .chain(self.preempted.drain(..))
            .collect();
        entries
            .into_iter()
            .map(|e| self.end(e, Err(error())))
            .collect()
    }

    /// Runs one step; returns the jobs that ended in it (or before it: cancelled, timed out).
    pub fn step<B: InferenceBackend>(
        &mut self,
        backend: &mut B,
        tokenizer: &Tokenizer,
    ) -> Vec<Ended<J>> {
        let mut ended = self.drop_stopped();
        self.resume_preempted();
        let plan = self.plan();
        if plan.is_empty() {
            if ended.is_empty() {
                // Every sequence waits for its grammar's mask: a short pause rather than a
                // loop that would take the core the masks are computed on.
                std::thread::sleep(MASK_POLL);
            }
            return ended;
        }
        let started = Instant::now();
        let result = self.run(backend, &plan, started);
        let step_time = started.elapsed();
        let tokens = plan.iter().map(|&(_, len)| len).sum();
        if result.is_ok() {
            let decodes = plan
                .iter()
                .filter(|&&(i, len)| self.is_decode(i, len))
                .count();
            self.pacer.observe(decodes, tokens - decodes, step_time);
        }
        self.stats.last_step = Some(StepStats {
            sequences: plan.len(),
            tokens,
            duration: step_time,
        });
        let memory_bytes = || backend.info().memory.total();
        let step = StepContext {
            tokenizer,
            memory_bytes: &memory_bytes,
            step_time,
        };
        let mut finished = Vec::new();
        for (k, &(i, len)) in plan.iter().enumerate() {
            let entry = &mut self.running[i];
            let accepted = entry.seq.speculation().accepted;
            let outcome = match &result {
                Ok(()) => self
                    .outputs
                    .get(k)
                    .map_err(GenerateError::from)
                    .and_then(|out| entry.seq.accept(len, out, &step, &mut entry.job)),
                Err(err) => Err(GenerateError::Backend(duplicate(err))),
            };
            self.stats.accepted_tokens += entry.seq.speculation().accepted - accepted;
            if let Some(drafter) = &mut self.drafter {
                drafter.truncate(entry.order, entry.seq.computed());
            }
            match outcome {
                Ok(None) => register_full_pages(&mut self.pool, entry),
                Ok(Some(done)) => finished.push((i, Ok(done))),
                Err(err) => finished.push((i, Err(err))),
            }
        }
        // Highest index first, so the indices still to remove stay valid. The plan lists
        // decodes before prefills, so its order is not the running list's: an old sequence
        // still prefilling comes after younger decoding ones.
        finished.sort_unstable_by_key(|&(i, _)| std::cmp::Reverse(i));
        for (i, result) in finished {
            let entry = self.running.remove(i);
            ended.push(self.end(entry, result));
        }
        ended
    }

    fn run<B: InferenceBackend>(
        &mut self,
        backend: &mut B,
        plan: &[(usize, usize)],
        started: Instant,
    ) -> Result<(), BackendError> {
        for &(i, _) in plan {
            self.running[i].seq.chunk_started(started);
        }
        let chunks: Vec<Chunk<'_>> = plan
            .iter()
            .map(|&(i, len)| {
                let entry = &self.running[i];
                let from = entry.seq.computed();
                Chunk {
                    tokens: &entry.seq.history()[from..from + len],
                    start_pos: from,
                    pages: &entry.pages,
                    want: entry.seq.want(len),
                }
            })
            .collect();
        backend.step(&chunks, &mut self.outputs)
    }

    /// Removes cancelled and timed-out sequences, returning their pages.
    fn drop_stopped(&mut self) -> Vec<Ended<J>> {
        let mut ended = Vec::new();
        let mut i = 0;
        while i < self.running.len() {
            match self.running[i].seq.check() {
                Ok(()) => i += 1,
                Err(err) => {
                    let entry = self.running.remove(i);
                    ended.push(self.end(entry, Err(err)));
                }
            }
        }
        let preempted = std::mem::take(&mut self.preempted);
        for entry in preempted {
            match entry.seq.check() {
                Ok(()) => self.preempted.push_back(entry),
                Err(err) => ended.push(self.end(entry, Err(err))),
            }
        }
        ended
    }

    /// Brings preempted sequences back, oldest first, while slots and pages allow.
    fn resume_preempted(&mut self) {
        while let Some(entry) = self.preempted.front() {
            let fits = self.running.len() < self.config.max_running
                && self.pool.available() >= pages_for(entry.seq.history().len() + 1);
            if !fits {
                return;
            }
            let Some(mut entry) = self.preempted.pop_front() else {
                return;
            };
            self.attach_cached(&mut entry);
            let at = self.running.partition_point(|e| e.order < entry.order);
            self.running.insert(at, entry);
        }
    }

    /// Points a sequence starting from nothing at the cached pages of its leading tokens.
    fn attach_cached(&mut self, entry: &mut Entry<J>) {
        let history = entry.seq.history();
        let (pages, parent_hash) = self.pool.lookup(history, history.len() - 1);
        entry.seq.start_from_cache(pages.len() * PAGE_SIZE);
        entry.registered = pages.len();
        entry.parent_hash = parent_hash;
        entry.pages = pages;
    }

    /// Chooses this step's chunks: `(index in running, tokens)`, decodes first.
    fn plan(&mut self) -> Vec<(usize, usize)> {
        for entry in &mut self.running {
            entry.seq.clear_drafts();
        }
        loop {
            self.reserve_decode_pages();
            let mut plan = Vec::new();
            let mut budget = self.config.step_tokens;
            for (i, entry) in self.running.iter().enumerate() {
                let has_page = entry.pages.len() * PAGE_SIZE > entry.seq.computed();
                let ready = !entry.seq.waits_for_mask();
                if entry.seq.pending() == 1 && has_page && ready && budget > 0 {
                    plan.push((i, 1));
                    budget -= 1;
                }
            }
            if self.config.draft_max > 0 && !self.running.iter().any(|e| e.seq.pending() >= 2) {
                budget -= self.draft(&mut plan, budget);
            }
            let paced = self.config.paced_prefill;
            let mut allowance = budget;
            if paced {
                allowance = self.pacer.allowance(plan.len(), budget);
            }
            let allowed = allowance;
            let (order, reserved) = self.prefill_order(allowance);
            for (k, &i) in order.iter().enumerate() {
                // What the last of the order (the oldest, when paced) keeps for itself.
                let keep = if k + 1 < order.len() { reserved } else { 0 };
                let seq = &self.running[i].seq;
                let mut len = prefill_len(seq, self.config.prefill_chunk);
                // Paced, a prompt that costs little all at once ends in this step from the
                // budget; the others share the allowance.
                let finishing =
                    paced && seq.pending() <= budget && self.pacer.may_finish(seq.pending());
                let room = if finishing {
                    len = seq.pending();
                    budget
                } else {
                    allowance.saturating_sub(keep)
                };
                if paced && !finishing {
                    len = len.min(room);
                }
                if len == 0 || len > room || !self.grow(i, seq.computed() + len) {
                    continue;
                }
                plan.push((i, len));
                budget -= len;
                allowance = if finishing {
                    allowance
                } else {
                    allowance - len
                }
                .min(budget);
            }
            if paced {
                self.pacer.spend(allowed.saturating_sub(allowance));
            }
            // Nothing fits although sequences wait: prefills hold every page. The youngest
            // gives its pages back so the oldest can go on — unless a sequence only waits for
            // its grammar's mask, which frees nothing but will run.
            let waiting = self.running.iter().any(|e| e.seq.waits_for_mask());
            if !plan.is_empty() || self.running.is_empty() || waiting {
                return plan;
            }
            self.preempt_youngest();
        }
    }

    /// Whether the chunk `(i, len)` of a plan is a decode (or a prompt's last token), drafts
    /// aside.
    fn is_decode(&self, i: usize, len: usize) -> bool {
        let seq = &self.running[i].seq;
        seq.pending() == 1 && len == 1 + seq.drafted()
    }

    /// The sequences with prompt tokens to compute, in the order they take the step's
    /// `allowance`, and how much the last of them keeps for itself. On the grid: oldest first,
    /// a whole grid chunk each, nothing kept. Paced: the others shortest first (a short prompt
    /// beside a long one is done in a step or two), the oldest last, keeping a quarter of the
    /// allowance (so it always advances).
    fn prefill_order(&self, allowance: usize) -> (Vec<usize>, usize) {
        let mut order: Vec<usize> = (0..self.running.len())
            .filter(|&i| self.running[i].seq.pending() >= 2)
            .collect();
        if !self.config.paced_prefill || order.is_empty() {
            return (order, 0);
        }
        let oldest = order.remove(0);
        order.sort_by_key(|&i| self.running[i].seq.pending());
        order.push(oldest);
        let oldest_wants = prefill_len(&self.running[oldest].seq, self.config.prefill_chunk);
        (order, oldest_wants.min((allowance / 4).max(1)))
    }

    /// Gives each decoding sequence the page its next position needs, preempting the youngest
    /// sequences while the pool has too few.
    fn reserve_decode_pages(&mut self) {
        loop {
            let needing = self
                .running
                .iter()
                .filter(|e| e.seq.pending() == 1 && e.pages.len() * PAGE_SIZE <= e.seq.computed())
                .count();
            if needing <= self.pool.available() || self.running.is_empty() {
                break;
            }
            self.preempt_youngest();
        }
        for i in 0..self.running.len() {
            if self.running[i].seq.pending() == 1 {
                let end = self.running[i].seq.computed() + 1;
                self.grow(i, end);
            }
        }
    }

    /// Gives sequence `i` pages up to `positions`; false (taking none) when the pool is short.
    fn grow(&mut self, i: usize, positions: usize) -> bool {
        let entry = &mut self.running[i];
        let missing = pages_for(positions).saturating_sub(entry.pages.len());
        if missing > self.pool.available() {
            return false;
        }
        for _ in 0..missing {
            match self.pool.allocate() {
                Some(page) => entry.pages.push(page),
                None => return false,
            }
        }
        true
    }

    fn preempt_youngest(&mut self) {
        let Some(mut entry) = self.running.pop() else {
            return;
        };
        self.pool.release(&entry.pages);
        if let Some(drafter) = &mut self.drafter {
            drafter.release(entry.order);
        }
        entry.pages.clear();
        entry.registered = 0;
        entry.parent_hash = 0;
        entry.seq.preempt();
        self.stats.preemptions += 1;
        let at = self.preempted.partition_point(|e| e.order < entry.order);
        self.preempted.insert(at, entry);
    }

    fn end(&mut self, entry: Entry<J>, result: Result<Finished, GenerateError>) -> Ended<J> {
        self.pool.release(&entry.pages);
        if let Some(drafter) = &mut self.drafter {
            drafter.release(entry.order);
        }
        Ended {
            job: entry.job,
            result,
        }
    }
}

/// Offers the sequence's newly full pages to the prefix cache.
fn register_full_pages<J>(pool: &mut PagePool, entry: &mut Entry<J>) {
    let full = entry.seq.computed() / PAGE_SIZE;
    while entry.registered < full.min(entry.pages.len()) {
        let page = entry.registered;
        let tokens = &entry.seq.history()[page * PAGE_SIZE..(page + 1) * PAGE_SIZE];
        entry.parent_hash = pool.register(entry.pages[page], entry.parent_hash, tokens);
        entry.registered += 1;
    }
}

/// The same error for each sequence of a failed step.
fn duplicate(err: &BackendError) -> BackendError {
    match err {
        BackendError::Unsupported { backend, what } => BackendError::Unsupported {
            backend,
            what: what.clone(),
        },
        BackendError::InvalidModel(what) => BackendError::InvalidModel(what.clone()),
        BackendError::InsufficientMemory {
            device,
            required,
            available,
        } => BackendError::InsufficientMemory {
            device: device.clone(),
            required: *required,
            available: *available,
        },
        BackendError::OutOfMemory { what, bytes } => BackendError::OutOfMemory {
            what,
            bytes: *bytes,
        },
        BackendError::InvalidInput(what) => BackendError::InvalidInput(what.clone()),
        BackendError::Device(what) => BackendError::Device(what.clone()),
        BackendError::DeviceLost(what) => BackendError::DeviceLost(what.clone()),
        BackendError::NonFiniteLogits { first } => BackendError::NonFiniteLogits { first: *first },
    }
}

#[cfg(test)]
mod tests;
