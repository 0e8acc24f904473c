//! Concurrency limit: at most `limit` units in flight per key. An admitted check takes a lease
//! that the caller hands back with [`release`] when the work is done; every lease also expires
//! after `lease_ms`, so a holder that crashed cannot leak capacity for longer than that.

use super::{Outcome, Update};
use crate::clock::Timestamp;
use crate::decision::{Decision, LeaseId};

/// One held lease.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lease {
    /// The id handed to the holder.
    pub id: LeaseId,
    /// Units it holds.
    pub cost: u64,
    /// When it lapses on its own, ms since the epoch.
    pub expires_ms: u64,
}

/// Stored state: the leases held.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct State {
    /// Held leases, in the order they were taken.
    pub leases: Vec<Lease>,
}

fn live(state: Option<&State>, now_ms: u64) -> Vec<Lease> {
    state.map_or_else(Vec::new, |s| {
        s.leases
            .iter()
            .filter(|l| l.expires_ms > now_ms)
            .cloned()
            .collect()
    })
}

fn reset_after(leases: &[Lease], now_ms: u64) -> u64 {
    leases
        .iter()
        .map(|l| l.expires_ms - now_ms)
        .max()
        .unwrap_or(0)
}

/// Decides one request (see `docs/algorithms.md`, "Concurrency"). `lease` is the id the lease
/// gets if this check admits with a cost above 0; stores generate a random one. Without one,
/// the id `t<now µs>-<n>` is used.
pub fn decide(
    state: Option<&State>,
    limit: u64,
    lease_ms: u64,
    now: Timestamp,
    cost: u64,
    lease: Option<&LeaseId>,
) -> Outcome<State> {
    let now_ms = now / 1000;
    let mut leases = live(state, now_ms);
    let in_flight: u64 = leases.iter().map(|l| l.cost).sum();
    let reset = reset_after(&leases, now_ms);
    if cost > limit {
        let decision = Decision::cost_exceeds_limit(limit, limit.saturating_sub(in_flight), reset);
        return Outcome {
            decision,
            update: Update::Keep,
        };
    }
    if in_flight + cost > limit {
        // The first expiry (soonest first) after which enough is free. An upper bound: a
        // release may free capacity sooner.
        let mut by_expiry: Vec<(u64, u64)> =
            leases.iter().map(|l| (l.expires_ms, l.cost)).collect();
        by_expiry.sort_unstable();
        let mut held = in_flight;
        let mut retry = 0;
        for (expires_ms, c) in by_expiry {
            held -= c;
            if held + cost <= limit {
                retry = expires_ms - now_ms;
                break;
            }
        }
        let decision = Decision::limited(limit, limit.saturating_sub(in_flight), retry, reset);
        return Outcome {
            decision,
            update: Update::Keep,
        };
    }
    if cost == 0 {
        return Outcome {
            decision: Decision::allow(limit, limit - in_flight, reset),
            update: Update::Keep,
        };
    }
    let id = lease
        .cloned()
        .unwrap_or_else(|| LeaseId(format!("t{now}-{}", leases.len())));
    leases.push(Lease {
        id: id.clone(),
        cost,
        expires_ms: now_ms + lease_ms,
    });
    let reset = reset_after(&leases, now_ms);
    let mut decision = Decision::allow(limit, limit - in_flight - cost, reset);
    decision.lease = Some(id);
    Outcome {
        decision,
        update: Update::Put {
            state: State { leases },
            expires_at: (now_ms + reset) * 1000,
        },
    }
}

/// Releases a lease: `(whether it was held, the state change)`. Expired leases are not held.
pub fn release(state: &State, now: Timestamp, lease: &LeaseId) -> (bool, Update<State>) {
    let now_ms = now / 1000;
    let mut leases = live(Some(state), now_ms);
    let Some(pos) = leases.iter().position(|l| &l.id == lease) else {
        return (false, Update::Keep);
    };
    leases.remove(pos);
    if leases.is_empty() {
        return (true, Update::Delete);
    }
    let expires_at = (now_ms + reset_after(&leases, now_ms)) * 1000;
    (
        true,
        Update::Put {
            state: State { leases },
            expires_at,
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decision::DenyReason;

    const T0: Timestamp = 1_700_000_000_000_000;

    fn acquire(state: &mut Option<State>, now: Timestamp, cost: u64, id: &str) -> Decision {
        let o = decide(
            state.as_ref(),
            3,
            30_000,
            now,
            cost,
            Some(&LeaseId(id.into())),
        );
        if let Update::Put { state: s, .. } = o.update {
            *state = Some(s);
        }
        o.decision
    }

    #[test]
    fn acquire_release_and_expiry() {
        let mut s = None;
        let d = acquire(&mut s, T0, 1, "a");
        assert_eq!(
            (d.allowed, d.remaining, d.reset_after_ms),
            (true, 2, 30_000)
        );
        assert_eq!(d.lease, Some(LeaseId("a".into())));
        assert!(acquire(&mut s, T0 + 10_000_000, 2, "b").allowed);
        let d = acquire(&mut s, T0 + 10_000_000, 1, "c");
        // "a" lapses first (20 s) and frees enough.
        assert_eq!(
            (d.allowed, d.retry_after_ms, d.reset_after_ms, d.lease),
            (false, 20_000, 30_000, None)
        );
        // Cost 2 needs "b" gone too.
        assert_eq!(
            acquire(&mut s, T0 + 10_000_000, 2, "c").retry_after_ms,
            30_000
        );

        let (held, update) = release(s.as_ref().unwrap(), T0 + 11_000_000, &LeaseId("b".into()));
        assert!(held);
        let Update::Put { state, expires_at } = update else {
            panic!("expected a put")
        };
        assert_eq!(expires_at, T0 + 30_000_000);
        s = Some(state);
        assert!(!release(s.as_ref().unwrap(), T0 + 11_000_000, &LeaseId("b".into())).0);
        assert_eq!(acquire(&mut s, T0 + 11_000_000, 2, "c").remaining, 0);

        // "a" lapses at 30 s: releasing it then finds nothing.
        assert!(!release(s.as_ref().unwrap(), T0 + 30_000_000, &LeaseId("a".into())).0);
        let (held, update) = release(s.as_ref().unwrap(), T0 + 30_000_000, &LeaseId("c".into()));
        assert_eq!((held, update), (true, Update::Delete));
    }

    #[test]
    fn cost_zero_peeks_and_oversized_cost_is_final() {
        let o = decide(None, 3, 1000, T0, 0, Some(&LeaseId("x".into())));
        assert_eq!(
            (
                o.decision.allowed,
                o.decision.remaining,
                o.decision.lease.clone()
            ),
            (true, 3, None)
        );
        assert_eq!(o.update, Update::Keep);
        let o = decide(None, 3, 1000, T0, 4, None);
        assert_eq!(
            (o.decision.reason, o.decision.retry_after_ms),
            (Some(DenyReason::CostExceedsLimit), 0)
        );
    }
}
