//! The conservative summary of evicted state: what keeps an eviction from resetting a limit.
//!
//! When the store must drop a state that still restricts its key (the key is not back at its
//! initial value), it first writes a [`Trace`] of it into a [`Sketch`]: an upper bound on how
//! much the key had spent (`amount`) and the time by which it is back at rest (`until`). A
//! later check of a key the map no longer holds asks the sketch for a bound and starts from
//! [`restrictive_state`], the most restrictive state that bound allows. That state is always at
//! least as restrictive as the one evicted (see "Why it is conservative" below), so an eviction
//! can make a key stricter than exact, never looser.
//!
//! # The sketch
//! [`ROWS`] rows of cells; a key hashes to one cell per row (the store's keyed hash of the
//! key, so clients cannot aim at a cell). A cell keeps the *maximum* `amount` and the maximum
//! `until` of every trace written to it, and forgets them once `until` has passed (every trace
//! in it has then reached rest). The bound for a key is the minimum over its cells: every one of
//! them is at least the key's own trace. A key whose cells all collide with other evicted keys
//! gets the larger of their traces, which only denies more. Memory is fixed: `ROWS x width`
//! cells of 16 bytes, whatever the number of keys written.
//!
//! Why a maximum and not a sum (a count-min sketch proper): each trace is already a bound on
//! its key's whole state, so a cell only has to bound each contributor on its own. A key
//! evicted twice is covered too: its later state was built from the earlier bound and the
//! maximum keeps the larger of the two.
//!
//! # Why it is conservative
//! For the algorithms that drain linearly (token bucket, leaky bucket, GCRA) the time back at
//! rest fixes the most that can still be missing: `(until - now) x rate`. For the windowed ones
//! (fixed window, sliding window counter and log) and concurrency, the spent amount is held
//! whole until `until`, although the true state may shrink before. Every algorithm is monotone:
//! a state that is more restrictive now admits nothing the true one would not, and after the
//! same admitted request both stay ordered.
#![forbid(unsafe_code)]

use sluice_core::algorithm::{State, bound};
use sluice_core::{Algorithm, LeaseId, Timestamp};

/// Rows of a sketch: a key is misjudged only if all of its cells collide.
pub const ROWS: usize = 4;

/// An upper bound on one key's evicted state.
pub type Trace = bound::Bound;

/// A fixed-size summary of evicted states (see the module docs).
#[derive(Debug, Clone)]
pub struct Sketch {
    cells: Box<[Trace]>,
    /// Cells per row, a power of two.
    width: usize,
}

impl Sketch {
    /// An empty sketch of `width` cells per row (rounded up to a power of two, at least 16).
    pub fn new(width: usize) -> Self {
        let width = width.max(16).next_power_of_two();
        Self {
            cells: vec![Trace::default(); ROWS * width].into_boxed_slice(),
            width,
        }
    }

    /// Heap bytes of a sketch of `width` cells per row.
    pub fn bytes_for(width: usize) -> usize {
        ROWS * width.max(16).next_power_of_two() * std::mem::size_of::<Trace>()
    }

    /// The cell of `hash` in `row`: the hash rotated by a row-specific amount, then
    /// multiplied by an odd constant; its top bits pick the cell, so every row depends on the
    /// high 56 bits of the keyed hash. (Only those: a trace pushed out of the fingerprint
    /// table, [`crate::fingerprints`], keeps no more of its key's hash.)
    fn index(&self, hash: u64, row: usize) -> usize {
        let mixed = (hash & !0xFF)
            .rotate_left(16 * row as u32)
            .wrapping_mul(0x9E37_79B9_7F4A_7C15);
        let bits = self.width.trailing_zeros();
        row * self.width + (mixed >> (64 - bits)) as usize
    }

    /// Records the trace of an evicted key.
    pub fn record(&mut self, hash: u64, trace: Trace, now: Timestamp) {
        for row in 0..ROWS {
            let i = self.index(hash, row);
            let cell = &mut self.cells[i];
            if cell.until <= now {
                // Every trace in it is back at rest: forget them.
                *cell = trace;
            } else {
                cell.amount = cell.amount.max(trace.amount);
                cell.until = cell.until.max(trace.until);
            }
        }
    }

    /// An upper bound on the evicted state of the key of `hash`, or `None` when it is
    /// certainly back at rest (one of its cells holds nothing live).
    pub fn bound(&self, hash: u64, now: Timestamp) -> Option<Trace> {
        let mut bound = Trace {
            amount: u64::MAX,
            until: u64::MAX,
        };
        for row in 0..ROWS {
            let cell = self.cells[self.index(hash, row)];
            if cell.until <= now {
                return None;
            }
            bound.amount = bound.amount.min(cell.amount);
            bound.until = bound.until.min(cell.until);
        }
        Some(bound)
    }
}

