//! `sluice-memory`: the embedded store, used when no Redis is configured.
//!
//! # Layout
//! - [`MemoryStore`]: the [`Store`] implementation, a map split into shards, each behind its
//!   own read-write lock, so checks of different keys rarely contend and there is no global
//!   lock on the hot path.
//! - [`MemoryStoreBuilder`]: the clock, the shard count and the limits on keys and bytes.
//! - [`EvictionCounts`]: what eviction did, for `/metrics`.
//!
//! Decisions come from [`sluice_core::algorithm::decide`]; this crate only keeps state and
//! makes a multi-limit check atomic, by write-locking every shard involved in ascending order (so two
//! checks can never wait on each other in a cycle) before evaluating anything.
//!
//! One keyed hash (aHash with random keys, so clients choosing identities cannot pile keys
//! onto one shard or one probe chain) is computed per key and check: its high bits pick the
//! shard and the whole hash places the key in the shard's [`hashbrown::HashTable`]. A state
//! of two 64-bit fields or fewer (GCRA, token bucket, leaky bucket, fixed window) sits in a
//! 128-bit atomic cell in its slot: a one-limit check of a key held in one
//! ([`MemoryStore::check_one`], what [`Store::check`] does for one item) takes the shard's read
//! lock, decides, and writes with one compare-and-swap, retrying on a race; the write lock is
//! only for new keys, states back at rest, other states and multi-limit checks, so the
//! all-or-nothing rule above holds against the read path too.
//!
//! Memory stays bounded without a background thread: a state past its `expires_at` (back to
//! its initial value) is dropped when next touched, and each shard sweeps its expired entries
//! after as many writes as it holds entries (amortised O(1) per write). Optional limits on keys
//! (`max_keys`) and bytes (`max_memory`, counted as [`MemoryStore::memory_bytes`] says) make the
//! store evict (module `evict`): entries back at rest first, then live ones, whose summary
//! keeps an evicted key at least as restricted as it was: the key's own trace in a table of
//! fingerprints ([`fingerprints`]), found again only by that key, so fresh identities start
//! fresh; the traces that table has no room for in a sketch ([`summary`]). An eviction can
//! never turn a denial into an admission; `docs/embedded-store.md` states the exact guarantee.
//! Module `shard` holds one shard's table, its byte count and its summaries; module `cell`
//! the atomic cells and the read path's one compare-and-swap loop, with the liveness rule
//! every path shares; module `many` the general (multi-limit) path; module `clock` the
//! default clock ([`FastClock`]).
#![forbid(unsafe_code)]

mod adjust;
mod cell;
mod clock;
mod evict;
pub mod fingerprints;
mod many;
mod shard;
pub mod summary;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use crossbeam_utils::sync::{ShardedLock, ShardedLockReadGuard, ShardedLockWriteGuard};
use parking_lot::Mutex;
use sluice_core::algorithm::{self, Update};
use sluice_core::{
    Algorithm, CheckItem, Clock, Decision, LeaseId, MultiDecision, Store, StoreError, Timestamp,
};

pub use clock::FastClock;
use shard::{Entry, KeyHasher, Lookup, Shard};

/// A shard's lock: a reader-writer lock split by thread (crossbeam's `ShardedLock`), so
/// checks on several cores read-lock different cache lines, even for one hot key: only the
/// key's own cell is shared between them. Writers lock every part; they are the rarer path
/// (a key's first check, multi-limit checks, eviction). A poisoned lock (a panic while it
/// was held) is used as is, as the non-poisoning lock before it was: a store that refused
/// every later check of 1/64 of its keys would be worse than the state one panic left.
#[derive(Debug)]
struct ShardLock(ShardedLock<Shard>);

