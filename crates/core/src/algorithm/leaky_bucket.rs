//! Leaky bucket: every admitted request pours `cost` into a bucket of `capacity` that drains at
//! `rate`; a request that would overflow it is denied. A new key starts empty.
//!
//! Two modes, as nginx `limit_req`: *policing* admits at once while there is room (`nodelay`);
//! *shaping* admits the same requests but tells the caller to hold each one for `delay_ms`, the
//! time the water already in the bucket needs to drain, so requests leave at the bucket's rate.
//! The level is kept in units (one request = `P` units, draining `R` units per ms) like the
//! token bucket, so draining is exact integer arithmetic.

use super::{Outcome, Update, div_ceil};
use crate::clock::Timestamp;
use crate::decision::Decision;
use crate::policy::{LeakyMode, Rate};

/// Stored state: the water level in units and when it was computed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct State {
    /// Water in the bucket, in units (one request of cost 1 = `P` units).
    pub level: u64,
    /// When `level` was computed, in ms since the epoch.
    pub last_ms: u64,
}

/// Decides one request (see `docs/algorithms.md`, "Leaky bucket").
pub fn decide(
    state: Option<&State>,
    capacity: u64,
    rate: Rate,
    mode: LeakyMode,
    now: Timestamp,
    cost: u64,
) -> Outcome<State> {
    let Rate {
        amount: r,
        per_ms: p,
    } = super::reduced(rate);
    let full = capacity * p;
    let now_ms = now / 1000;
    let level = match state {
        None => 0,
        Some(s) => {
            let elapsed = now_ms.saturating_sub(s.last_ms);
            if elapsed >= div_ceil(s.level, r) {
                0
            } else {
                s.level - elapsed * r
            }
        }
    };
    // A charge (`super::adjust`) can leave the level above capacity: nothing is left then.
    let remaining = |level: u64| full.saturating_sub(level) / p;
    if cost > capacity {
        let decision = Decision::cost_exceeds_limit(capacity, remaining(level), div_ceil(level, r));
        return Outcome {
            decision,
            update: Update::Keep,
        };
    }
    let need = cost * p;
    if level + need > full {
        let retry = div_ceil(level + need - full, r);
        let decision = Decision::limited(capacity, remaining(level), retry, div_ceil(level, r));
        return Outcome {
            decision,
            update: Update::Keep,
        };
    }
    let after = level + need;
    let reset_after_ms = div_ceil(after, r);
    let mut decision = Decision::allow(capacity, remaining(after), reset_after_ms);
    if mode == LeakyMode::Shaping {
        decision.delay_ms = div_ceil(level, r);
    }
    let update = if cost == 0 {
        Update::Keep
    } else {
        Update::Put {
            state: State {
                level: after,
                last_ms: now_ms,
            },
            expires_at: (now_ms + reset_after_ms) * 1000,
        }
    };
    Outcome { decision, update }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decision::DenyReason;

    const T0: Timestamp = 1_700_000_000_000_000;

    fn run(
        state: &mut Option<State>,
        mode: LeakyMode,
        rate: Rate,
        now: Timestamp,
        cost: u64,
    ) -> Decision {
        let o = decide(state.as_ref(), 3, rate, mode, now, cost);
        if let Update::Put { state: s, .. } = o.update {
            *state = Some(s);
        }
        o.decision
    }

    #[test]
    fn shaping_delays_by_the_drain_interval() {
        // 2 per second: P/R = 500 ms.
        let (rate, mut s) = (Rate::per_second(2), None);
        for (k, want_remaining) in [2, 1, 0].into_iter().enumerate() {
            let d = run(&mut s, LeakyMode::Shaping, rate, T0, 1);
            assert!(d.allowed);
            assert_eq!(
                (d.delay_ms, d.remaining, d.reset_after_ms),
                (500 * k as u64, want_remaining, 500 * (k as u64 + 1))
            );
        }
        let d = run(&mut s, LeakyMode::Shaping, rate, T0, 1);
        assert_eq!(
            (d.allowed, d.retry_after_ms, d.reset_after_ms, d.delay_ms),
            (false, 500, 1500, 0)
        );
        // 500 ms later one request has drained; the next waits behind the other two.
        let d = run(&mut s, LeakyMode::Shaping, rate, T0 + 500_000, 1);
        assert_eq!((d.allowed, d.delay_ms, d.remaining), (true, 1000, 0));
    }

    #[test]
    fn policing_admits_without_delay() {
        let (rate, mut s) = (Rate::per_second(1), None);
        for want in [2, 1, 0] {
            let d = run(&mut s, LeakyMode::Policing, rate, T0, 1);
            assert_eq!((d.allowed, d.delay_ms, d.remaining), (true, 0, want));
        }
        let d = run(&mut s, LeakyMode::Policing, rate, T0 + 250_000, 1);
        assert_eq!(
            (d.allowed, d.retry_after_ms, d.reset_after_ms),
            (false, 750, 2750)
        );
        assert!(run(&mut s, LeakyMode::Policing, rate, T0 + 1_000_000, 1).allowed);
    }

    #[test]
    fn cost_zero_peeks_and_oversized_cost_is_final() {
        let rate = Rate::per_second(1);
        let o = decide(None, 3, rate, LeakyMode::Policing, T0, 0);
        assert_eq!(
            (o.decision.allowed, o.decision.remaining, o.update),
            (true, 3, Update::Keep)
        );
        let o = decide(None, 3, rate, LeakyMode::Policing, T0, 4);
        assert_eq!(
            (o.decision.reason, o.decision.retry_after_ms),
            (Some(DenyReason::CostExceedsLimit), 0)
        );
        let o = decide(None, 3, rate, LeakyMode::Policing, T0, u64::MAX);
        assert_eq!(o.decision.reason, Some(DenyReason::CostExceedsLimit));
    }
}
