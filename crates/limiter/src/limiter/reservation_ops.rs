//! [`Limiter::reserve`] and [`Limiter::settle`]: the limiter's side of
//! [`crate::reservation`]. A reserve is a check of the maximum cost plus a record; a settle
//! takes the record (once) and refunds or charges the difference on the key the maximum was
//! consumed from, under the parameters it was consumed under.

use std::sync::Arc;
use std::time::{Duration, Instant};

use sluice_core::algorithm::Adjustment;
use sluice_core::policy::MAX_EXACT;
use sluice_core::{Identity, Policy, StoreError};

use super::{Limiter, Verdict};
use crate::control::Screen;
use crate::reservation::{
    MAX_TTL, MIN_TTL, Record, Reservation, Reserved, SettleError, Settled, Taken, new_id, valid_id,
};

impl Limiter {
    /// Reserves `max_cost` of `policy` for `identity` for at most `ttl`: a check of that cost
    /// which, when admitted, consumes it until [`Reservation::settle`] (or [`Self::settle`] by
    /// id, from any instance sharing the store) gives the unused part back. Unsettled when
    /// `ttl` ends, it counts in full. Errors: a concurrency policy, a ttl outside
    /// [`MIN_TTL`]..=[`MAX_TTL`], a cost beyond 2^53 ([`StoreError::Invalid`]); a record the
    /// store did not keep (the maximum then stays spent).
    pub async fn reserve(
        &self,
        identity: &Identity,
        policy: &Arc<Policy>,
        max_cost: u64,
        ttl: Duration,
    ) -> Result<Reserved, StoreError> {
        if policy.algorithm.holds_leases() {
            return Err(StoreError::Invalid(format!(
                "policy {} is a concurrency limit: it holds leases, not costs, so it cannot be reserved from",
                policy.name
            )));
        }
        if !(MIN_TTL..=MAX_TTL).contains(&ttl) {
            return Err(StoreError::Invalid(format!(
                "a reservation's ttl must be between {} ms and {} ms",
                MIN_TTL.as_millis(),
                MAX_TTL.as_millis()
            )));
        }
        if max_cost > MAX_EXACT {
            return Err(StoreError::Invalid(format!(
                "cost {max_cost} is too large (at most 2^53)"
            )));
        }
        let control = &self.inner.control;
        // An allow-listed identity is admitted without consuming: nothing to settle.
        let allow_listed = control.active()
            && matches!(
                control.screen(identity.as_str(), policy, control.clock_ms()),
                Screen::Allowed
            );
        let effective = self.effective(identity, policy);
        let checked = self.check(identity, policy, max_cost).await;
        let consumed = checked.allowed
            && !allow_listed
            && checked.verdict == Verdict::Decided
            && checked
                .limits
                .first()
                .and_then(|l| l.decision.as_ref())
                .is_some_and(|d| d.allowed);
        if !consumed {
            return Ok(Reserved {
                checked,
                reservation: None,
            });
        }
        let record = Record {
            policy: policy.name.clone(),
            identity: identity.as_str().to_string(),
            key: checked.limits[0].key.clone(),
            algorithm: effective.shard_algorithm(),
            max_cost,
        };
        let id = new_id();
        self.inner.reservations.put(&id, &record, ttl).await?;
        metrics::counter!("sluice_reservations_total", "policy" => policy.name.clone(), "outcome" => "reserved")
            .increment(1);
        Ok(Reserved {
            checked,
            reservation: Some(Reservation {
                limiter: self.clone(),
                id,
                max_cost,
                expires: Instant::now() + ttl,
            }),
        })
    }

    /// Settles the reservation `id` with the real cost `actual`: the unused part of its
    /// maximum goes back, or the excess is charged as debt. Exactly once per reservation,
    /// from any instance sharing the store.
    pub async fn settle(&self, id: &str, actual: u64) -> Result<Settled, SettleError> {
        if actual > MAX_EXACT {
            return Err(SettleError::Store(StoreError::Invalid(format!(
                "cost {actual} is too large (at most 2^53)"
            ))));
        }
        if !valid_id(id) {
            return Err(SettleError::Unknown);
        }
        let record = match self.inner.reservations.take(id).await? {
            Taken::Open(record) => record,
            Taken::Settled => return Err(SettleError::AlreadySettled),
            Taken::Unknown => return Err(SettleError::Unknown),
        };
        let max = record.max_cost;
        let adjustment = match actual.cmp(&max) {
            std::cmp::Ordering::Less => Some(Adjustment::Refund(max - actual)),
            std::cmp::Ordering::Greater => Some(Adjustment::Charge(actual - max)),
            std::cmp::Ordering::Equal => None,
        };
        let decision = match adjustment {
            Some(adjustment) => {
                let store = &self.inner.store;
                let d = self
                    .guarded(store.adjust(&record.key, &record.algorithm, adjustment))
                    .await?;
                if matches!(adjustment, Adjustment::Refund(_)) {
                    if let Some(cache) = &self.inner.deny_cache {
                        cache.forget(&record.key);
                    }
                    self.inner.leases.forget(&record.key);
                }
                Some(d)
            }
            None => None,
        };
        let debt = actual.saturating_sub(max);
        let outcome = if debt > 0 { "debt" } else { "settled" };
        metrics::counter!("sluice_reservations_total", "policy" => record.policy.clone(), "outcome" => outcome)
            .increment(1);
        Ok(Settled {
            policy: record.policy,
            identity: record.identity,
            max_cost: max,
            actual,
            refunded: max.saturating_sub(actual),
            debt,
            decision,
        })
    }
}
