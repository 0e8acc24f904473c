//! Charges and refunds: changing an identity's state by a cost outside of a check.
//!
//! A check admits or denies; the settle pattern (check an estimated cost, then charge or refund
//! the difference once the real cost is known, e.g. LLM tokens) and count-by-outcome rules need
//! to move the state without asking first. [`adjust`] does that for every algorithm, as a pure
//! function like [`super::decide`], so the embedded store and the Lua scripts share one
//! definition (`docs/admin.md`, "State, charge and refund"):
//!
//! - **charge** consumes `cost` unconditionally. The state goes into debt as far as it can
//!   express: a window's count, a log's entries, a leaky bucket's level and a GCRA TAT grow past
//!   the limit (so the debt delays later admissions); a token bucket cannot hold fewer than zero
//!   tokens, so its debt beyond empty is dropped. Stored values stay below [`MAX_EXACT`].
//! - **refund** gives `cost` back, never beyond the policy's capacity: buckets and GCRA move
//!   toward full, window counters decrement the current window's count (never below zero), and
//!   the sliding log removes its newest entries. A state back at rest is deleted.
//! - A concurrency limit is neither charged nor refunded: a lease is taken by a check and given
//!   back by a release.
//!
//! The answer is the state afterwards, as a check of cost 0 sees it.

use super::{
    Outcome, State, Update, decide, div_ceil, fixed_window, gcra, leaky_bucket,
    sliding_window_counter, sliding_window_log, token_bucket,
};
use crate::clock::Timestamp;
use crate::policy::{Algorithm, MAX_EXACT};

/// What to do to the state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Adjustment {
    /// Consume `cost` without an admission check.
    Charge(u64),
    /// Give `cost` back, bounded by the policy's capacity.
    Refund(u64),
}

impl Adjustment {
    /// The cost moved.
    pub fn cost(self) -> u64 {
        match self {
            Adjustment::Charge(c) | Adjustment::Refund(c) => c,
        }
    }
    /// `charge` or `refund`.
    pub fn name(self) -> &'static str {
        match self {
            Adjustment::Charge(_) => "charge",
            Adjustment::Refund(_) => "refund",
        }
    }
}

/// Why a state cannot be adjusted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AdjustError {
    /// Concurrency limits hold leases: take one with a check, give it back with a release.
    #[error(
        "a concurrency limit cannot be charged or refunded: a check takes a lease and a release gives it back"
    )]
    Concurrency,
    /// The cost is beyond what every store represents exactly.
    #[error("cost {0} is too large (at most 2^53)")]
    CostTooLarge(u64),
}

