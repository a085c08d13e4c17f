//! The seam between the shared worker and a compute backend: [`InferenceBackend`].
//!
//! A backend only runs the model: it loads weights, keeps a KV cache for one sequence and turns
//! tokens into the logits of the last position. Tokenizing, templating, sampling, stop checks,
//! streaming, timing and cancellation live once, in [`crate::generate`].

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
    /// An allocation for one sequence failed; the backend stays usable (`VRAM_OOM`).
    #[error("out of memory allocating {bytes} bytes for {what}")]
    OutOfMemory {
        /// What was being allocated (KV cache, scratch).
        what: &'static str,
        /// Size of the failed allocation.
        bytes: u64,
    },
    /// The caller broke the sequence protocol (positions, lengths, token ids).
    #[error("invalid forward call: {0}")]
    InvalidInput(String),
    /// The device or its driver failed (`CUDA_ERROR`).
    #[error("device error: {0}")]
    Device(String),
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
    /// The KV cache of the current sequence.
    pub kv: u64,
    /// Activations and other per-sequence scratch buffers.
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

/// Tensors some architectures may carry that no backend applies yet; refusing them at load is
/// better than silently computing something else than llama.cpp.
const UNAPPLIED_OPTIONAL_TENSORS: [&str; 7] = [
    "attn_output.bias",
    "ffn_gate.bias",
    "ffn_up.bias",
    "ffn_down.bias",
    "rope_freqs.weight",
    "rope_factors_long.weight",
    "rope_factors_short.weight",
];

/// Refuses a model carrying a tensor the backends do not apply (`backend` is its `WORKER_TYPE`).
pub fn refuse_unapplied_tensors(
    model: &ModelFile,
    backend: &'static str,
) -> Result<(), BackendError> {
    let unapplied = model.gguf.tensors().find(|tensor| {
        UNAPPLIED_OPTIONAL_TENSORS
            .iter()
            .any(|suffix| tensor.name.ends_with(suffix))
    });
    match unapplied {
        Some(tensor) => Err(BackendError::Unsupported {
            backend,
            what: format!("tensor {}", tensor.name),
        }),
        None => Ok(()),
    }
}

/// A compute backend for one model: what `worker-orcd` (CUDA) and `llorch-cpud` (CPU) differ in.
///
/// The protocol for one sequence: [`begin_sequence`](Self::begin_sequence), then
/// [`forward`](Self::forward) with contiguous positions starting at 0 (prefill is one call over
/// many tokens, possibly split in chunks; decode is one call per token), then
/// [`end_sequence`](Self::end_sequence), which releases the sequence's KV cache and scratch.
pub trait InferenceBackend: Sized + Send + 'static {
    /// `worker_type` of the contract: `"cpu"` or `"bespoke-cuda"`.
    const WORKER_TYPE: &'static str;
    /// `memory_architecture` of the contract: `"cpu"` or `"vram-only"`.
    const MEMORY_ARCHITECTURE: &'static str;
    /// Whether [`greedy_token`](Self::greedy_token) answers after every `forward`. The CUDA
    /// backend's does (one small kernel, where the host's scan of 152k logits cost 0.15 ms a
    /// token); the generation loop then skips the sampler for greedy requests.
    const COMPUTES_GREEDY: bool = false;
    /// Backend-specific start-up options (thread count, GPU index).
    type Options: Clone + Send + std::fmt::Debug + 'static;

    /// Builds the backend from a parsed, validated model, reporting progress as weights load.
    fn load(
        model: Arc<ModelFile>,
        options: &Self::Options,
        progress: &mut dyn FnMut(LoadProgress),
    ) -> Result<Self, BackendError>;

    /// Device and measured memory, cheap enough to call after every job.
    fn info(&self) -> BackendInfo;

    /// Starts a sequence of at most `max_len` positions, allocating its KV cache.
    fn begin_sequence(&mut self, max_len: usize) -> Result<(), BackendError>;

    /// Runs `tokens` at positions `start_pos..start_pos + tokens.len()` and returns the logits
    /// (`vocab_size` values) of the last position.
    fn forward(&mut self, tokens: &[u32], start_pos: usize) -> Result<&[f32], BackendError>;

    /// The greedy choice over the last `forward` call's logits, when the backend computes it
    /// beside them ([`COMPUTES_GREEDY`](Self::COMPUTES_GREEDY)): the highest logit, NaN as
    /// -inf and +inf as `f32::MAX`, the lowest id on ties, exactly what
    /// [`Sampler`](crate::sampling::Sampler) picks at T = 0 without a penalty.
    fn greedy_token(&self) -> Option<u32> {
        None
    }

    /// [`forward`](Self::forward) for a step that needs only the greedy choice; a backend that
    /// computes it may skip handing over the logits (the CUDA backend then copies 4 bytes
    /// instead of the vocabulary's logits).
    fn forward_greedy(&mut self, tokens: &[u32], start_pos: usize) -> Result<u32, BackendError> {
        self.forward(tokens, start_pos)?;
        self.greedy_token()
            .ok_or_else(|| BackendError::Unsupported {
                backend: Self::WORKER_TYPE,
                what: "a greedy choice beside the logits".to_owned(),
            })
    }

    /// Ends the sequence and frees its KV cache and scratch; safe to call without a sequence.
    fn end_sequence(&mut self);
}
