//! The seam between the shared worker and a compute backend: [`Load`] builds one,
//! [`InferenceBackend`] runs it.
//!
//! A backend only runs the model: it holds the weights and a pool of KV pages, and a step turns
//! a batch of [`Chunk`]s (each one sequence's tokens at its positions, with its page table) into
//! what each chunk asked for ([`Want`]). Which pages a sequence owns, which prompts share pages,
//! what runs in a step, and tokenizing, sampling, stop checks, streaming, timing and
//! cancellation live once, in [`crate::schedule`] and [`crate::generate`].

mod decode_steps;
mod outputs;
mod single;

pub use decode_steps::{DecodeSteps, time_decode_steps};
pub use outputs::{ChunkOutput, StepOutputs, TaskRunner};
pub use single::SingleSequence;

use std::sync::Arc;

use crate::model::ModelFile;

/// Why a backend could not load or run.
#[derive(Debug, thiserror::Error)]
pub enum BackendError {
    /// The model uses something this backend does not implement.
    #[error("unsupported by the {backend} backend: {what}")]
    Unsupported {
        /// The backend's `WORKER_TYPE`.
        backend: &'static str,
        /// What is missing, naming the tensor or feature.
        what: String,
    },
    /// The model file is inconsistent in a way only the backend can see.
    #[error("invalid model: {0}")]
    InvalidModel(String),
    /// Not enough memory to load the model (`INSUFFICIENT_VRAM` on a GPU).
    #[error("insufficient memory on {device}: {required} bytes required, {available} available")]
    InsufficientMemory {
        /// The device, as in [`BackendInfo::device`].
        device: String,
        /// Bytes the model needs.
        required: u64,
        /// Bytes free when loading.
        available: u64,
    },
    /// An allocation at run time failed; the backend stays usable (`VRAM_OOM`).
    #[error("out of memory allocating {bytes} bytes for {what}")]
    OutOfMemory {
        /// What was being allocated (KV cache, scratch).
        what: &'static str,
        /// Size of the failed allocation.
        bytes: u64,
    },
    /// The caller broke the step protocol (positions, page tables, token ids).
    #[error("invalid forward call: {0}")]
    InvalidInput(String),
    /// The device or its driver failed for this call, and the backend stays usable
    /// (`CUDA_ERROR`; the worker keeps serving).
    #[error("device error: {0}")]
    Device(String),
    /// The device failed in a way that poisons it for the life of the process: a "sticky" CUDA
    /// error (an illegal address, a kernel launch failure or timeout, an uncorrectable ECC
    /// error, …) after which every later call fails the same way (`CUDA_ERROR`; the worker turns
    /// `failed` and exits so that its supervisor restarts it). See [`BackendError::poisons_device`].
    #[error("device lost: {0}")]
    DeviceLost(String),
    /// The model computed a NaN or an infinity among a chunk's logits (`MODEL_NUMERICS`): its
    /// weights are broken or its activations overflowed, so sending the job again cannot help.
    #[error(
        "the model computed non-finite logits ({}): its weights are broken or its numerics overflow on this input; check the model file (a retry gives the same result)",
        describe_non_finite(.first)
    )]
    NonFiniteLogits {
        /// The first non-finite logit (token id, value), when the host saw the row; `None` when
        /// a device only flagged it.
        first: Option<(u32, f32)>,
    },
}

impl BackendError {
    /// Whether the backend is unusable after this error, for good: only a restart of the
    /// process (a new device context) recovers. `OutOfMemory` and `Device` leave it usable.
    pub fn poisons_device(&self) -> bool {
        matches!(self, BackendError::DeviceLost(_))
    }
}

fn describe_non_finite(first: &Option<(u32, f32)>) -> String {
    match *first {
        Some((token, value)) => format!("{value} for token {token}"),
        None => "NaN or infinity, found on the device".to_owned(),
    }
}

