//! The life of a worker process: bind → load on the engine thread → ready → callback → serve →
//! drain on SIGTERM, SIGINT or `/shutdown` → exit.

use std::net::SocketAddr;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use futures_util::FutureExt;
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use worker_common::backend::Load;

use crate::api::ErrorCode;
use crate::callback::{self, CallbackError};
use crate::connections::{self, ConnectionLimits};
use crate::engine::{self, LoadError};
use crate::job_end::{JobEnd, end_job};
use crate::routes::router;
use crate::state::{Lifecycle, Settings, Shared};
use crate::{Access, ApiKey, CommonFlags};

/// Why the worker stopped with exit code 1.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// The listener could not be bound.
    #[error("cannot listen on {address}: {source}")]
    Bind {
        /// The address asked for.
        address: SocketAddr,
        /// The OS error.
        source: std::io::Error,
    },
    /// The model could not be loaded.
    #[error("loading {model}: {source}")]
    Load {
        /// `--model`.
        model: String,
        /// What failed.
        source: LoadError,
    },
    /// The ready callback failed.
    #[error(transparent)]
    Callback(#[from] CallbackError),
    /// A flag's value could not be used (the API key file).
    #[error("{0}")]
    Config(String),
    /// The engine thread died without reporting (a bug).
    #[error("the engine thread ended without reporting the load")]
    EngineLost,
    /// The worker failed while serving (its device failed for good) and exited after the grace.
    #[error("the worker failed: {message}")]
    Failed {
        /// The contract's code, e.g. `CUDA_ERROR`.
        code: &'static str,
        /// What failed.
        message: String,
    },
}

impl StartError {
    /// The code logged with the failure.
    pub fn code(&self) -> &'static str {
        match self {
            StartError::Load { source, .. } => source.code(),
            StartError::Callback(_) => "CALLBACK_FAILED",
            StartError::Failed { code, .. } => code,
            StartError::Bind { .. } | StartError::Config(_) | StartError::EngineLost => {
                "STARTUP_FAILED"
            }
        }
    }
}

/// Runs the worker until it has drained; `Err` means exit 1.
pub async fn serve<B: Load>(flags: CommonFlags, options: B::Options) -> Result<(), StartError> {
    let address = SocketAddr::new(flags.host, flags.port);
    let listener = TcpListener::bind(address)
        .await
        .map_err(|source| StartError::Bind { address, source })?;
    let bound = listener
        .local_addr()
        .map_err(|source| StartError::Bind { address, source })?;
    let access = Access::new(
        api_key(&flags)?,
        bound.ip(),
        flags.advertise_host.as_deref(),
    );
    if access.api_key.is_none() && !bound.ip().is_loopback() {
        tracing::warn!(
            event = "startup",
            address = %bound,
            "listening beyond loopback without --api-key: anyone who reaches the port can run, cancel and stop jobs"
        );
    }
    let test_engine_panic = engine::engine_panic_from_env().map_err(StartError::Config)?;
    let settings = Settings {
        test_engine_panic,
        ..settings::<B>(&flags, access)
    };
    let shared = Arc::new(Shared::new(settings, flags.queue_depth as usize));
    let limits = ConnectionLimits::new(
        flags.max_connections.map(|max| max as usize),
        Duration::from_secs(flags.http_idle_timeout_sec),
        Duration::from_secs(flags.stream_stall_sec),
    );
    let worker_id = shared.settings.worker_id.clone();
    tracing::info!(
        event = "startup",
        worker_id,
        address = %bound,
        port = bound.port(),
        max_connections = limits.max,
        model_ref = %flags.model.display(),
        worker_type = B::WORKER_TYPE,
        version = env!("CARGO_PKG_VERSION"),
        "listening on {bound}"
    );
    let (ready_tx, ready_rx) = oneshot::channel();
    let load_error = |source| StartError::Load {
        model: flags.model.display().to_string(),
        source,
    };
    let engine = engine::spawn::<B>(shared.clone(), options, ready_tx).map_err(load_error)?;
    let (stop_server, server_stopped) = oneshot::channel::<()>();
    let app = router(shared.clone());
    let shutdown = async {
        let _ = server_stopped.await;
    };
    let stats = shared.connections.clone();
    let listening = connections::serve(listener, app, limits, stats, shutdown);
    let server = tokio::spawn(fail_on_panic(
        shared.clone(),
        "the HTTP listener",
        listening,
    ));
    tokio::spawn(forward_signals(shared.clone()));
    tokio::select! {
        loaded = ready_rx => match loaded {
            Ok(Ok(())) => {}
            Ok(Err(source)) => {
                shared.fail(source.code(), source.to_string());
                return Err(load_error(source));
            }
            Err(_) => return Err(StartError::EngineLost),
        },
        () = shared.shutdown.notified() => {
            tracing::info!(event = "shutdown", worker_id, "stopped while loading");
            return Ok(());
        }
    }
    tracing::info!(event = "ready", worker_id, "ready to serve");
    if let Some(url) = &flags.callback_url {
        let uri = format!(
            "http://{}:{}",
            flags
                .advertise_host
                .clone()
                .unwrap_or_else(|| bound.ip().to_string()),
            bound.port()
        );
        let payload = callback_payload(&shared, &uri);
        callback::send(url, &payload, |attempt, outcome| {
            tracing::info!(
                event = "callback",
                worker_id,
                url,
                attempt,
                outcome,
                "ready callback"
            );
        })
        .await?;
    }
    let stopped = serve_until_stopped(&shared, engine).await;
    let _ = stop_server.send(());
    let _ = tokio::time::timeout(std::time::Duration::from_secs(5), server).await;
    tracing::info!(event = "shutdown", worker_id, "stopped");
    stopped
}

