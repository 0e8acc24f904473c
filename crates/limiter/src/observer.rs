//! A hook that sees every decision and every store call of a limiter, for live views.
//!
//! `sluice serve` feeds its console, heavy-hitter summary and latency histograms from here, so
//! the decision API, the Envoy service and the proxy (whose checks happen inside the
//! `sluice-http` layer) are all seen at the one place they meet. An observer runs inline on
//! the decision path: it must cost a few atomic operations or a short lock, never I/O.

use std::sync::Arc;
use std::time::Duration;

use sluice_core::{Identity, Policy, StoreError};

use crate::limiter::{Checked, LimitResult, Verdict};

/// What one policy of a check came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Outcome {
    /// Admitted by the policy (allow-listed included).
    Allowed,
    /// Refused by the policy, a ban or the deny list.
    Denied,
    /// Would have been refused, but the policy (or the limiter) is shadow.
    ShadowDenied,
    /// The store did not answer and the policy failed open.
    FailedOpen,
    /// The store did not answer (or sluice was saturated) and the check was refused.
    FailedClosed,
}

impl Outcome {
    /// The outcome's name as metrics label it.
    pub fn name(self) -> &'static str {
        match self {
            Outcome::Allowed => "allowed",
            Outcome::Denied => "denied",
            Outcome::ShadowDenied => "shadow_denied",
            Outcome::FailedOpen => "failed_open",
            Outcome::FailedClosed => "failed_closed",
        }
    }
}

/// One finished check as an observer sees it.
#[derive(Debug)]
pub struct DecisionEvent<'a> {
    /// What was asked: identity (as keyed: credentials arrive hashed), policy, cost.
    pub items: &'a [(&'a Identity, &'a Arc<Policy>, u64)],
    /// The answer; `checked.limits[i]` belongs to `items[i]`.
    pub checked: &'a Checked,
    /// How long the check took, store calls included.
    pub elapsed: Duration,
    pub(crate) global_shadow: bool,
}

impl DecisionEvent<'_> {
    /// The outcome of `limit` (one of `checked.limits`).
    pub fn outcome(&self, limit: &LimitResult) -> Outcome {
        match (&limit.decision, &self.checked.verdict) {
            (Some(d), _) if d.allowed => Outcome::Allowed,
            (Some(_), _) if limit.policy.shadow || self.global_shadow => Outcome::ShadowDenied,
            (Some(_), _) => Outcome::Denied,
            (None, Verdict::FailedClosed(_)) => Outcome::FailedClosed,
            (None, _) => Outcome::FailedOpen,
        }
    }
}

/// Receives every decision and store call of the limiter it is set on
/// ([`crate::Limiter::set_observer`]).
pub trait DecisionObserver: Send + Sync + std::fmt::Debug {
    /// A check finished.
    fn decision(&self, event: &DecisionEvent<'_>);

    /// A store call finished after `elapsed`, for `policies`; `error` when it failed.
    fn store_call(&self, policies: &[&str], elapsed: Duration, error: Option<&StoreError>);
}
