//! The job queue between the HTTP handlers and the engine thread: arrival order, a bounded
//! number of waiting jobs, the list of running jobs, and cancellation of either by id. A job
//! whose client left is taken out at once ([`JobQueue::abandon`]); a cancel for an id not seen yet
//! is remembered for [`EARLY_CANCEL_WINDOW`] and applied when the job arrives.

use std::collections::VecDeque;
use std::sync::{Condvar, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

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

/// How long a cancel for an unknown job id waits for that job to arrive: a client may send the
/// cancel while its `/execute` is still being tokenized.
pub const EARLY_CANCEL_WINDOW: Duration = Duration::from_secs(5);

/// Most remembered early cancels (and ended ids); the oldest are forgotten first.
const MAX_REMEMBERED: usize = 1024;

/// What became of a submitted job.
#[derive(Debug)]
pub enum Submitted {
    /// Waiting for the engine.
    Queued {
        /// How many jobs must start or end before it can start (0: a slot is free).
        position: usize,
        /// The job's handle for [`JobQueue::abandon`] and [`JobQueue::finish`].
        ticket: Ticket,
    },
    /// A cancel for its id arrived first: the job is handed back, to be ended as cancelled.
    CancelledOnArrival(Box<Job>),
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
    ticket: Ticket,
    id: String,
    cancel: CancelToken,
}

#[derive(Debug, Default)]
struct Inner {
    /// Waiting jobs in arrival order, with their tickets.
    waiting: VecDeque<(Ticket, Job)>,
    running: Vec<RunningJob>,
    next_serial: u64,
    closed: bool,
    /// Cancelled ids no job had yet, oldest first, with when the cancel came.
    early_cancels: VecDeque<(String, Instant)>,
    /// Ids of jobs that ended lately, oldest first: a late cancel of one is not an early cancel
    /// of the next job with its id.
    recently_ended: VecDeque<(String, Instant)>,
}

impl Inner {
    /// Forgets early cancels and ended ids older than the window.
    fn expire(&mut self, now: Instant) {
        for ids in [&mut self.early_cancels, &mut self.recently_ended] {
            while ids
                .front()
                .is_some_and(|(_, at)| now.duration_since(*at) > EARLY_CANCEL_WINDOW)
            {
                ids.pop_front();
            }
        }
    }

    /// Adds `id` to `ids`, forgetting the oldest beyond [`MAX_REMEMBERED`].
    fn remember(ids: &mut VecDeque<(String, Instant)>, id: String, now: Instant) {
        if ids.len() >= MAX_REMEMBERED {
            ids.pop_front();
        }
        ids.push_back((id, now));
    }
}

/// A job's handle from submission to its end: tells jobs with the same caller id apart.
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

    /// Enqueues `job` for an engine running at most `slots` jobs, unless a cancel for its id
    /// came first. A refused job is dropped.
    pub fn submit(&self, job: Job, slots: usize) -> Result<Submitted, Rejected> {
        let mut inner = self.lock();
        if inner.closed {
            return Err(Rejected::Closed);
        }
        inner.expire(Instant::now());
        if let Some(at) = inner.early_cancels.iter().position(|(id, _)| *id == job.id) {
            inner.early_cancels.remove(at);
            return Ok(Submitted::CancelledOnArrival(Box::new(job)));
        }
        if inner.waiting.len() >= self.depth {
            return Err(Rejected::Full);
        }
        let position = (inner.running.len() + inner.waiting.len() + 1).saturating_sub(slots);
        inner.next_serial += 1;
        let ticket = Ticket(inner.next_serial);
        inner.waiting.push_back((ticket, job));
        self.wake.notify_one();
        Ok(Submitted::Queued { position, ticket })
    }

    /// Takes the job of `ticket` out if it is still waiting (its client left), for the caller
    /// to end; a running one is left to its cancel token.
    pub fn abandon(&self, ticket: Ticket) -> Option<Job> {
        let mut inner = self.lock();
        let at = inner.waiting.iter().position(|(t, _)| *t == ticket)?;
        inner.waiting.remove(at).map(|(_, job)| job)
    }

    /// Takes the first waiting job if `admit` accepts it, and marks it running: arrival order,
    /// so a job that does not fit yet holds back the ones behind it.
    pub fn start_next(&self, admit: impl FnOnce(&Job) -> bool) -> Option<(Job, Ticket)> {
        let mut inner = self.lock();
        if !admit(&inner.waiting.front()?.1) {
            return None;
        }
        let (ticket, job) = inner.waiting.pop_front()?;
        inner.running.push(RunningJob {
            ticket,
            id: job.id.clone(),
            cancel: job.cancel.clone(),
        });
        Some((job, ticket))
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
        let mut inner = self.lock();
        if let Some(at) = inner.running.iter().position(|job| job.ticket == ticket) {
            let job = inner.running.swap_remove(at);
            Inner::remember(&mut inner.recently_ended, job.id, Instant::now());
        }
    }

    /// Cancels the running jobs with `id` and removes the waiting ones, which are returned for
    /// the caller to end. With no such job, the cancel is remembered for a job of that id
    /// arriving within [`EARLY_CANCEL_WINDOW`].
    pub fn cancel(&self, id: &str) -> Vec<Job> {
        let mut inner = self.lock();
        let mut found = false;
        for job in inner.running.iter().filter(|job| job.id == id) {
            job.cancel.cancel();
            found = true;
        }
        let (removed, kept): (VecDeque<_>, VecDeque<_>) = std::mem::take(&mut inner.waiting)
            .into_iter()
            .partition(|(_, job)| job.id == id);
        inner.waiting = kept;
        let now = Instant::now();
        inner.expire(now);
        let ended = inner.recently_ended.iter().any(|(ended, _)| ended == id);
        if !found && removed.is_empty() && !ended {
            Inner::remember(&mut inner.early_cancels, id.to_owned(), now);
        }
        removed.into_iter().map(|(_, job)| job).collect()
    }

    /// Refuses new jobs and returns the waiting ones; the engine ends after the running jobs.
    pub fn close(&self) -> Vec<Job> {
        let mut inner = self.lock();
        inner.closed = true;
        self.wake.notify_all();
        inner.waiting.drain(..).map(|(_, job)| job).collect()
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
            grammar: None,
            speculative: true,
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

    fn position(submitted: Result<Submitted, Rejected>) -> Option<usize> {
        match submitted {
            Ok(Submitted::Queued { position, .. }) => Some(position),
            _ => None,
        }
    }

    fn start(queue: &JobQueue) -> Option<(String, Ticket)> {
        queue
            .start_next(|_| true)
            .map(|(job, ticket)| (job.id, ticket))
    }

    #[test]
    fn jobs_start_in_order_and_the_depth_bounds_waiting_jobs() {
        let queue = JobQueue::new(2);
        assert_eq!(position(queue.submit(job("a").0, 1)), Some(0));
        assert_eq!(position(queue.submit(job("b").0, 1)), Some(1));
        assert_eq!(queue.submit(job("c").0, 1).err(), Some(Rejected::Full));
        assert!(
            queue.start_next(|_| false).is_none(),
            "the engine had no room"
        );
        let (first, ticket) = start(&queue).unwrap();
        assert_eq!(first, "a");
        assert_eq!(queue.running(), 1);
        assert_eq!(
            position(queue.submit(job("c").0, 1)),
            Some(2),
            "one running, one waiting ahead"
        );
        assert_eq!(start(&queue).map(|(id, _)| id).as_deref(), Some("b"));
        queue.finish(ticket);
        assert_eq!(queue.running(), 1);
        assert_eq!(
            position(queue.submit(job("d").0, 4)),
            Some(0),
            "a free slot of four"
        );
    }

    #[test]
    fn cancel_reaches_running_and_waiting_jobs() {
        let queue = JobQueue::new(4);
        let (running, _rx) = job("x");
        let token = running.cancel.clone();
        for submitted in [running, job("y").0, job("x").0] {
            let _ = queue.submit(submitted, 1);
        }
        let _ = start(&queue);
        let removed = queue.cancel("x");
        assert!(token.is_cancelled());
        assert_eq!(removed.len(), 1);
        assert_eq!(queue.len(), 1);
        assert!(queue.cancel("unknown").is_empty());
    }

    #[test]
    fn a_cancel_before_the_job_arrives_cancels_it_on_arrival() {
        let queue = JobQueue::new(4);
        assert!(queue.cancel("early").is_empty());
        let arrived = queue.submit(job("early").0, 1);
        assert!(
            matches!(arrived, Ok(Submitted::CancelledOnArrival(ref job)) if job.id == "early"),
            "{arrived:?}"
        );
        assert!(queue.is_empty());
        assert_eq!(
            position(queue.submit(job("early").0, 1)),
            Some(0),
            "a remembered cancel applies once"
        );
        let (_, ticket) = start(&queue).unwrap();
        queue.finish(ticket);
        assert!(queue.cancel("early").is_empty());
        assert_eq!(
            position(queue.submit(job("early").0, 1)),
            Some(0),
            "a late cancel of an ended job is not remembered for the next one"
        );
    }

    #[test]
    fn an_abandoned_waiting_job_leaves_the_queue_at_once() {
        let queue = JobQueue::new(1);
        let Ok(Submitted::Queued { ticket, .. }) = queue.submit(job("gone").0, 1) else {
            panic!("not queued");
        };
        assert_eq!(queue.submit(job("next").0, 1).err(), Some(Rejected::Full));
        assert_eq!(
            queue.abandon(ticket).map(|job| job.id).as_deref(),
            Some("gone")
        );
        assert!(queue.abandon(ticket).is_none());
        assert_eq!(position(queue.submit(job("next").0, 1)), Some(0));
    }

    #[test]
    fn a_closed_queue_refuses_jobs_and_ends_the_engine_loop() {
        let queue = JobQueue::new(4);
        let _ = queue.submit(job("a").0, 1);
        assert_eq!(queue.close().len(), 1);
        assert_eq!(queue.submit(job("b").0, 1).err(), Some(Rejected::Closed));
        assert!(!queue.wait());
    }
}
