//! `sluice-memory`: the embedded store, used when no Redis is configured.
//!
//! # Layout
//! - [`MemoryStore`]: the [`Store`] implementation, a map split into shards, each behind its
//!   own mutex, so checks of different keys rarely contend and there is no global lock on the
//!   hot path.
//! - [`MemoryStoreBuilder`]: the clock, the shard count and the cap on tracked keys.
//!
//! Decisions come from [`sluice_core::algorithm::decide`]; this crate only keeps state and
//! makes a multi-limit check atomic, by locking every shard involved in ascending order (so two
//! checks can never wait on each other in a cycle) before evaluating anything.
//!
//! One keyed hash (SipHash-1-3 with a random key, so clients choosing identities cannot pile
//! keys onto one shard or one probe chain) is computed per key and check: its high bits pick
//! the shard and the whole hash places the key in the shard's [`hashbrown::HashTable`]. A check
//! of one limit ([`MemoryStore::check_one`], what [`Store::check`] does for one item) takes one
//! lock, allocates nothing for a key already held, and writes the new state in place.
//!
//! Memory stays bounded without a background thread: a state past its `expires_at` (back to
//! its initial value) is dropped when next touched, each shard sweeps its expired entries after
//! as many writes as it holds entries (amortised O(1) per write), and an optional cap on
//! tracked keys evicts expired entries first, then the ones expiring soonest.
#![forbid(unsafe_code)]

use std::collections::HashMap;
use std::hash::BuildHasher;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use hashbrown::HashTable;
use parking_lot::{Mutex, MutexGuard};
use sluice_core::algorithm::{self, State, Update};
use sluice_core::{
    Algorithm, CheckItem, Clock, Decision, DenyReason, LeaseId, MultiDecision, Store, StoreError,
    SystemClock, Timestamp,
};

/// The wall clock as of the store's creation, advanced by the CPU's time-stamp counter
/// (through `quanta`; the OS monotonic clock where there is none). Reading it costs a few ns
/// instead of the ~25-50 ns of `SystemTime::now` on a VM, which is a large share of an embedded
/// decision; and it never jumps when NTP steps the wall clock. The default clock of
/// [`MemoryStore`] (only this process compares its timestamps).
#[derive(Debug, Clone)]
pub struct FastClock {
    base_us: Timestamp,
    start: quanta::Instant,
}

impl FastClock {
    /// A clock anchored at the wall clock now.
    pub fn new() -> Self {
        Self {
            base_us: SystemClock.now(),
            start: quanta::Instant::now(),
        }
    }
}

impl Default for FastClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for FastClock {
    fn now(&self) -> Timestamp {
        self.base_us
            + quanta::Instant::now()
                .saturating_duration_since(self.start)
                .as_micros() as u64
    }
}

/// The default number of shards.
pub const DEFAULT_SHARDS: usize = 64;

/// A stored state and when it is back to its initial value.
#[derive(Debug)]
struct Entry {
    state: State,
    expires_at: Timestamp,
}

/// A key, its hash (kept for rehashing when the table grows) and its entry.
#[derive(Debug)]
struct Slot {
    hash: u64,
    key: Box<str>,
    entry: Entry,
}

#[derive(Debug, Default)]
struct Shard {
    map: HashTable<Slot>,
    /// Checks since this shard last dropped its expired entries.
    ops_since_sweep: usize,
}

impl Shard {
    fn get(&self, hash: u64, key: &str) -> Option<&Entry> {
        self.map.find(hash, |s| &*s.key == key).map(|s| &s.entry)
    }

    /// The live state of `key`, or `None` if absent or expired.
    fn live(&self, hash: u64, key: &str, now: Timestamp) -> Option<&State> {
        self.get(hash, key)
            .filter(|e| e.expires_at > now)
            .map(|e| &e.state)
    }

    /// Removes `key`; whether it was held.
    fn remove(&mut self, hash: u64, key: &str) -> bool {
        match self.map.find_entry(hash, |s| &*s.key == key) {
            Ok(e) => {
                e.remove();
                true
            }
            Err(_) => false,
        }
    }

