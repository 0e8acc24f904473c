//! What a rate-limit check answers.

use serde::{Deserialize, Serialize};

/// Why a request was denied.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DenyReason {
    /// The limit is used up for now; `retry_after_ms` says when to try again.
    Limited,
    /// The cost is larger than the policy can ever admit; retrying will never help.
    CostExceedsLimit,
    /// Another limit of the same all-or-nothing check denied, so this one was not consumed.
    OtherLimitDenied,
    /// The store could not be reached and the policy fails closed.
    StoreUnavailable,
    /// The identity is banned (by hand, or automatically after repeated denials) for a scope
    /// that includes this policy; `retry_after_ms` is the time left on the ban.
    Banned,
    /// The identity (or its network) is on the deny list; retrying will not help.
    Denied,
}

/// The identifier of a concurrency lease, returned by an admitted concurrency check and
/// handed back to release it.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct LeaseId(pub String);

impl std::fmt::Display for LeaseId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// The answer to one (key, policy, cost) check. All durations are whole milliseconds,
/// rounded up so a caller that waits `retry_after_ms` is never early.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Decision {
    /// Whether the request is admitted (and, for cost > 0, consumed).
    pub allowed: bool,
    /// The policy's quota as shown to clients (capacity, burst + 1, limit...).
    pub limit: u64,
    /// How many more cost-1 requests would be admitted right now, after this one.
    pub remaining: u64,
    /// 0 when allowed; otherwise how long until this same request would be admitted.
    pub retry_after_ms: u64,
    /// How long until the state is back to its initial value (full bucket, empty window).
    pub reset_after_ms: u64,
    /// For shaping policies: how long the caller should hold the request before passing it on.
    pub delay_ms: u64,
    /// Set when `allowed` is false.
    pub reason: Option<DenyReason>,
    /// Set when an admitted concurrency check took a lease.
    pub lease: Option<LeaseId>,
}

impl Decision {
    /// True when this decision, on its own, refuses the request: not admitted, and not merely
    /// because another limit of the same all-or-nothing check refused. Whether the refusal is
    /// enforced is the policy's business (a shadow policy's denial is only recorded).
    pub fn denies(&self) -> bool {
        !self.allowed && self.reason != Some(DenyReason::OtherLimitDenied)
    }

    /// A decision refused because the identity is banned for `left_ms` more.
    pub fn banned(limit: u64, left_ms: u64) -> Self {
        Self {
            allowed: false,
            limit,
            remaining: 0,
            retry_after_ms: left_ms.max(1),
            reset_after_ms: left_ms.max(1),
            delay_ms: 0,
            reason: Some(DenyReason::Banned),
            lease: None,
        }
    }

    /// A decision refused because the identity is on the deny list.
    pub fn deny_listed(limit: u64) -> Self {
        Self {
            allowed: false,
            limit,
            remaining: 0,
            retry_after_ms: 0,
            reset_after_ms: 0,
            delay_ms: 0,
            reason: Some(DenyReason::Denied),
            lease: None,
        }
    }

    /// An admitted decision with no delay and no lease.
    pub fn allow(limit: u64, remaining: u64, reset_after_ms: u64) -> Self {
        Self {
            allowed: true,
            limit,
            remaining,
            retry_after_ms: 0,
            reset_after_ms,
            delay_ms: 0,
            reason: None,
            lease: None,
        }
    }

    /// A decision denied because the limit is used up.
    pub fn limited(limit: u64, remaining: u64, retry_after_ms: u64, reset_after_ms: u64) -> Self {
        Self {
            allowed: false,
            limit,
            remaining,
            retry_after_ms: retry_after_ms.max(1),
            reset_after_ms,
            delay_ms: 0,
            reason: Some(DenyReason::Limited),
            lease: None,
        }
    }

    /// A decision denied because the cost can never be admitted by this policy.
    pub fn cost_exceeds_limit(limit: u64, remaining: u64, reset_after_ms: u64) -> Self {
        Self {
            allowed: false,
            limit,
            remaining,
            retry_after_ms: 0,
            reset_after_ms,
            delay_ms: 0,
            reason: Some(DenyReason::CostExceedsLimit),
            lease: None,
        }
    }
}

/// The answer to an all-or-nothing check of several limits: `allowed` only if every limit
/// admitted, and then every one was consumed; otherwise none was.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MultiDecision {
    /// True when every limit admitted the request.
    pub allowed: bool,
    /// One decision per checked item, in the order given. When the check as a whole is denied,
    /// items that would have admitted show `allowed: false` with reason
    /// [`DenyReason::OtherLimitDenied`] and their unconsumed state.
    pub decisions: Vec<Decision>,
}

impl MultiDecision {
    /// The decision that denied (the first one with reason other than `OtherLimitDenied`).
    pub fn denied_by(&self) -> Option<usize> {
        self.decisions.iter().position(Decision::denies)
    }

    /// The longest retry among the denying decisions (how long the caller must wait).
    pub fn retry_after_ms(&self) -> u64 {
        self.decisions
            .iter()
            .map(|d| d.retry_after_ms)
            .max()
            .unwrap_or(0)
    }
}

/// Milliseconds from a microsecond duration, rounded up.
pub fn ceil_ms(us: u64) -> u64 {
    us.div_ceil(1000)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_decision_that_refused_on_its_own_denies() {
        assert!(!Decision::allow(10, 9, 100).denies());
        assert!(Decision::limited(10, 0, 5, 100).denies());
        assert!(Decision::cost_exceeds_limit(10, 10, 0).denies());
        let mut other = Decision::allow(10, 9, 100);
        other.allowed = false;
        other.reason = Some(DenyReason::OtherLimitDenied);
        assert!(!other.denies());
        let multi = MultiDecision {
            allowed: false,
            decisions: vec![other, Decision::limited(10, 0, 5, 100)],
        };
        assert_eq!(multi.denied_by(), Some(1));
    }
}
