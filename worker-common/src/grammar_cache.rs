//! Compiled grammars by content: a request whose grammar was compiled before (the same schema
//! sent again, the same tools forced again) gets a copy of what that compile made, its first
//! mask included, or the same refusal, without compiling it again. A small LRU shared by every
//! request of the worker.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

/// Entries kept: grammars a worker sees again are few (a client's schema, an agent's tool set),
/// and one compiled grammar holds its lexer and first mask (a bitset of the vocabulary: 19 kB
/// for 152k tokens), so 64 of them stay within a few megabytes.
pub const GRAMMAR_CACHE_ENTRIES: usize = 64;

/// Longest grammar text cached, in bytes: the key is the whole text (a hash could make two
/// grammars one), so a larger grammar is compiled each time rather than kept.
pub const MAX_CACHED_GRAMMAR_BYTES: usize = 64 * 1024;

/// What the cache has done, for tests and metrics.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CacheStats {
    /// Lookups answered from the cache.
    pub hits: u64,
    /// Lookups that found nothing (the grammar was then compiled).
    pub misses: u64,
    /// Entries held now.
    pub entries: usize,
}

/// One entry: the value and when it was last used.
struct Entry<V> {
    value: Arc<V>,
    used: u64,
}

/// The map and its clock, behind the cache's lock.
struct Inner<V> {
    entries: HashMap<String, Entry<V>>,
    /// Counts lookups and inserts: an entry's `used` is the tick of its last one.
    clock: u64,
    stats: CacheStats,
}

/// A bounded least-recently-used map from a grammar's text to what compiling it gave.
pub struct LruCache<V> {
    inner: Mutex<Inner<V>>,
    capacity: usize,
}

impl<V> LruCache<V> {
    /// An empty cache of at most `capacity` entries (at least one).
    pub fn new(capacity: usize) -> Self {
        Self {
            inner: Mutex::new(Inner {
                entries: HashMap::new(),
                clock: 0,
                stats: CacheStats::default(),
            }),
            capacity: capacity.max(1),
        }
    }

    /// The map. A panic while the lock was held (none of the code under it calls out, so none
    /// is expected) leaves the map whole: every change under the lock is one map operation.
    fn lock(&self) -> std::sync::MutexGuard<'_, Inner<V>> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The value under `key`, now the most recently used; counts a hit or a miss.
    pub fn get(&self, key: &str) -> Option<Arc<V>> {
        let mut inner = self.lock();
        inner.clock += 1;
        let now = inner.clock;
        let found = inner.entries.get_mut(key).map(|entry| {
            entry.used = now;
            entry.value.clone()
        });
        match found {
            Some(_) => inner.stats.hits += 1,
            None => inner.stats.misses += 1,
        }
        found
    }

    /// Keeps `value` under `key`, dropping the least recently used entry when full (a linear
    /// scan: the cache is small, and a compile costs far more).
    pub fn insert(&self, key: String, value: V) {
        let mut inner = self.lock();
        inner.clock += 1;
        let now = inner.clock;
        if !inner.entries.contains_key(&key) && inner.entries.len() >= self.capacity {
            let oldest = inner
                .entries
                .iter()
                .min_by_key(|(_, entry)| entry.used)
                .map(|(key, _)| key.clone());
            if let Some(oldest) = oldest {
                inner.entries.remove(&oldest);
            }
        }
        let value = Arc::new(value);
        inner.entries.insert(key, Entry { value, used: now });
        inner.stats.entries = inner.entries.len();
    }

    /// Hits, misses and entries so far.
    pub fn stats(&self) -> CacheStats {
        self.lock().stats
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_least_recently_used_entry_goes_first_and_the_bound_holds() {
        let cache = LruCache::new(3);
        for (i, key) in ["a", "b", "c"].into_iter().enumerate() {
            cache.insert(key.into(), i);
        }
        assert_eq!(cache.get("a").as_deref(), Some(&0), "a is now the newest");
        cache.insert("d".into(), 3);
        assert!(cache.get("b").is_none(), "b was the least recently used");
        assert_eq!(cache.get("c").as_deref(), Some(&2));
        assert_eq!(cache.get("a").as_deref(), Some(&0));
        assert_eq!(cache.get("d").as_deref(), Some(&3));
        for i in 0..100 {
            cache.insert(format!("k{i}"), i);
            assert!(cache.stats().entries <= 3);
        }
        assert_eq!(cache.get("k99").as_deref(), Some(&99));
        let stats = cache.stats();
        assert_eq!((stats.hits, stats.misses, stats.entries), (5, 1, 3));
    }

    #[test]
    fn a_grammar_compiled_again_comes_from_the_cache_with_the_same_masks() {
        use crate::grammar::tests::allowed_ids;
        use crate::grammar::{GrammarError, GrammarSpec, Grammars};
        use crate::testing::ascii_tokenizer;
        use serde_json::json;

        let tokenizer = ascii_tokenizer();
        let grammars = Grammars::new(&tokenizer).unwrap();
        let schema = json!({"type": "object", "properties": {"a": {"type": "integer"}},
            "required": ["a"]});
        let spec = GrammarSpec::JsonSchema(schema);
        let text = tokenizer.encode("{\"a\": 12}", false, false).unwrap();
        let n = tokenizer.vocab().len() as u32;
        // The masks along a valid text, and where the grammar may end.
        let walk = |grammars: &Grammars| {
            let mut guide = grammars.compile(&spec).unwrap().start();
            let mut masks = vec![allowed_ids(&guide, n)];
            for &token in &text {
                guide.accept(token).unwrap();
                masks.push(allowed_ids(&guide, n));
            }
            masks
        };
        let first = walk(&grammars);
        assert_eq!(grammars.cache_stats().misses, 1);
        let again = walk(&grammars);
        let third = walk(&grammars);
        let stats = grammars.cache_stats();
        assert_eq!((stats.hits, stats.misses, stats.entries), (2, 1, 1));
        assert_eq!(
            first, again,
            "the cached parser allows what a fresh one does"
        );
        assert_eq!(first, third, "and jobs that ran it left it as it was");
        let uncached = Grammars::new(&tokenizer).unwrap();
        assert_eq!(walk(&uncached), first);

        // Another grammar is another entry.
        let other = GrammarSpec::JsonSchema(json!({"type": "object"}));
        grammars.compile(&other).unwrap();
        assert_eq!(grammars.cache_stats().entries, 2);

        // A refusal is kept too, and given again the same.
        let bad = GrammarSpec::Lark("start: (".into());
        let refused = grammars.compile(&bad).unwrap_err();
        let before = grammars.cache_stats().hits;
        let again = grammars.compile(&bad).unwrap_err();
        assert!(matches!(again, GrammarError::Compile(_)), "{again}");
        assert_eq!(again.to_string(), refused.to_string());
        assert_eq!(grammars.cache_stats().hits, before + 1);
    }

    #[test]
    fn a_key_inserted_again_replaces_its_value_without_evicting() {
        let cache = LruCache::new(2);
        cache.insert("a".into(), 1);
        cache.insert("b".into(), 2);
        cache.insert("a".into(), 3);
        assert_eq!(cache.get("a").as_deref(), Some(&3));
        assert_eq!(cache.get("b").as_deref(), Some(&2));
    }
}
