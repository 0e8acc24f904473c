//! What a check answers: the verdict, each policy's decision and the concurrency leases to
//! release. Plain data, kept apart from the engine that fills it in, since every caller
//! (the layer, the server, the bindings) reads it.

use std::sync::Arc;

use sluice_core::{Decision, DenyReason, LeaseId, Policy, StoreError};

/// How the verdict of a check was reached.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// The store answered (or, while it is unreachable, the embedded store of the local
    /// fallback answered for `failure_mode = "local"` policies).
    Decided,
    /// The store failed and every policy involved fails open: the request is admitted.
    FailedOpen(StoreError),
    /// The store failed and a policy involved fails closed, or sluice itself was saturated
    /// ([`StoreError::Overloaded`], whatever the failure modes): the request is denied.
    FailedClosed(StoreError),
}

impl Verdict {
    /// `decided`, `failed_open` or `failed_closed`: its one spelling in the decision API's
    /// JSON, the stats and the Python and Node packages.
    pub fn as_str(&self) -> &'static str {
        match self {
            Self::Decided => "decided",
            Self::FailedOpen(_) => "failed_open",
            Self::FailedClosed(_) => "failed_closed",
        }
    }
}

impl std::fmt::Display for Verdict {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One policy's part of a check.
#[derive(Debug, Clone)]
pub struct LimitResult {
    /// The policy.
    pub policy: Arc<Policy>,
    /// The store's decision; `None` when the store failed.
    pub decision: Option<Decision>,
    /// The key that was checked.
    pub key: String,
}

impl LimitResult {
    /// True when this policy, on its own, denied (a shadow policy's denial included).
    pub fn denied(&self) -> bool {
        self.decision
            .as_ref()
            .is_some_and(|d| !d.allowed && d.reason != Some(DenyReason::OtherLimitDenied))
    }
}

/// A held concurrency lease, to hand back to [`Limiter::release`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lease {
    /// The key holding the lease.
    pub key: String,
    /// The policy's algorithm (as evaluated, i.e. per shard).
    pub algorithm: sluice_core::Algorithm,
    /// The lease id.
    pub id: LeaseId,
}

/// The verdict of a check over one or more policies.
#[derive(Debug, Clone)]
pub struct Checked {
    /// Whether to let the request through (shadow denials and fail-open admit).
    pub allowed: bool,
    /// How the verdict was reached.
    pub verdict: Verdict,
    /// One result per policy, in the order given.
    pub limits: Vec<LimitResult>,
    /// Concurrency leases taken (release them when the request ends).
    pub leases: Vec<Lease>,
}

impl Checked {
    /// The results of enforced (non-shadow) policies that denied.
    pub fn denials(&self) -> impl Iterator<Item = &LimitResult> {
        self.limits
            .iter()
            .filter(|l| !l.policy.shadow && l.denied())
    }

    /// The longest wait among enforced denials, in ms.
    pub fn retry_after_ms(&self) -> u64 {
        self.denials()
            .filter_map(|l| l.decision.as_ref())
            .map(|d| d.retry_after_ms)
            .max()
            .unwrap_or(0)
    }

    /// The largest shaping delay among the decisions, in ms.
    pub fn delay_ms(&self) -> u64 {
        self.limits
            .iter()
            .filter_map(|l| l.decision.as_ref())
            .map(|d| d.delay_ms)
            .max()
            .unwrap_or(0)
    }
}