impl ShardLock {
    #[inline]
    fn read(&self) -> ShardedLockReadGuard<'_, Shard> {
        self.0
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    #[inline]
    fn write(&self) -> ShardedLockWriteGuard<'_, Shard> {
        self.0
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// The default number of shards.
pub const DEFAULT_SHARDS: usize = 64;

/// How many entries the store evicted to stay under its limits, and how often a check of an
/// evicted key started from its summary. Counters since the store was built.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EvictionCounts {
    /// Entries dropped that were back at their initial value (nothing lost).
    pub at_rest: u64,
    /// Entries dropped that still restricted their key; each left a trace in its policy's
    /// summary.
    pub informative: u64,
    /// Checks of keys the map no longer held that started from a summary.
    pub summarized_checks: u64,
    /// Traces that found no room in the fingerprint table and went to a sketch, where they
    /// may also restrict other keys (see `docs/embedded-store.md`).
    pub to_sketch: u64,
}

/// The embedded in-memory [`Store`].
#[derive(Debug)]
pub struct MemoryStore {
    shards: Box<[ShardLock]>,
    /// Keyed with random keys so clients choosing identities cannot pile every key onto one
    /// shard or one probe chain.
    hasher: KeyHasher,
    clock: Arc<dyn Clock>,
    /// The default clock, read directly (inlined) instead of through `clock`.
    fast: Option<FastClock>,
    max_keys: Option<usize>,
    max_memory: Option<usize>,
    /// Keys held over all shards; updated under the shard locks.
    keys: AtomicUsize,
    /// Bytes allocated over all shards (see [`MemoryStore::memory_bytes`]).
    bytes: AtomicUsize,
    /// The part of `bytes` taken by the summaries of evicted keys (only eviction changes it).
    summary_bytes: AtomicUsize,
    /// Held while enforcing the limits, so only one thread evicts at a time.
    evicting: Mutex<()>,
    /// The id of the lease standing for evicted concurrency leases: random, never handed out.
    evicted_lease: LeaseId,
    evicted_at_rest: AtomicU64,
    evicted_informative: AtomicU64,
    summarized_checks: AtomicU64,
}

/// Configures a [`MemoryStore`].
#[derive(Debug)]
pub struct MemoryStoreBuilder {
    clock: Arc<dyn Clock>,
    fast: Option<FastClock>,
    shards: usize,
    max_keys: Option<usize>,
    max_memory: Option<usize>,
    summary_width: usize,
    fingerprint_memory: Option<usize>,
}

/// Default cells per row of each policy's summary, over all shards: 1 MiB per policy that had
/// to evict live state.
pub const DEFAULT_SUMMARY_WIDTH: usize = 16_384;

/// Slots of the fingerprint table per key of `max_keys`, when no `max_memory` sizes it: a flood
/// of up to about 30 times `max_keys` fresh identities is remembered key by key.
pub const FINGERPRINTS_PER_KEY: usize = 32;

