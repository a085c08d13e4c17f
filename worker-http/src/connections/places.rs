//! Who holds the connection places (specs/HTTP.md, "Connections"): every open connection, what
//! it is doing, and which one gives up its place when another needs it.
//!
//! A connection without a complete request (no head yet, a keep-alive wait, or a body still
//! arriving) is *unidentified*: its place goes to the next connection that needs one, the least
//! recently active first. A request for a job route (every route but `/health` and `/metrics`)
//! holds one of the job places, all places but the reserve; a status request holds none, so the
//! reserve is always theirs. A new connection is refused only when every place holds a complete
//! request, and a job request only when every job place does.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use super::{Connection, ConnectionLimits, ConnectionStats};

/// What a request holds on its connection; the guard reads it (a request extension).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Place {
    /// A request for `/health` or `/metrics`: never refused for want of a place.
    Status,
    /// One of the job places.
    Job,
    /// Every job place holds a complete request: answered 503 `WORKER_BUSY`.
    JobsFull {
        /// How many job places there are.
        places: usize,
    },
}

/// One open connection as the registry keeps it.
#[derive(Debug)]
struct Entry {
    connection: Arc<Connection>,
    /// Requests whose head has arrived and whose response has not been fully sent.
    requests: usize,
    /// Of them, those holding a job place.
    jobs: usize,
    /// The request in flight still has body to come.
    receiving: bool,
    /// The registry's clock when it last changed: who goes first among the unidentified.
    since: u64,
}

impl Entry {
    /// No complete request: none at all, or a body still arriving.
    fn unidentified(&self) -> bool {
        self.requests == 0 || self.receiving
    }
}

/// The open connections and the places they hold.
#[derive(Debug)]
pub struct Registry {
    limits: ConnectionLimits,
    stats: Arc<ConnectionStats>,
    next_id: u64,
    /// Counts changes, to order the unidentified connections by their last activity.
    clock: u64,
    open: BTreeMap<u64, Entry>,
    /// Job places held.
    jobs: usize,
}

impl Registry {
    /// No connection yet, under `limits`.
    pub fn new(limits: ConnectionLimits, stats: Arc<ConnectionStats>) -> Self {
        stats.limit.store(limits.max, Ordering::Relaxed);
        Self {
            limits,
            stats,
            next_id: 0,
            clock: 0,
            open: BTreeMap::new(),
            jobs: 0,
        }
    }

    /// A place for a new connection: a free one, else the place of the least recently active
    /// unidentified connection; `None` (counted as refused) when every place holds a request.
    pub fn admit(&mut self) -> Option<Arc<Connection>> {
        if self.open.len() >= self.limits.max && !self.shed_one(|_| true) {
            self.stats.refused.fetch_add(1, Ordering::Relaxed);
            return None;
        }
        let id = self.next_id;
        self.next_id += 1;
        let connection = Arc::new(Connection::new(id));
        let entry = Entry {
            connection: connection.clone(),
            requests: 0,
            jobs: 0,
            receiving: false,
            since: self.tick(),
        };
        self.open.insert(id, entry);
        self.count_open();
        Some(connection)
    }

    /// A request's head has arrived on connection `id`, for a status route or not, with body to
    /// come or not: the place it holds. A job request takes a free job place, else that of the
    /// least recently active job request whose body is still arriving, else none.
    pub fn claim(&mut self, id: u64, status_route: bool, receiving: bool) -> Place {
        let places = self.limits.job_places();
        let place = if status_route {
            Place::Status
        } else if self.jobs < places
            || self.shed_one(|e| e.receiving && e.jobs > 0 && e.connection.id != id)
        {
            Place::Job
        } else {
            self.stats.jobs_full.fetch_add(1, Ordering::Relaxed);
            Place::JobsFull { places }
        };
        let since = self.tick();
        // An evicted connection's last request counts nowhere.
        if let Some(entry) = self.open.get_mut(&id) {
            entry.requests += 1;
            entry.receiving = receiving;
            entry.since = since;
            if place == Place::Job {
                entry.jobs += 1;
                self.jobs += 1;
            }
        }
        place
    }

    /// The body of the request on connection `id` has arrived, or will not.
    pub fn received(&mut self, id: u64) {
        let since = self.tick();
        if let Some(entry) = self.open.get_mut(&id) {
            entry.receiving = false;
            entry.since = since;
        }
    }

    /// A request on connection `id` is over (its response sent or dropped).
    pub fn release(&mut self, id: u64, place: Place) {
        let since = self.tick();
        let Some(entry) = self.open.get_mut(&id) else {
            return;
        };
        entry.requests = entry.requests.saturating_sub(1);
        entry.receiving = false;
        entry.since = since;
        if place == Place::Job && entry.jobs > 0 {
            entry.jobs -= 1;
            self.jobs = self.jobs.saturating_sub(1);
        }
    }

    /// Connection `id` has closed.
    pub fn close(&mut self, id: u64) {
        if let Some(entry) = self.open.remove(&id) {
            self.jobs = self.jobs.saturating_sub(entry.jobs);
        }
        self.count_open();
    }

    /// After an accept failed for want of descriptors or memory: the limit lowered to fit
    /// `descriptors` (the descriptor limit, read again after `EMFILE`), then unidentified
    /// connections closed until a place is free, at least one. Whether the limit was lowered, and
    /// how many were closed.
    pub fn shed_for_descriptors(&mut self, descriptors: Option<u64>) -> (bool, usize) {
        let lowered = descriptors.is_some_and(|d| self.limits.fit_descriptors(d));
        if lowered {
            self.stats.limit.store(self.limits.max, Ordering::Relaxed);
        }
        let mut shed = 0;
        while (shed == 0 || self.open.len() >= self.limits.max) && self.shed_one(|_| true) {
            shed += 1;
        }
        (lowered, shed)
    }

    /// The limits in force.
    pub fn limits(&self) -> &ConnectionLimits {
        &self.limits
    }

    /// Closes the least recently active unidentified connection that `pick` accepts, giving
    /// back its job places; whether there was one.
    fn shed_one(&mut self, pick: impl Fn(&Entry) -> bool) -> bool {
        let victim = self
            .open
            .iter()
            .filter(|(_, entry)| entry.unidentified() && pick(entry))
            .min_by_key(|(_, entry)| entry.since)
            .map(|(&id, _)| id);
        let Some(entry) = victim.and_then(|id| self.open.remove(&id)) else {
            return false;
        };
        self.jobs = self.jobs.saturating_sub(entry.jobs);
        entry.connection.close.notify_one();
        self.stats.evicted.fetch_add(1, Ordering::Relaxed);
        self.count_open();
        true
    }

    fn tick(&mut self) -> u64 {
        self.clock += 1;
        self.clock
    }

    fn count_open(&self) {
        self.stats.open.store(self.open.len(), Ordering::Relaxed);
    }
}
