//! Reading and changing one identity's state outside of a check: [`Limiter::state`],
//! [`Limiter::reset`], [`Limiter::charge`] and [`Limiter::refund`] (`docs/admin.md`, "State,
//! charge and refund").
//!
//! They go through the same circuit breaker and call bound as checks, but they are not
//! admissions: a store failure is returned to the caller (never failed open or closed), so an
//! operator or a settling application knows the change did not happen. A sharded policy is
//! handled whole: its state is the sum over its shards, a reset deletes every shard, and a
//! charge or refund is spread evenly over the shards (each shard holds `1/n` of the limit).
//! A reset or refund also drops this instance's remembered denial of the key (the deny
//! cache); other instances' remembered denials run out at their retry time. An override of
//! the identity's parameters (the control plane) applies here as it does to checks: the state
//! is read, charged and refunded under the parameters its checks use.

use std::sync::Arc;
use std::time::Instant;

use sluice_core::algorithm::Adjustment;
use sluice_core::store::CheckItem;
use sluice_core::{Decision, DenyReason, Identity, Policy, StoreError};

use super::Limiter;
use crate::breaker::Admission;
use crate::control::Screen;

impl Limiter {
    /// The keys of `policy` for `identity`: one, or one per shard.
    fn state_keys(&self, identity: &Identity, policy: &Policy) -> Vec<String> {
        let keys = &self.inner.keys;
        if policy.shards > 1 {
            (0..policy.shards)
                .map(|s| keys.shard_key(identity, &policy.name, Some(s)))
                .collect()
        } else {
            vec![keys.key(identity, &policy.name)]
        }
    }

    /// `policy` as `identity`'s checks see it: with the parameters of an override, if any.
    pub(super) fn effective(&self, identity: &Identity, policy: &Arc<Policy>) -> Arc<Policy> {
        let control = &self.inner.control;
        if !control.active() {
            return Arc::clone(policy);
        }
        match control.screen(identity.as_str(), policy, control.clock_ms()) {
            Screen::Override(with) => with.over(policy),
            _ => Arc::clone(policy),
        }
    }

    /// Runs a store call that is not a check under the breaker and the call bound.
    pub(super) async fn guarded<T>(
        &self,
        call: impl std::future::Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        let inner = &*self.inner;
        let admission = inner.breaker.admit(Instant::now());
        if admission == Admission::Reject {
            return Err(StoreError::Unavailable("circuit breaker open".into()));
        }
        let result = self.bounded(call).await;
        match &result {
            Ok(_) => inner.breaker.success(),
            Err(StoreError::Invalid(_)) => {}
            Err(StoreError::Overloaded(_)) => {
                if admission == Admission::Probe {
                    inner.breaker.abandon_probe();
                }
            }
            Err(_) => inner.breaker.failure(Instant::now()),
        }
        result
    }

    /// `identity`'s state for `policy` without consuming anything: what a check of cost 0
    /// answers (`remaining`, `limit`, `reset_after_ms`; `allowed` is false while the state is
    /// in debt beyond the limit).
    pub async fn state(
        &self,
        identity: &Identity,
        policy: &Arc<Policy>,
    ) -> Result<Decision, StoreError> {
        let policy = &self.effective(identity, policy);
        let algorithm = policy.shard_algorithm();
        let mut decisions = Vec::new();
        for key in self.state_keys(identity, policy) {
            let item = CheckItem {
                key: &key,
                algorithm: &algorithm,
                cost: 0,
            };
            let mut d = self
                .guarded(self.inner.store.check(std::slice::from_ref(&item)))
                .await?;
            decisions.push(d.decisions.remove(0));
        }
        Ok(whole(policy, decisions))
    }