impl MemoryStoreBuilder {
    /// The source of `now` (default: [`FastClock`], the wall clock at creation advanced by a
    /// monotonic counter).
    pub fn clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self.fast = None;
        self
    }
    /// The number of shards (default 64; at least 1).
    pub fn shards(mut self, shards: usize) -> Self {
        self.shards = shards.max(1);
        self
    }
    /// The most keys tracked at once (default: unbounded). Beyond it the store evicts, as
    /// described in the crate docs; an eviction never makes a key less restricted.
    pub fn max_keys(mut self, max_keys: usize) -> Self {
        self.max_keys = Some(max_keys.max(1));
        self
    }
    /// The most bytes the store allocates (default: unbounded): the tables, keys, states and
    /// summaries, as [`MemoryStore::memory_bytes`] counts them. Evicts like `max_keys`.
    pub fn max_memory(mut self, bytes: usize) -> Self {
        self.max_memory = Some(bytes.max(1));
        self
    }
    /// Cells per row of each policy's summary of evicted state, over all shards (default
    /// [`DEFAULT_SUMMARY_WIDTH`]; 4 rows of 16-byte cells). Wider summaries misjudge fewer
    /// evicted keys as more restricted than they are.
    pub fn summary_width(mut self, cells: usize) -> Self {
        self.summary_width = cells.max(1);
        self
    }
    /// The most bytes of the table that remembers each evicted key's own trace, over all
    /// shards (24 bytes a slot). Default: half of `max_memory`; with only `max_keys`,
    /// [`FINGERPRINTS_PER_KEY`] slots per key. Past it, traces of evicted keys go to the
    /// coarser summary, which may deny fresh identities (see `docs/embedded-store.md`).
    pub fn fingerprint_memory(mut self, bytes: usize) -> Self {
        self.fingerprint_memory = Some(bytes);
        self
    }
    /// The store.
    pub fn build(self) -> MemoryStore {
        let width = (self.summary_width / self.shards).max(16);
        let table = self
            .fingerprint_memory
            .unwrap_or(match (self.max_memory, self.max_keys) {
                (Some(bytes), _) => bytes / 2,
                (None, Some(keys)) => {
                    keys.saturating_mul(FINGERPRINTS_PER_KEY * fingerprints::SLOT_BYTES)
                }
                (None, None) => 0,
            });
        let slots = table / self.shards / fingerprints::SLOT_BYTES;
        let hasher = KeyHasher::new();
        MemoryStore {
            shards: (0..self.shards)
                .map(|_| ShardLock(ShardedLock::new(Shard::new(width, slots, hasher.clone()))))
                .collect(),
            hasher,
            clock: self.clock,
            fast: self.fast,
            max_keys: self.max_keys,
            max_memory: self.max_memory,
            keys: AtomicUsize::new(0),
            bytes: AtomicUsize::new(0),
            summary_bytes: AtomicUsize::new(0),
            evicting: Mutex::new(()),
            evicted_lease: LeaseId(format!("evicted-{:016x}", rand::random::<u64>())),
            evicted_at_rest: AtomicU64::new(0),
            evicted_informative: AtomicU64::new(0),
            summarized_checks: AtomicU64::new(0),
        }
    }
}

impl Default for MemoryStore {
    fn default() -> Self {
        Self::builder().build()
    }
}

impl MemoryStore {
    /// A store on the default clock ([`FastClock`]) with the defaults.
    pub fn new() -> Self {
        Self::default()
    }

    /// A store reading time from `clock`.
    pub fn with_clock(clock: Arc<dyn Clock>) -> Self {
        Self::builder().clock(clock).build()
    }

    /// Configure a store.
    pub fn builder() -> MemoryStoreBuilder {
        let fast = FastClock::new();
        MemoryStoreBuilder {
            clock: Arc::new(fast.clone()),
            fast: Some(fast),
            shards: DEFAULT_SHARDS,
            max_keys: None,
            max_memory: None,
            summary_width: DEFAULT_SUMMARY_WIDTH,
            fingerprint_memory: None,
        }
    }

    /// Keys currently held (including expired ones not yet dropped).
    pub fn len(&self) -> usize {
        self.keys.load(Ordering::Relaxed)
    }

    /// Whether no key is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Bytes the store allocates, as `max_memory` counts them: each shard's table (slots and
    /// control bytes), every key's and state's heap block rounded up as glibc's allocator
    /// does, and the summaries of evicted state. Not counted: the fixed array of shards and
    /// the allocator's own free lists.
    pub fn memory_bytes(&self) -> usize {
        self.bytes.load(Ordering::Relaxed)
    }

    /// The part of [`MemoryStore::memory_bytes`] taken by the summaries of evicted keys: the
    /// fingerprint tables and the sketches.
    pub fn summary_bytes(&self) -> usize {
        self.summary_bytes.load(Ordering::Relaxed)
    }

    /// Slots of the fingerprint tables: `(allocated, holding a live trace, most allowed)`,
    /// over all shards (a scan: for tests and measurements).
    pub fn fingerprint_slots(&self) -> (usize, usize, usize) {
        let now = self.now();
        self.shards.iter().fold((0, 0, 0), |(a, l, m), s| {
            let s = s.read();
            let f = s.fingerprints();
            (a + f.slots(), l + f.live(now), m + f.max_slots())
        })
    }

