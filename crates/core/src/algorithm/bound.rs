//! What an algorithm's state has spent, as a bound, and the most restrictive state a bound
//! allows: the two directions the embedded store's eviction summary needs
//! (`crates/store-memory/src/summary.rs`, which also says why the result is conservative).
//! Per algorithm, so they live with the algorithms.

use crate::clock::Timestamp;
use crate::decision::LeaseId;
use crate::policy::Algorithm;

use super::{
    State, concurrency, fixed_window, gcra, leaky_bucket, sliding_window_counter,
    sliding_window_log, token_bucket,
};

/// An upper bound on one key's state.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Bound {
    /// At most this much is spent (units of cost; unused by the linearly draining algorithms).
    pub amount: u64,
    /// The key is back at its initial value by this time (µs).
    pub until: Timestamp,
}

/// An upper bound on what `state`, back at rest at `expires_at`, has spent at `now`.
pub fn spent(state: &State, expires_at: Timestamp, now: Timestamp) -> Bound {
    let now_ms = now / 1000;
    let amount = match state {
        // Drain linearly: the time back at rest says it all.
        State::TokenBucket(_) | State::LeakyBucket(_) | State::Gcra(_) => 0,
        State::FixedWindow(s) => s.count,
        // The previous window may no longer count; adding it can only overstate.
        State::SlidingWindowCounter(s) => s.curr.saturating_add(s.prev),
        State::SlidingWindowLog(s) => s.entries.iter().map(|&(_, c)| c).sum(),
        State::Concurrency(s) => s
            .leases
            .iter()
            .filter(|l| l.expires_ms > now_ms)
            .map(|l| l.cost)
            .sum(),
    };
    Bound {
        amount,
        until: expires_at,
    }
}

/// The most restrictive state of `algorithm` that `bound` allows at `now`, or `None` when that
/// is the initial state. `evicted_lease` names the one lease standing for the evicted
/// concurrency leases (it cannot be released: nobody was given its id).
pub fn restrictive_state(
    algorithm: &Algorithm,
    bound: Bound,
    now: Timestamp,
    evicted_lease: &LeaseId,
) -> Option<State> {
    if bound.until <= now {
        return None;
    }
    let now_ms = now / 1000;
    let until_ms = bound.until.div_ceil(1000);
    let left_ms = until_ms.saturating_sub(now_ms);
    let state = match *algorithm {
        Algorithm::TokenBucket { capacity, rate } => {
            let r = rate.reduced();
            let full = capacity.saturating_mul(r.per_ms);
            let missing = left_ms.saturating_mul(r.amount).min(full);
            State::TokenBucket(token_bucket::State {
                tokens: full - missing,
                last_ms: now_ms,
            })
        }
        Algorithm::LeakyBucket { capacity, rate, .. } => {
            let r = rate.reduced();
            let full = capacity.saturating_mul(r.per_ms);
            State::LeakyBucket(leaky_bucket::State {
                level: left_ms.saturating_mul(r.amount).min(full),
                last_ms: now_ms,
            })
        }
        Algorithm::Gcra { .. } => State::Gcra(gcra::State { tat: bound.until }),
        Algorithm::FixedWindow { limit, window_ms } => {
            let count = bound.amount.min(limit);
            if count == 0 {
                return None;
            }
            State::FixedWindow(fixed_window::State {
                window_start: now_ms / window_ms * window_ms,
                count,
            })
        }
        Algorithm::CalendarWindow { limit, period } => {
            let count = bound.amount.min(limit);
            if count == 0 {
                return None;
            }
            State::FixedWindow(fixed_window::State {
                window_start: period.bounds(now_ms).0,
                count,
            })
        }
        Algorithm::SlidingWindowCounter { limit, window_ms } => {
            let spent = bound.amount.min(limit);
            if spent == 0 {
                return None;
            }
            let start = now_ms / window_ms * window_ms;
            // A key back at rest by the end of this window spent nothing in it.
            let curr = if until_ms <= start + window_ms {
                0
            } else {
                spent
            };
            State::SlidingWindowCounter(sliding_window_counter::State {
                window_start: start,
                curr,
                prev: spent,
            })
        }
        Algorithm::SlidingWindowLog { limit, window_ms } => {
            let spent = bound.amount.min(limit);
            if spent == 0 {
                return None;
            }
            // One entry leaving the window at `until`; never later than a request made now
            // would leave, as every evicted request was made by now.
            let t = until_ms.saturating_sub(window_ms).min(now_ms);
            State::SlidingWindowLog(sliding_window_log::State {
                entries: [(t, spent)].into(),
            })
        }
        Algorithm::Concurrency { limit, .. } => {
            let held = bound.amount.min(limit);
            if held == 0 {
                return None;
            }
            State::Concurrency(concurrency::State {
                leases: vec![concurrency::Lease {
                    id: evicted_lease.clone(),
                    cost: held,
                    expires_ms: until_ms,
                }],
            })
        }
    };
    Some(state)
}