/// Charges or refunds `algorithm`'s state at `now`. The decision is the state afterwards seen
/// by a check of cost 0; the update is what to store.
pub fn adjust(
    algorithm: &Algorithm,
    state: Option<&State>,
    now: Timestamp,
    adjustment: Adjustment,
) -> Result<Outcome<State>, AdjustError> {
    let cost = adjustment.cost();
    if cost > MAX_EXACT {
        return Err(AdjustError::CostTooLarge(cost));
    }
    let charge = matches!(adjustment, Adjustment::Charge(_));
    let update = match *algorithm {
        Algorithm::Concurrency { .. } => return Err(AdjustError::Concurrency),
        Algorithm::TokenBucket { capacity, rate } => {
            let s = match state {
                Some(State::TokenBucket(s)) => Some(s),
                _ => None,
            };
            let r = rate.reduced();
            let full = capacity * r.per_ms;
            let now_ms = now / 1000;
            let tokens = token_bucket_level(s, full, r.amount, now_ms);
            let moved = cost.saturating_mul(r.per_ms);
            let left = if charge {
                tokens.saturating_sub(moved)
            } else {
                tokens.saturating_add(moved).min(full)
            };
            if left == full {
                Update::Delete
            } else {
                Update::Put {
                    state: State::TokenBucket(token_bucket::State {
                        tokens: left,
                        last_ms: now_ms,
                    }),
                    expires_at: (now_ms + div_ceil(full - left, r.amount)) * 1000,
                }
            }
        }
        Algorithm::Gcra { rate, .. } => {
            let tat = match state {
                Some(State::Gcra(s)) => s.tat.max(now),
                _ => now,
            };
            let moved = gcra::emission_interval_us(rate).saturating_mul(cost);
            let tat = if charge {
                tat.saturating_add(moved).min(MAX_EXACT)
            } else {
                tat.saturating_sub(moved).max(now)
            };
            if tat <= now {
                Update::Delete
            } else {
                Update::Put {
                    state: State::Gcra(gcra::State { tat }),
                    expires_at: tat,
                }
            }
        }
        Algorithm::LeakyBucket { rate, .. } => {
            let s = match state {
                Some(State::LeakyBucket(s)) => Some(s),
                _ => None,
            };
            let r = rate.reduced();
            let now_ms = now / 1000;
            let level = s.map_or(0, |s| {
                let elapsed = now_ms.saturating_sub(s.last_ms);
                if elapsed >= div_ceil(s.level, r.amount) {
                    0
                } else {
                    s.level - elapsed * r.amount
                }
            });
            let moved = cost.saturating_mul(r.per_ms);
            let level = if charge {
                level.saturating_add(moved).min(MAX_EXACT)
            } else {
                level.saturating_sub(moved)
            };
            if level == 0 {
                Update::Delete
            } else {
                Update::Put {
                    state: State::LeakyBucket(leaky_bucket::State {
                        level,
                        last_ms: now_ms,
                    }),
                    expires_at: (now_ms + div_ceil(level, r.amount)) * 1000,
                }
            }
        }
        Algorithm::FixedWindow { window_ms, .. } => moved_window(state, now, cost, charge, |t| {
            fixed_window::epoch_bounds(window_ms, t)
        }),
        Algorithm::CalendarWindow { period, .. } => {
            moved_window(state, now, cost, charge, |t| period.bounds(t))
        }
        Algorithm::SlidingWindowCounter { window_ms: w, .. } => {
            let s = match state {
                Some(State::SlidingWindowCounter(s)) => Some(s),
                _ => None,
            };
            let now_ms = (now / 1000).max(s.map_or(0, |s| s.window_start));
            let start = now_ms / w * w;
            let (curr, prev) = match s {
                Some(s) if s.window_start == start => (s.curr, s.prev),
                Some(s) if s.window_start + w == start => (0, s.curr),
                _ => (0, 0),
            };
            let curr = moved_count(curr, cost, charge);
            if curr == 0 && prev == 0 {
                Update::Delete
            } else {
                Update::Put {
                    state: State::SlidingWindowCounter(sliding_window_counter::State {
                        window_start: start,
                        curr,
                        prev,
                    }),
                    expires_at: (start + 2 * w) * 1000,
                }
            }
        }
        Algorithm::SlidingWindowLog { window_ms, .. } => {
            let now_ms = now / 1000;
            let mut entries: Vec<(u64, u64)> = match state {
                Some(State::SlidingWindowLog(s)) => s
                    .entries
                    .iter()
                    .copied()
                    .filter(|&(t, _)| t + window_ms > now_ms)
                    .collect(),
                _ => Vec::new(),
            };
            if charge {
                if cost > 0 {
                    let pos = entries.partition_point(|&(t, _)| t <= now_ms);
                    match pos.checked_sub(1).map(|i| &mut entries[i]) {
                        Some((t, c)) if *t == now_ms => *c = (*c + cost).min(MAX_EXACT),
                        _ => entries.insert(pos, (now_ms, cost)),
                    }
                }
            } else {
                let mut left = cost;
                while left > 0 {
                    let Some(last) = entries.last_mut() else {
                        break;
                    };
                    if last.1 > left {
                        last.1 -= left;
                        left = 0;
                    } else {
                        left -= last.1;
                        entries.pop();
                    }
                }
            }
            match entries.last() {
                None => Update::Delete,
                Some(&(newest, _)) => Update::Put {
                    expires_at: (newest + window_ms) * 1000,
                    state: State::SlidingWindowLog(sliding_window_log::State {
                        entries: entries.into(),
                    }),
                },
            }
        }
    };
    let after = match &update {
        Update::Put { state, .. } => Some(state),
        _ => None,
    };
    let decision = decide(algorithm, after, now, 0, None).decision;
    Ok(Outcome { decision, update })
}