    /// Stores `entry` under `key`, in place when held (no allocation); whether it is new.
    fn put(&mut self, hash: u64, key: &str, entry: Entry) -> bool {
        if let Some(s) = self.map.find_mut(hash, |s| &*s.key == key) {
            s.entry = entry;
            return false;
        }
        self.map.insert_unique(
            hash,
            Slot {
                hash,
                key: key.into(),
                entry,
            },
            |s| s.hash,
        );
        true
    }

    fn len(&self) -> usize {
        self.map.len()
    }
}

/// The embedded in-memory [`Store`].
#[derive(Debug)]
pub struct MemoryStore {
    shards: Box<[Mutex<Shard>]>,
    /// Keyed (SipHash) so clients choosing identities cannot pile every key onto one shard.
    hasher: std::hash::RandomState,
    clock: Arc<dyn Clock>,
    max_keys: Option<usize>,
    /// Keys held over all shards; updated under the shard locks.
    keys: AtomicUsize,
    /// Held while enforcing the cap, so only one thread evicts at a time.
    evicting: Mutex<()>,
}

/// Configures a [`MemoryStore`].
#[derive(Debug)]
pub struct MemoryStoreBuilder {
    clock: Arc<dyn Clock>,
    shards: usize,
    max_keys: Option<usize>,
}

impl MemoryStoreBuilder {
    /// The source of `now` (default: [`FastClock`], the wall clock at creation advanced by a
    /// monotonic counter).
    pub fn clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }
    /// The number of shards (default 64; at least 1).
    pub fn shards(mut self, shards: usize) -> Self {
        self.shards = shards.max(1);
        self
    }
    /// The most keys tracked at once; beyond it, expired keys and then the keys expiring
    /// soonest are evicted (which resets their limits). Default: unbounded.
    pub fn max_keys(mut self, max_keys: usize) -> Self {
        self.max_keys = Some(max_keys.max(1));
        self
    }
    /// The store.
    pub fn build(self) -> MemoryStore {
        MemoryStore {
            shards: (0..self.shards)
                .map(|_| Mutex::new(Shard::default()))
                .collect(),
            hasher: std::hash::RandomState::new(),
            clock: self.clock,
            max_keys: self.max_keys,
            keys: AtomicUsize::new(0),
            evicting: Mutex::new(()),
        }
    }
}

impl Default for MemoryStore {
    fn default() -> Self {
        Self::builder().build()
    }
}

