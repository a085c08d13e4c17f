//! The responses `/v1/responses` keeps for `previous_response_id` (specs/OPENAI.md,
//! "Responses"): each finished response's conversation as input items (the input it was given,
//! the previous response's included, then its output items), in memory, bounded in count, age
//! and bytes; the oldest is evicted first. Nothing survives a restart.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use serde_json::Value;

/// Most responses kept; storing one more evicts the oldest.
pub const MAX_STORED_RESPONSES: usize = 1_000;

/// How long a response is kept after it finished.
pub const MAX_STORED_AGE: Duration = Duration::from_secs(60 * 60);

/// Most bytes (the items' JSON text) kept for all responses together; a response whose items
/// alone are larger is not kept.
pub const MAX_STORED_BYTES: usize = 64 << 20;

/// The bounds of a [`ResponseStore`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StoreLimits {
    /// Most responses kept.
    pub responses: usize,
    /// Longest a response is kept.
    pub age: Duration,
    /// Most bytes kept.
    pub bytes: usize,
}

impl Default for StoreLimits {
    fn default() -> Self {
        Self {
            responses: MAX_STORED_RESPONSES,
            age: MAX_STORED_AGE,
            bytes: MAX_STORED_BYTES,
        }
    }
}

/// One kept response.
#[derive(Debug)]
struct Entry {
    items: Arc<[Value]>,
    bytes: usize,
    at: Instant,
}

#[derive(Debug, Default)]
struct Inner {
    limits: StoreLimits,
    entries: HashMap<String, Entry>,
    /// Ids in the order they were stored (oldest first).
    order: VecDeque<String>,
    bytes: usize,
}

impl Inner {
    /// Evicts the oldest entry; false when there is none.
    fn evict_oldest(&mut self) -> bool {
        let Some(id) = self.order.pop_front() else {
            return false;
        };
        if let Some(entry) = self.entries.remove(&id) {
            self.bytes -= entry.bytes;
        }
        true
    }

    /// Evicts the entries older than the age limit at `now`.
    fn evict_expired(&mut self, now: Instant) {
        while let Some(entry) = self.order.front().and_then(|id| self.entries.get(id)) {
            if now.saturating_duration_since(entry.at) <= self.limits.age {
                break;
            }
            self.evict_oldest();
        }
    }
}

/// The kept responses, shared by every request of the worker.
#[derive(Debug, Default)]
pub struct ResponseStore {
    inner: Mutex<Inner>,
}

impl ResponseStore {
    /// An empty store within `limits`.
    pub fn with_limits(limits: StoreLimits) -> Self {
        let inner = Inner {
            limits,
            ..Inner::default()
        };
        Self {
            inner: Mutex::new(inner),
        }
    }

    fn inner(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Keeps the conversation `items` of response `id`, evicting the oldest responses as the
    /// limits require.
    pub fn insert(&self, id: String, items: Vec<Value>) {
        self.insert_at(id, items, Instant::now());
    }

    /// [`Self::insert`] at `now`.
    pub fn insert_at(&self, id: String, items: Vec<Value>, now: Instant) {
        let bytes: usize = items.iter().map(|item| item.to_string().len()).sum();
        let mut inner = self.inner();
        inner.evict_expired(now);
        if bytes > inner.limits.bytes || inner.limits.responses == 0 {
            return;
        }
        if let Some(old) = inner.entries.remove(&id) {
            inner.bytes -= old.bytes;
            inner.order.retain(|kept| *kept != id);
        }
        while inner.entries.len() >= inner.limits.responses
            || inner.bytes + bytes > inner.limits.bytes
        {
            if !inner.evict_oldest() {
                break;
            }
        }
        inner.bytes += bytes;
        inner.order.push_back(id.clone());
        let entry = Entry {
            items: items.into(),
            bytes,
            at: now,
        };
        inner.entries.insert(id, entry);
    }

    /// The conversation of response `id`, while it is kept.
    pub fn get(&self, id: &str) -> Option<Arc<[Value]>> {
        self.get_at(id, Instant::now())
    }

    /// [`Self::get`] at `now`.
    pub fn get_at(&self, id: &str, now: Instant) -> Option<Arc<[Value]>> {
        let mut inner = self.inner();
        inner.evict_expired(now);
        inner.entries.get(id).map(|entry| entry.items.clone())
    }

    /// How many responses are kept.
    pub fn len(&self) -> usize {
        self.inner().entries.len()
    }

    /// Whether no response is kept.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Replaces the limits (tests: a small store); entries over them go at the next insert.
    pub fn set_limits(&self, limits: StoreLimits) {
        self.inner().limits = limits;
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use serde_json::json;

    use super::*;

    fn limits(responses: usize, bytes: usize) -> StoreLimits {
        StoreLimits {
            responses,
            age: Duration::from_secs(10),
            bytes,
        }
    }

    fn item(text: &str) -> Vec<Value> {
        vec![json!({"role": "user", "content": text})]
    }

    #[test]
    fn the_oldest_response_goes_first_when_the_count_is_reached() {
        let store = ResponseStore::with_limits(limits(2, 1 << 20));
        store.insert("a".into(), item("1"));
        store.insert("b".into(), item("2"));
        assert_eq!(store.get("a").unwrap()[0]["content"], "1");
        store.insert("c".into(), item("3"));
        assert!(store.get("a").is_none(), "evicted");
        assert_eq!(store.get("b").unwrap()[0]["content"], "2");
        assert_eq!(store.get("c").unwrap()[0]["content"], "3");
        assert_eq!(store.len(), 2);
    }

    #[test]
    fn a_response_expires_after_the_age_limit() {
        let store = ResponseStore::with_limits(limits(10, 1 << 20));
        let start = Instant::now();
        store.insert_at("a".into(), item("1"), start);
        store.insert_at("b".into(), item("2"), start + Duration::from_secs(5));
        let later = start + Duration::from_secs(11);
        assert!(store.get_at("a", later).is_none());
        assert!(store.get_at("b", later).is_some());
        assert!(store.get_at("b", start + Duration::from_secs(16)).is_none());
        assert!(store.is_empty());
    }

    #[test]
    fn bytes_are_bounded_and_an_oversized_response_is_not_kept() {
        let one = item("x").iter().map(|v| v.to_string().len()).sum::<usize>();
        let store = ResponseStore::with_limits(limits(10, 2 * one));
        store.insert("a".into(), item("x"));
        store.insert("b".into(), item("y"));
        store.insert("c".into(), item("z"));
        assert!(store.get("a").is_none());
        assert_eq!(store.len(), 2);
        store.insert("big".into(), item(&"w".repeat(3 * one)));
        assert!(store.get("big").is_none());
        assert_eq!(store.len(), 2, "nothing evicted for a response never kept");
    }
}