/// What the backend reports about itself once loaded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BackendInfo {
    /// Human-readable device, e.g. the CPU model or `NVIDIA H100 80GB HBM3`.
    pub device: String,
    /// Measured memory in use, by kind.
    pub memory: MemoryUsage,
    /// GPU facts `/health` adds on a GPU backend (`None` on the CPU).
    pub gpu: Option<GpuInfo>,
    /// CPU facts `/health` adds on the CPU backend (`None` on a GPU).
    pub cpu: Option<CpuInfo>,
}

/// What the CPU backend reports beyond [`BackendInfo`], for `/health`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CpuInfo {
    /// The instruction set its kernels run with: `scalar`, `avx2`, `avx512` or `avx512-vnni`.
    pub isa: String,
}

/// What a GPU backend reports beyond [`BackendInfo`], for `/health`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuInfo {
    /// Device ordinal (`--gpu-device`).
    pub ordinal: u32,
    /// Compute capability, e.g. `"9.0"`.
    pub sm: String,
    /// CUDA version the driver supports, e.g. `"13.0"`.
    pub cuda_runtime_version: String,
}

/// Bytes a loaded backend holds, by kind, as measured from its actual allocations.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct MemoryUsage {
    /// Model weights (on the CPU: the mapped tensor bytes the model reads plus small copies).
    pub weights: u64,
    /// The KV page pool, allocated at load.
    pub kv: u64,
    /// Activations and other per-step scratch buffers.
    pub scratch: u64,
}

impl MemoryUsage {
    /// Weights + KV + scratch.
    pub fn total(&self) -> u64 {
        self.weights + self.kv + self.scratch
    }
}

/// Load progress, reported at least at 0 % and 100 %.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LoadProgress {
    /// Bytes of weights processed so far.
    pub done_bytes: u64,
    /// Bytes of weights to process in total.
    pub total_bytes: u64,
}

impl LoadProgress {
    /// Whole percent done, 0..=100.
    pub fn percent(&self) -> u8 {
        if self.total_bytes == 0 {
            return 100;
        }
        (self.done_bytes.min(self.total_bytes) * 100 / self.total_bytes) as u8
    }
}

/// Positions per KV page, for every backend: small enough that a sequence wastes little of its
/// last page, large enough that page tables stay short (an 8192-position sequence has 512).
pub const PAGE_SIZE: usize = 16;

/// A page of a backend's KV pool: [`PAGE_SIZE`] positions of every layer's keys and values.
/// Ids run from 0 to [`InferenceBackend::kv_pages`] − 1.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PageId(pub u32);

impl PageId {
    /// The id as an index into the pool.
    pub fn index(self) -> usize {
        self.0 as usize
    }
}

/// Where position `pos` of a sequence with `pages` lives in the pool: the page's index and the
/// slot within it; `None` past the table.
pub fn page_slot(pages: &[PageId], pos: usize) -> Option<(usize, usize)> {
    let page = pages.get(pos / PAGE_SIZE)?;
    Some((page.index(), pos % PAGE_SIZE))
}

/// What a chunk wants back from a step.
#[derive(Debug, Clone, Copy)]
pub enum Want<'a> {
    /// Nothing: a prefill chunk that does not reach the end of its prompt.
    Nothing,
    /// The logits (`vocab_size` values) of the chunk's last position.
    Logits,
    /// Only the greedy choice over those logits: the highest logit, the lowest id on ties,
    /// exactly what [`Sampler`](crate::sampling::Sampler) picks at T = 0 without a penalty
    /// ([`greedy_choice`](crate::sampling::greedy_choice)). A GPU backend computes it on the
    /// device and copies 4 bytes instead of the logits. Logits that are not all finite give no
    /// choice but [`BackendError::NonFiniteLogits`], as a logits row would
    /// ([`StepOutputs::set_non_finite`]).
    Greedy,
    /// The greedy choice among the ids a grammar allows (the sampler's constrained greedy
    /// step, [`masked_greedy_choice`](crate::sampling::masked_greedy_choice)); the mask may
    /// still be computing while the step runs, so a backend asks for it only once it needs it.
    GreedyAmong(&'a dyn AllowedIds),
    /// The greedy choice after every position of the chunk, as [`Want::Greedy`] would give it
    /// for a chunk ending there: the verify pass of speculative decoding, whose chunk is the
    /// sequence's next input followed by drafted tokens (specs/SPECULATIVE.md). Asked only of
    /// a backend that [`verifies_drafts`](InferenceBackend::verifies_drafts).
    GreedyEach,
    /// The logits after every position of the chunk: the verify pass of a sampled (or
    /// penalized, or logprobs-reporting) sequence's drafts, each row the one `Want::Logits`
    /// would give a chunk ending there. Asked only of a backend that
    /// [`verifies_drafts`](InferenceBackend::verifies_drafts).
    LogitsEach,
}

