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
//! Memory stays bounded without a background thread: a state past its `expires_at` (back to
//! its initial value) is dropped when next touched, each shard sweeps its expired entries after
//! as many writes as it holds entries (amortised O(1) per write), and an optional cap on
//! tracked keys evicts expired entries first, then the ones expiring soonest.
#![forbid(unsafe_code)]

use std::collections::HashMap;
use std::collections::hash_map::Entry as MapEntry;
use std::hash::BuildHasher;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use parking_lot::{Mutex, MutexGuard};
use sluice_core::algorithm::{self, State, Update};
use sluice_core::{
    Algorithm, CheckItem, Clock, Decision, DenyReason, LeaseId, MultiDecision, Store, StoreError, SystemClock,
    Timestamp,
};

/// The default number of shards.
pub const DEFAULT_SHARDS: usize = 64;

/// A stored state and when it is back to its initial value.
#[derive(Debug)]
struct Entry {
    state: State,
    expires_at: Timestamp,
}

#[derive(Debug, Default)]
struct Shard {
    map: HashMap<String, Entry>,
    /// Checks since this shard last dropped its expired entries.
    ops_since_sweep: usize,
}

impl Shard {
    /// The live state of `key`, or `None` if absent or expired.
    fn live(&self, key: &str, now: Timestamp) -> Option<&State> {
        self.map.get(key).filter(|e| e.expires_at > now).map(|e| &e.state)
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
    /// The source of `now` (default: the system clock).
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
            shards: (0..self.shards).map(|_| Mutex::new(Shard::default())).collect(),
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
    /// A store on the system clock with the defaults.
    pub fn new() -> Self {
        Self::default()
    }

    /// A store reading time from `clock`.
    pub fn with_clock(clock: Arc<dyn Clock>) -> Self {
        Self::builder().clock(clock).build()
    }

    /// Configure a store.
    pub fn builder() -> MemoryStoreBuilder {
        MemoryStoreBuilder { clock: Arc::new(SystemClock), shards: DEFAULT_SHARDS, max_keys: None }
    }

    /// Keys currently held (including expired ones not yet dropped).
    pub fn len(&self) -> usize {
        self.keys.load(Ordering::Relaxed)
    }

    /// Whether no key is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn shard_of(&self, key: &str) -> usize {
        (self.hasher.hash_one(key) % self.shards.len() as u64) as usize
    }

    /// The synchronous core of [`Store::check`]: evaluates and (if all admit) commits.
    pub fn check_now(&self, items: &[CheckItem<'_>]) -> MultiDecision {
        let now = self.clock.now();
        let lease = items
            .iter()
            .any(|i| matches!(i.algorithm, Algorithm::Concurrency { .. }) && i.cost > 0)
            .then(random_lease_id);

        // Lock every shard involved, once each, in ascending order.
        let mut idx: Vec<usize> = items.iter().map(|i| self.shard_of(i.key)).collect();
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
        for (item, &g) in items.iter().zip(&idx) {
            let shard = &mut guards[g].1;
            if shard.map.get(item.key).is_some_and(|e| e.expires_at <= now) {
                shard.map.remove(item.key);
                removed += 1;
            }
        }
        if removed > 0 {
            self.keys.fetch_sub(removed, Ordering::Relaxed);
        }

        // Evaluate in order; a key appearing twice sees the change staged by the first.
        let mut staged: HashMap<&str, Staged> = HashMap::new();
        let mut decisions = Vec::with_capacity(items.len());
        for (item, &g) in items.iter().zip(&idx) {
            let state = match staged.get(item.key) {
                Some(Staged::Put(s, _)) => Some(s),
                Some(Staged::Delete) => None,
                None => guards[g].1.live(item.key, now),
            };
            let outcome = algorithm::decide(item.algorithm, state, now, item.cost, lease.as_ref());
            match outcome.update {
                Update::Keep => {}
                Update::Put { state, expires_at } => {
                    staged.insert(item.key, Staged::Put(state, expires_at));
                }
                Update::Delete => {
                    staged.insert(item.key, Staged::Delete);
                }
            }
            decisions.push(outcome.decision);
        }

        let allowed = decisions.iter().all(|d| d.allowed);
        if allowed {
            let mut added = 0usize;
            let mut removed = 0usize;

            for (key, change) in staged {
                let g = slot(self.shard_of(key));
                let shard = &mut guards[g].1;
                match change {
                    Staged::Put(state, expires_at) => match shard.map.entry(key.to_owned()) {
                        MapEntry::Occupied(mut e) => *e.get_mut() = Entry { state, expires_at },
                        MapEntry::Vacant(e) => {
                            e.insert(Entry { state, expires_at });
                            added += 1;
                        }
                    },
                    Staged::Delete => removed += usize::from(shard.map.remove(key).is_some()),
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
        for (i, (item, &g)) in items.iter().zip(&idx).enumerate() {
            if decisions[i].allowed {
                let peek = algorithm::decide(item.algorithm, guards[g].1.live(item.key, now), now, 0, None).decision;
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
            if shard.ops_since_sweep >= shard.map.len().max(64) {
                removed += sweep(shard, now);
            }
        }
        removed
    }

    /// The synchronous core of [`Store::release`].
    pub fn release_now(&self, key: &str, lease: &LeaseId) -> bool {
        let now = self.clock.now();
        let mut shard = self.shards[self.shard_of(key)].lock();
        let Some(state) = shard.live(key, now) else {
            return false;
        };
        let (held, update) = algorithm::release(Some(state), now, lease);
        match update {
            Update::Keep => {}
            Update::Put { state, expires_at } => {
                shard.map.insert(key.to_owned(), Entry { state, expires_at });
            }
            Update::Delete => {
                if shard.map.remove(key).is_some() {
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
        let Some(_evicting) = self.evicting.try_lock() else { return };
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
            expiries.extend(shard.lock().map.values().map(|e| e.expires_at));
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
                shard.map.retain(|_, e| {
                    let evict =
                        excess > 0 && if strictly_before { e.expires_at < cutoff } else { e.expires_at == cutoff };
                    excess -= usize::from(evict);
                    !evict
                });
                self.keys.fetch_sub(before - shard.map.len(), Ordering::Relaxed);
            }
        }
    }
}

/// Drops a shard's expired entries; returns how many.
fn sweep(shard: &mut Shard, now: Timestamp) -> usize {
    let before = shard.map.len();
    shard.map.retain(|_, e| e.expires_at > now);
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

    async fn release(&self, key: &str, _algorithm: &Algorithm, lease: &LeaseId) -> Result<bool, StoreError> {
        Ok(self.release_now(key, lease))
    }

    fn kind(&self) -> &'static str {
        "memory"
    }
}