/// A token bucket's tokens (units) at `now_ms`, refilled as [`token_bucket::decide`] does.
fn token_bucket_level(s: Option<&token_bucket::State>, full: u64, r: u64, now_ms: u64) -> u64 {
    match s {
        None => full,
        Some(s) => {
            let elapsed = now_ms.saturating_sub(s.last_ms);
            let missing = full.saturating_sub(s.tokens);
            if elapsed >= div_ceil(missing, r) {
                full
            } else {
                s.tokens + elapsed * r
            }
        }
    }
}

/// A fixed (or calendar) window's update: the count of the window `bounds(now_ms)` moved.
fn moved_window(
    state: Option<&State>,
    now: Timestamp,
    cost: u64,
    charge: bool,
    bounds: impl Fn(u64) -> (u64, u64),
) -> Update<State> {
    let s = match state {
        Some(State::FixedWindow(s)) => Some(s),
        _ => None,
    };
    let (start, end) = bounds(fixed_window::window_now(s, now));
    let count = s.filter(|s| s.window_start == start).map_or(0, |s| s.count);
    match moved_count(count, cost, charge) {
        0 => Update::Delete,
        count => Update::Put {
            state: State::FixedWindow(fixed_window::State {
                window_start: start,
                count,
            }),
            expires_at: end * 1000,
        },
    }
}