/// Serves until a shutdown (signal, `/shutdown`) or a device failure wakes it, then drains.
/// `Err` (exit 1) when the worker failed: `/health` says `failed` until `--shutdown-grace-sec`
/// after the failure (a signal cuts that short), so a pool manager polling it sees why.
pub(crate) async fn serve_until_stopped(
    shared: &Arc<Shared>,
    engine: JoinHandle<()>,
) -> Result<(), StartError> {
    shared.shutdown.notified().await;
    drain(shared, engine).await;
    let Some(failure) = shared.failure() else {
        return Ok(());
    };
    let until = failure.at + shared.settings.shutdown_grace;
    tracing::info!(
        event = "shutdown",
        worker_id = shared.settings.worker_id.as_str(),
        code = failure.code,
        "failed: exiting with code 1 once the grace is over"
    );
    tokio::select! {
        () = tokio::time::sleep_until(until.into()) => {}
        () = shared.shutdown.notified() => {}
    }
    Err(StartError::Failed {
        code: failure.code,
        message: failure.message.clone(),
    })
}

/// `--api-key`, or the first line of `--api-key-file`.
fn api_key(flags: &CommonFlags) -> Result<Option<ApiKey>, StartError> {
    match (&flags.api_key, &flags.api_key_file) {
        (Some(key), _) => Ok(Some(key.clone())),
        (None, Some(path)) => ApiKey::from_file(path)
            .map(Some)
            .map_err(StartError::Config),
        (None, None) => Ok(None),
    }
}

fn settings<B: Load>(flags: &CommonFlags, access: Access) -> Settings {
    Settings {
        worker_id: flags.worker_id.clone(),
        model_ref: flags.model.clone(),
        ctx_size: flags.ctx_size,
        max_tokens_out: flags.max_tokens_out,
        max_prompt_tokens: flags.max_prompt_tokens,
        inference_timeout: std::time::Duration::from_secs(flags.inference_timeout_sec),
        shutdown_grace: std::time::Duration::from_secs(flags.shutdown_grace_sec),
        parallel: flags.parallel,
        batch_tokens: flags.batch_tokens,
        kv_cache_mb: flags.kv_cache_mb,
        prefix_cache: !flags.no_prefix_cache,
        draft_max: match flags.spec_ngram || flags.draft_model.is_some() {
            true => flags.draft_max,
            false => 0,
        },
        draft_model: flags.draft_model.clone(),
        worker_type: B::WORKER_TYPE,
        memory_architecture: B::MEMORY_ARCHITECTURE,
        access,
        test_engine_panic: None,
    }
}