    /// The eviction counters (for `sluice_store_evictions_total{kind="at_rest"|"informative"}`).
    pub fn eviction_counts(&self) -> EvictionCounts {
        EvictionCounts {
            at_rest: self.evicted_at_rest.load(Ordering::Relaxed),
            informative: self.evicted_informative.load(Ordering::Relaxed),
            summarized_checks: self.summarized_checks.load(Ordering::Relaxed),
            to_sketch: self.shards.iter().map(|s| s.read().overflowed).sum(),
        }
    }

    /// The store's clock now.
    #[inline]
    pub(crate) fn now(&self) -> Timestamp {
        match &self.fast {
            Some(fast) => fast.now_us(),
            None => self.clock.now(),
        }
    }

    /// The hash of a key's bytes (the shards hash slots' keys the same way).
    #[inline]
    fn hash(&self, key: &str) -> u64 {
        self.hasher.hash_one(key.as_bytes())
    }

    /// The shard of a hash: bits 24 to 55 scaled to the number of shards (a multiply, not a
    /// division), so the table inside the shard still sees keys spread over all of its low
    /// bits and over the top 7 bits its control bytes are made of.
    #[inline]
    fn shard_index(&self, hash: u64) -> usize {
        ((u64::from((hash >> 24) as u32) * self.shards.len() as u64) >> 32) as usize
    }

    /// Adds a shard's byte change to the total.
    fn account_bytes(&self, delta: isize) {
        match delta {
            0 => {}
            d if d > 0 => {
                self.bytes.fetch_add(d as usize, Ordering::Relaxed);
            }
            d => {
                self.bytes.fetch_sub(d.unsigned_abs(), Ordering::Relaxed);
            }
        }
    }

    /// Checks one limit: the fast path of [`MemoryStore::check_now`] (one hash, one lock, no
    /// allocation for a key already held). A concurrency check that takes a lease goes through
    /// the general path.
    pub fn check_one(&self, item: &CheckItem<'_>) -> Decision {
        if item.algorithm.takes_lease(item.cost) {
            let mut d = self.check_many_now(std::slice::from_ref(item));
            return d
                .decisions
                .pop()
                .unwrap_or_else(|| Decision::allow(0, 0, 0));
        }
        let now = self.now();
        let hash = self.hash(item.key);
        let lock = &self.shards[self.shard_index(hash)];
        if let Some(decision) = Self::check_in_cell(&lock.read(), hash, item, now) {
            return decision;
        }
        self.check_one_locked(item, hash, now)
    }

    /// The write path of [`MemoryStore::check_one`], out of line so the read path stays small.
    #[inline(never)]
    fn check_one_locked(&self, item: &CheckItem<'_>, hash: u64, now: Timestamp) -> Decision {
        let key = item.key;
        let mut shard = self.shards[self.shard_index(hash)].write();
        let found = shard.lookup(hash, key, now, item.algorithm, &self.evicted_lease);
        let stale = matches!(found, Lookup::Stale);
        let summarized = matches!(found, Lookup::Summarized(_));
        let outcome = algorithm::decide(item.algorithm, found.state(), now, item.cost, None);
        let (mut added, mut removed) = (0usize, 0usize);
        match outcome.update {
            Update::Put { state, expires_at } => {
                let entry = Entry { state, expires_at };
                added += usize::from(shard.put(hash, key, entry, item.algorithm))
            }
            Update::Delete => removed += usize::from(shard.remove(hash, key)),
            Update::Keep if stale => removed += usize::from(shard.remove(hash, key)),
            Update::Keep => {}
        }
        shard.ops_since_sweep += 1;
        if shard.ops_since_sweep >= shard.len().max(64) {
            removed += shard.sweep(now);
        }
        let bytes = shard.take_bytes_delta();
        drop(shard);
        if summarized {
            self.summarized_checks.fetch_add(1, Ordering::Relaxed);
        }
        if removed > 0 {
            self.keys.fetch_sub(removed, Ordering::Relaxed);
        }
        self.account_bytes(bytes);
        if added > 0 {
            self.keys.fetch_add(added, Ordering::Relaxed);
        }
        if added > 0 || bytes > 0 {
            self.enforce_limits(now);
        }
        outcome.decision
    }

