//! The KV page pool's bookkeeping, backend-agnostic: which pages are free, which belong to
//! sequences (by reference count), and the prefix cache that lets a new sequence start from
//! pages another one filled with the same tokens.
//!
//! A full page is keyed by a chain hash of every token up to its end (the hash of the page
//! before it and the page's own tokens), as vLLM keys its blocks. The entry keeps the parent
//! hash and the tokens and a lookup compares both, so two prompts only share a page when their
//! tokens up to its end agree (up to a collision of the 64-bit parent hash). Pages nobody
//! references but the cache still knows are reused least recently used first.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::{Arc, PoisonError, RwLock};

use crate::backend::{PAGE_SIZE, PageId};

/// The chain hash of a page's tokens after a page whose hash is `parent` (0 for the first).
pub fn chain_hash(parent: u64, tokens: &[u32]) -> u64 {
    // `DefaultHasher::new()` has fixed keys: the same tokens hash the same in every run.
    let mut hasher = DefaultHasher::new();
    parent.hash(&mut hasher);
    tokens.hash(&mut hasher);
    hasher.finish()
}

/// A read-only view of which chain hashes the prefix cache holds, for other threads: the
/// HTTP side reports a new job's expected `cached_tokens` on acceptance without asking the
/// engine (the pages may still be evicted before the job starts; its `end` event has what was
/// really reused).
#[derive(Debug, Clone, Default)]
pub struct PrefixIndex(Arc<RwLock<HashSet<u64>>>);

impl PrefixIndex {
    /// Leading tokens of `tokens` whose full pages are cached now, at most `limit`.
    pub fn cached_tokens(&self, tokens: &[u32], limit: usize) -> usize {
        let hashes = self.0.read().unwrap_or_else(PoisonError::into_inner);
        let mut parent = 0;
        let mut cached = 0;
        for page in tokens[..limit.min(tokens.len())].chunks_exact(PAGE_SIZE) {
            parent = chain_hash(parent, page);
            if !hashes.contains(&parent) {
                break;
            }
            cached += PAGE_SIZE;
        }
        cached
    }

    fn insert(&self, hash: u64) {
        self.0
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(hash);
    }

    fn remove(&self, hash: u64) {
        self.0
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&hash);
    }
}

/// What the cache knows of a full page.
#[derive(Debug, Clone)]
struct Cached {
    hash: u64,
    parent: u64,
    tokens: [u32; PAGE_SIZE],
    /// When it was last referenced, for least-recently-used eviction.
    tick: u64,
}

/// Free pages, reference counts and the prefix cache of one pool.
#[derive(Debug)]
pub struct PagePool {
    refs: Vec<u32>,
    cached: Vec<Option<Cached>>,
    by_hash: HashMap<u64, PageId>,
    /// Pages with no reference and no cache entry, a stack: the page freed last is reused
    /// first, so a worker touches (and, on the CPU, makes resident) as few pages as its load
    /// needs instead of cycling through the whole pool.
    free: Vec<PageId>,
    /// Cached pages with no reference, by last use: the eviction order.
    idle: BTreeMap<u64, PageId>,
    prefix_cache: bool,
    tick: u64,
    index: PrefixIndex,
}

impl PagePool {
    /// A pool of `pages` pages, all free; `prefix_cache` off never shares a page.
    pub fn new(pages: usize, prefix_cache: bool) -> Self {
        Self {
            refs: vec![0; pages],
            cached: vec![None; pages],
            by_hash: HashMap::new(),
            free: (0..pages as u32).rev().map(PageId).collect(),
            idle: BTreeMap::new(),
            prefix_cache,
            tick: 0,
            index: PrefixIndex::default(),
        }
    }

    /// The shared view of the cached hashes.
    pub fn index(&self) -> PrefixIndex {
        self.index.clone()
    }

    /// Pages in the pool.
    pub fn total(&self) -> usize {
        self.refs.len()
    }

    /// Pages a sequence can get now: free ones and cached ones nobody references.
    pub fn available(&self) -> usize {
        self.free.len() + self.idle.len()
    }

    /// Pages holding a cached prefix that nobody references.
    pub fn idle_cached(&self) -> usize {
        self.idle.len()
    }

    /// The cached pages that hold `tokens`' leading full pages, referenced for the caller,
    /// with the chain hash of the last one (0 for none). At most `limit` tokens' pages.
    pub fn lookup(&mut self, tokens: &[u32], limit: usize) -> (Vec<PageId>, u64) {
        let mut pages = Vec::new();
        let mut parent = 0;
        if !self.prefix_cache {
            return (pages, parent);
        }
        for page_tokens in tokens[..limit.min(tokens.len())].chunks_exact(PAGE_SIZE) {
            let hash = chain_hash(parent, page_tokens);
            let Some(&page) = self.by_hash.get(&hash) else {
                break;
            };
            let matches = self.cached[page.index()]
                .as_ref()
                .is_some_and(|c| c.parent == parent && c.tokens[..] == *page_tokens);
            if !matches {
                break;
            }
            self.reference(page);
            pages.push(page);
            parent = hash;
        }
        (pages, parent)
    }

