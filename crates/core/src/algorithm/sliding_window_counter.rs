//! Sliding window counter: two fixed-window counters, the current one and the previous one,
//! with the previous weighted by how much of it the sliding window still covers. Two integers
//! per key approximate the exact log (it assumes the previous window's requests were spread
//! evenly); the retry time is the exact moment this estimate first lets the request through.

use super::{Outcome, Update, div_ceil};
use crate::clock::Timestamp;
use crate::decision::Decision;

/// Stored state: the current aligned window and the counts of it and of the one before.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct State {
    /// Start of the current window, ms since the epoch, a multiple of the window length.
    pub window_start: u64,
    /// Admitted cost in the current window.
    pub curr: u64,
    /// Admitted cost in the previous window.
    pub prev: u64,
}

/// Decides one request (see `docs/algorithms.md`, "Sliding window counter").
pub fn decide(
    state: Option<&State>,
    limit: u64,
    window_ms: u64,
    now: Timestamp,
    cost: u64,
) -> Outcome<State> {
    let w = window_ms;
    // As in the fixed window: a clock behind the stored window stands at its start.
    let now_ms = (now / 1000).max(state.map_or(0, |s| s.window_start));
    let start = now_ms / w * w;
    let e = now_ms - start;
    let (curr, prev) = match state {
        Some(s) if s.window_start == start => (s.curr, s.prev),
        Some(s) if s.window_start + w == start => (0, s.curr),
        _ => (0, 0),
    };
    let estimate = |curr: u64| prev * (w - e) / w + curr;
    let reset = |curr: u64| {
        if curr > 0 {
            start + 2 * w - now_ms
        } else if prev > 0 {
            start + w - now_ms
        } else {
            0
        }
    };
    let est = estimate(curr);
    let remaining = |est: u64| limit.saturating_sub(est);
    if cost > limit {
        let decision = Decision::cost_exceeds_limit(limit, remaining(est), reset(curr));
        return Outcome {
            decision,
            update: Update::Keep,
        };
    }
    if est + cost > limit {
        let retry = if curr + cost <= limit {
            // Later in this window, once the previous window's weight has shrunk enough:
            // floor(prev * (w - e') / w) <= a  <=>  w - e' <= x.
            let a = limit - curr - cost;
            let x = div_ceil((a + 1) * w, prev) - 1;
            (w - x) - e
        } else {
            // In the next window, where prev' = curr and curr' = 0.
            let b = limit - cost;
            let x = div_ceil((b + 1) * w, curr) - 1;
            (w - e) + w.saturating_sub(x)
        };
        let decision = Decision::limited(limit, remaining(est), retry, reset(curr));
        return Outcome {
            decision,
            update: Update::Keep,
        };
    }
    let after = curr + cost;
    let decision = Decision::allow(limit, remaining(estimate(after)), reset(after));
    let update = if cost == 0 {
        Update::Keep
    } else {
        Update::Put {
            state: State {
                window_start: start,
                curr: after,
                prev,
            },
            expires_at: (start + 2 * w) * 1000,
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
        let o = decide(state.as_ref(), 4, 10_000, now, cost);
        if let Update::Put { state: s, .. } = o.update {
            *state = Some(s);
        }
        o.decision
    }

    #[test]
    fn four_per_ten_seconds() {
        let mut s = None;
        for want in [3, 2, 1, 0] {
            let d = run(&mut s, T0, 1);
            assert_eq!(
                (d.allowed, d.remaining, d.reset_after_ms),
                (true, want, 20_000)
            );
        }
        // Full: the earliest fit is 1 ms into the next window (floor(4 * 9999 / 10000) = 3).
        let d = run(&mut s, T0, 1);
        assert_eq!(
            (d.allowed, d.retry_after_ms, d.reset_after_ms),
            (false, 10_001, 20_000)
        );
        let d = run(&mut s, T0 + 10_000_000, 1);
        assert_eq!((d.allowed, d.retry_after_ms), (false, 1));
        let d = run(&mut s, T0 + 10_001_000, 1);
        assert_eq!(
            (d.allowed, d.remaining, d.reset_after_ms),
            (true, 0, 19_999)
        );
        // Now prev = 4, curr = 1: it fits once floor(4 * (w - e) / w) <= 2, at e = 2501.
        let d = run(&mut s, T0 + 10_001_000, 1);
        assert_eq!((d.allowed, d.retry_after_ms), (false, 2500));
        assert!(!run(&mut s, T0 + 12_500_000, 1).allowed);
        let d = run(&mut s, T0 + 12_501_000, 1);
        assert_eq!((d.allowed, d.remaining), (true, 0));
        // Two idle windows later it is back to the initial state.
        let d = run(&mut s, T0 + 30_000_000, 1);
        assert_eq!(
            (d.allowed, d.remaining, d.reset_after_ms),
            (true, 3, 20_000)
        );
    }

    /// The documented worst case (`docs/algorithms.md`): 2L within one window of W ms, when L
    /// arrive at the last millisecond of a window and L more near the end of the next.
    #[test]
    fn admits_up_to_twice_the_limit_across_a_boundary() {
        let mut s = None;
        let last_ms_of_window = T0 + 9_999_000;
        for _ in 0..4 {
            assert!(run(&mut s, last_ms_of_window, 1).allowed);
        }
        // 9_999 ms later, still inside one 10 s window: floor(4 * 2 / 10_000) = 0 of the
        // previous window counts, so 4 more are admitted, and no fifth.
        let later = last_ms_of_window + 9_999_000;
        for _ in 0..4 {
            assert!(run(&mut s, later, 1).allowed);
        }
        assert!(!run(&mut s, later, 1).allowed);
    }

    #[test]
    fn cost_zero_peeks_and_oversized_cost_is_final() {
        let o = decide(None, 4, 10_000, T0, 0);
        assert_eq!(
            (o.decision.allowed, o.decision.remaining, o.update),
            (true, 4, Update::Keep)
        );
        let o = decide(None, 4, 10_000, T0, 5);
        assert_eq!(
            (o.decision.reason, o.decision.retry_after_ms),
            (Some(DenyReason::CostExceedsLimit), 0)
        );
    }
}