impl Want<'_> {
    /// Whether the chunk wants anything back (its last row goes through the output head).
    pub fn has_output(&self) -> bool {
        !matches!(self, Want::Nothing)
    }

    /// How many of a chunk's `len` rows go through the output head: its last, every one
    /// ([`Want::GreedyEach`]) or none.
    pub fn output_rows(&self, len: usize) -> usize {
        match self {
            Want::Nothing => 0,
            Want::GreedyEach | Want::LogitsEach => len,
            Want::Logits | Want::Greedy | Want::GreedyAmong(_) => 1.min(len),
        }
    }
}

/// The ids a chunk's greedy choice may take ([`Want::GreedyAmong`]).
pub trait AllowedIds: Sync {
    /// Waits for the mask: a bitset over ids (bit `id % 32` of word `id / 32`; ids past its
    /// words are not allowed). `None` when it could not be computed: its owner reports why, and
    /// the chunk's choice is then discarded, so a backend may answer it unmasked.
    fn wait(&self) -> Option<&[u32]>;
}

impl std::fmt::Debug for dyn AllowedIds + '_ {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("AllowedIds")
    }
}

/// One sequence's part of a step: `tokens` at positions `start_pos..start_pos + tokens.len()`.
///
/// The keys and values of positions `0..start_pos` are already in the sequence's pages (written
/// by earlier steps, or shared with another sequence through the prefix cache); the step writes
/// those of its own positions. A step never holds two chunks of one sequence.
#[derive(Debug, Clone, Copy)]
pub struct Chunk<'a> {
    /// Token ids, at least one.
    pub tokens: &'a [u32],
    /// Position of the first token.
    pub start_pos: usize,
    /// The sequence's page table: page `i` holds positions `i * PAGE_SIZE..(i + 1) * PAGE_SIZE`.
    /// It covers at least `start_pos + tokens.len()` positions.
    pub pages: &'a [PageId],
    /// What to return for this chunk.
    pub want: Want<'a>,
}

impl Chunk<'_> {
    /// The first position after the chunk.
    pub fn end_pos(&self) -> usize {
        self.start_pos + self.tokens.len()
    }

    /// Checks the chunk against a pool of `kv_pages` pages and a vocabulary of `vocab_size`;
    /// every backend calls this before running a step.
    pub fn validate(&self, kv_pages: usize, vocab_size: usize) -> Result<(), BackendError> {
        if self.tokens.is_empty() {
            return Err(BackendError::InvalidInput(
                "a chunk without tokens".to_owned(),
            ));
        }
        let needed = self.end_pos().div_ceil(PAGE_SIZE);
        if self.pages.len() < needed {
            return Err(BackendError::InvalidInput(format!(
                "positions {}..{} need {needed} pages, the table has {}",
                self.start_pos,
                self.end_pos(),
                self.pages.len()
            )));
        }
        if let Some(page) = self.pages[..needed].iter().find(|p| p.index() >= kv_pages) {
            return Err(BackendError::InvalidInput(format!(
                "page {} is outside the pool of {kv_pages}",
                page.0
            )));
        }
        if let Some(&token) = self.tokens.iter().find(|&&t| t as usize >= vocab_size) {
            return Err(BackendError::InvalidInput(format!(
                "token id {token} is outside the vocabulary of {vocab_size}"
            )));
        }
        Ok(())
    }
}

