//! The job queue between the HTTP handlers and the engine thread: arrival order, a bounded
//! number of waiting jobs, the list of running jobs, and cancellation of either by id.

use std::collections::VecDeque;
use std::sync::{Condvar, Mutex, MutexGuard, PoisonError};

use tokio::sync::mpsc::UnboundedSender;
use worker_common::generate::{CancelToken, GenerateRequest};

use crate::job_end::JobEvent;

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
    pub events: UnboundedSender<JobEvent>,
}

/// Why a job was not accepted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rejected {
    /// `--queue-depth` jobs are already waiting.
    Full,
    /// The worker is draining.
    Closed,
}

/// A running job as the queue knows it: enough to cancel it.
#[derive(Debug)]
struct RunningJob {
    /// Tells running jobs with the same caller id apart.
    serial: u64,
    id: String,
    cancel: CancelToken,
}

#[derive(Debug, Default)]
struct Inner {
    waiting: VecDeque<Job>,
    running: Vec<RunningJob>,
    next_serial: u64,
    closed: bool,
}

/// A started job's ticket, handed back to [`JobQueue::finish`] when it ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ticket(u64);

/// FIFO of jobs for the engine thread, and the list of the running ones.
#[derive(Debug)]
pub struct JobQueue {
    depth: usize,
    inner: Mutex<Inner>,
    wake: Condvar,
}

impl JobQueue {
    /// A queue holding at most `depth` waiting jobs besides the running ones.
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

    /// Enqueues `job` for an engine running at most `slots` jobs; returns its queue position:
    /// how many jobs must start or end before it can start (0: it starts now, a slot being
    /// free). A refused job is dropped.
    pub fn submit(&self, job: Job, slots: usize) -> Result<usize, Rejected> {
        let mut inner = self.lock();
        if inner.closed {
            return Err(Rejected::Closed);
        }
        if inner.waiting.len() >= self.depth {
            return Err(Rejected::Full);
        }
        let ahead = (inner.running.len() + inner.waiting.len() + 1).saturating_sub(slots);
        inner.waiting.push_back(job);
        self.wake.notify_one();
        Ok(ahead)
    }

    /// Takes the first waiting job if `admit` accepts it, and marks it running: arrival order,
    /// so a job that does not fit yet holds back the ones behind it.
    pub fn start_next(&self, admit: impl FnOnce(&Job) -> bool) -> Option<(Job, Ticket)> {
        let mut inner = self.lock();
        if !admit(inner.waiting.front()?) {
            return None;
        }
        let job = inner.waiting.pop_front()?;
        inner.next_serial += 1;
        let serial = inner.next_serial;
        inner.running.push(RunningJob {
            serial,
            id: job.id.clone(),
            cancel: job.cancel.clone(),
        });
        Some((job, Ticket(serial)))
    }

    /// Blocks until a job waits; false once the queue is closed and empty.
    pub fn wait(&self) -> bool {
        let mut inner = self.lock();
        loop {
            if !inner.waiting.is_empty() {
                return true;
            }
            if inner.closed {
                return false;
            }
            inner = self
                .wake
                .wait(inner)
                .unwrap_or_else(PoisonError::into_inner);
        }
    }

    /// Marks the running job of `ticket` done.
    pub fn finish(&self, ticket: Ticket) {
        self.lock().running.retain(|job| job.serial != ticket.0);
    }

    /// Cancels the running jobs with `id` and removes the waiting ones, which are returned for
    /// the caller to end.
    pub fn cancel(&self, id: &str) -> Vec<Job> {
        let mut inner = self.lock();
        for job in inner.running.iter().filter(|job| job.id == id) {
            job.cancel.cancel();
        }
        let (removed, kept): (VecDeque<Job>, VecDeque<Job>) = std::mem::take(&mut inner.waiting)
            .into_iter()
            .partition(|job| job.id == id);
        inner.waiting = kept;
        removed.into()
    }

    /// Refuses new jobs and returns the waiting ones; the engine ends after the running jobs.
    pub fn close(&self) -> Vec<Job> {
        let mut inner = self.lock();
        inner.closed = true;
        self.wake.notify_all();
        inner.waiting.drain(..).collect()
    }

    /// Cancels every running job.
    pub fn cancel_running(&self) {
        for job in &self.lock().running {
            job.cancel.cancel();
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

    /// Jobs running.
    pub fn running(&self) -> usize {
        self.lock().running.len()
    }
}

#[cfg(test)]
mod tests {
    use tokio::sync::mpsc;
    use worker_common::sampling::SamplingParams;

    use super::*;

    fn job(id: &str) -> (Job, mpsc::UnboundedReceiver<JobEvent>) {
        let (events, receiver) = mpsc::unbounded_channel();
        let request = GenerateRequest {
            prompt_tokens: vec![1],
            max_tokens: 1,
            sampling: SamplingParams::default(),
            stop: Vec::new(),
            deadline: None,
            ignore_eos: false,
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

    fn start(queue: &JobQueue) -> Option<(String, Ticket)> {
        queue
            .start_next(|_| true)
            .map(|(job, ticket)| (job.id, ticket))
    }

    #[test]
    fn jobs_start_in_order_and_the_depth_bounds_waiting_jobs() {
        let queue = JobQueue::new(2);
        assert_eq!(queue.submit(job("a").0, 1).ok(), Some(0));
        assert_eq!(queue.submit(job("b").0, 1).ok(), Some(1));
        assert_eq!(queue.submit(job("c").0, 1).err(), Some(Rejected::Full));
        assert!(
            queue.start_next(|_| false).is_none(),
            "the engine had no room"
        );
        let (first, ticket) = start(&queue).unwrap();
        assert_eq!(first, "a");
        assert_eq!(queue.running(), 1);
        assert_eq!(
            queue.submit(job("c").0, 1).ok(),
            Some(2),
            "one running, one waiting ahead"
        );
        assert_eq!(start(&queue).map(|(id, _)| id).as_deref(), Some("b"));
        queue.finish(ticket);
        assert_eq!(queue.running(), 1);
        assert_eq!(
            queue.submit(job("d").0, 4).ok(),
            Some(0),
            "a free slot of four"
        );
    }

    #[test]
    fn cancel_reaches_running_and_waiting_jobs() {
        let queue = JobQueue::new(4);
        let (running, _rx) = job("x");
        let token = running.cancel.clone();
        queue.submit(running, 1).ok();
        queue.submit(job("y").0, 1).ok();
        queue.submit(job("x").0, 1).ok();
        let _ = start(&queue);
        let removed = queue.cancel("x");
        assert!(token.is_cancelled());
        assert_eq!(removed.len(), 1);
        assert_eq!(queue.len(), 1);
        assert!(queue.cancel("unknown").is_empty());
    }

    #[test]
    fn a_closed_queue_refuses_jobs_and_ends_the_engine_loop() {
        let queue = JobQueue::new(4);
        queue.submit(job("a").0, 1).ok();
        assert_eq!(queue.close().len(), 1);
        assert_eq!(queue.submit(job("b").0, 1).err(), Some(Rejected::Closed));
        assert!(!queue.wait());
    }
}