    /// The read path of a one-limit check: a key held in a [`cell::Cell`] of its algorithm
    /// decides from the cell's word and writes with one compare-and-swap, deciding again if
    /// another thread swapped first ([`cell::decide_in`], with its liveness rule). `None`
    /// sends the check to the write path: the key is not held in a cell of this algorithm,
    /// its state is at rest, or the new state does not fit the cell.
    #[inline]
    fn check_in_cell(
        shard: &Shard,
        hash: u64,
        item: &CheckItem<'_>,
        now: Timestamp,
    ) -> Option<Decision> {
        let (cell, written_under) = shard.cell(hash, item.key)?;
        if written_under != item.algorithm {
            return None;
        }
        cell.decide(item.algorithm, now, item.cost)
    }

    /// The synchronous core of [`Store::check`]: evaluates and (if all admit) commits.
    pub fn check_now(&self, items: &[CheckItem<'_>]) -> MultiDecision {
        if let [item] = items {
            let d = self.check_one(item);
            return MultiDecision {
                allowed: d.allowed,
                decisions: vec![d],
            };
        }
        self.check_many_now(items)
    }

    /// The synchronous core of [`Store::release`].
    pub fn release_now(&self, key: &str, lease: &LeaseId) -> bool {
        let now = self.now();
        let hash = self.hash(key);
        let mut shard = self.shards[self.shard_index(hash)].write();
        let Some(state) = shard.get(hash, key).filter(|e| e.expires_at > now) else {
            return false;
        };
        let (held, update) = algorithm::release(Some(&state.state), now, lease);
        let mut removed = false;
        match update {
            Update::Keep => {}
            Update::Put { state, expires_at } => {
                shard.replace(hash, key, Entry { state, expires_at });
            }
            Update::Delete => removed = shard.remove(hash, key),
        }
        let bytes = shard.take_bytes_delta();
        drop(shard);
        if removed {
            self.keys.fetch_sub(1, Ordering::Relaxed);
        }
        self.account_bytes(bytes);
        held
    }

    /// Whether the store holds more keys or bytes than its limits allow.
    fn over_limits(&self) -> bool {
        self.max_keys.is_some_and(|m| self.len() > m)
            || self.max_memory.is_some_and(|m| self.memory_bytes() > m)
    }
}

/// 16 random hex characters.
fn random_lease_id() -> LeaseId {
    LeaseId(format!("{:016x}", rand::random::<u64>()))
}

#[async_trait::async_trait]
impl Store for MemoryStore {
    async fn check(&self, items: &[CheckItem<'_>]) -> Result<MultiDecision, StoreError> {
        Ok(self.check_now(items))
    }

    async fn check_one(&self, item: &CheckItem<'_>) -> Result<Decision, StoreError> {
        Ok(MemoryStore::check_one(self, item))
    }

    async fn release(
        &self,
        key: &str,
        _algorithm: &Algorithm,
        lease: &LeaseId,
    ) -> Result<bool, StoreError> {
        Ok(self.release_now(key, lease))
    }

    fn kind(&self) -> &'static str {
        "memory"
    }

    async fn reset(&self, key: &str) -> Result<bool, StoreError> {
        Ok(self.reset_now(key))
    }

    async fn adjust(
        &self,
        key: &str,
        algorithm: &Algorithm,
        adjustment: sluice_core::algorithm::Adjustment,
    ) -> Result<Decision, StoreError> {
        self.adjust_now(key, algorithm, adjustment)
            .map_err(|e| StoreError::Invalid(e.to_string()))
    }

    fn evictions(&self) -> Vec<(&'static str, u64)> {
        let c = self.eviction_counts();
        vec![("at_rest", c.at_rest), ("informative", c.informative)]
    }
}
