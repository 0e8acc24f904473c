//! The local deny cache: once the store denies a key until T, further requests for that key
//! are denied in-process until T, with no store round trip, so a flood of denied traffic costs
//! Redis nothing.
//!
//! # Why it is exact for token bucket, GCRA and fixed (and calendar) windows
//! For these algorithms ([`Algorithm::denial_holds`] in the core registry) nothing but time
//! makes room: a denied request of cost `c` whose store
//! answered `retry_after_ms = R` cannot be admitted — by this process or any other — before the
//! store's clock has moved `R` ms past the moment it decided (other clients only consume, which
//! moves the time further out), and a request of cost `c' >= c` needs at least as long. The
//! store decided after we sent the call, and rounds `R` up from its own time floored to the
//! millisecond, so we deny locally only until `sent + R - 1 ms`, and only requests of cost at
//! least `c`: every request the cache denies, the store would also have denied.
//! Clock *rate* differences between this host and the store (ppm) are the only residue.
//!
//! # Resets and refunds
//! A reset or a refund (`Limiter::reset`, `Limiter::refund`, `/v1/state`, `/v1/refund`) makes
//! room before the time is up. This process forgets the key's denial at once; other instances
//! cannot know, so a denial is trusted locally for at most [`MAX_TRUST_MS`]: a reset or refund
//! through one instance reaches every other instance's next decision within a second, as
//! control changes do, and a denied flood costs the store one call per key per second.
//!
//! # Where it is approximate (opt-in with [`DenyCacheMode::All`])
//! Sliding window counter and log, and leaky bucket: their `retry_after` is exact for the key's
//! state when decided, but the answers they give the client in between (remaining, reset) are
//! the cached ones, and for the sliding window counter a request can fit earlier than the
//! weighted estimate says when the previous window's weight drops in steps. Concurrency is
//! never cached: a release frees a slot at any time.

use std::collections::HashMap;
use std::hash::BuildHasher;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use parking_lot::Mutex;
use sluice_core::{Algorithm, Decision, DenyReason};

/// Which denials the [`crate::Limiter`] remembers locally.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum DenyCacheMode {
    /// [`DenyCacheMode::Exact`] on remote stores (Redis, Valkey, Cluster), off on the embedded
    /// store (where the store itself is a local call). The default.
    #[default]
    Auto,
    /// Never: every check reaches the store.
    Off,
    /// Token bucket, GCRA and fixed window, where it is exact (see the module docs).
    Exact,
    /// Also leaky bucket and the sliding windows, where it is approximate. Never concurrency.
    All,
}

impl DenyCacheMode {
    /// Whether denials of `algorithm` are cached in this mode (`Auto` as `Exact`).
    pub fn caches(self, algorithm: &Algorithm) -> bool {
        match self {
            DenyCacheMode::Off => false,
            DenyCacheMode::Auto | DenyCacheMode::Exact => algorithm.denial_holds(),
            DenyCacheMode::All => !algorithm.holds_leases(),
        }
    }

    /// The mode in force for a store of `kind` (see [`sluice_core::Store::kind`]).
    pub fn resolve(self, store_kind: &str) -> DenyCacheMode {
        match self {
            DenyCacheMode::Auto if store_kind == "memory" => DenyCacheMode::Off,
            DenyCacheMode::Auto => DenyCacheMode::Exact,
            other => other,
        }
    }
}

impl std::str::FromStr for DenyCacheMode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Ok(match s {
            "auto" => DenyCacheMode::Auto,
            "off" => DenyCacheMode::Off,
            "exact" | "on" => DenyCacheMode::Exact,
            "all" => DenyCacheMode::All,
            other => {
                return Err(format!(
                    "unknown deny cache mode {other:?} (auto, off, exact, all)"
                ));
            }
        })
    }
}

/// One remembered denial. Times are µs on the limiter's monotonic clock.
#[derive(Debug, Clone, Copy)]
struct Denial {
    /// Deny locally while `now < until`.
    until: u64,
    /// The retry time the store gave (`until` + 1 ms), for the answer's `retry_after_ms`.
    retry_at: u64,
    /// When the state is back to its initial value, as the store said.
    reset_at: u64,
    /// The smallest cost this denial covers.
    cost: u64,
    limit: u64,
    remaining: u64,
}