    /// A page for the caller (reference count 1), evicting the least recently used idle cached
    /// page when none is free; `None` when every page is referenced.
    pub fn allocate(&mut self) -> Option<PageId> {
        let page = match self.free.pop() {
            Some(page) => page,
            None => {
                let (_, page) = self.idle.pop_first()?;
                if let Some(entry) = self.cached[page.index()].take() {
                    self.by_hash.remove(&entry.hash);
                    self.index.remove(entry.hash);
                }
                page
            }
        };
        self.refs[page.index()] = 1;
        Some(page)
    }

    /// Offers `page`, now full with `tokens` after a page of chain hash `parent`, to the cache;
    /// returns its chain hash. A page whose tokens are cached already (another sequence filled
    /// the same prefix at the same time) stays private.
    pub fn register(&mut self, page: PageId, parent: u64, tokens: &[u32]) -> u64 {
        let hash = chain_hash(parent, tokens);
        if !self.prefix_cache || self.by_hash.contains_key(&hash) {
            return hash;
        }
        let Ok(tokens) = <[u32; PAGE_SIZE]>::try_from(tokens) else {
            return hash;
        };
        self.tick += 1;
        self.by_hash.insert(hash, page);
        self.index.insert(hash);
        self.cached[page.index()] = Some(Cached {
            hash,
            parent,
            tokens,
            tick: self.tick,
        });
        hash
    }

    /// Drops one reference on each of `pages`; a page nobody references becomes idle (cached)
    /// or free.
    pub fn release(&mut self, pages: &[PageId]) {
        for &page in pages {
            let refs = &mut self.refs[page.index()];
            *refs = refs.saturating_sub(1);
            if *refs > 0 {
                continue;
            }
            self.tick += 1;
            match &mut self.cached[page.index()] {
                Some(entry) => {
                    entry.tick = self.tick;
                    self.idle.insert(self.tick, page);
                }
                None => self.free.push(page),
            }
        }
    }

    fn reference(&mut self, page: PageId) {
        let refs = &mut self.refs[page.index()];
        if *refs == 0
            && let Some(entry) = &self.cached[page.index()]
        {
            self.idle.remove(&entry.tick);
        }
        *refs += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tokens(n: usize, salt: u32) -> Vec<u32> {
        (0..n as u32).map(|t| t * 7 + salt).collect()
    }

    /// Takes pages for `tokens` as a sequence would, registering every full page.
    fn fill(pool: &mut PagePool, tokens: &[u32]) -> Vec<PageId> {
        let mut parent = 0;
        let mut pages = Vec::new();
        for page_tokens in tokens.chunks(PAGE_SIZE) {
            let page = pool.allocate().unwrap();
            if page_tokens.len() == PAGE_SIZE {
                parent = pool.register(page, parent, page_tokens);
            }
            pages.push(page);
        }
        pages
    }

    #[test]
    fn a_shared_prefix_is_found_page_by_page_and_released_to_the_cache() {
        let mut pool = PagePool::new(8, true);
        let prompt = tokens(40, 1);
        let first = fill(&mut pool, &prompt);
        assert_eq!(pool.available(), 5);
        let (shared, _) = pool.lookup(&prompt, 39);
        assert_eq!(shared, first[..2].to_vec(), "two full pages of 16");
        assert_eq!(pool.index().cached_tokens(&prompt, 40), 32);
        pool.release(&first);
        assert_eq!(pool.available(), 6, "the shared pages are still referenced");
        pool.release(&shared);
        assert_eq!((pool.available(), pool.idle_cached()), (8, 2));
        let mut other = prompt.clone();
        other[20] += 1;
        assert_eq!(pool.lookup(&other, 40).0, first[..1].to_vec());
    }

    #[test]
    fn idle_cached_pages_are_evicted_least_recently_used_first() {
        let mut pool = PagePool::new(3, true);
        let a = fill(&mut pool, &tokens(16, 1));
        let b = fill(&mut pool, &tokens(16, 2));
        pool.release(&a);
        pool.release(&b);
        let _c = pool.allocate().unwrap();
        let _d = pool.allocate().unwrap();
        assert!(pool.lookup(&tokens(16, 1), 16).0.is_empty(), "a went first");
        assert_eq!(pool.index().cached_tokens(&tokens(16, 1), 16), 0);
        assert_eq!(pool.lookup(&tokens(16, 2), 16).0, b);
        assert!(pool.allocate().is_none(), "every page is referenced");
    }

    #[test]
    fn the_page_freed_last_is_reused_first() {
        let mut pool = PagePool::new(8, false);
        let first = pool.allocate().unwrap();
        let second = pool.allocate().unwrap();
        assert_eq!((first, second), (PageId(0), PageId(1)));
        pool.release(&[first]);
        assert_eq!(pool.allocate(), Some(first), "not a never-touched page");
    }

    #[test]
    fn without_the_prefix_cache_nothing_is_shared() {
        let mut pool = PagePool::new(4, false);
        let prompt = tokens(32, 3);
        let pages = fill(&mut pool, &prompt);
        pool.release(&pages);
        assert!(pool.lookup(&prompt, 32).0.is_empty());
        assert_eq!((pool.available(), pool.idle_cached()), (4, 0));
    }
}
