//! Sliding window log: the exact limit. It remembers every admitted request of the last
//! window (the Redis scripts keep them in a sorted set), so it never admits more than `limit`
//! in any window of `window_ms`, at the price of memory proportional to the limit. Use it for
//! small limits where exactness matters (password resets, OTP sends, payouts).

use std::collections::VecDeque;

use super::{Outcome, Update};
use crate::clock::Timestamp;
use crate::decision::Decision;

/// Stored state: the admitted requests still inside the window, oldest first.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct State {
    /// `(t_ms, cost)` of each admitted request, sorted by time. Requests of the same
    /// millisecond are merged into one entry; that changes no answer, as all of them leave the
    /// window together.
    pub entries: VecDeque<(u64, u64)>,
}

/// Decides one request (see `docs/algorithms.md`, "Sliding window log").
pub fn decide(
    state: Option<&State>,
    limit: u64,
    window_ms: u64,
    now: Timestamp,
    cost: u64,
) -> Outcome<State> {
    let now_ms = now / 1000;
    // Entries still in the window: t > now_ms - W.
    let live: Vec<(u64, u64)> = state
        .map(|s| {
            s.entries
                .iter()
                .copied()
                .filter(|&(t, _)| t + window_ms > now_ms)
                .collect()
        })
        .unwrap_or_default();
    let count: u64 = live.iter().map(|&(_, c)| c).sum();
    let reset = |newest: Option<u64>| newest.map_or(0, |t| (t + window_ms).saturating_sub(now_ms));
    let newest = live.iter().map(|&(t, _)| t).max();
    if cost > limit {
        let decision =
            Decision::cost_exceeds_limit(limit, limit.saturating_sub(count), reset(newest));
        return Outcome {
            decision,
            update: Update::Keep,
        };
    }
    if count + cost > limit {
        // The first entry (oldest first) whose expiry frees enough room.
        let mut left = count;
        let mut retry = 0;
        for &(t, c) in &live {
            left -= c;
            if left + cost <= limit {
                retry = t + window_ms - now_ms;
                break;
            }
        }
        let decision = Decision::limited(limit, limit.saturating_sub(count), retry, reset(newest));
        return Outcome {
            decision,
            update: Update::Keep,
        };
    }
    let after = count + cost;
    if cost == 0 {
        return Outcome {
            decision: Decision::allow(limit, limit - after, reset(newest)),
            update: Update::Keep,
        };
    }
    let mut entries: VecDeque<(u64, u64)> = live.into();
    // Sorted insert: a clock behind the newest entry (another server) keeps the log in order,
    // as a sorted set would.
    let pos = entries.partition_point(|&(t, _)| t <= now_ms);
    match pos.checked_sub(1).map(|i| &mut entries[i]) {
        Some((t, c)) if *t == now_ms => *c += cost,
        _ => entries.insert(pos, (now_ms, cost)),
    }
    let newest = entries.back().map(|&(t, _)| t);
    let reset_after_ms = reset(newest);
    let decision = Decision::allow(limit, limit - after, reset_after_ms);
    let expires_at = (now_ms + reset_after_ms) * 1000;
    Outcome {
        decision,
        update: Update::Put {
            state: State { entries },
            expires_at,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decision::DenyReason;

    const T0: Timestamp = 1_700_000_000_000_000;

    fn run(state: &mut Option<State>, now: Timestamp, cost: u64) -> Decision {
        let o = decide(state.as_ref(), 3, 10_000, now, cost);
        if let Update::Put { state: s, .. } = o.update {
            *state = Some(s);
        }
        o.decision
    }

    #[test]
    fn guide_three_per_ten_seconds_same_instant() {
        let mut s = None;
        for want in [2, 1, 0] {
            let d = run(&mut s, T0, 1);
            assert_eq!(
                (d.allowed, d.remaining, d.reset_after_ms),
                (true, want, 10_000)
            );
        }
        let d = run(&mut s, T0, 1);
        assert_eq!(
            (d.allowed, d.remaining, d.retry_after_ms, d.reset_after_ms),
            (false, 0, 10_000, 10_000)
        );
        assert_eq!(
            s.as_ref().unwrap().entries,
            VecDeque::from([(T0 / 1000, 3)])
        );
    }

    #[test]
    fn spaced_requests_leave_one_by_one() {
        let mut s = None;
        for i in 0..3 {
            assert!(run(&mut s, T0 + i * 1_000_000, 1).allowed);
        }
        let d = run(&mut s, T0 + 3_000_000, 1);
        assert_eq!(
            (d.allowed, d.retry_after_ms, d.reset_after_ms),
            (false, 7000, 9000)
        );
        // Cost 2 must wait for two entries to leave.
        let d = run(&mut s, T0 + 3_000_000, 2);
        assert_eq!((d.allowed, d.retry_after_ms), (false, 8000));
        assert!(!run(&mut s, T0 + 9_999_000, 1).allowed);
        let d = run(&mut s, T0 + 10_000_000, 1);
        assert_eq!(
            (d.allowed, d.remaining, d.reset_after_ms),
            (true, 0, 10_000)
        );
        assert_eq!(run(&mut s, T0 + 10_000_000, 1).retry_after_ms, 1000);
    }

    #[test]
    fn cost_zero_peeks_and_oversized_cost_is_final() {
        let mut s = None;
        assert!(run(&mut s, T0, 1).allowed);
        let o = decide(s.as_ref(), 3, 10_000, T0 + 1_000_000, 0);
        assert_eq!(
            (
                o.decision.allowed,
                o.decision.remaining,
                o.decision.reset_after_ms
            ),
            (true, 2, 9000)
        );
        assert_eq!(o.update, Update::Keep);
        let o = decide(s.as_ref(), 3, 10_000, T0, 4);
        assert_eq!(
            (o.decision.reason, o.decision.retry_after_ms),
            (Some(DenyReason::CostExceedsLimit), 0)
        );
    }
}