/// The ready callback's body.
fn callback_payload(shared: &Shared, uri: &str) -> serde_json::Value {
    let settings = &shared.settings;
    let memory_bytes = shared.memory().total();
    let loaded = shared.loaded();
    let scheduler = shared.scheduler();
    serde_json::json!({
        "worker_id": settings.worker_id,
        "model_ref": settings.model_ref.display().to_string(),
        "model": loaded.map(|m| m.model_name.clone()),
        "uri": uri,
        "worker_type": settings.worker_type,
        "memory_architecture": settings.memory_architecture,
        "memory_bytes": memory_bytes,
        "vram_bytes": if settings.memory_architecture == "vram-only" { memory_bytes } else { 0 },
        "capabilities": crate::state::advertised_capabilities(loaded.map(Arc::as_ref)),
        "protocol": "sse",
        "quant_kind": loaded.map(|m| m.quant_kind.clone()),
        "context_length": loaded.map(|m| m.context_length),
        "slots": loaded.map(|m| m.slots),
        "slots_busy": shared.queue.running(),
        "kv_pages_total": scheduler.kv_pages_total,
        "kv_pages_free": scheduler.kv_pages_free,
    })
}

/// Refuses new jobs, ends the waiting ones, lets the running ones finish within the grace, then
/// cancels them and waits for the engine to release the backend.
async fn drain(shared: &Arc<Shared>, engine: JoinHandle<()>) {
    let worker_id = shared.settings.worker_id.as_str();
    let grace = shared.settings.shutdown_grace;
    if shared.failure().is_none() {
        tracing::info!(
            event = "shutdown",
            worker_id,
            grace_sec = grace.as_secs(),
            "draining"
        );
    }
    // A failed worker stays failed (`set_lifecycle` never leaves `Failed`).
    shared.set_lifecycle(Lifecycle::Draining);
    for job in shared.queue.close() {
        let end = JobEnd::failed(ErrorCode::WorkerDraining, "the worker is shutting down");
        end_job(shared, job, end, 0.0);
    }
    let mut joined = tokio::task::spawn_blocking(move || engine.join());
    if tokio::time::timeout(grace, &mut joined).await.is_err() {
        tracing::info!(
            event = "shutdown",
            worker_id,
            "grace over: cancelling the running jobs"
        );
        shared.queue.cancel_running();
        // Cancelled jobs leave at the next step boundary; a step that never ends must not keep
        // the process from exiting.
        if tokio::time::timeout(ENGINE_STOP_TIMEOUT, joined)
            .await
            .is_err()
        {
            tracing::warn!(
                event = "shutdown",
                worker_id,
                "the engine did not stop within {}s of the cancel; exiting without it",
                ENGINE_STOP_TIMEOUT.as_secs()
            );
        }
    }
}

/// How long the drain waits for the engine after cancelling its running jobs.
const ENGINE_STOP_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// Runs `task`; if it panics, the worker fails (`INTERNAL`: it can no longer serve what that
/// task served) and the server is woken to drain and exit 1 after the grace.
pub(crate) async fn fail_on_panic(
    shared: Arc<Shared>,
    what: &'static str,
    task: impl Future<Output = ()>,
) {
    let Err(payload) = AssertUnwindSafe(task).catch_unwind().await else {
        return;
    };
    let message = format!(
        "{what} panicked: {}",
        engine::panic_message(payload.as_ref())
    );
    tracing::error!(
        event = "error",
        worker_id = shared.settings.worker_id.as_str(),
        code = ErrorCode::Internal.as_str(),
        "{message}; exiting"
    );
    shared.fail(ErrorCode::Internal.as_str(), message);
    shared.shutdown.notify_one();
}

/// Turns SIGTERM and SIGINT into a drain.
async fn forward_signals(shared: Arc<Shared>) {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut terminate), Ok(mut interrupt)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        tracing::warn!(
            event = "error",
            "cannot install signal handlers; use POST /shutdown"
        );
        return;
    };
    loop {
        let name = tokio::select! {
            _ = terminate.recv() => "SIGTERM",
            _ = interrupt.recv() => "SIGINT",
        };
        tracing::info!(event = "shutdown", worker_id = %shared.settings.worker_id, signal = name, "signal received");
        shared.shutdown.notify_one();
    }
}
