//! The job queue between the HTTP handlers and the engine thread: arrival order, a bounded
//! number of waiting jobs, and cancellation of waiting and running jobs by id.

use std::collections::VecDeque;
use std::sync::{Condvar, Mutex, MutexGuard, PoisonError};

use tokio::sync::mpsc::UnboundedSender;
use worker_common::generate::{CancelToken, GenerateRequest};

use crate::api::StreamEvent;

/// An accepted job, waiting or running.
#[derive(Debug)]
pub struct Job {
    /// The caller's job id.
    pub id: String,
    /// The request's correlation id, for logs.
    pub correlation_id: String,
    /// What to generate (the engine sets the deadline when the job starts).
    pub request: GenerateRequest,
    /// Set by `/cancel`, a disconnect or shutdown.
    pub cancel: CancelToken,
    /// What the logs say about the prompt instead of its text: characters and FNV-1a hash.
    pub prompt_summary: (usize, u64),
    /// The job's stream; dropped after the terminal event, which ends the response.
    pub events: UnboundedSender<StreamEvent>,
}

/// Why a job was not accepted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rejected {
    /// `--queue-depth` jobs are already waiting.
    Full,
    /// The worker is draining.
    Closed,
}

#[derive(Debug, Default)]
struct Inner {
    waiting: VecDeque<Job>,
    running: Option<(String, CancelToken)>,
    closed: bool,
}

/// FIFO of jobs for the one engine thread.
#[derive(Debug)]
pub struct JobQueue {
    depth: usize,
    inner: Mutex<Inner>,
    wake: Condvar,
}

impl JobQueue {
    /// A queue holding at most `depth` waiting jobs besides the running one.
    pub fn new(depth: usize) -> Self {
        Self {
            depth,
            inner: Mutex::default(),
            wake: Condvar::new(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // A panic elsewhere while holding the lock leaves the queue consistent (every change is
        // one push, pop or assignment), so keep serving.
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Enqueues `job`; returns how many jobs are ahead of it. A refused job is dropped.
    pub fn submit(&self, job: Job) -> Result<usize, Rejected> {
        let mut inner = self.lock();
        if inner.closed {
            return Err(Rejected::Closed);
        }
        if inner.waiting.len() >= self.depth {
            return Err(Rejected::Full);
        }
        let ahead = inner.waiting.len() + usize::from(inner.running.is_some());
        inner.waiting.push_back(job);
        self.wake.notify_one();
        Ok(ahead)
    }

    /// Blocks until a job is waiting and marks it running; `None` once closed and empty.
    pub fn next(&self) -> Option<Job> {
        let mut inner = self.lock();
        loop {
            if let Some(job) = inner.waiting.pop_front() {
                inner.running = Some((job.id.clone(), job.cancel.clone()));
                return Some(job);
            }
            if inner.closed {
                return None;
            }
            inner = self
                .wake
                .wait(inner)
                .unwrap_or_else(PoisonError::into_inner);
        }
    }

    /// Marks the running job done.
    pub fn finish(&self) {
        self.lock().running = None;
    }

    /// Cancels the running job with `id`, if any, and removes waiting ones, which are returned
    /// for the caller to end.
    pub fn cancel(&self, id: &str) -> Vec<Job> {
        let mut inner = self.lock();
        if let Some((running, cancel)) = &inner.running
            && running == id
        {
            cancel.cancel();
        }
        let (removed, kept): (VecDeque<Job>, VecDeque<Job>) = std::mem::take(&mut inner.waiting)
            .into_iter()
            .partition(|job| job.id == id);
        inner.waiting = kept;
        removed.into()
    }

    /// Refuses new jobs and returns the waiting ones; the engine ends after the running job.
    pub fn close(&self) -> Vec<Job> {
        let mut inner = self.lock();
        inner.closed = true;
        self.wake.notify_all();
        inner.waiting.drain(..).collect()
    }

    /// Cancels the running job, whatever its id.
    pub fn cancel_running(&self) {
        if let Some((_, cancel)) = &self.lock().running {
            cancel.cancel();
        }
    }

    /// Jobs waiting.
    pub fn len(&self) -> usize {
        self.lock().waiting.len()
    }

    /// Whether no job is waiting.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Whether a job is running.
    pub fn is_busy(&self) -> bool {
        self.lock().running.is_some()
    }
}

#[cfg(test)]
mod tests {
    use tokio::sync::mpsc;
    use worker_common::sampling::SamplingParams;

    use super::*;

    fn job(id: &str) -> (Job, mpsc::UnboundedReceiver<StreamEvent>) {
        let (events, receiver) = mpsc::unbounded_channel();
        let request = GenerateRequest {
            prompt_tokens: vec![1],
            max_tokens: 1,
            sampling: SamplingParams::default(),
            stop: Vec::new(),
            deadline: None,
        };
        let job = Job {
            id: id.into(),
            correlation_id: String::new(),
            request,
            cancel: CancelToken::new(),
            prompt_summary: (0, 0),
            events,
        };
        (job, receiver)
    }

    #[test]
    fn jobs_run_in_order_and_the_depth_bounds_waiting_jobs() {
        let queue = JobQueue::new(2);
        assert_eq!(queue.submit(job("a").0).ok(), Some(0));
        assert_eq!(queue.submit(job("b").0).ok(), Some(1));
        assert_eq!(queue.submit(job("c").0).err(), Some(Rejected::Full));
        assert_eq!(queue.next().map(|j| j.id).as_deref(), Some("a"));
        assert!(queue.is_busy());
        assert_eq!(queue.submit(job("c").0).ok(), Some(2));
        assert_eq!(queue.next().map(|j| j.id).as_deref(), Some("b"));
    }

    #[test]
    fn cancel_reaches_running_and_waiting_jobs() {
        let queue = JobQueue::new(4);
        let (running, _rx) = job("x");
        let token = running.cancel.clone();
        queue.submit(running).ok();
        queue.submit(job("y").0).ok();
        queue.submit(job("x").0).ok();
        let _ = queue.next();
        let removed = queue.cancel("x");
        assert!(token.is_cancelled());
        assert_eq!(removed.len(), 1);
        assert_eq!(queue.len(), 1);
        assert!(queue.cancel("unknown").is_empty());
    }

    #[test]
    fn a_closed_queue_refuses_jobs_and_ends_the_engine_loop() {
        let queue = JobQueue::new(4);
        queue.submit(job("a").0).ok();
        assert_eq!(queue.close().len(), 1);
        assert_eq!(queue.submit(job("b").0).err(), Some(Rejected::Closed));
        assert!(queue.next().is_none());
    }
}
