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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Limiter;
    use parking_lot::Mutex;
    use sluice_core::Algorithm;

    #[derive(Debug, Default)]
    struct Recorder {
        outcomes: Mutex<Vec<(String, String, Outcome)>>,
        calls: Mutex<Vec<Vec<String>>>,
    }

    impl DecisionObserver for Recorder {
        fn decision(&self, event: &DecisionEvent<'_>) {
            for (l, (id, _, _)) in event.checked.limits.iter().zip(event.items) {
                self.outcomes.lock().push((
                    id.as_str().to_string(),
                    l.policy.name.clone(),
                    event.outcome(l),
                ));
            }
        }
        fn store_call(&self, policies: &[&str], _: Duration, error: Option<&StoreError>) {
            assert!(error.is_none());
            self.calls
                .lock()
                .push(policies.iter().map(|p| p.to_string()).collect());
        }
    }

    fn policy(name: &str, limit: u64, shadow: bool) -> Arc<Policy> {
        let mut p = Policy::new(
            name,
            Algorithm::FixedWindow {
                limit,
                window_ms: 60_000,
            },
        )
        .unwrap();
        p.shadow = shadow;
        Arc::new(p)
    }

    #[tokio::test]
    async fn every_decision_and_store_call_is_seen_with_its_outcome() {
        let limiter = Limiter::memory();
        let rec = Arc::new(Recorder::default());
        assert!(limiter.set_observer(rec.clone()));
        assert!(!limiter.set_observer(rec.clone()), "set once only");
        let (enforced, shadow) = (policy("api", 1, false), policy("trial", 1, true));
        let who = Identity::new("user:1");
        for _ in 0..2 {
            limiter
                .check_many(&[(&who, &enforced, 1), (&who, &shadow, 1)])
                .await;
        }
        let seen = rec.outcomes.lock().clone();
        let outcomes: Vec<(&str, Outcome)> =
            seen.iter().map(|(_, p, o)| (p.as_str(), *o)).collect();
        assert_eq!(
            outcomes,
            [
                ("api", Outcome::Allowed),
                ("trial", Outcome::Allowed),
                ("api", Outcome::Denied),
                ("trial", Outcome::ShadowDenied),
            ]
        );
        assert!(seen.iter().all(|(id, _, _)| id == "user:1"));
        // Enforced and shadow policies are separate store calls; the second check's enforced
        // call still runs the shadow one.
        let calls = rec.calls.lock().clone();
        assert_eq!(calls.len(), 4, "{calls:?}");
        assert_eq!(calls[0], ["api"]);
        assert_eq!(calls[1], ["trial"]);
    }
}