const SHARDS: usize = 16;

/// The longest a remembered denial answers locally, ms (see the module docs).
pub const MAX_TRUST_MS: u64 = 1_000;

type Shard = Mutex<HashMap<Box<str>, Denial>>;

/// Remembered denials by key, sharded, bounded.
#[derive(Debug)]
pub(crate) struct DenyCache {
    shards: Box<[Shard]>,
    hasher: std::hash::RandomState,
    per_shard: usize,
    /// Entries over all shards, so the hot allowed path skips the lookup while none is held.
    len: AtomicUsize,
    hits: AtomicU64,
}

impl DenyCache {
    /// A cache holding at most `capacity` denials (beyond, new denials are not remembered until
    /// old ones run out).
    pub(crate) fn new(capacity: usize) -> Self {
        Self {
            shards: (0..SHARDS).map(|_| Mutex::new(HashMap::new())).collect(),
            hasher: std::hash::RandomState::new(),
            per_shard: capacity.div_ceil(SHARDS).max(1),
            len: AtomicUsize::new(0),
            hits: AtomicU64::new(0),
        }
    }

    fn shard(&self, key: &str) -> &Shard {
        &self.shards[(self.hasher.hash_one(key) % SHARDS as u64) as usize]
    }

    /// True while no denial is remembered (then no lookup can answer, and the caller need not
    /// even read the clock).
    pub(crate) fn is_empty(&self) -> bool {
        self.len.load(Ordering::Relaxed) == 0
    }

    /// Denials answered locally so far.
    pub(crate) fn hits(&self) -> u64 {
        self.hits.load(Ordering::Relaxed)
    }

    /// The local answer for `key` at `now`, if a remembered denial covers a request of `cost`.
    pub(crate) fn lookup(&self, key: &str, cost: u64, now: u64) -> Option<Decision> {
        if self.len.load(Ordering::Relaxed) == 0 || cost == 0 {
            return None;
        }
        let mut shard = self.shard(key).lock();
        let d = *shard.get(key)?;
        if now >= d.until {
            shard.remove(key);
            self.len.fetch_sub(1, Ordering::Relaxed);
            return None;
        }
        if cost < d.cost {
            return None;
        }
        drop(shard);
        self.hits.fetch_add(1, Ordering::Relaxed);
        let ms = |at: u64| at.saturating_sub(now).div_ceil(1000);
        Some(Decision::limited(
            d.limit,
            d.remaining,
            ms(d.retry_at),
            ms(d.reset_at),
        ))
    }

    /// Forgets the denial remembered for `key` (its state was reset or refunded, so the
    /// remembered retry time no longer holds).
    pub(crate) fn forget(&self, key: &str) {
        if self.shard(key).lock().remove(key).is_some() {
            self.len.fetch_sub(1, Ordering::Relaxed);
        }
    }

    /// Forgets every remembered denial (the policies changed).
    pub(crate) fn clear(&self) {
        for shard in self.shards.iter() {
            let mut shard = shard.lock();
            self.len.fetch_sub(shard.len(), Ordering::Relaxed);
            shard.clear();
        }
    }