/// A window count after a charge (capped below 2^53) or a refund (never below zero).
fn moved_count(count: u64, cost: u64, charge: bool) -> u64 {
    if charge {
        count.saturating_add(cost).min(MAX_EXACT)
    } else {
        count.saturating_sub(cost)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::{LeakyMode, Rate};

    const T0: Timestamp = 1_700_000_000_000_000; // a multiple of 10 s

    /// Applies `adj` to `state` and returns the decision (remaining, reset_after_ms, allowed).
    fn apply(
        alg: &Algorithm,
        state: &mut Option<State>,
        now: Timestamp,
        adj: Adjustment,
    ) -> (u64, u64, bool) {
        let o = adjust(alg, state.as_ref(), now, adj).unwrap();
        match o.update {
            Update::Put { state: s, .. } => *state = Some(s),
            Update::Delete => *state = None,
            Update::Keep => {}
        }
        (
            o.decision.remaining,
            o.decision.reset_after_ms,
            o.decision.allowed,
        )
    }

    fn check(alg: &Algorithm, state: &mut Option<State>, now: Timestamp, cost: u64) -> bool {
        let o = decide(alg, state.as_ref(), now, cost, None);
        if let Update::Put { state: s, .. } = o.update {
            *state = Some(s);
        }
        o.decision.allowed
    }

    #[test]
    fn token_bucket_charge_clamps_at_empty_and_refund_at_full() {
        let alg = Algorithm::TokenBucket {
            capacity: 10,
            rate: Rate::per_second(1),
        };
        let mut s = None;
        assert_eq!(
            apply(&alg, &mut s, T0, Adjustment::Charge(4)),
            (6, 4000, true)
        );
        // 15 more than the 6 left: empty, not negative.
        assert_eq!(
            apply(&alg, &mut s, T0, Adjustment::Charge(15)),
            (0, 10_000, true)
        );
        assert!(!check(&alg, &mut s, T0, 1));
        assert_eq!(
            apply(&alg, &mut s, T0, Adjustment::Refund(3)),
            (3, 7000, true)
        );
        // A refund never fills beyond capacity; a full bucket is deleted.
        assert_eq!(
            apply(&alg, &mut s, T0, Adjustment::Refund(100)),
            (10, 0, true)
        );
        assert_eq!(s, None);
    }

    #[test]
    fn gcra_charge_goes_into_debt_and_refund_pays_it_back() {
        // 1 per second, burst 4: limit 5.
        let alg = Algorithm::Gcra {
            rate: Rate::per_second(1),
            burst: 4,
        };
        let mut s = None;
        assert_eq!(
            apply(&alg, &mut s, T0, Adjustment::Charge(2)),
            (3, 2000, true)
        );
        // 8 seconds of debt: 3 beyond the tolerance of 5.
        assert_eq!(
            apply(&alg, &mut s, T0, Adjustment::Charge(6)),
            (0, 8000, false)
        );
        assert!(!check(&alg, &mut s, T0 + 3_999_000, 1));
        assert_eq!(
            apply(&alg, &mut s, T0, Adjustment::Refund(5)),
            (2, 3000, true)
        );
        assert_eq!(apply(&alg, &mut s, T0, Adjustment::Refund(9)), (5, 0, true));
        assert_eq!(s, None);
    }

    #[test]
    fn leaky_bucket_level_can_exceed_capacity_after_a_charge() {
        let alg = Algorithm::LeakyBucket {
            capacity: 4,
            rate: Rate::per_second(2),
            mode: LeakyMode::Policing,
        };
        let mut s = None;
        assert_eq!(
            apply(&alg, &mut s, T0, Adjustment::Charge(6)),
            (0, 3000, false)
        );
        // 1 s drains 2: level 4 = capacity, still nothing left.
        assert!(!check(&alg, &mut s, T0 + 1_000_000, 1));
        assert_eq!(
            apply(&alg, &mut s, T0 + 1_000_000, Adjustment::Refund(3)),
            (3, 500, true)
        );
        assert_eq!(
            apply(&alg, &mut s, T0 + 1_000_000, Adjustment::Refund(3)),
            (4, 0, true)
        );
        assert_eq!(s, None);
    }

    #[test]
    fn windows_count_debt_and_refund_only_the_current_window() {
        for alg in [
            Algorithm::FixedWindow {
                limit: 10,
                window_ms: 10_000,
            },
            Algorithm::SlidingWindowCounter {
                limit: 10,
                window_ms: 10_000,
            },
            Algorithm::SlidingWindowLog {
                limit: 10,
                window_ms: 10_000,
            },
        ] {
            let mut s = None;
            let at = T0 + 2_000_000;
            assert_eq!(
                apply(&alg, &mut s, at, Adjustment::Charge(14)).0,
                0,
                "{alg:?}"
            );
            // 14 - 6 = 8: 2 left.
            assert_eq!(
                apply(&alg, &mut s, at, Adjustment::Refund(6)).0,
                2,
                "{alg:?}"
            );
            assert!(check(&alg, &mut s, at, 2), "{alg:?}");
            assert!(!check(&alg, &mut s, at, 1), "{alg:?}");
            assert_eq!(
                apply(&alg, &mut s, at, Adjustment::Refund(50)),
                (10, 0, true),
                "{alg:?}"
            );
            assert_eq!(s, None, "{alg:?}");
        }
        // The previous window's count is not refundable: only the current one is.
        let alg = Algorithm::FixedWindow {
            limit: 10,
            window_ms: 10_000,
        };
        let mut s = None;
        apply(&alg, &mut s, T0, Adjustment::Charge(7));
        assert_eq!(
            apply(&alg, &mut s, T0 + 10_000_000, Adjustment::Refund(3)).0,
            10
        );
    }

    #[test]
    fn sliding_log_refund_removes_the_newest_entries_first() {
        let alg = Algorithm::SlidingWindowLog {
            limit: 5,
            window_ms: 10_000,
        };
        let mut s = None;
        assert!(check(&alg, &mut s, T0, 2));
        assert!(check(&alg, &mut s, T0 + 1_000_000, 3));
        // The 3 at +1 s go and 1 of the 2 at +0 s: one entry of 1 at T0 remains.
        assert_eq!(
            apply(&alg, &mut s, T0 + 2_000_000, Adjustment::Refund(4)),
            (4, 8000, true)
        );
        let Some(State::SlidingWindowLog(log)) = &s else {
            panic!("{s:?}")
        };
        assert_eq!(log.entries, [(T0 / 1000, 1)]);
    }

    #[test]
    fn concurrency_and_huge_costs_are_refused() {
        let cc = Algorithm::Concurrency {
            limit: 2,
            lease_ms: 1000,
        };
        assert_eq!(
            adjust(&cc, None, T0, Adjustment::Refund(1)),
            Err(AdjustError::Concurrency)
        );
        let fw = Algorithm::FixedWindow {
            limit: 2,
            window_ms: 1000,
        };
        assert_eq!(
            adjust(&fw, None, T0, Adjustment::Charge(u64::MAX)),
            Err(AdjustError::CostTooLarge(u64::MAX))
        );
    }
}
