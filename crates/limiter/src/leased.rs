//! Leased mode (`mode = "leased"`): an instance takes a slice of a key's quota from the shared
//! store in one call and spends it in-process, so a busy key costs the store one call per
//! slice instead of one per request.
//!
//! Why it never admits more than the limit: every admission spends a unit the store already
//! handed out, and a unit is only spent while spending it is equivalent to having spent it
//! when it was taken:
//! - a **fixed (or calendar) window**'s slice is spent only in the window it was taken in, and
//!   goes back (a refund) only while that window still runs;
//! - a **token bucket**'s or **GCRA**'s slice shrinks as the store's bucket refills: units held
//!   here plus the bucket's level never exceed the capacity, so the refill the exact algorithm
//!   would have dropped at a full bucket is dropped here too, never handed out twice.
//!
//! What it costs: units held by one instance are not available to another until they are spent,
//! expire or are refunded, so the instances together may under-admit by up to the slices they
//! hold (each at most `max_slice`) for at most a slice's lifetime. Slices size themselves from
//! the rate this instance saw over the previous slice (at most doubling), so a key seen rarely
//! holds a slice of one. When the store denies a slice, the request is checked exactly; when
//! an exact check denies, the key is answered locally as denied until the store's retry time.
//!
//! Times here are the limiter's clock ([`sluice_core::Clock`]); durations the store answers
//! (`reset_after_ms`) are taken from the moment the call was sent, which is never later than
//! the store's own evaluation, so window ends are estimated early, never late.

use std::collections::HashMap;
use std::hash::BuildHasher;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::Mutex;
use sluice_core::algorithm::Adjustment;
use sluice_core::{Algorithm, Clock, Decision, DenyReason, Store, Timestamp};

mod slot;

use slot::{Bound, Slot};

const SHARDS: usize = 64;

/// foldhash, not SipHash: every leased check hashes its key twice (shard, then map), and the
/// keys are sluice's own names (identities in them are hashed already when they are secrets).
type Shard = Mutex<HashMap<Box<str>, Slot, foldhash::fast::RandomState>>;

/// The most keys the table holds slices for; beyond, new keys are checked exactly.
pub(crate) const LEASE_TABLE_CAPACITY: usize = 65_536;

/// The largest share of a key's quota one slice takes.
pub const MAX_SLICE_DIVISOR: u64 = 10;

/// The largest slice of `algorithm` (sharded policies pass the per-shard algorithm).
pub fn max_slice(algorithm: &Algorithm) -> u64 {
    (algorithm.quota() / MAX_SLICE_DIVISOR).max(1)
}

/// What [`LeaseTable::spend`] found.
#[derive(Debug)]
pub(crate) enum Spend {
    /// Admitted from the slice; `generation` identifies it for [`LeaseTable::give_back`].
    Admitted { decision: Decision, generation: u64 },
    /// Denied from a remembered denial.
    Denied(Decision),
    /// No slice to spend: reserve `size` units (at least the cost), then refund `refund`
    /// units left of the expired slice.
    Reserve { size: u64, refund: u64 },
    /// A reservation of this key is on its way: wait for it, then spend again.
    Wait(Arc<tokio::sync::Notify>),
    /// Check this request exactly (the table is full, the window is about to end, the cost is
    /// beyond a slice).
    Exact,
}

/// A refund due: `units` of `key`'s quota to give back to the store.
#[derive(Debug)]
pub(crate) struct Refund {
    pub(crate) key: String,
    pub(crate) algorithm: Algorithm,
    pub(crate) units: u64,
}

/// The slices this instance holds, by key, sharded.
#[derive(Debug)]
pub(crate) struct LeaseTable {
    shards: Box<[Shard]>,
    hasher: foldhash::fast::RandomState,
    per_shard: usize,
    clock: Arc<dyn Clock>,
    /// The longest a refund may take to reach the store (the limiter's call timeout): a
    /// refund that might arrive after its window ended is not sent.
    margin_us: u64,
    pub(crate) store: Arc<dyn Store>,
    stats: LeaseStats,
}

