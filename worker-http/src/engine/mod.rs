//! The engine: ONE dedicated OS thread that loads the model, owns the backend and runs the
//! scheduler: it admits queued jobs while there is room and steps every running job together
//! (`worker_common::schedule`). The async runtime never runs model code. A panic in a step
//! fails the worker instead of killing the thread unnoticed ([`failure`]).

mod draft;
mod failure;
mod running;

use std::panic::{self, AssertUnwindSafe};
use std::sync::Arc;
use std::time::Instant;

use tokio::sync::oneshot;
use worker_common::backend::{
    BackendError, InferenceBackend, Load, LoadConfig, LoadProgress, PAGE_SIZE, StepLimits,
};
use worker_common::generate::{PromptFormatter, Sequence, TemplateRendering, check_context};
use worker_common::model::{ModelError, ModelFile};
use worker_common::schedule::{DraftModel, Ended, PrefixIndex, Scheduler, SchedulerConfig};
use worker_common::tokenizer::template::TemplateError;
use worker_common::tokenizer::{Tokenizer, TokenizerError};

use crate::api::ErrorCode;
use crate::grammars::GrammarCell;
use crate::job_end::JobEnd;
use crate::queue::Job;
use crate::state::{Loaded, Shared};
use failure::{DeathWatch, Fatal, fail_worker};
pub use failure::{ENGINE_PANIC_ENV, engine_panic_from_env, panic_message};
use running::{LostJobs, Running, Started};

/// Largest default context: a model's full context can need gigabytes of KV cache.
pub const DEFAULT_MAX_CONTEXT: usize = 8192;

/// Most jobs running at once when `--parallel` is not given.
pub const MAX_DEFAULT_PARALLEL: usize = 64;

/// Why the model could not be loaded (the process exits 1).
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// The file is not a model we can read.
    #[error(transparent)]
    Model(#[from] ModelError),
    /// The vocabulary is unusable.
    #[error(transparent)]
    Tokenizer(#[from] TokenizerError),
    /// The chat template does not compile.
    #[error(transparent)]
    Template(#[from] TemplateError),
    /// The backend refused or failed.
    #[error(transparent)]
    Backend(#[from] BackendError),
    /// `--ctx-size` is beyond what the model was trained for.
    #[error(
        "--ctx-size {requested} exceeds the model's context length {model}; use at most {model}"
    )]
    ContextSize {
        /// The flag's value.
        requested: u32,
        /// The model's `context_length`.
        model: usize,
    },
    /// The KV pool cannot hold one sequence of the whole context.
    #[error(
        "the KV cache holds {positions} positions, less than the context of {context}; raise --kv-cache-mb or lower --ctx-size"
    )]
    KvTooSmall {
        /// Positions the pool holds.
        positions: usize,
        /// The context length.
        context: usize,
    },
    /// The draft model does not share the model's vocabulary.
    #[error(
        "the draft model {path} has another vocabulary than the model ({difference}); a draft model must share the model's tokenizer"
    )]
    DraftVocabulary {
        /// `--draft-model`.
        path: String,
        /// Where the vocabularies differ.
        difference: String,
    },
    /// The engine thread could not be started.
    #[error("starting the engine thread: {0}")]
    Thread(#[from] std::io::Error),
}

impl LoadError {
    /// The contract's start-up error code.
    pub fn code(&self) -> &'static str {
        match self {
            LoadError::Backend(BackendError::InsufficientMemory { .. }) => "INSUFFICIENT_VRAM",
            _ => "MODEL_LOAD_FAILED",
        }
    }
}

/// Starts the engine thread for backend `B`; `ready` reports the load's outcome, after which
/// the thread serves the queue until it is closed.
pub fn spawn<B: Load>(
    shared: Arc<Shared>,
    options: B::Options,
    ready: oneshot::Sender<Result<(), LoadError>>,
) -> Result<std::thread::JoinHandle<()>, LoadError> {
    let handle = std::thread::Builder::new()
        .name("engine".into())
        .spawn(move || match load::<B>(&shared, &options) {
            Ok((mut backend, draft, loaded)) => {
                let scheduler = publish(&shared, &mut backend, draft, loaded);
                let _ = ready.send(Ok(()));
                crate::grammars::build_in_background(&shared);
                serve(&shared, backend, scheduler);
            }
            Err(err) => {
                let _ = ready.send(Err(err));
            }
        })?;
    Ok(handle)
}

