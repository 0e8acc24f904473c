//! [`Count`]: which responses a rule's cost is charged for, and the check-then-charge steps
//! the layer runs for a rule that does not count every request.
//!
//! A login route that should stop after a few wrong passwords must not count the right
//! ones, and an API that limits errors must not count its successes; neither outcome is
//! known until the upstream answers. So for such a rule the layer checks before forwarding
//! *without consuming* (a check of cost 0: control-plane refusals, debt and store failures
//! are answered as usual, and a policy with less left than the cost denies), forwards, and
//! charges the cost only when the response status is one the rule counts.
//!
//! The bound this gives is looser than consuming up front: requests in flight at the same
//! time all pass the check before any of their charges lands, so a limit can be overshot by
//! the number of concurrent requests (`docs/http.md`, "Counting by outcome").
//! Concurrency policies are not affected: they hold their lease from the check on, as always.

use std::sync::Arc;

use http::StatusCode;
use sluice::{Algorithm, Checked, FailureMode, Identity, Limiter, Policy, StoreError};

/// Which responses a rule charges its cost for.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum Count {
    /// Every request, consumed before forwarding (the default).
    #[default]
    All,
    /// Responses with a 2xx or 3xx status.
    Successes,
    /// Responses with a 4xx or 5xx status.
    Failures,
    /// Responses with one of these statuses.
    Statuses(Vec<StatusCode>),
}

impl Count {
    /// `"all"`, `"successes"` or `"failures"`; anything else is an error naming the choices.
    pub fn named(name: &str) -> Result<Self, String> {
        match name {
            "all" => Ok(Self::All),
            "successes" => Ok(Self::Successes),
            "failures" => Ok(Self::Failures),
            other => Err(format!(
                "unknown count {other:?}: expected \"all\", \"successes\", \"failures\" or a \
                 list of statuses such as [401, 403]"
            )),
        }
    }

    /// An explicit list of statuses; each must be 100..=599 and the list must not be empty.
    pub fn statuses(statuses: impl IntoIterator<Item = u16>) -> Result<Self, String> {
        let mut list = Vec::new();
        for s in statuses {
            match StatusCode::from_u16(s) {
                Ok(code) if (100..600).contains(&s) => list.push(code),
                _ => return Err(format!("invalid status {s}: expected 100 to 599")),
            }
        }
        if list.is_empty() {
            return Err("an empty list of statuses would count nothing".into());
        }
        Ok(Self::Statuses(list))
    }

    /// True when a response with this status is charged.
    pub fn counts(&self, status: StatusCode) -> bool {
        match self {
            Self::All => true,
            Self::Successes => status.is_success() || status.is_redirection(),
            Self::Failures => status.is_client_error() || status.is_server_error(),
            Self::Statuses(list) => list.contains(&status),
        }
    }

    /// True for the default: consume before forwarding, whatever the outcome.
    pub fn is_all(&self) -> bool {
        matches!(self, Self::All)
    }
}

/// Whether a policy's cost is deferred to the charge. Concurrency is about requests in
/// flight, not outcomes, so its lease is taken at the check whatever the rule counts.
fn deferred(policy: &Policy) -> bool {
    !matches!(policy.algorithm, Algorithm::Concurrency { .. })
}

/// The check before forwarding for a rule that counts by outcome: nothing deferred is
/// consumed. A policy with less than `cost` left is then checked with its real cost, which,
/// being a denial, writes nothing and answers the exact wait (and counts towards bans like
/// any denial). Should the state have refilled in between so that this check admits, what it
/// consumed is refunded and the request goes on as admitted.
pub(crate) async fn precheck(
    limiter: &Limiter,
    identity: &Identity,
    policies: &[Arc<Policy>],
    cost: u64,
) -> Checked {
    let items: Vec<(&Identity, &Arc<Policy>, u64)> = policies
        .iter()
        .map(|p| (identity, p, if deferred(p) { 0 } else { cost }))
        .collect();
    let peek = limiter.check_many(&items).await;
    if !peek.allowed {
        return peek;
    }
    let short: Vec<&Arc<Policy>> = peek
        .limits
        .iter()
        .filter(|l| deferred(&l.policy) && !l.policy.shadow)
        .filter(|l| l.decision.as_ref().is_some_and(|d| d.remaining < cost))
        .map(|l| &l.policy)
        .collect();
    if short.is_empty() {
        return peek;
    }
    let items: Vec<(&Identity, &Arc<Policy>, u64)> =
        short.iter().map(|&p| (identity, p, cost)).collect();
    let full = limiter.check_many(&items).await;
    if !full.allowed {
        // Leases the peek took are released by the caller's guard.
        return full;
    }
    for p in short {
        if let Err(e) = limiter.refund(identity, p, cost).await {
            tracing::debug!(error = %e, policy = %p.name, "refund after a racing check failed");
        }
    }
    peek
}

/// What charging after the response came to.
pub(crate) enum Charged {
    /// Every deferred policy was charged; `checked` carries the states afterwards.
    Done(Checked),
    /// The store failed and a policy fails closed: the response must not be delivered.
    FailedClosed(Checked),
    /// The store failed and every failing policy fails open: deliver, uncharged.
    FailedOpen(Checked),
}

/// Charges `cost` to every deferred policy of `checked` (shadow policies included: they
/// count as if enforced). Each charge is bounded by the limiter's store timeout.
pub(crate) async fn charge(
    limiter: &Limiter,
    identity: &Identity,
    mut checked: Checked,
    cost: u64,
) -> Charged {
    let mut failure: Option<(StoreError, bool)> = None;
    for l in checked.limits.iter_mut().filter(|l| deferred(&l.policy)) {
        match limiter.charge(identity, &l.policy, cost).await {
            Ok(d) => l.decision = Some(d),
            Err(e) => {
                let closed = l.policy.failure_mode == FailureMode::Closed && !l.policy.shadow;
                tracing::debug!(error = %e, policy = %l.policy.name, "charge after the response failed");
                let was_closed = failure.as_ref().is_some_and(|f| f.1);
                failure = Some((e, closed || was_closed));
            }
        }
    }
    match failure {
        None => Charged::Done(checked),
        Some((e, true)) => {
            checked.allowed = false;
            checked.verdict = sluice::Verdict::FailedClosed(e);
            Charged::FailedClosed(checked)
        }
        Some((e, false)) => {
            checked.verdict = sluice::Verdict::FailedOpen(e);
            Charged::FailedOpen(checked)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classes_and_lists_match_their_statuses() {
        let s = |n| StatusCode::from_u16(n).unwrap();
        assert!(Count::All.counts(s(500)));
        assert!(Count::Successes.counts(s(204)) && Count::Successes.counts(s(302)));
        assert!(!Count::Successes.counts(s(404)));
        assert!(Count::Failures.counts(s(401)) && Count::Failures.counts(s(503)));
        assert!(!Count::Failures.counts(s(200)));
        let list = Count::statuses([401, 403]).unwrap();
        assert!(list.counts(s(403)) && !list.counts(s(404)));
    }

    #[test]
    fn bad_counts_are_refused() {
        assert!(Count::named("errors").unwrap_err().contains("successes"));
        assert!(Count::statuses([]).is_err());
        assert!(Count::statuses([99]).is_err());
        assert!(Count::statuses([600]).is_err());
        assert_eq!(Count::named("failures"), Ok(Count::Failures));
    }
}