/// Counters of the table, for tests and the benchmark.
#[derive(Debug, Default)]
pub(crate) struct LeaseStats {
    pub(crate) reservations: AtomicU64,
    pub(crate) refunded_units: AtomicU64,
    pub(crate) local_admissions: AtomicU64,
    pub(crate) local_denials: AtomicU64,
}

/// Counters of a limiter's leased mode since it was built.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LeaseCounters {
    /// Slices reserved from the store (one store call each).
    pub reservations: u64,
    /// Units given back to the store (by expiry, a replaced slice or shutdown).
    pub refunded_units: u64,
    /// Requests admitted from a slice without a store call.
    pub local_admissions: u64,
    /// Requests denied from a remembered denial without a store call.
    pub local_denials: u64,
}

impl LeaseTable {
    pub(crate) fn new(store: Arc<dyn Store>, clock: Arc<dyn Clock>, margin_us: u64) -> Self {
        Self {
            shards: (0..SHARDS)
                .map(|_| Mutex::new(HashMap::with_hasher(Default::default())))
                .collect(),
            hasher: foldhash::fast::RandomState::default(),
            per_shard: LEASE_TABLE_CAPACITY.div_ceil(SHARDS),
            clock,
            margin_us,
            store,
            stats: LeaseStats::default(),
        }
    }

    pub(crate) fn now(&self) -> Timestamp {
        self.clock.now()
    }

    fn shard(&self, key: &str) -> &Shard {
        &self.shards[(self.hasher.hash_one(key) % SHARDS as u64) as usize]
    }

    pub(crate) fn counters(&self) -> LeaseCounters {
        let s = &self.stats;
        LeaseCounters {
            reservations: s.reservations.load(Ordering::Relaxed),
            refunded_units: s.refunded_units.load(Ordering::Relaxed),
            local_admissions: s.local_admissions.load(Ordering::Relaxed),
            local_denials: s.local_denials.load(Ordering::Relaxed),
        }
    }

    /// Spends `cost` of `key`'s slice at `now`, or says what to do instead.
    pub(crate) fn spend(
        &self,
        key: &str,
        algorithm: &Algorithm,
        ttl_ms: u64,
        cost: u64,
        now: Timestamp,
    ) -> Spend {
        if cost == 0 {
            return Spend::Exact;
        }
        let mut shard = self.shard(key).lock();
        let slot = match shard.get_mut(key) {
            Some(slot) if slot.algorithm == *algorithm => slot,
            Some(_) => {
                // The policy changed (a reload): what was learnt no longer holds. Units held
                // under the old parameters are dropped, not refunded.
                shard.remove(key);
                return Spend::Exact;
            }
            None => {
                if shard.len() >= self.per_shard {
                    return Spend::Exact;
                }
                shard.insert(key.into(), Slot::new(algorithm, ttl_ms * 1000));
                shard.get_mut(key).expect("just inserted")
            }
        };
        if now < slot.denied_until && cost >= slot.denied_cost {
            self.stats.local_denials.fetch_add(1, Ordering::Relaxed);
            let ms = |at: Timestamp| at.saturating_sub(now).div_ceil(1000);
            return Spend::Denied(Decision::limited(
                slot.limit,
                slot.denied_remaining,
                ms(slot.denied_retry_at),
                ms(slot.denied_reset_at),
            ));
        }
        let spendable = slot.spendable(now);
        if spendable >= cost {
            slot.held = spendable - cost;
            slot.used += cost;
            self.stats.local_admissions.fetch_add(1, Ordering::Relaxed);
            let remaining = slot
                .store_remaining
                .saturating_add(slot.held)
                .min(slot.limit);
            let reset = slot.reset_at.saturating_sub(now).div_ceil(1000);
            return Spend::Admitted {
                decision: Decision::allow(slot.limit, remaining, reset),
                generation: slot.generation,
            };
        }
        if slot.in_flight {
            let waiters = slot.waiters.get_or_insert_with(Default::default);
            return Spend::Wait(Arc::clone(waiters));
        }
        // A window about to end: a slice taken now could not go back.
        if let Bound::Window { end } = slot.bound
            && now < end
            && now.saturating_add(self.margin_us) >= end
        {
            return Spend::Exact;
        }
        let max = max_slice(algorithm);
        if cost > max {
            return Spend::Exact;
        }
        let refund = slot.refundable(now, self.margin_us);
        // Units the refill took before the slice's lifetime ended.
        let shrunk = matches!(slot.bound, Bound::Refill { .. })
            && now < slot.expires
            && slot.size.saturating_sub(slot.used) > spendable;
        let size = slot.next_size(now, max, shrunk).max(cost);
        slot.held = 0;
        slot.in_flight = true;
        Spend::Reserve { size, refund }
    }