/// The model's backend, the draft model's when there is one, and what the worker publishes.
type LoadedBackends<B> = (B, Option<B>, Loaded);

fn load<B: Load>(shared: &Shared, options: &B::Options) -> Result<LoadedBackends<B>, LoadError> {
    let settings = &shared.settings;
    let worker_id = settings.worker_id.as_str();
    let path = settings.model_ref.display().to_string();
    tracing::info!(event = "model_load_start", worker_id, model_ref = %path, "loading the model");
    let model = Arc::new(ModelFile::open(&settings.model_ref)?);
    let context_length = context_length(settings.ctx_size, model.spec.hparams.context_length)?;
    let tokenizer = Tokenizer::for_model(&model.gguf, &settings.model_ref, None)?;
    let formatter =
        PromptFormatter::from_model(&model.gguf, &tokenizer, TemplateRendering::Isolated)?;
    let mut logged_quarter = None;
    let mut progress = |step: LoadProgress| {
        let quarter = step.percent() / 25;
        if logged_quarter.is_none_or(|logged| quarter > logged) {
            logged_quarter = Some(quarter);
            let percent = quarter * 25;
            tracing::info!(
                event = "model_load_progress",
                worker_id,
                percent,
                "loading: {percent} %"
            );
        }
    };
    let config = LoadConfig {
        context_length,
        kv_cache_bytes: settings.kv_cache_mb.map(|mb| mb << 20),
        parallel: settings.parallel.map(|n| n as usize),
    };
    let backend = B::load(model.clone(), options, &config, &mut progress)?;
    let info = backend.info();
    let positions = backend.kv_pages() * PAGE_SIZE;
    if positions < context_length {
        return Err(LoadError::KvTooSmall {
            positions,
            context: context_length,
        });
    }
    let slots = match settings.parallel {
        Some(parallel) => parallel as usize,
        None => (positions / context_length).clamp(1, MAX_DEFAULT_PARALLEL),
    };
    let spec = &model.spec;
    let loaded = Loaded {
        grammars: GrammarCell::default(),
        model_name: spec.name.clone(),
        quant_kind: spec.quant_kind.clone(),
        capabilities: crate::state::model_capabilities(spec),
        tokenizer_kind: tokenizer.kind().as_str(),
        vocab_size: spec.hparams.vocab_size,
        context_length,
        tokenizer,
        formatter,
        device: info.device.clone(),
        gpu: info.gpu.clone(),
        cpu: info.cpu.clone(),
        slots,
        prefix_index: PrefixIndex::default(),
    };
    tracing::info!(
        event = "model_load_complete",
        worker_id,
        model = %loaded.model_name,
        device = %info.device,
        cpu_isa = info.cpu.as_ref().map(|cpu| cpu.isa.as_str()),
        memory_bytes = info.memory.total(),
        kv_cache_bytes = info.memory.kv,
        kv_pages = backend.kv_pages(),
        slots,
        batch_tokens = settings.batch_tokens,
        prefix_cache = settings.prefix_cache,
        context_length,
        "model loaded"
    );
    // A backend that cannot verify drafts runs without speculation (`draft_max` warns): its
    // memory is not spent on a draft model it would not use.
    let draft = match &settings.draft_model {
        Some(path) if backend.verifies_drafts() => {
            Some(draft::load::<B>(path, &loaded.tokenizer, options, &config)?)
        }
        _ => None,
    };
    Ok((backend, draft, loaded))
}

/// The grammar compiler over the model's vocabulary; a vocabulary it cannot take leaves
/// structured output unavailable (requests for it are refused), not the worker.
/// The context this worker serves: `--ctx-size`, else the model's, at most 8192.
fn context_length(flag: Option<u32>, model: usize) -> Result<usize, LoadError> {
    match flag {
        Some(requested) if requested as usize > model => {
            Err(LoadError::ContextSize { requested, model })
        }
        Some(requested) => Ok(requested as usize),
        None => Ok(model.min(DEFAULT_MAX_CONTEXT)),
    }
}