    /// Remembers the store's denial of a request of `cost` on `key`, sent at `sent`.
    pub(crate) fn record(&self, key: &str, cost: u64, sent: u64, decision: &Decision) {
        if decision.allowed
            || decision.reason != Some(DenyReason::Limited)
            || decision.retry_after_ms <= 1
            || cost == 0
        {
            return;
        }
        let retry_at = sent + decision.retry_after_ms * 1000;
        let denial = Denial {
            until: (retry_at - 1000).min(sent + MAX_TRUST_MS * 1000),
            retry_at,
            reset_at: sent + decision.reset_after_ms * 1000,
            cost,
            limit: decision.limit,
            remaining: decision.remaining,
        };
        let mut shard = self.shard(key).lock();
        if let Some(old) = shard.get_mut(key) {
            // Keep the denial that covers more: the smaller cost, then the later time.
            if cost < old.cost || (cost == old.cost && denial.until > old.until) {
                *old = denial;
            }
            return;
        }
        if shard.len() >= self.per_shard {
            let before = shard.len();
            shard.retain(|_, d| d.until > sent);
            self.len.fetch_sub(before - shard.len(), Ordering::Relaxed);
            if shard.len() >= self.per_shard {
                return;
            }
        }
        shard.insert(key.into(), denial);
        self.len.fetch_add(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_core::Rate;

    fn limited(retry: u64) -> Decision {
        Decision::limited(10, 0, retry, 2000)
    }

    #[test]
    fn clear_forgets_every_denial() {
        let c = DenyCache::new(100);
        c.record("a", 1, 0, &limited(5_000));
        c.record("b", 1, 0, &limited(5_000));
        assert!(c.lookup("a", 1, 1_000).is_some());
        c.clear();
        assert!(c.is_empty());
        assert!(c.lookup("a", 1, 1_000).is_none());
        assert!(c.lookup("b", 1, 1_000).is_none());
    }

    #[test]
    fn denies_until_one_ms_before_the_store_retry_time() {
        let c = DenyCache::new(100);
        c.record("k", 1, 5_000, &limited(200));
        // Sent at 5 ms, retry 200 ms: denied locally until 204 ms (exclusive).
        let d = c.lookup("k", 1, 100_000).unwrap();
        assert_eq!(
            (d.allowed, d.retry_after_ms, d.reason),
            (false, 105, Some(DenyReason::Limited))
        );
        assert!(c.lookup("k", 1, 203_999).is_some());
        assert!(c.lookup("k", 1, 204_000).is_none());
        assert_eq!(c.hits(), 2);
    }

    #[test]
    fn a_long_denial_is_trusted_for_a_second_only() {
        let c = DenyCache::new(100);
        // Denied for an hour at 5 ms: answered locally until 1.005 s, then by the store (a
        // reset or refund on another instance may have made room).
        c.record("k", 1, 5_000, &limited(3_600_000));
        let d = c.lookup("k", 1, 1_004_999).unwrap();
        assert_eq!(
            d.retry_after_ms, 3_599_001,
            "the store's retry time, not the trust's"
        );
        assert!(c.lookup("k", 1, 1_005_000).is_none());
    }

    #[test]
    fn covers_only_costs_at_least_the_denied_one() {
        let c = DenyCache::new(100);
        c.record("k", 3, 0, &limited(500));
        assert!(c.lookup("k", 2, 1000).is_none());
        assert!(c.lookup("k", 3, 1000).is_some());
        assert!(c.lookup("k", 7, 1000).is_some());
        assert!(
            c.lookup("k", 0, 1000).is_none(),
            "peeks always reach the store"
        );
    }

    #[test]
    fn ignores_what_it_cannot_bound() {
        let c = DenyCache::new(100);
        c.record("a", 1, 0, &Decision::cost_exceeds_limit(10, 0, 100));
        c.record("b", 1, 0, &limited(1));
        c.record("c", 1, 0, &Decision::allow(10, 3, 100));
        assert!(
            c.lookup("a", 1, 10).is_none()
                && c.lookup("b", 1, 10).is_none()
                && c.lookup("c", 1, 10).is_none()
        );
    }

    #[test]
    fn stays_bounded() {
        let c = DenyCache::new(32);
        for i in 0..1000 {
            c.record(&format!("k{i}"), 1, 0, &limited(1000));
        }
        assert!(c.len.load(Ordering::Relaxed) <= 32);
        // Once they run out, room is made again.
        c.record("late", 1, 2_000_000, &limited(1000));
        assert!(c.lookup("late", 1, 2_000_001).is_some());
    }

    #[test]
    fn modes() {
        let tb = Algorithm::TokenBucket {
            capacity: 1,
            rate: Rate::per_second(1),
        };
        let swc = Algorithm::SlidingWindowCounter {
            limit: 1,
            window_ms: 1000,
        };
        let cc = Algorithm::Concurrency {
            limit: 1,
            lease_ms: 1000,
        };
        assert!(DenyCacheMode::Auto.resolve("redis").caches(&tb));
        assert_eq!(DenyCacheMode::Auto.resolve("memory"), DenyCacheMode::Off);
        assert!(!DenyCacheMode::Exact.caches(&swc) && DenyCacheMode::All.caches(&swc));
        assert!(!DenyCacheMode::All.caches(&cc));
        assert_eq!("on".parse::<DenyCacheMode>().unwrap(), DenyCacheMode::Exact);
    }
}
