//! The engine: ONE dedicated OS thread that loads the model, owns the backend and runs jobs one
//! at a time through `worker_common::generate`. The async runtime never runs model code.

use std::sync::Arc;
use std::time::Instant;

use tokio::sync::oneshot;
use worker_common::backend::{BackendError, InferenceBackend, LoadProgress};
use worker_common::generate::{GenerateError, GenerateEvent, PromptFormatter, generate};
use worker_common::model::{ModelError, ModelFile};
use worker_common::tokenizer::template::TemplateError;
use worker_common::tokenizer::{Tokenizer, TokenizerError};

use crate::api::{EndEvent, ErrorCode, StreamEvent};
use crate::metrics::{JobRecord, Outcome};
use crate::queue::Job;
use crate::state::{Loaded, Shared};

/// Largest default context: a model's full context can need gigabytes of KV cache.
pub const DEFAULT_MAX_CONTEXT: usize = 8192;

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
pub fn spawn<B: InferenceBackend>(
    shared: Arc<Shared>,
    options: B::Options,
    ready: oneshot::Sender<Result<(), LoadError>>,
) -> Result<std::thread::JoinHandle<()>, LoadError> {
    let handle = std::thread::Builder::new()
        .name("engine".into())
        .spawn(move || match load::<B>(&shared, &options) {
            Ok((mut backend, loaded)) => {
                shared.publish(loaded, &backend.info());
                let _ = ready.send(Ok(()));
                serve(&shared, &mut backend);
            }
            Err(err) => {
                let _ = ready.send(Err(err));
            }
        })?;
    Ok(handle)
}

fn load<B: InferenceBackend>(
    shared: &Shared,
    options: &B::Options,
) -> Result<(B, Loaded), LoadError> {
    let settings = &shared.settings;
    let worker_id = settings.worker_id.as_str();
    let path = settings.model_ref.display().to_string();
    tracing::info!(event = "model_load_start", worker_id, model_ref = %path, "loading the model");
    let model = Arc::new(ModelFile::open(&settings.model_ref)?);
    let context_length = context_length(settings.ctx_size, model.spec.hparams.context_length)?;
    let tokenizer = Tokenizer::for_model(&model.gguf, &settings.model_ref, None)?;
    let formatter = PromptFormatter::from_model(&model.gguf, &tokenizer)?;
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
    let backend = B::load(model.clone(), options, &mut progress)?;
    let info = backend.info();
    let spec = &model.spec;
    let loaded = Loaded {
        model_name: spec.name.clone(),
        quant_kind: spec.quant_kind.clone(),
        tokenizer_kind: tokenizer.kind().as_str(),
        vocab_size: spec.hparams.vocab_size,
        context_length,
        tokenizer,
        formatter,
        device: info.device.clone(),
        gpu: info.gpu.clone(),
    };
    tracing::info!(
        event = "model_load_complete",
        worker_id,
        model = %loaded.model_name,
        device = %info.device,
        memory_bytes = info.memory.total(),
        context_length,
        "model loaded"
    );
    Ok((backend, loaded))
}

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

fn serve<B: InferenceBackend>(shared: &Shared, backend: &mut B) {
    let Some(loaded) = shared.loaded().cloned() else {
        return;
    };
    while let Some(mut job) = shared.queue.next() {
        let terminal = run_job(shared, backend, &loaded, &mut job);
        shared.set_memory(backend.info().memory);
        shared.queue.finish();
        // Last, so a client that has the terminal event sees the job in /metrics and /health.
        let _ = job.events.send(terminal);
    }
}

/// Runs `job`; returns its terminal event, not yet sent.
fn run_job<B: InferenceBackend>(
    shared: &Shared,
    backend: &mut B,
    loaded: &Loaded,
    job: &mut Job,
) -> StreamEvent {
    let started = Instant::now();
    let worker_id = shared.settings.worker_id.as_str();
    job.request.deadline = Some(started + shared.settings.inference_timeout);
    tracing::info!(
        event = "execute_start",
        worker_id,
        job_id = %job.id,
        correlation_id = %job.correlation_id,
        prompt_chars = job.prompt_summary.0,
        prompt_hash = %format!("{:016x}", job.prompt_summary.1),
        prompt_tokens = job.request.prompt_tokens.len(),
        max_tokens = job.request.max_tokens,
        "job started"
    );
    let events = job.events.clone();
    let job_id = job.id.clone();
    let mut sink = |event: GenerateEvent| {
        let event = match event {
            GenerateEvent::Token { text, index } => StreamEvent::Token { t: text, i: index },
            GenerateEvent::Metrics {
                tokens_out,
                decode_time_ms,
                tokens_per_sec,
                memory_bytes,
            } => StreamEvent::Metrics {
                job_id: job_id.clone(),
                tokens_out,
                decode_time_ms,
                tokens_per_sec,
                memory_bytes,
            },
        };
        events.send(event).is_ok()
    };
    let context = loaded.context_length;
    let result = generate(
        backend,
        &loaded.tokenizer,
        context,
        &job.request,
        &job.cancel,
        &mut sink,
    );
    finish_job(shared, job, result, started)
}