/// Builds the scheduler for a loaded backend, lets the backend reserve memory for the
/// scheduler's largest step, and publishes the model: the worker is ready.
fn publish<B: InferenceBackend>(
    shared: &Shared,
    backend: &mut B,
    draft: Option<B>,
    mut loaded: Loaded,
) -> Scheduler<Running> {
    let config = SchedulerConfig {
        max_running: loaded.slots,
        step_tokens: shared.settings.batch_tokens as usize,
        prefill_chunk: backend.prefill_chunk(),
        prefix_cache: shared.settings.prefix_cache,
        paced_prefill: backend.paces_prefill(),
        draft_max: draft_max(shared.settings.draft_max, backend),
    };
    let mut scheduler = Scheduler::new(config, backend.kv_pages(), backend.vocab_size());
    if let Some(draft) = draft
        && config.draft_max > 0
    {
        scheduler.set_drafter(Box::new(DraftModel::new(draft)));
    }
    let limits = StepLimits {
        tokens: scheduler.config().step_tokens,
        sequences: scheduler.config().max_running,
    };
    // Not fatal: steps then grow their buffers as they come (and fail alone if they cannot).
    if let Err(err) = backend.reserve(limits) {
        tracing::warn!(event = "reserve_failed", error = %err, "could not reserve step memory: {err}");
    }
    loaded.prefix_index = scheduler.prefix_index();
    shared.set_scheduler(scheduler.stats());
    shared.publish(loaded, &backend.info());
    scheduler
}

/// The scheduler's `draft_max`: `--draft-max` with `--spec-ngram` or `--draft-model`, on a
/// backend whose verify pass gives the tokens one step each would; on another speculation stays
/// off, with a warning.
fn draft_max<B: InferenceBackend>(requested: u32, backend: &B) -> usize {
    if requested > 0 && !backend.verifies_drafts() {
        tracing::warn!(
            event = "speculation_unsupported",
            backend = B::WORKER_TYPE,
            "speculation is off: the {} backend does not verify drafts exactly yet",
            B::WORKER_TYPE
        );
        return 0;
    }
    requested as usize
}

/// Serves the queue with an already built backend on a new engine thread (the in-process
/// route tests, over a scripted backend).
#[cfg(test)]
pub(crate) fn start_loaded<B: InferenceBackend>(
    shared: Arc<Shared>,
    backend: B,
    loaded: Loaded,
) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        let mut backend = backend;
        let scheduler = publish(&shared, &mut backend, None, loaded);
        serve(&shared, backend, scheduler);
    })
}

/// What one turn of the engine's loop came to.
enum Turn {
    /// Jobs were admitted or stepped, or one arrived: go on.
    Served,
    /// The queue is closed and every job has ended.
    Closed,
    /// The worker cannot go on.
    Failed(Fatal),
}

/// Admits jobs and steps the scheduler until the queue is closed and every job has ended, or
/// until the device fails for good or a step panics ([`failure`]).
fn serve<B: InferenceBackend>(shared: &Shared, mut backend: B, mut scheduler: Scheduler<Running>) {
    let Some(loaded) = shared.loaded().cloned() else {
        return;
    };
    let _watch = DeathWatch(shared);
    if let Some(step) = shared.settings.test_engine_panic {
        tracing::warn!(
            event = "startup",
            worker_id = shared.settings.worker_id.as_str(),
            "{ENGINE_PANIC_ENV} is set: the engine panics after its step {step}; for tests only"
        );
    }
    let lost = LostJobs::default();
    let mut steps = 0;
    loop {
        let turn = panic::catch_unwind(AssertUnwindSafe(|| {
            turn(
                shared,
                &loaded,
                &mut backend,
                &mut scheduler,
                &lost,
                &mut steps,
            )
        }));
        let fatal = match turn {
            Ok(Turn::Served) => {
                end_lost_by_a_bug(shared, &lost);
                continue;
            }
            Ok(Turn::Closed) => return,
            Ok(Turn::Failed(fatal)) => fatal,
            Err(payload) => Fatal::Panic(panic_message(payload.as_ref())),
        };
        fail_worker(shared, &fatal, scheduler, &lost);
        // Freeing on a poisoned context fails (a library's handle may panic on it), and a backend that
        // a panic left half-way through a step promises nothing: the process exits within the
        // grace, and the backend is left to its end.
        std::mem::forget(backend);
        return;
    }
}