/// A staged change to one key during a check.
#[derive(Debug)]
enum Staged {
    Put(State, Timestamp),
    Delete,
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
        MemoryStoreBuilder {
            clock: Arc::new(FastClock::new()),
            shards: DEFAULT_SHARDS,
            max_keys: None,
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

    fn hash(&self, key: &str) -> u64 {
        self.hasher.hash_one(key)
    }

    /// The shard of a hash: its high bits, so the table inside the shard still sees keys
    /// spread over all of its low bits.
    fn shard_index(&self, hash: u64) -> usize {
        ((hash >> 40) % self.shards.len() as u64) as usize
    }

    /// Checks one limit: the fast path of [`MemoryStore::check_now`] (one hash, one lock, no
    /// allocation for a key already held). A concurrency check that takes a lease goes through
    /// the general path.
    pub fn check_one(&self, item: &CheckItem<'_>) -> Decision {
        if matches!(item.algorithm, Algorithm::Concurrency { .. }) && item.cost > 0 {
            let mut d = self.check_many_now(std::slice::from_ref(item));
            return d
                .decisions
                .pop()
                .unwrap_or_else(|| Decision::allow(0, 0, 0));
        }
        let now = self.clock.now();
        let key = item.key;
        let hash = self.hash(key);
        let mut shard = self.shards[self.shard_index(hash)].lock();
        let decide = |state| algorithm::decide(item.algorithm, state, now, item.cost, None);
        let (outcome, stale) = match shard.get(hash, key) {
            Some(e) if e.expires_at > now => (decide(Some(&e.state)), false),
            Some(_) => (decide(None), true),
            None => (decide(None), false),
        };
        let (mut added, mut removed) = (0usize, 0usize);
        match outcome.update {
            Update::Put { state, expires_at } => {
                added += usize::from(shard.put(hash, key, Entry { state, expires_at }))
            }
            Update::Delete => removed += usize::from(shard.remove(hash, key)),
            Update::Keep if stale => removed += usize::from(shard.remove(hash, key)),
            Update::Keep => {}
        }
        shard.ops_since_sweep += 1;
        if shard.ops_since_sweep >= shard.len().max(64) {
            removed += sweep(&mut shard, now);
        }
        drop(shard);
        if removed > 0 {
            self.keys.fetch_sub(removed, Ordering::Relaxed);
        }
        if added > 0 {
            self.keys.fetch_add(added, Ordering::Relaxed);
            self.enforce_cap(now);
        }
        outcome.decision
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

    /// The general path: any number of items, all-or-nothing.
    fn check_many_now(&self, items: &[CheckItem<'_>]) -> MultiDecision {
        let now = self.clock.now();
        let lease = items
            .iter()
            .any(|i| matches!(i.algorithm, Algorithm::Concurrency { .. }) && i.cost > 0)
            .then(random_lease_id);

        // Lock every shard involved, once each, in ascending order.
        let hashes: Vec<u64> = items.iter().map(|i| self.hash(i.key)).collect();
        let mut idx: Vec<usize> = hashes.iter().map(|&h| self.shard_index(h)).collect();
        let mut order = idx.clone();
        order.sort_unstable();
        order.dedup();
        let mut guards: Vec<(usize, MutexGuard<'_, Shard>)> =
            order.iter().map(|&s| (s, self.shards[s].lock())).collect();
        let slot = |s: usize| order.binary_search(&s).unwrap_or(0);
        for s in &mut idx {
            *s = slot(*s);
        }
        // Drop the expired states of the keys touched: they are back to their initial value.
        let mut removed = 0usize;
        for ((item, &g), &h) in items.iter().zip(&idx).zip(&hashes) {
            let shard = &mut guards[g].1;
            if shard.get(h, item.key).is_some_and(|e| e.expires_at <= now) {
                shard.remove(h, item.key);
                removed += 1;
            }
        }
        if removed > 0 {
            self.keys.fetch_sub(removed, Ordering::Relaxed);
        }

        // Evaluate in order; a key appearing twice sees the change staged by the first.
        let mut staged: HashMap<&str, (u64, Staged)> = HashMap::new();
        let mut decisions = Vec::with_capacity(items.len());
        for ((item, &g), &h) in items.iter().zip(&idx).zip(&hashes) {
            let state = match staged.get(item.key) {
                Some((_, Staged::Put(s, _))) => Some(s),
                Some((_, Staged::Delete)) => None,
                None => guards[g].1.live(h, item.key, now),
            };
            let outcome = algorithm::decide(item.algorithm, state, now, item.cost, lease.as_ref());
            match outcome.update {
                Update::Keep => {}
                Update::Put { state, expires_at } => {
                    staged.insert(item.key, (h, Staged::Put(state, expires_at)));
                }
                Update::Delete => {
                    staged.insert(item.key, (h, Staged::Delete));
                }
            }
            decisions.push(outcome.decision);
        }

        let allowed = decisions.iter().all(|d| d.allowed);
        if allowed {
            let mut added = 0usize;
            let mut removed = 0usize;

            for (key, (h, change)) in staged {
                let g = slot(self.shard_index(h));
                let shard = &mut guards[g].1;
                match change {
                    Staged::Put(state, expires_at) => {
                        added += usize::from(shard.put(h, key, Entry { state, expires_at }));
                    }
                    Staged::Delete => removed += usize::from(shard.remove(h, key)),
                }
            }
            removed += self.sweep_some(&mut guards, now);
            self.keys.fetch_add(added, Ordering::Relaxed);
            self.keys.fetch_sub(removed, Ordering::Relaxed);
            drop(guards);
            if added > 0 {
                self.enforce_cap(now);
            }
            return MultiDecision { allowed, decisions };
        }

        let swept = self.sweep_some(&mut guards, now);
        self.keys.fetch_sub(swept, Ordering::Relaxed);
        // Denied: nothing is written. Items that would have admitted report their unconsumed
        // state, as a cost-0 peek sees it.
        for (i, ((item, &g), &h)) in items.iter().zip(&idx).zip(&hashes).enumerate() {
            if decisions[i].allowed {
                let peek = algorithm::decide(
                    item.algorithm,
                    guards[g].1.live(h, item.key, now),
                    now,
                    0,
                    None,
                )
                .decision;
                decisions[i] = Decision {
                    allowed: false,
                    retry_after_ms: 0,
                    delay_ms: 0,
                    reason: Some(DenyReason::OtherLimitDenied),
                    lease: None,
                    ..peek
                };
            }
        }
        MultiDecision { allowed, decisions }
    }

    /// Counts a check against each locked shard and sweeps those that have seen as many checks
    /// as they hold entries (at least 64), so sweeping costs O(1) per check amortised.
    fn sweep_some(&self, guards: &mut [(usize, MutexGuard<'_, Shard>)], now: Timestamp) -> usize {
        let mut removed = 0;
        for (_, shard) in guards.iter_mut() {
            shard.ops_since_sweep += 1;
            if shard.ops_since_sweep >= shard.len().max(64) {
                removed += sweep(shard, now);
            }
        }
        removed
    }

    /// The synchronous core of [`Store::release`].
    pub fn release_now(&self, key: &str, lease: &LeaseId) -> bool {
        let now = self.clock.now();
        let hash = self.hash(key);
        let mut shard = self.shards[self.shard_index(hash)].lock();
        let Some(state) = shard.live(hash, key, now) else {
            return false;
        };
        let (held, update) = algorithm::release(Some(state), now, lease);
        match update {
            Update::Keep => {}
            Update::Put { state, expires_at } => {
                shard.put(hash, key, Entry { state, expires_at });
            }
            Update::Delete => {
                if shard.remove(hash, key) {
                    self.keys.fetch_sub(1, Ordering::Relaxed);
                }
            }
        }
        held
    }

    /// Brings the key count back under the cap: expired entries go first, then those expiring
    /// soonest. Evicts down to 95% of the cap so a full store does not scan on every insert.
    fn enforce_cap(&self, now: Timestamp) {
        let Some(max) = self.max_keys else { return };
        if self.len() <= max {
            return;
        }
        let Some(_evicting) = self.evicting.try_lock() else {
            return;
        };
        for shard in self.shards.iter() {
            let removed = sweep(&mut shard.lock(), now);
            self.keys.fetch_sub(removed, Ordering::Relaxed);
        }
        let target = max - max / 20;
        let len = self.len();
        if len <= max {
            return;
        }
        let mut excess = len - target;
        let mut expiries: Vec<Timestamp> = Vec::with_capacity(len);
        for shard in self.shards.iter() {
            expiries.extend(shard.lock().map.iter().map(|s| s.entry.expires_at));
        }
        if expiries.is_empty() {
            return;
        }
        excess = excess.min(expiries.len());
        let (_, &mut cutoff, _) = expiries.select_nth_unstable(excess - 1);
        // First every entry expiring before the cutoff (fewer than `excess`), then entries
        // expiring at the cutoff until enough are gone.
        for strictly_before in [true, false] {
            for shard in self.shards.iter() {
                if excess == 0 {
                    return;
                }
                let mut shard = shard.lock();
                let before = shard.map.len();
                shard.map.retain(|s| {
                    let e = &s.entry;
                    let evict = excess > 0
                        && if strictly_before {
                            e.expires_at < cutoff
                        } else {
                            e.expires_at == cutoff
                        };
                    excess -= usize::from(evict);
                    !evict
                });
                self.keys
                    .fetch_sub(before - shard.map.len(), Ordering::Relaxed);
            }
        }
    }
}

/// Drops a shard's expired entries; returns how many.
fn sweep(shard: &mut Shard, now: Timestamp) -> usize {
    let before = shard.map.len();
    shard.map.retain(|s| s.entry.expires_at > now);
    shard.ops_since_sweep = 0;
    before - shard.map.len()
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
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fast_clock_follows_the_wall_clock() {
        let fast = FastClock::new();
        let (a, wall, b) = (fast.now(), SystemClock.now(), fast.now());
        assert!(a <= b);
        // Within 50 ms of the wall clock right after creation.
        assert!(wall.abs_diff(a) < 50_000, "fast {a} wall {wall}");
    }
}
