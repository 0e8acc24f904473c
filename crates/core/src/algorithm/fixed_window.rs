//! Fixed window: a counter per window of `window_ms`, windows aligned to the Unix epoch (so
//! every server and the Lua scripts agree on where a window starts), or per calendar day, week
//! or month in UTC ([`super::calendar`]). The cheapest algorithm; it
//! admits up to twice the limit across a window boundary.

use super::calendar::CalendarPeriod;
use super::{Outcome, Update};
use crate::clock::Timestamp;
use crate::decision::Decision;

/// Stored state: the window the count belongs to and the admitted cost in it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct State {
    /// Start of the window, ms since the epoch, a multiple of the window length.
    pub window_start: u64,
    /// Admitted cost in that window.
    pub count: u64,
}

/// Decides one request (see `docs/algorithms.md`, "Fixed window").
pub fn decide(
    state: Option<&State>,
    limit: u64,
    window_ms: u64,
    now: Timestamp,
    cost: u64,
) -> Outcome<State> {
    decide_in(state, limit, |t| epoch_bounds(window_ms, t), now, cost)
}

/// Decides one request in a calendar window (see [`super::calendar`]).
pub fn decide_calendar(
    state: Option<&State>,
    limit: u64,
    period: CalendarPeriod,
    now: Timestamp,
    cost: u64,
) -> Outcome<State> {
    decide_in(state, limit, |t| period.bounds(t), now, cost)
}

/// `[start, end)` of the epoch-aligned window of `window_ms` holding `now_ms`.
pub fn epoch_bounds(window_ms: u64, now_ms: u64) -> (u64, u64) {
    let start = now_ms / window_ms * window_ms;
    (start, start + window_ms)
}

/// The clock as the window sees it: a clock behind the stored window is treated as standing
/// at its start, so a step back across a boundary cannot open a fresh window (nothing is
/// refunded).
pub(crate) fn window_now(state: Option<&State>, now: Timestamp) -> u64 {
    (now / 1000).max(state.map_or(0, |s| s.window_start))
}

/// Decides one request in the window `bounds(now_ms)` gives.
fn decide_in(
    state: Option<&State>,
    limit: u64,
    bounds: impl Fn(u64) -> (u64, u64),
    now: Timestamp,
    cost: u64,
) -> Outcome<State> {
    let now_ms = window_now(state, now);
    let (start, end) = bounds(now_ms);
    let count = match state {
        Some(s) if s.window_start == start => s.count,
        _ => 0,
    };
    let until_end = end - now_ms;
    let reset = |count: u64| if count > 0 { until_end } else { 0 };
    if cost > limit {
        let decision =
            Decision::cost_exceeds_limit(limit, limit.saturating_sub(count), reset(count));
        return Outcome {
            decision,
            update: Update::Keep,
        };
    }
    if count + cost > limit {
        let decision =
            Decision::limited(limit, limit.saturating_sub(count), until_end, reset(count));
        return Outcome {
            decision,
            update: Update::Keep,
        };
    }
    let after = count + cost;
    let decision = Decision::allow(limit, limit - after, reset(after));
    let update = if cost == 0 {
        Update::Keep
    } else {
        Update::Put {
            state: State {
                window_start: start,
                count: after,
            },
            expires_at: end * 1000,
        }
    };
    Outcome { decision, update }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decision::DenyReason;

    const T0: Timestamp = 1_700_000_000_000_000; // a multiple of 10 s

    fn run(state: &mut Option<State>, now: Timestamp, cost: u64) -> Decision {
        let o = decide(state.as_ref(), 3, 10_000, now, cost);
        if let Update::Put { state: s, .. } = o.update {
            *state = Some(s);
        }
        o.decision
    }

    #[test]
    fn three_per_ten_seconds() {
        let mut s = None;
        for want in [2, 1, 0] {
            let d = run(&mut s, T0 + 1_000_000, 1);
            assert_eq!(
                (d.allowed, d.remaining, d.reset_after_ms),
                (true, want, 9000)
            );
        }
        let d = run(&mut s, T0 + 4_000_000, 1);
        assert_eq!(
            (d.allowed, d.remaining, d.retry_after_ms, d.reset_after_ms),
            (false, 0, 6000, 6000)
        );
        let d = run(&mut s, T0 + 10_000_000, 2);
        assert_eq!(
            (d.allowed, d.remaining, d.reset_after_ms),
            (true, 1, 10_000)
        );
    }

    #[test]
    fn clock_stepping_back_across_a_boundary_refunds_nothing() {
        let mut s = None;
        for _ in 0..3 {
            assert!(run(&mut s, T0 + 10_000_000, 1).allowed);
        }
        let d = run(&mut s, T0 + 9_999_000, 1);
        assert_eq!((d.allowed, d.retry_after_ms), (false, 10_000));
    }

    #[test]
    fn cost_zero_peeks_and_oversized_cost_is_final() {
        let o = decide(None, 3, 10_000, T0, 0);
        assert_eq!(
            (
                o.decision.allowed,
                o.decision.remaining,
                o.decision.reset_after_ms
            ),
            (true, 3, 0)
        );
        assert_eq!(o.update, Update::Keep);
        let o = decide(None, 3, 10_000, T0, 4);
        assert_eq!(
            (o.decision.reason, o.decision.retry_after_ms),
            (Some(DenyReason::CostExceedsLimit), 0)
        );
    }
}
