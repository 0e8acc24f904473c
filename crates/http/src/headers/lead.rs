//! Which decision a check's answer leads with, how long the client must wait, and the
//! numbers a client is shown for each policy.
//!
//! The headers, the legacy `X-RateLimit-*` fields, the 429 body, the decision API's JSON and
//! the Envoy service all answer the same two questions about a check. They are answered here
//! once, so no two answers can disagree.
//!
//! A sharded policy (`shards = N`) is evaluated on one of N sub-keys, each holding 1/N of the
//! quota, so the store's decision carries per-shard numbers. Clients are shown the whole
//! policy instead: the limit is the policy's full quota (the `q` of `RateLimit-Policy`) and
//! the remaining count is the shard's, scaled by N and capped at the quota. A policy with one
//! shard is shown exactly as decided.

use sluice::{Checked, Decision, DenyReason, Policy, Verdict};

/// One policy's decision as a client is told about it.
#[derive(Debug, Clone, Copy)]
pub struct Shown<'a> {
    /// The policy.
    pub policy: &'a Policy,
    /// The store's decision (per shard for a sharded policy).
    pub decision: &'a Decision,
}

impl<'a> Shown<'a> {
    /// A policy's decision.
    pub fn new(policy: &'a Policy, decision: &'a Decision) -> Self {
        Self { policy, decision }
    }

    /// The limit shown: the whole policy's quota.
    pub fn limit(&self) -> u64 {
        if self.policy.shards > 1 {
            self.policy.algorithm.quota()
        } else {
            self.decision.limit
        }
    }

    /// The remaining count shown: the shard's, scaled to the whole policy.
    pub fn remaining(&self) -> u64 {
        if self.policy.shards > 1 {
            self.decision
                .remaining
                .saturating_mul(u64::from(self.policy.shards))
                .min(self.limit())
        } else {
            self.decision.remaining
        }
    }
}

/// Which decision leads an answer and how long the client must wait.
#[derive(Debug, Clone, Copy, Default)]
pub struct Lead<'a> {
    /// The enforced denial with the longest wait, else the enforced decision with the least
    /// remaining; `None` when nothing was decided (the store failed) or nothing is enforced.
    pub leader: Option<Shown<'a>>,
    /// `Some(ms)` for a denial that retrying can cure: the longest wait among the denials, or
    /// 1000 when the store failed and a policy fails closed. `None` when admitted, or when
    /// every denial is a cost the policy can never admit.
    pub retry_after_ms: Option<u64>,
}

impl Lead<'_> {
    /// The wait to report in a number field: 0 when there is none.
    pub fn wait_ms(&self) -> u64 {
        self.retry_after_ms.unwrap_or(0)
    }
}

/// The lead of enforced decisions (shadow policies must already be filtered out).
pub fn lead<'a, I>(shown: I) -> Lead<'a>
where
    I: Iterator<Item = Shown<'a>> + Clone,
{
    let denials = shown.clone().filter(|s| s.decision.denies());
    let leader = denials
        .clone()
        .max_by_key(|s| s.decision.retry_after_ms)
        .or_else(|| shown.min_by_key(Shown::remaining));
    // A cost above the quota and the deny list are never cured by waiting.
    let curable = denials.clone().any(|s| {
        !matches!(
            s.decision.reason,
            Some(DenyReason::CostExceedsLimit | DenyReason::Denied)
        )
    });
    let retry_after_ms = curable.then(|| {
        denials
            .map(|s| s.decision.retry_after_ms)
            .max()
            .unwrap_or(0)
    });
    Lead {
        leader,
        retry_after_ms,
    }
}

/// The enforced policies of a check that have a decision, as clients see them.
pub fn shown(checked: &Checked) -> impl Iterator<Item = Shown<'_>> + Clone {
    checked
        .limits
        .iter()
        .filter(|l| !l.policy.shadow)
        .filter_map(|l| l.decision.as_ref().map(|d| Shown::new(&l.policy, d)))
}

/// The lead of a check, with the store's failure taken into account: a fail-closed check
/// waits 1 s, a fail-open one has nothing to lead with.
pub fn lead_of(checked: &Checked) -> Lead<'_> {
    match checked.verdict {
        Verdict::FailedClosed(_) => Lead {
            leader: None,
            retry_after_ms: Some(1000),
        },
        Verdict::FailedOpen(_) => Lead::default(),
        Verdict::Decided => lead(shown(checked)),
    }
}

/// The policy a denial is reported under: the enforced denial with the longest wait, else
/// (fail closed) the first enforced policy that fails closed.
pub fn denying_policy(checked: &Checked) -> Option<&Policy> {
    lead(shown(checked))
        .leader
        .filter(|s| s.decision.denies())
        .map(|s| s.policy)
        .or_else(|| {
            checked
                .limits
                .iter()
                .find(|l| !l.policy.shadow && l.policy.failure_mode == sluice::FailureMode::Closed)
                .map(|l| &*l.policy)
        })
}
