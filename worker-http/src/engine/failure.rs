//! When the engine cannot go on: the device failed for good, or a step panicked. Either way
//! the worker turns `failed` first (`/health` 503 with `last_error`, new jobs refused), then
//! every job, running, preempted or queued, ends with one retriable error (the request is not
//! at fault: a pool manager sends it elsewhere), and the server is woken to exit 1 after
//! `--shutdown-grace-sec`. [`DeathWatch`] does the same if the engine thread dies another way.

use std::any::Any;

use worker_common::generate::{Finished, GenerateError};
use worker_common::schedule::Scheduler;

use super::running::{LostJobs, Running};
use crate::api::ErrorCode;
use crate::job_end::{JobEnd, end_job};
use crate::state::Shared;

/// The variable that makes the engine panic after a given step, for tests (specs/HTTP.md).
pub const ENGINE_PANIC_ENV: &str = "LLORCH_TEST_ENGINE_PANIC";

/// Reads [`ENGINE_PANIC_ENV`]: `None` when unset or empty, an error naming the value when it is
/// not a step index.
pub fn engine_panic_from_env() -> Result<Option<u64>, String> {
    let value = std::env::var(ENGINE_PANIC_ENV).unwrap_or_default();
    match value.trim() {
        "" => Ok(None),
        text => text.parse().map(Some).map_err(|_| {
            format!("{ENGINE_PANIC_ENV}={text:?} is not a step index (a non-negative integer)")
        }),
    }
}

/// Why the engine stops for good.
#[derive(Debug)]
pub(super) enum Fatal {
    /// The device failed for good (a sticky CUDA error).
    DeviceLost(String),
    /// A step panicked: the scheduler, the backend or a job's state may be half-way through it.
    Panic(String),
}

impl Fatal {
    /// The fatal error of a job's result, if it is one: a backend error that poisons the device.
    pub(super) fn of(result: &Result<Finished, GenerateError>) -> Option<Self> {
        match result {
            Err(GenerateError::Backend(err)) if err.poisons_device() => {
                Some(Fatal::DeviceLost(err.to_string()))
            }
            _ => None,
        }
    }

    fn code(&self) -> ErrorCode {
        match self {
            Fatal::DeviceLost(_) => ErrorCode::CudaError,
            Fatal::Panic(_) => ErrorCode::Internal,
        }
    }

    fn message(&self) -> String {
        match self {
            Fatal::DeviceLost(message) => message.clone(),
            Fatal::Panic(message) => format!("the engine thread panicked: {message}"),
        }
    }
}

/// The text a panic was raised with.
pub fn panic_message(payload: &(dyn Any + Send)) -> String {
    if let Some(text) = payload.downcast_ref::<&str>() {
        (*text).to_owned()
    } else if let Some(text) = payload.downcast_ref::<String>() {
        text.clone()
    } else {
        "a panic without a message".to_owned()
    }
}

/// Moves the worker to `failed` for `fatal` and logs it, once (a second call does nothing).
pub(super) fn fail(shared: &Shared, fatal: &Fatal) {
    let (code, message) = (fatal.code().as_str(), fatal.message());
    let grace_sec = shared.settings.shutdown_grace.as_secs();
    if shared.fail(code, message.clone()) {
        tracing::error!(
            event = "error",
            worker_id = shared.settings.worker_id.as_str(),
            code,
            grace_sec,
            "the worker failed for good ({message}): failing every job, exiting in {grace_sec}s"
        );
    }
}

/// Fails the worker for `fatal`, ends every job it still holds (dropping the scheduler hands
/// its jobs to `lost`, whatever state a panic left it in) and every queued one, closes the
/// queue and wakes the server to exit after the grace.
pub(super) fn fail_worker(
    shared: &Shared,
    fatal: &Fatal,
    scheduler: Scheduler<Running>,
    lost: &LostJobs,
) {
    fail(shared, fatal);
    drop(scheduler);
    let (code, message) = (fatal.code(), fatal.message());
    lost.end_all(shared, || {
        JobEnd::worker_failed(
            code,
            format!(
                "the worker failed while running this job ({message}); send it to another worker"
            ),
        )
    });
    end_queued(shared, code, &message);
    // After every job has its end, so the drain finds nothing to end as draining.
    shared.shutdown.notify_one();
}

/// Closes the queue and ends the jobs still waiting in it with `code`, retriable elsewhere.
fn end_queued(shared: &Shared, code: ErrorCode, message: &str) {
    for job in shared.queue.close() {
        let end = JobEnd::worker_failed(
            code,
            format!(
                "the worker failed before this job started ({message}); send it to another worker"
            ),
        );
        end_job(shared, job, end, 0.0);
    }
}

/// Fails the worker if the engine thread unwinds past it (a panic while the engine was already
/// failing the worker): `/health` turns `failed`, queued jobs end, the server exits after the
/// grace. Running jobs whose ends were lost with the thread end on the HTTP side, whose
/// streams see their sender gone (`submit::JobEvents`).
pub(super) struct DeathWatch<'a>(pub &'a Shared);

impl Drop for DeathWatch<'_> {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            return;
        }
        let fatal = Fatal::Panic("while failing the worker".to_owned());
        fail(self.0, &fatal);
        end_queued(self.0, ErrorCode::Internal, &fatal.message());
        self.0.shutdown.notify_one();
    }
}