/// The trace of a state about to be evicted, whose value is back at rest at `expires_at`
/// ([`sluice_core::algorithm::bound::spent`]).
pub fn trace(state: &State, expires_at: Timestamp, now: Timestamp) -> Trace {
    bound::spent(state, expires_at, now)
}

/// The most restrictive state of `algorithm` that `bound` allows at `now`, or `None` when that
/// is the initial state ([`sluice_core::algorithm::bound::restrictive_state`]).
pub fn restrictive_state(
    algorithm: &Algorithm,
    bound: Trace,
    now: Timestamp,
    evicted_lease: &LeaseId,
) -> Option<State> {
    bound::restrictive_state(algorithm, bound, now, evicted_lease)
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_core::Rate;
    use sluice_core::algorithm::{Update, decide};

    const T0: Timestamp = 1_700_000_000_000_000;

    #[test]
    fn a_cell_forgets_once_every_trace_in_it_is_at_rest() {
        let mut s = Sketch::new(16);
        let t = Trace {
            amount: 3,
            until: T0 + 1_000_000,
        };
        s.record(7, t, T0);
        assert_eq!(s.bound(7, T0), Some(t));
        assert_eq!(s.bound(7, T0 + 1_000_000), None);
        // A later, smaller trace replaces a cell at rest instead of adding to it.
        let small = Trace {
            amount: 1,
            until: T0 + 3_000_000,
        };
        s.record(7, small, T0 + 2_000_000);
        assert_eq!(s.bound(7, T0 + 2_000_000), Some(small));
    }

    #[test]
    fn collisions_only_raise_the_bound() {
        let mut s = Sketch::new(16);
        let mine = Trace {
            amount: 2,
            until: T0 + 5_000_000,
        };
        s.record(0, mine, T0);
        // A hash landing in the same cell as hash 0 in every row.
        let twin = (1..u64::MAX)
            .map(|h| h << 8)
            .find(|&h| (0..ROWS).all(|r| s.index(h, r) == s.index(0, r)))
            .unwrap();
        s.record(
            twin,
            Trace {
                amount: 9,
                until: T0 + 1_000_000,
            },
            T0,
        );
        let b = s.bound(0, T0).unwrap();
        assert_eq!((b.amount, b.until), (9, T0 + 5_000_000));
    }

    /// Replays `costs` on an exact state, then checks that the state rebuilt from its trace
    /// denies whatever the exact state denies, at several later times.
    fn rebuilt_is_at_least_as_strict(algorithm: Algorithm, costs: &[u64]) {
        let lease = LeaseId("evicted".into());
        let mut state = None;
        let mut expires = 0;
        let mut now = T0;
        for (i, &c) in costs.iter().enumerate() {
            now = T0 + i as u64 * 7_000;
            let o = decide(&algorithm, state.as_ref(), now, c, Some(&lease));
            if let Update::Put {
                state: s,
                expires_at,
            } = o.update
            {
                (state, expires) = (Some(s), expires_at);
            }
        }
        let Some(exact) = state else { return };
        let tr = trace(&exact, expires, now);
        for later_ms in [0u64, 1, 500, 999, 1000, 2500, 9000] {
            let at = now + later_ms * 1000;
            let rebuilt = restrictive_state(&algorithm, tr, at, &lease);
            for cost in 0..=6 {
                let e = decide(&algorithm, Some(&exact), at, cost, None).decision;
                let r = decide(&algorithm, rebuilt.as_ref(), at, cost, None).decision;
                assert!(
                    !r.allowed || e.allowed,
                    "{algorithm:?} at +{later_ms} ms, cost {cost}: rebuilt admits, exact denies"
                );
                if cost == 0 {
                    assert!(r.remaining <= e.remaining, "{algorithm:?} +{later_ms} ms");
                }
            }
        }
    }

    #[test]
    fn rebuilt_states_deny_what_the_exact_state_denies() {
        let rate = Rate::per_second(3);
        for algorithm in [
            Algorithm::TokenBucket { capacity: 6, rate },
            Algorithm::Gcra { rate, burst: 5 },
            Algorithm::LeakyBucket {
                capacity: 6,
                rate,
                mode: sluice_core::LeakyMode::Policing,
            },
            Algorithm::FixedWindow {
                limit: 6,
                window_ms: 2000,
            },
            Algorithm::SlidingWindowCounter {
                limit: 6,
                window_ms: 2000,
            },
            Algorithm::SlidingWindowLog {
                limit: 6,
                window_ms: 2000,
            },
            Algorithm::Concurrency {
                limit: 6,
                lease_ms: 2000,
            },
        ] {
            for costs in [
                &[1u64][..],
                &[6],
                &[2, 3],
                &[1, 1, 1, 1, 1, 1, 1],
                &[4, 0, 2],
            ] {
                rebuilt_is_at_least_as_strict(algorithm.clone(), costs);
            }
        }
    }
}
