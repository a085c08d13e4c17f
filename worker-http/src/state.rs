//! State shared by the handlers, the engine thread and the start-up task. Everything `/health`
//! and `/metrics` read is here, cached, so they never wait for the engine.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::{Duration, Instant};

use tokio::sync::Notify;
use worker_common::backend::{BackendInfo, CpuInfo, GpuInfo, MemoryUsage};
use worker_common::generate::PromptFormatter;
use worker_common::schedule::{PrefixIndex, SchedulerStats};
use worker_common::tokenizer::Tokenizer;

use crate::grammars::GrammarCell;
use crate::metrics::Metrics;
use crate::queue::JobQueue;

/// Settings fixed at start-up, from the flags and the backend type.
#[derive(Debug, Clone)]
pub struct Settings {
    /// `--worker-id`.
    pub worker_id: String,
    /// `--model`, as given.
    pub model_ref: PathBuf,
    /// `--ctx-size`, when given.
    pub ctx_size: Option<u32>,
    /// `--max-tokens-out`.
    pub max_tokens_out: u32,
    /// `--max-prompt-tokens`, when given (else the context bounds prompts).
    pub max_prompt_tokens: Option<u32>,
    /// `--inference-timeout-sec`.
    pub inference_timeout: Duration,
    /// `--shutdown-grace-sec`.
    pub shutdown_grace: Duration,
    /// `--parallel`, when given (else derived from the KV pool at load).
    pub parallel: Option<u32>,
    /// `--batch-tokens`.
    pub batch_tokens: u32,
    /// `--kv-cache-mb`, when given.
    pub kv_cache_mb: Option<u64>,
    /// Whether full KV pages are shared between prompts (`--no-prefix-cache` turns it off).
    pub prefix_cache: bool,
    /// Most tokens a job drafts per step (`--draft-max` with `--spec-ngram` or
    /// `--draft-model`); 0: no speculation.
    pub draft_max: u32,
    /// `--draft-model`, when given.
    pub draft_model: Option<std::path::PathBuf>,
    /// The backend's `WORKER_TYPE`.
    pub worker_type: &'static str,
    /// The backend's `MEMORY_ARCHITECTURE`.
    pub memory_architecture: &'static str,
    /// The API key and the accepted `Host` names.
    pub access: crate::routes::Access,
    /// The engine step after which the engine panics (`LLORCH_TEST_ENGINE_PANIC`, tests only).
    pub test_engine_panic: Option<u64>,
}

/// The loaded model's facts, and what turns prompts into tokens.
#[derive(Debug)]
pub struct Loaded {
    /// `general.name`.
    pub model_name: String,
    /// File type label, e.g. `Q4_K_M`.
    pub quant_kind: String,
    /// What the worker advertises once loaded ([`model_capabilities`]).
    pub capabilities: Vec<String>,
    /// `gguf-bpe`, `gguf-spm` or `hf-json`.
    pub tokenizer_kind: &'static str,
    /// Tokens in the vocabulary.
    pub vocab_size: usize,
    /// The context this worker serves (`--ctx-size`, else min(model, 8192)).
    pub context_length: usize,
    /// The model's tokenizer.
    pub tokenizer: Tokenizer,
    /// Chat template rendering.
    pub formatter: PromptFormatter,
    /// The backend's device description.
    pub device: String,
    /// GPU facts on a GPU backend.
    pub gpu: Option<GpuInfo>,
    /// CPU facts on the CPU backend.
    pub cpu: Option<CpuInfo>,
    /// Most jobs running at once (`--parallel`, else from the KV pool).
    pub slots: usize,
    /// Which prompt prefixes the engine's KV pages hold (for `started.cached_tokens`).
    pub prefix_index: PrefixIndex,
    /// What compiles grammars over this vocabulary, or why structured output is unavailable.
    pub grammars: GrammarCell,
}

/// Where the worker is in its life (`busy` is `Ready` with every slot taken).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Lifecycle {
    /// Loading the model; `/execute` answers `WORKER_NOT_READY`.
    Loading = 0,
    /// Serving.
    Ready = 1,
    /// Shutting down; `/execute` answers `WORKER_DRAINING`.
    Draining = 2,
    /// The model failed to load, or the device failed for good ([`Shared::failure`]): the
    /// process is exiting (exit 1); `/execute` answers `WORKER_NOT_READY`.
    Failed = 3,
}

/// Why the worker is [`Lifecycle::Failed`]: kept for `/health` (`last_error`) and the exit.
#[derive(Debug, Clone)]
pub struct Failure {
    /// The contract's code (`CUDA_ERROR`, `MODEL_LOAD_FAILED`, …).
    pub code: &'static str,
    /// What failed, for the operator.
    pub message: String,
    /// When it failed: the exit comes `--shutdown-grace-sec` later.
    pub at: Instant,
}

