//! The limiter's side of leased mode ([`crate::leased`]): which items of a check a slice
//! answers, the reservation calls, giving units back when another limit of the check denied,
//! and returning every slice at shutdown.

use std::sync::{Arc, Weak};
use std::time::Duration;

use sluice_core::store::CheckItem;
use sluice_core::{Clock, DecisionMode, Timestamp};

use super::{Inner, Limiter, PlannedItem};
use crate::leased::{LeaseCounters, Spend};

/// How often idle slices are looked for and returned.
const SWEEP_EVERY: Duration = Duration::from_millis(250);

/// A monotonic clock in µs since the limiter was built: slices need durations, which a wall
/// clock stepped by NTP would break.
#[derive(Debug)]
pub(crate) struct MonotonicClock(std::time::Instant);

impl MonotonicClock {
    pub(crate) fn new() -> Self {
        Self(std::time::Instant::now())
    }
}

impl Clock for MonotonicClock {
    fn now(&self) -> Timestamp {
        // Offset by a second so "time 0" never reads as "unset" in the slots.
        self.0.elapsed().as_micros() as u64 + 1_000_000
    }
}

/// Abandons the reservation of `key` if its request goes away before the answer.
struct Reserving<'a> {
    table: &'a crate::leased::LeaseTable,
    key: &'a str,
    answered: bool,
}

impl Drop for Reserving<'_> {
    fn drop(&mut self) {
        if !self.answered {
            self.table.abandon(self.key);
        }
    }
}

/// Units of a check spent from slices: (planned item, slice generation).
pub(super) type Spent = Vec<(usize, u64)>;

impl Limiter {
    /// Answers the leased items of a check from their slices, reserving a slice where there
    /// is none. Items left without a decision are checked exactly; `true` when a slice's
    /// remembered denial refused the check.
    pub(super) async fn spend_leases(
        &self,
        planned: &mut [PlannedItem],
        spent: &mut Spent,
    ) -> bool {
        let inner = &*self.inner;
        let table = &inner.leases;
        for (i, item) in planned.iter_mut().enumerate() {
            let DecisionMode::Leased { ttl_ms } = item.result.policy.mode else {
                continue;
            };
            if item.shadow
                || item.screened
                || item.result.decision.is_some()
                || item.result.policy.mode.check(&item.algorithm).is_err()
            {
                continue;
            }
            let (key, cost) = (item.result.key.as_str(), item.cost);
            let mut waited = false;
            let spend = loop {
                match table.spend(key, &item.algorithm, ttl_ms, cost, table.now()) {
                    // Another request of this instance is reserving: its slice will do, and
                    // waiting for it costs the store nothing (once; then check exactly).
                    Spend::Wait(waiters) if !waited => {
                        waited = true;
                        let notified = waiters.notified();
                        tokio::pin!(notified);
                        notified.as_mut().enable();
                        if table.reserving(key) {
                            let _ = tokio::time::timeout(inner.timeout, notified).await;
                        }
                    }
                    Spend::Wait(_) => break Spend::Exact,
                    other => break other,
                }
            };
            match spend {
                Spend::Exact | Spend::Wait(_) => {}
                Spend::Admitted {
                    decision,
                    generation,
                } => {
                    item.result.decision = Some(decision);
                    spent.push((i, generation));
                }
                Spend::Denied(decision) => {
                    item.result.decision = Some(decision);
                    return true;
                }
                Spend::Reserve { size, refund } => {
                    let mut guard = Reserving {
                        table,
                        key,
                        answered: false,
                    };
                    if refund > 0 {
                        let refunds = vec![crate::leased::Refund {
                            key: key.to_string(),
                            algorithm: item.algorithm.clone(),
                            units: refund,
                        }];
                        table.refund(refunds, inner.timeout).await;
                        if let Some(cache) = &inner.deny_cache {
                            cache.forget(key);
                        }
                    }
                    self.start_sweeper();
                    let reserve = [CheckItem {
                        key,
                        algorithm: &item.algorithm,
                        cost: size,
                    }];
                    let sent = table.now();
                    let result = self.call_store(&reserve).await;
                    guard.answered = true;
                    if let Some(observer) = inner.observer.get() {
                        let elapsed = Duration::from_micros(table.now().saturating_sub(sent));
                        observer.store_call(
                            &[item.result.policy.name.as_str()],
                            elapsed,
                            result.as_ref().err(),
                        );
                    }
                    metrics::counter!("sluice_lease_reservations_total", "policy" => item.result.policy.name.clone())
                        .increment(1);
                    let answer = result.as_ref().ok().and_then(|m| m.decisions.first());
                    let algorithm = item.algorithm.clone();
                    let key = key.to_string();
                    if let Some((decision, generation)) =
                        table.reserved(&key, &algorithm, size, cost, sent, answer)
                    {
                        item.result.decision = Some(decision);
                        spent.push((i, generation));
                    } else if let Some(d) = answer.filter(|d| size == cost && !d.allowed) {
                        // A slice of just this request's cost is the exact check: its
                        // denial is the answer, and is remembered.
                        table.denied(&key, cost, sent, d);
                        item.result.decision = Some(d.clone());
                        return true;
                    }
                }
            }
        }
        false
    }

    /// Gives the units of a denied check back to their slices.
    pub(super) fn give_back_leases(&self, planned: &[PlannedItem], spent: &Spent) {
        for &(i, generation) in spent {
            let item = &planned[i];
            self.inner
                .leases
                .give_back(&item.result.key, item.cost, generation);
        }
    }

    /// Remembers an exact denial of a leased item, sent at `sent` (µs on the limiter's
    /// clock), so the key is denied locally until the store's retry time.
    pub(super) fn note_leased_denial(&self, item: &PlannedItem, sent: Timestamp) {
        if let (DecisionMode::Leased { .. }, Some(d)) =
            (item.result.policy.mode, item.result.decision.as_ref())
        {
            self.inner
                .leases
                .denied(&item.result.key, item.cost, sent, d);
        }
    }

    /// Returns every unit this instance holds in leased slices to the store and forgets the
    /// slices; later checks reserve afresh. Call it before the process exits (dropping the
    /// last clone of a limiter inside a runtime sends the same refunds without waiting).
    /// Returns the units the store took back.
    pub async fn shutdown(&self) -> u64 {
        let inner = &*self.inner;
        let refunds = inner.leases.sweep(true);
        if let Some(cache) = &inner.deny_cache {
            for r in &refunds {
                cache.forget(&r.key);
            }
        }
        inner.leases.refund(refunds, inner.timeout).await
    }

    /// Counters of leased mode since the limiter was built.
    pub fn lease_counters(&self) -> LeaseCounters {
        self.inner.leases.counters()
    }

    /// Starts (once, inside a runtime) the task that returns slices that ended unspent.
    fn start_sweeper(&self) {
        let inner = &self.inner;
        if inner.sweeper.get().is_some() {
            return;
        }
        let Ok(handle) = tokio::runtime::Handle::try_current() else {
            return;
        };
        if inner.sweeper.set(()).is_err() {
            return;
        }
        let weak: Weak<Inner> = Arc::downgrade(inner);
        handle.spawn(async move {
            loop {
                tokio::time::sleep(SWEEP_EVERY).await;
                let Some(inner) = weak.upgrade() else {
                    break;
                };
                let refunds = inner.leases.sweep(false);
                if !refunds.is_empty() {
                    inner.leases.refund(refunds, inner.timeout).await;
                }
            }
        });
    }
}