/// What a backend is told at load, besides its own options.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoadConfig {
    /// Most positions one sequence reaches: the worker's context length.
    pub context_length: usize,
    /// Bytes for the KV page pool; `None` for the backend's default (what the device has left
    /// after weights and scratch, capped: see each backend's spec).
    pub kv_cache_bytes: Option<u64>,
    /// Sequences the worker runs at once (`--parallel`), when given: the default pool then holds
    /// that many full contexts (memory allowing), so they run without preemption and the pool
    /// takes no more than they need.
    pub parallel: Option<usize>,
}

/// The largest step a scheduler will run: a backend may hold its memory for such a step from
/// the start ([`InferenceBackend::reserve`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StepLimits {
    /// Most tokens in a step (its budget).
    pub tokens: usize,
    /// Most sequences in a step.
    pub sequences: usize,
}

/// Builds a backend: loading is its own step, apart from running.
pub trait Load: InferenceBackend {
    /// Backend-specific start-up options (thread count, GPU index).
    type Options: Clone + Send + std::fmt::Debug + 'static;

    /// Builds the backend from a parsed, validated model, allocating its KV page pool and
    /// reporting progress as weights load.
    fn load(
        model: Arc<ModelFile>,
        options: &Self::Options,
        config: &LoadConfig,
        progress: &mut dyn FnMut(LoadProgress),
    ) -> Result<Self, BackendError>;
}

/// A loaded model on a compute backend: what `worker-orcd` (CUDA) and `llorch-cpud` (CPU)
/// differ in.
///
/// # Batch invariance
///
/// A chunk's outputs and the keys and values it writes depend only on its own tokens,
/// positions and the keys and values already in its pages, never on the other chunks of the
/// step, their number or their order: every reduction runs in an order fixed by the model
/// alone. The CPU backend also gives the same bits however a sequence's positions are cut into
/// chunks; the CUDA backend's kernels still differ between chunk sizes, which the scheduler
/// makes harmless by cutting prompts on a fixed grid (specs/BATCHING.md).
pub trait InferenceBackend: Sized + Send + 'static {
    /// `worker_type` of the contract: `"cpu"` or `"bespoke-cuda"`.
    const WORKER_TYPE: &'static str;
    /// `memory_architecture` of the contract: `"cpu"` or `"vram-only"`.
    const MEMORY_ARCHITECTURE: &'static str;

    /// Device and measured memory, cheap enough to call after every step.
    fn info(&self) -> BackendInfo;

    /// Pages in the KV pool (fixed at load).
    fn kv_pages(&self) -> usize;

    /// Logits per position: the model's output rows.
    fn vocab_size(&self) -> usize;

    /// Prefill chunks end on multiples of this many positions (the scheduler's grid, fixed for
    /// the life of the backend, so a prompt is always cut the same way): larger on a device
    /// whose long chunks cost little more than short ones, smaller where a chunk's time delays
    /// every running sequence's next token.
    fn prefill_chunk(&self) -> usize {
        crate::schedule::PREFILL_CHUNK
    }

    /// Whether the scheduler paces this backend's prompts by the steps' measured times
    /// (specs/BATCHING.md, "Prefill pacing"). By default yes; a backend whose short chunks cost much more a token than long
    /// ones says no and keeps its grid.
    fn paces_prefill(&self) -> bool {
        true
    }

    /// Whether the backend answers [`Want::GreedyEach`] and [`Want::LogitsEach`] with, at
    /// every position, the bits a chunk ending there would give: then a pass over drafted tokens verifies them exactly
    /// and the scheduler may speculate. By default no.
    fn verifies_drafts(&self) -> bool {
        false
    }

    /// Allocates now what steps within `limits` need, so that memory does not grow under load
    /// (what `/health` reports then holds from the start). By default nothing: buffers grow
    /// as steps need them.
    fn reserve(&mut self, limits: StepLimits) -> Result<(), BackendError> {
        let _ = limits;
        Ok(())
    }

    /// Runs one step over `chunks` (at most one per sequence) and fills `outputs` with what
    /// each chunk wants, in the chunks' order.
    fn step(&mut self, chunks: &[Chunk<'_>], outputs: &mut StepOutputs)
    -> Result<(), BackendError>;
}