/// The state everything shares.
#[derive(Debug)]
pub struct Shared {
    /// Start-up settings.
    pub settings: Settings,
    /// The job queue.
    pub queue: JobQueue,
    /// Counters and histograms.
    pub metrics: Metrics,
    /// Connection counters, kept by the listener.
    pub connections: Arc<crate::connections::ConnectionStats>,
    /// Signalled by `/shutdown` and the signal handler.
    pub shutdown: Notify,
    /// The responses `/v1/responses` keeps for `previous_response_id`.
    pub responses: crate::response_store::ResponseStore,
    started: Instant,
    lifecycle: AtomicU8,
    loaded: OnceLock<Arc<Loaded>>,
    failure: OnceLock<Failure>,
    memory: [AtomicU64; 3],
    scheduler: Mutex<SchedulerStats>,
}

impl Shared {
    /// Fresh state of a worker that is about to load.
    pub fn new(settings: Settings, queue_depth: usize) -> Self {
        Self {
            settings,
            queue: JobQueue::new(queue_depth),
            metrics: Metrics::default(),
            connections: Arc::default(),
            shutdown: Notify::new(),
            responses: crate::response_store::ResponseStore::default(),
            started: Instant::now(),
            lifecycle: AtomicU8::new(Lifecycle::Loading as u8),
            loaded: OnceLock::new(),
            failure: OnceLock::new(),
            memory: Default::default(),
            scheduler: Mutex::default(),
        }
    }

    /// The current lifecycle state.
    pub fn lifecycle(&self) -> Lifecycle {
        match self.lifecycle.load(Ordering::Acquire) {
            0 => Lifecycle::Loading,
            1 => Lifecycle::Ready,
            2 => Lifecycle::Draining,
            _ => Lifecycle::Failed,
        }
    }

    /// Moves to `state`; `Failed` is final, nothing moves the worker out of it.
    pub fn set_lifecycle(&self, state: Lifecycle) {
        let _ = self
            .lifecycle
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |now| {
                (now != Lifecycle::Failed as u8).then_some(state as u8)
            });
    }

    /// Moves to `Failed` for good, keeping the first failure's `code` and `message`; returns
    /// false when the worker had already failed.
    pub fn fail(&self, code: &'static str, message: String) -> bool {
        let first = self
            .failure
            .set(Failure {
                code,
                message,
                at: Instant::now(),
            })
            .is_ok();
        self.set_lifecycle(Lifecycle::Failed);
        first
    }

    /// Why the worker failed, once it has.
    pub fn failure(&self) -> Option<&Failure> {
        self.failure.get()
    }

    /// The model, once loaded.
    pub fn loaded(&self) -> Option<&Arc<Loaded>> {
        self.loaded.get()
    }

    /// Publishes the loaded model and moves to `Ready`.
    pub fn publish(&self, loaded: Loaded, info: &BackendInfo) {
        let _ = self.loaded.set(Arc::new(loaded));
        self.set_memory(info.memory);
        self.set_lifecycle(Lifecycle::Ready);
    }

    /// Caches the backend's memory use.
    pub fn set_memory(&self, memory: MemoryUsage) {
        for (slot, bytes) in self
            .memory
            .iter()
            .zip([memory.weights, memory.kv, memory.scratch])
        {
            slot.store(bytes, Ordering::Relaxed);
        }
    }

    /// The last measured memory use.
    pub fn memory(&self) -> MemoryUsage {
        let [weights, kv, scratch] = &self.memory;
        MemoryUsage {
            weights: weights.load(Ordering::Relaxed),
            kv: kv.load(Ordering::Relaxed),
            scratch: scratch.load(Ordering::Relaxed),
        }
    }

    /// Caches the scheduler's state (the engine calls this after every step).
    pub fn set_scheduler(&self, stats: SchedulerStats) {
        *self
            .scheduler
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = stats;
    }

    /// The scheduler's state after its last step.
    pub fn scheduler(&self) -> SchedulerStats {
        *self
            .scheduler
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Seconds since the process started serving.
    pub fn uptime(&self) -> Duration {
        self.started.elapsed()
    }
}

/// The one capability every worker has, advertised also before the model is loaded.
pub const TEXT_GEN: &str = "text-gen";

/// The capabilities of a worker serving `spec`: `text-gen`, `arch:<general.architecture>`,
/// then `quant:<format>` for each block format its tensors are stored in (so a pool manager can
/// pick workers by architecture and quantization as it picks them by capability).
pub fn model_capabilities(spec: &worker_common::model::ModelSpec) -> Vec<String> {
    let arch = format!("arch:{}", spec.architecture);
    let formats = spec.formats.iter().map(|f| format!("quant:{f}"));
    [TEXT_GEN.to_owned(), arch]
        .into_iter()
        .chain(formats)
        .collect()
}

/// The `capabilities` of /health, the ready callback and /v1/models: the model's once it is
/// loaded, `["text-gen"]` before.
pub fn advertised_capabilities(loaded: Option<&Loaded>) -> Vec<String> {
    loaded.map_or_else(|| vec![TEXT_GEN.to_owned()], |m| m.capabilities.clone())
}
