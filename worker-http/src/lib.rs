//! The worker shell shared by `worker-orcd` and `llorch-cpud`: the HTTP/SSE server of
//! `specs/CONTRACT.md`, generic over the backend ([`Load`]).
//!
//! [`run`] is all a binary calls. Requests are validated and tokenized on the async runtime; the
//! model runs on one engine thread that owns the backend ([`engine`]), fed by a bounded FIFO
//! ([`queue`]); `/health` and `/metrics` read cached [`state`].

pub mod api;
mod callback;
mod clock;
mod connections;
mod correlation;
pub mod engine;
mod flags;
pub mod grammars;
pub mod job_end;
mod logging;
mod metrics;
pub mod queue;
pub mod response_store;
mod routes;
mod server;
pub mod state;
mod submit;

use std::process::ExitCode;

pub use flags::{ApiKey, CommonFlags, LogFormat};
pub use routes::Access;
pub use server::StartError;
use worker_common::backend::Load;

/// How long the exit waits for blocking tasks once the server has stopped.
const RUNTIME_STOP_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(1);

/// Runs a worker over backend `B` until it has drained: exit code 0 after a shutdown, 1 when
/// start-up fails (model load, memory, listener, callback) or when the worker failed while
/// serving (its device failed for good), after `--shutdown-grace-sec`.
pub fn run<B: Load>(flags: CommonFlags, options: B::Options) -> ExitCode {
    logging::init(flags.log_format);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("http")
        .enable_all()
        .build();
    let runtime = match runtime {
        Ok(runtime) => runtime,
        Err(err) => {
            tracing::error!(
                event = "error",
                code = "STARTUP_FAILED",
                "starting the runtime: {err}"
            );
            return ExitCode::FAILURE;
        }
    };
    let model_ref = flags.model.display().to_string();
    let worker_id = flags.worker_id.clone();
    let served = runtime.block_on(server::serve::<B>(flags, options));
    // A blocking task still running (a request's render, the engine's join after the drain gave
    // up on it) must not keep the process from exiting.
    runtime.shutdown_timeout(RUNTIME_STOP_TIMEOUT);
    exit_code(served, &worker_id, &model_ref)
}

/// The process's exit code for how serving ended, logging a failure (`event: error` with its
/// code: start-up codes, or `CUDA_ERROR` for a worker whose device failed).
fn exit_code(served: Result<(), StartError>, worker_id: &str, model_ref: &str) -> ExitCode {
    match served {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            tracing::error!(
                event = "error",
                worker_id,
                code = err.code(),
                model_ref,
                "{}: {err}",
                err.code()
            );
            ExitCode::FAILURE
        }
    }
}
