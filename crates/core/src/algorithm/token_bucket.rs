//! Token bucket: a bucket of `capacity` tokens refilled at `rate`; a request spends `cost`
//! tokens or is denied without spending. A new key starts full.
//!
//! Tokens are kept in units of `1/P` token where the reduced rate is `R` tokens per `P` ms, so
//! refilling `R` units per millisecond is exact integer arithmetic (see `docs/algorithms.md`).

use super::{Outcome, Update, div_ceil, reduced};
use crate::clock::Timestamp;
use crate::decision::Decision;
use crate::policy::Rate;

/// Stored state: tokens in units (one token = `P` units) and the time of the last refill.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct State {
    /// Tokens left, in units.
    pub tokens: u64,
    /// When `tokens` was computed, in ms since the epoch.
    pub last_ms: u64,
}

/// When a state is back at rest: the time its bucket is full again.
#[inline]
pub fn rest_time(state: &State, capacity: u64, rate: Rate) -> Timestamp {
    let r = reduced(rate);
    let full = capacity.saturating_mul(r.per_ms);
    let wait_ms = full.saturating_sub(state.tokens).div_ceil(r.amount.max(1));
    state.last_ms.saturating_add(wait_ms).saturating_mul(1000)
}

/// Whole tokens in `units`, without the division when there is less than one (every
/// denial of cost 1).
#[inline]
fn whole_tokens(units: u64, p: u64) -> u64 {
    if units < p { 0 } else { units / p }
}

/// Decides one request.
///
/// Integer arithmetic throughout (tokens in units of `1/P`); the refill test
/// `elapsed * R >= missing` is the same as `elapsed >= ceil(missing / R)` without its
/// division, and a denial of cost 1 divides only by a reduced rate of more than one unit.
#[inline]
pub fn decide(
    state: Option<&State>,
    capacity: u64,
    rate: Rate,
    now: Timestamp,
    cost: u64,
) -> Outcome<State> {
    let Rate {
        amount: r,
        per_ms: p,
    } = reduced(rate);
    let full = capacity * p;
    let now_ms = now / 1000;
    let tokens = match state {
        None => full,
        Some(s) => {
            let elapsed = now_ms.saturating_sub(s.last_ms);
            let missing = full.saturating_sub(s.tokens);
            // An overflowing product is more than any `missing`.
            if elapsed
                .checked_mul(r)
                .is_none_or(|refilled| refilled >= missing)
            {
                full
            } else {
                s.tokens + elapsed * r
            }
        }
    };
    if cost > capacity {
        let decision = Decision::cost_exceeds_limit(
            capacity,
            whole_tokens(tokens, p),
            div_ceil(full - tokens, r),
        );
        return Outcome {
            decision,
            update: Update::Keep,
        };
    }
    let need = cost * p; // cannot overflow: cost <= capacity and capacity * P was validated
    if tokens < need {
        let decision = Decision::limited(
            capacity,
            whole_tokens(tokens, p),
            div_ceil(need - tokens, r),
            div_ceil(full - tokens, r),
        );
        return Outcome {
            decision,
            update: Update::Keep,
        };
    }
    let left = tokens - need;
    let reset_after_ms = div_ceil(full - left, r);
    let decision = Decision::allow(capacity, left / p, reset_after_ms);
    let update = if cost == 0 {
        Update::Keep
    } else {
        Update::Put {
            state: State {
                tokens: left,
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

    fn run(state: &mut Option<State>, now: Timestamp, cost: u64) -> Decision {
        let o = decide(state.as_ref(), 5, Rate::per_second(1), now, cost);
        match o.update {
            Update::Put { state: s, .. } => *state = Some(s),
            Update::Delete => *state = None,
            Update::Keep => {}
        }
        o.decision
    }

    #[test]
    fn guide_sequence_capacity_5_rate_1_per_s() {
        let mut s = None;
        let t0 = 1_700_000_000_000_000;
        for (i, want) in [4, 3, 2, 1, 0].into_iter().enumerate() {
            let d = run(&mut s, t0, 1);
            assert!(d.allowed, "call {i}");
            assert_eq!(d.remaining, want);
            assert_eq!(d.retry_after_ms, 0);
        }
        let d = run(&mut s, t0, 1);
        assert!(!d.allowed);
        assert_eq!(
            (d.remaining, d.retry_after_ms, d.reset_after_ms),
            (0, 1000, 5000)
        );
        // 400 ms later: 0.4 tokens back, 600 ms to wait.
        let d = run(&mut s, t0 + 400_000, 1);
        assert_eq!((d.allowed, d.retry_after_ms), (false, 600));
        let d = run(&mut s, t0 + 1_000_000, 1);
        assert!(d.allowed);
    }
}
