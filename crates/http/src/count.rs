//! [`Count`]: which responses a rule's cost is charged for, and the reserve-then-settle
//! steps the layer runs for a rule that does not count every request.
//!
//! A login route that should stop after a few wrong passwords must not count the right
//! ones, and an API that limits errors must not count its successes; neither outcome is
//! known until the upstream answers. So for such a rule the layer *reserves* the cost at the
//! check, exactly as a rule counting every request consumes it (so requests in flight at the
//! same time hold their units, and no more of them than the limit can pass together), and
//! *settles* once the response status is known: a counted status keeps the reservation, any
//! other status refunds it ([`Limiter::refund`]).
//!
//! A request whose outcome never becomes known stays counted: the client went away (the
//! response future is dropped before the status arrives), the inner service failed, or the
//! answer is not the upstream's own but a stand-in such as the proxy's 502 (upstream
//! unreachable) or 504 (upstream timeout), which carries [`UpstreamFailed`] in its
//! extensions. Otherwise a client could start requests, abandon them before the answer and
//! have the upstream act on every one uncounted. A refund the store fails leaves the
//! reservation in place (the request stays counted, the response is delivered).
//!
//! Concurrency policies are not affected: they hold their lease from the check on, as always.

use http::StatusCode;
use sluice::{Checked, Identity, Limiter, Policy};

/// Which responses a rule charges its cost for.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum Count {
    /// Every request, consumed at the check (the default).
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

/// Marks a response that is not the upstream's answer but a stand-in for a failure (the
/// proxy's 502 when the upstream cannot be reached, 504 when it does not answer in time).
/// Inserted into the response's extensions, it settles a reservation as counted whatever the
/// status: the upstream may have acted on the request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UpstreamFailed;

/// Whether a policy's reservation is settled by outcome. Concurrency is about requests in
/// flight, not outcomes, so its lease is released when the request ends whatever it counts.
fn settled_by_outcome(policy: &Policy) -> bool {
    !policy.algorithm.holds_leases()
}

/// What settling an uncounted response came to.
pub(crate) enum Settled {
    /// Every reservation was given back; `checked` carries the states afterwards.
    Refunded(Checked),
    /// The store failed a refund: that reservation stays (the request counted).
    RefundFailed(Checked),
}

/// Gives back the `cost` that the check reserved on every policy settled by outcome (shadow
/// policies included: they count as if enforced). A policy the store did not answer for, or
/// that denied (a shadow denial lets the request through), reserved nothing and is skipped. Each refund is bounded by the limiter's store timeout.
pub(crate) async fn refund(
    limiter: &Limiter,
    identity: &Identity,
    mut checked: Checked,
    cost: u64,
) -> Settled {
    let mut failed = false;
    for l in checked
        .limits
        .iter_mut()
        .filter(|l| settled_by_outcome(&l.policy) && l.decision.as_ref().is_some_and(|d| d.allowed))
    {
        match limiter.refund(identity, &l.policy, cost).await {
            Ok(d) => l.decision = Some(d),
            Err(e) => {
                tracing::debug!(error = %e, policy = %l.policy.name, "refund of an uncounted response failed; it stays counted");
                failed = true;
            }
        }
    }
    if failed {
        Settled::RefundFailed(checked)
    } else {
        Settled::Refunded(checked)
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
