//! The jobs the engine runs, each sure to end once. [`Running`] is the scheduler's job type; one
//! dropped without its end (a panic unwound past it, or a bug let it go) hands its job to
//! [`LostJobs`], which the engine ends once it knows why (after failing the worker, for a
//! panic), so that no client waits for a terminal event that never comes.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Instant;

use worker_common::generate::{EventSink, Finished, GenerateError, GenerateEvent};

use crate::job_end::{JobEnd, JobEvent, end_job};
use crate::queue::{Job, Ticket};
use crate::state::Shared;

/// A job the engine took from the queue: its entry, its ticket and when it started.
pub(super) struct Started {
    job: Job,
    ticket: Ticket,
    started: Instant,
}

impl Started {
    /// A job taken from the queue at `started`.
    pub(super) fn new(job: Job, ticket: Ticket, started: Instant) -> Self {
        Self {
            job,
            ticket,
            started,
        }
    }

    /// Ends the job: the queue learns first, so a client holding the terminal event sees the
    /// job gone from /health.
    fn end(self, shared: &Shared, end: JobEnd) {
        shared.queue.finish(self.ticket);
        let ran_for = self.started.elapsed().as_secs_f64();
        end_job(shared, self.job, end, ran_for);
    }
}

/// Jobs whose [`Running`] was dropped before they ended, waiting for the engine to end them.
#[derive(Clone, Default)]
pub(super) struct LostJobs(Arc<Mutex<Vec<Started>>>);

impl LostJobs {
    /// Ends every lost job with `end()`; returns how many there were.
    pub(super) fn end_all(&self, shared: &Shared, end: impl Fn() -> JobEnd) -> usize {
        let lost = std::mem::take(&mut *self.0.lock().unwrap_or_else(PoisonError::into_inner));
        let count = lost.len();
        for job in lost {
            job.end(shared, end());
        }
        count
    }
}

/// A job the scheduler runs. Its events go to the client's stream as they come; its end goes
/// through [`Running::end`], or, if it is dropped first, through [`LostJobs`].
pub(super) struct Running {
    /// `None` once ended.
    job: Option<Started>,
    lost: LostJobs,
}

impl Running {
    /// `job`, handed to `lost` if it is dropped before its end.
    pub(super) fn new(job: Started, lost: &LostJobs) -> Self {
        Self {
            job: Some(job),
            lost: lost.clone(),
        }
    }

    /// Ends the job with `result`.
    pub(super) fn end(mut self, shared: &Shared, result: Result<Finished, GenerateError>) {
        if let Some(job) = self.job.take() {
            job.end(shared, JobEnd::from(result));
        }
    }
}

impl EventSink for Running {
    fn send(&mut self, event: GenerateEvent) -> bool {
        self.job
            .as_ref()
            .is_some_and(|started| started.job.events.send(JobEvent::Generate(event)).is_ok())
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Some(job) = self.job.take() {
            self.lost
                .0
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .push(job);
        }
    }
}