    /// Records the store's answer to a reservation of `size` sent at `sent`, of which this
    /// request spends `cost` when it was admitted. Returns the request's decision when the
    /// slice was granted, `None` when the request is to be checked exactly.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn reserved(
        &self,
        key: &str,
        algorithm: &Algorithm,
        size: u64,
        cost: u64,
        sent: Timestamp,
        answer: Option<&Decision>,
    ) -> Option<(Decision, u64)> {
        let mut shard = self.shard(key).lock();
        let slot = shard.get_mut(key)?;
        slot.end_reservation();
        if slot.algorithm != *algorithm {
            return None;
        }
        let d = answer?;
        if !d.allowed {
            // Fewer than a slice left: start again from slices of one (the slice's lifetime
            // counts as over, so the next size comes from a rate of nothing).
            slot.size = d.remaining.max(1);
            slot.used = 0;
            slot.held = 0;
            slot.taken = sent.saturating_sub(slot.ttl_us);
            slot.expires = sent;
            return None;
        }
        self.stats.reservations.fetch_add(1, Ordering::Relaxed);
        slot.generation += 1;
        slot.size = size;
        slot.used = cost;
        slot.held = size - cost;
        slot.taken = sent;
        slot.expires = sent + slot.ttl_us;
        slot.store_remaining = d.remaining;
        slot.reset_at = sent + d.reset_after_ms * 1000;
        slot.limit = d.limit;
        slot.bound = match algorithm.token_refill() {
            // `remaining` is the level rounded down: the level is below `remaining + 1`.
            Some(refill) => Bound::Refill {
                room: refill.capacity.saturating_sub(d.remaining + 1),
                rate: refill.rate,
                slack_us: refill.slack_us,
            },
            // The window ends `reset_after_ms` after the store's now, which is no earlier than
            // `sent`; its whole-ms arithmetic may put the end up to 1 ms before that.
            None => Bound::Window {
                end: (sent + d.reset_after_ms * 1000).saturating_sub(1000),
            },
        };
        if let Bound::Window { end } = slot.bound {
            slot.expires = slot.expires.min(end);
        }
        slot.held = slot.held.min(slot.spendable(sent));
        let remaining = d.remaining.saturating_add(slot.held).min(d.limit);
        Some((
            Decision::allow(d.limit, remaining, d.reset_after_ms),
            slot.generation,
        ))
    }

    /// True while a reservation of `key` is on its way.
    pub(crate) fn reserving(&self, key: &str) -> bool {
        self.shard(key).lock().get(key).is_some_and(|s| s.in_flight)
    }

    /// Ends a reservation that was never answered (its request went away mid-call), so the
    /// key does not wait on it forever.
    pub(crate) fn abandon(&self, key: &str) {
        if let Some(slot) = self.shard(key).lock().get_mut(key)
            && slot.in_flight
        {
            slot.end_reservation();
        }
    }

    /// Forgets `key`'s slice and remembered denial (its state was reset or refunded by hand).
    /// Units the slice held are dropped, not refunded: the state they came from is gone.
    pub(crate) fn forget(&self, key: &str) {
        let mut shard = self.shard(key).lock();
        if shard.get(key).is_some_and(|s| !s.in_flight) {
            shard.remove(key);
        }
    }

    /// Gives `cost` back to the slice it was spent from (another limit of the same check
    /// denied). A unit of a slice since replaced is dropped: under-admission, never more.
    pub(crate) fn give_back(&self, key: &str, cost: u64, generation: u64) {
        if let Some(slot) = self.shard(key).lock().get_mut(key)
            && slot.generation == generation
        {
            slot.held += cost;
            slot.used = slot.used.saturating_sub(cost);
        }
    }

    /// Remembers the store's denial of a request of `cost` on `key` sent at `sent`, so requests
    /// until its retry time are denied here.
    pub(crate) fn denied(&self, key: &str, cost: u64, sent: Timestamp, d: &Decision) {
        if d.allowed || d.reason != Some(DenyReason::Limited) || d.retry_after_ms <= 1 {
            return;
        }
        if let Some(slot) = self.shard(key).lock().get_mut(key) {
            let retry_at = sent + d.retry_after_ms * 1000;
            // The store's whole-ms answer may be up to 1 ms late: trust it 1 ms less, and
            // for a slice's lifetime at most (another instance may refund meanwhile).
            slot.denied_until = (retry_at - 1000).min(sent + slot.ttl_us);
            slot.denied_cost = cost;
            slot.denied_retry_at = retry_at;
            slot.denied_reset_at = sent + d.reset_after_ms * 1000;
            slot.denied_remaining = d.remaining;
            slot.limit = d.limit;
        }
    }

    /// Takes the units of ended slices (every slice when `all`, for shutdown) for refunds, and
    /// forgets keys idle for ten lifetimes.
    pub(crate) fn sweep(&self, all: bool) -> Vec<Refund> {
        let now = self.now();
        let mut refunds = Vec::new();
        for shard in self.shards.iter() {
            let mut shard = shard.lock();
            shard.retain(|key, slot| {
                if slot.in_flight {
                    return true;
                }
                if (all || now >= slot.expires) && slot.held > 0 {
                    let units = slot.refundable(now, self.margin_us);
                    slot.held = 0;
                    if units > 0 {
                        refunds.push(Refund {
                            key: key.to_string(),
                            algorithm: slot.algorithm.clone(),
                            units,
                        });
                    }
                }
                let idle = now.saturating_sub(slot.taken.max(slot.denied_until));
                !all && idle < slot.ttl_us.saturating_mul(10)
            });
        }
        refunds
    }

    /// Sends refunds, each bounded by `timeout`; returns the units the store took back.
    pub(crate) async fn refund(&self, refunds: Vec<Refund>, timeout: std::time::Duration) -> u64 {
        let mut units = 0;
        for r in refunds {
            let call = self
                .store
                .adjust(&r.key, &r.algorithm, Adjustment::Refund(r.units));
            if let Ok(Ok(_)) = tokio::time::timeout(timeout, call).await {
                units += r.units;
            }
        }
        self.stats
            .refunded_units
            .fetch_add(units, Ordering::Relaxed);
        metrics::counter!("sluice_lease_refunded_units_total").increment(units);
        units
    }
}

impl Drop for LeaseTable {
    /// Units still held go back when the limiter goes away inside a runtime (an explicit
    /// [`crate::Limiter::shutdown`] waits for them instead).
    fn drop(&mut self) {
        let refunds = self.sweep(true);
        if refunds.is_empty() {
            return;
        }
        let Ok(handle) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let store = Arc::clone(&self.store);
        let timeout = std::time::Duration::from_micros(self.margin_us.max(1000));
        handle.spawn(async move {
            for r in refunds {
                let call = store.adjust(&r.key, &r.algorithm, Adjustment::Refund(r.units));
                let _ = tokio::time::timeout(timeout, call).await;
            }
        });
    }
}