/// Records metrics and logs the end; returns the terminal event.
fn finish_job(
    shared: &Shared,
    job: &Job,
    result: Result<worker_common::generate::Finished, GenerateError>,
    started: Instant,
) -> StreamEvent {
    let duration = started.elapsed().as_secs_f64();
    let mut decode_steps = None;
    let (event, record) = match result {
        Ok(done) => {
            decode_steps = Some(done.decode_steps_ms);
            let tokens_out = done.tokens.len();
            let record = JobRecord {
                outcome: Outcome::Success,
                tokens_out: tokens_out as u64,
                time_to_first_token: Some(done.time_to_first_token_ms / 1e3),
                inter_token_latency: (tokens_out > 1)
                    .then(|| done.decode_time_ms / 1e3 / (tokens_out - 1) as f64),
                duration,
            };
            let end = EndEvent {
                tokens_out,
                decode_time_ms: micros(done.decode_time_ms),
                prefill_time_ms: micros(done.prefill_time_ms),
                time_to_first_token_ms: micros(done.time_to_first_token_ms),
                stop_reason: done.stop_reason.as_str(),
                stop_sequence_matched: done.stop_sequence_matched,
            };
            (StreamEvent::End(end), record)
        }
        Err(err) => {
            let (code, outcome) = error_code(&err);
            let record = JobRecord {
                outcome,
                tokens_out: 0,
                time_to_first_token: None,
                inter_token_latency: None,
                duration,
            };
            (StreamEvent::error(code, err.to_string()), record)
        }
    };
    log_end(shared, job, &event, &record, decode_steps);
    shared.metrics.record(record);
    event
}

/// Logs how `job` ended; `decode_steps` is the part of its decode time (ms) in the steps
/// themselves (forward and the token's choice), for a job that finished.
fn log_end(
    shared: &Shared,
    job: &Job,
    event: &StreamEvent,
    record: &JobRecord,
    decode_steps: Option<f64>,
) {
    let worker_id = shared.settings.worker_id.as_str();
    let (job_id, correlation_id) = (job.id.as_str(), job.correlation_id.as_str());
    match event {
        StreamEvent::Error { code, message, .. } => {
            let kind = if *code == ErrorCode::Cancelled.as_str() {
                "cancel"
            } else {
                "error"
            };
            tracing::info!(event = kind, worker_id, job_id, correlation_id, code, detail = %message, "job ended with {code}");
        }
        _ => tracing::info!(
            event = "execute_end",
            worker_id,
            job_id,
            correlation_id,
            tokens_out = record.tokens_out,
            duration_ms = record.duration * 1e3,
            decode_steps_ms = decode_steps.map(micros),
            "job finished"
        ),
    }
}

/// Milliseconds rounded to the microsecond, for readable events.
fn micros(ms: f64) -> f64 {
    (ms * 1e3).round() / 1e3
}

/// The stream error code and metrics outcome of a failed job.
fn error_code(err: &GenerateError) -> (ErrorCode, Outcome) {
    match err {
        GenerateError::Cancelled => (ErrorCode::Cancelled, Outcome::Cancelled),
        GenerateError::Timeout => (ErrorCode::InferenceTimeout, Outcome::Timeout),
        GenerateError::ContextLength { .. } | GenerateError::InvalidRequest(_) => {
            (ErrorCode::InvalidRequest, Outcome::Error)
        }
        GenerateError::Backend(BackendError::OutOfMemory { .. }) => {
            (ErrorCode::VramOom, Outcome::Error)
        }
        GenerateError::Backend(BackendError::Device(_)) => (ErrorCode::CudaError, Outcome::Error),
        GenerateError::Backend(_) => (ErrorCode::Internal, Outcome::Error),
    }
}

/// Ends a job that never ran (cancelled while waiting, or the worker draining).
pub fn end_unstarted(shared: &Shared, job: Job, code: ErrorCode, message: &str) {
    let outcome = if code == ErrorCode::Cancelled {
        Outcome::Cancelled
    } else {
        Outcome::Error
    };
    let record = JobRecord {
        outcome,
        tokens_out: 0,
        time_to_first_token: None,
        inter_token_latency: None,
        duration: 0.0,
    };
    let event = StreamEvent::error(code, message);
    log_end(shared, &job, &event, &record, None);
    shared.metrics.record(record);
    let _ = job.events.send(event);
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