    /// Deletes `identity`'s state for `policy` (every shard): its next check starts afresh.
    /// Returns whether there was any state.
    pub async fn reset(
        &self,
        identity: &Identity,
        policy: &Arc<Policy>,
    ) -> Result<bool, StoreError> {
        let mut any = false;
        for key in self.state_keys(identity, policy) {
            any |= self.guarded(self.inner.store.reset(&key)).await?;
            if let Some(cache) = &self.inner.deny_cache {
                cache.forget(&key);
            }
            self.inner.leases.forget(&key);
        }
        Ok(any)
    }

    /// Consumes `cost` without an admission check (the state may go into debt; see
    /// [`sluice_core::algorithm::adjust`]). Answers the state afterwards.
    pub async fn charge(
        &self,
        identity: &Identity,
        policy: &Arc<Policy>,
        cost: u64,
    ) -> Result<Decision, StoreError> {
        self.adjust(identity, policy, cost, Adjustment::Charge)
            .await
    }

    /// Gives `cost` back, never beyond the policy's capacity. Answers the state afterwards.
    pub async fn refund(
        &self,
        identity: &Identity,
        policy: &Arc<Policy>,
        cost: u64,
    ) -> Result<Decision, StoreError> {
        self.adjust(identity, policy, cost, Adjustment::Refund)
            .await
    }

    async fn adjust(
        &self,
        identity: &Identity,
        policy: &Arc<Policy>,
        cost: u64,
        make: fn(u64) -> Adjustment,
    ) -> Result<Decision, StoreError> {
        let policy = &self.effective(identity, policy);
        let algorithm = policy.shard_algorithm();
        let keys = self.state_keys(identity, policy);
        let n = keys.len() as u64;
        let mut decisions = Vec::with_capacity(keys.len());
        for (i, key) in keys.iter().enumerate() {
            // An even split; the first `cost % n` shards take one more.
            let part = cost / n + u64::from((i as u64) < cost % n);
            let adjustment = make(part);
            let d = self
                .guarded(self.inner.store.adjust(key, &algorithm, adjustment))
                .await?;
            if matches!(adjustment, Adjustment::Refund(_)) {
                if let Some(cache) = &self.inner.deny_cache {
                    cache.forget(key);
                }
                self.inner.leases.forget(key);
            }
            decisions.push(d);
        }
        metrics::counter!("sluice_adjustments_total", "policy" => policy.name.clone(), "kind" => make(0).name())
            .increment(1);
        Ok(whole(policy, decisions))
    }
}

/// The policy an override stands for, from what the control plane screens it as (the
/// override's parameters, or the overridden policy whole).
trait OverridePolicy {
    fn over(self, base: &Arc<Policy>) -> Arc<Policy>;
}

impl OverridePolicy for sluice_core::Algorithm {
    fn over(self, base: &Arc<Policy>) -> Arc<Policy> {
        let mut p = (**base).clone();
        p.algorithm = self;
        Arc::new(p)
    }
}

impl OverridePolicy for Arc<Policy> {
    fn over(self, _base: &Arc<Policy>) -> Arc<Policy> {
        self
    }
}

/// One decision for a whole policy from its shards' decisions: remaining summed (at most the
/// policy's quota), the latest reset, allowed while any shard admits.
fn whole(policy: &Policy, mut decisions: Vec<Decision>) -> Decision {
    if decisions.len() == 1 {
        return decisions.remove(0);
    }
    let allowed = decisions.iter().any(|d| d.allowed);
    let limit = policy.algorithm.quota();
    let remaining = decisions
        .iter()
        .map(|d| d.remaining)
        .sum::<u64>()
        .min(limit);
    let reset_after_ms = decisions
        .iter()
        .map(|d| d.reset_after_ms)
        .max()
        .unwrap_or(0);
    if allowed {
        Decision::allow(limit, remaining, reset_after_ms)
    } else {
        let retry = decisions
            .iter()
            .map(|d| d.retry_after_ms)
            .min()
            .unwrap_or(0);
        let mut d = Decision::limited(limit, remaining, retry, reset_after_ms);
        d.reason = Some(DenyReason::Limited);
        d
    }
}