/// One turn of the engine's loop: admits what fits, then runs one step (counted in `steps`) or
/// waits for a job.
fn turn<B: InferenceBackend>(
    shared: &Shared,
    loaded: &Loaded,
    backend: &mut B,
    scheduler: &mut Scheduler<Running>,
    lost: &LostJobs,
    steps: &mut u64,
) -> Turn {
    admit(shared, loaded, scheduler, lost);
    if scheduler.is_idle() {
        return if shared.queue.wait() {
            Turn::Served
        } else {
            Turn::Closed
        };
    }
    let ended = scheduler.step(backend, &loaded.tokenizer);
    if shared.settings.test_engine_panic == Some(*steps) {
        // With the step's ended jobs in hand and the others in the scheduler: both must end.
        panic!("{ENGINE_PANIC_ENV}: the engine panics after its step {steps}");
    }
    *steps += 1;
    let stats = scheduler.stats();
    if let Some(step) = stats.last_step {
        shared
            .metrics
            .record_step(step.sequences, step.tokens, step.duration.as_secs_f64());
    }
    shared.set_scheduler(stats);
    let fatal = ended.iter().find_map(|e| Fatal::of(&e.result));
    match &fatal {
        // Failed before any job hears of the fault: a client holding its error event finds
        // /health failed.
        Some(fatal) => failure::fail(shared, fatal),
        // After every step, not only when a job ends: a step that grew the scratch (a larger
        // batch) is in nvidia-smi's figure at once, and must be in /health too.
        None => shared.set_memory(backend.info().memory),
    }
    for Ended { job, result } in ended {
        job.end(shared, result);
    }
    fatal.map_or(Turn::Served, Turn::Failed)
}

/// Ends jobs the scheduler dropped without a panic (a bug): `INTERNAL`, retriable, and logged;
/// the worker serves on.
fn end_lost_by_a_bug(shared: &Shared, lost: &LostJobs) {
    let message = "the worker lost this job (a bug); send it again";
    let count = lost.end_all(shared, || {
        JobEnd::worker_failed(ErrorCode::Internal, message)
    });
    if count > 0 {
        tracing::error!(
            event = "error",
            worker_id = shared.settings.worker_id.as_str(),
            code = ErrorCode::Internal.as_str(),
            count,
            "the scheduler dropped {count} jobs without ending them; they were ended INTERNAL"
        );
    }
}

/// Starts queued jobs, in arrival order, while the scheduler has a slot and pages for them.
fn admit(shared: &Shared, loaded: &Loaded, scheduler: &mut Scheduler<Running>, lost: &LostJobs) {
    while let Some((mut job, ticket)) = shared
        .queue
        .start_next(|job| scheduler.can_admit(job.request.prompt_tokens.len()))
    {
        let started = Instant::now();
        job.request.deadline = Some(started + shared.settings.inference_timeout);
        log_start(shared, &job);
        let sequence = check_context(&job.request, loaded.context_length)
            .and_then(|()| Sequence::new(job.request.clone(), job.cancel.clone()));
        let running = Running::new(Started::new(job, ticket, started), lost);
        match sequence {
            Ok(sequence) => scheduler.admit(running, sequence),
            Err(err) => running.end(shared, Err(err)),
        }
    }
}

fn log_start(shared: &Shared, job: &Job) {
    tracing::info!(
        event = "execute_start",
        worker_id = shared.settings.worker_id.as_str(),
        job_id = %job.id,
        correlation_id = %job.correlation_id,
        prompt_chars = job.prompt_summary.0,
        prompt_hash = %format!("{:016x}", job.prompt_summary.1),
        prompt_tokens = job.request.prompt_tokens.len(),
        max_tokens = job.request.max_tokens,
        "job started"
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_context_defaults_to_the_model_capped_at_8192() {
        assert_eq!(context_length(None, 32768).ok(), Some(8192));
        assert_eq!(context_length(None, 2048).ok(), Some(2048));
        assert_eq!(context_length(Some(512), 32768).ok(), Some(512));
        assert!(matches!(
            context_length(Some(4096), 2048),
            Err(LoadError::ContextSize {
                requested: 4096,
                model: 2048
            })
        ));
    }
}
