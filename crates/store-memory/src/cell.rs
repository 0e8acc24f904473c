//! The embedded store's atomic cells and the one compare-and-swap loop of its read path.
//!
//! A state of two 64-bit fields or fewer (GCRA, token bucket, leaky bucket, fixed window, a
//! sliding window counter that fits 128 bits) is held in a [`Cell`]: one atomic word, so a
//! one-limit check of a key already held decides under the shard's read lock and writes with
//! one compare-and-swap ([`decide_in`]). GCRA and the token bucket, the common cases, run the
//! same loop on their own word types ([`GcraWord`], [`TokenBucketWord`]) so they skip the
//! general [`State`] dispatch; every algorithm goes through the one loop and the one
//! liveness rule below.
//!
//! # Liveness: one rule for every algorithm
//!
//! A cell holds no expiry: when its state is back at rest follows from the state and the
//! algorithm, [`sluice_core::algorithm::rest_time`] (the `expires_at` the algorithm itself
//! gives when it writes that state). A held state is *live* while its rest time is after
//! `now` ([`is_live`]), the rule the shard's lookup, sweep and eviction apply to stored
//! `expires_at` too. A decision that keeps the state (a denial, a peek) answers on the read
//! path only from a live state; a state at or past its rest time goes to the write path,
//! which drops the slot and decides from the initial state. The answer would be the same
//! either way (a state at rest means what the initial state means), so the rule exists for
//! memory: a key whose slot is never written again must still be found at rest and removed,
//! and every path must agree on which keys are held, or the key count and the eviction of
//! "entries at rest first" drift. GCRA judged this by `tat > now` and the others by their
//! rest time in separate loops; GCRA's rest time *is* its TAT, so they agreed, but only by
//! coincidence of two texts. Now the rule is written once.
#![forbid(unsafe_code)]

use std::sync::atomic::{AtomicU64, Ordering};

use portable_atomic::AtomicU128;
use sluice_core::algorithm::{
    Outcome, State, Update, fixed_window, gcra, leaky_bucket, rest_time, sliding_window_counter,
    token_bucket,
};
use sluice_core::{Algorithm, Decision, Timestamp};

/// Which state a [`Cell`] holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CellKind {
    Gcra,
    TokenBucket,
    LeakyBucket,
    FixedWindow,
    /// Three fields in 48 + 40 + 40 bits, when they fit (else the state is boxed).
    SlidingWindowCounter,
}

/// Bits of a sliding window counter's window start (ms) and of each of its two counts.
const SWC_START_BITS: u32 = 48;
const SWC_COUNT_BITS: u32 = 40;

/// A small state in one atomic word: 64 bits for GCRA's one field, 128 for the others.
///
/// The word is all there is: when the state is back at rest follows from it and the slot's
/// algorithm ([`rest_time`]), so a check on the read path changes one word with one
/// compare-and-swap and nothing else. The slot's policy always names the algorithm the state
/// was written under (the write path updates it; the read path only serves checks of exactly
/// that algorithm).
#[derive(Debug)]
pub(crate) enum Cell {
    Gcra(AtomicU64),
    Pair(CellKind, AtomicU128),
}

/// Two fields in one word: `hi` in the upper 64 bits.
#[inline]
pub(crate) fn pack(hi: u64, lo: u64) -> u128 {
    (u128::from(hi) << 64) | u128::from(lo)
}

#[inline]
pub(crate) fn unpack(bits: u128) -> (u64, u64) {
    ((bits >> 64) as u64, bits as u64)
}

impl CellKind {
    /// The kind of word that holds `state`, and the word; `None` for states that need more.
    #[inline]
    pub(crate) fn encode(state: &State) -> Option<(CellKind, u128)> {
        Some(match *state {
            State::Gcra(gcra::State { tat }) => (CellKind::Gcra, u128::from(tat)),
            State::TokenBucket(token_bucket::State { tokens, last_ms }) => {
                (CellKind::TokenBucket, pack(tokens, last_ms))
            }
            State::LeakyBucket(leaky_bucket::State { level, last_ms }) => {
                (CellKind::LeakyBucket, pack(level, last_ms))
            }
            State::FixedWindow(fixed_window::State {
                window_start,
                count,
            }) => (CellKind::FixedWindow, pack(window_start, count)),
            State::SlidingWindowCounter(sliding_window_counter::State {
                window_start,
                curr,
                prev,
            }) => {
                let fits = window_start >> SWC_START_BITS == 0
                    && curr >> SWC_COUNT_BITS == 0
                    && prev >> SWC_COUNT_BITS == 0;
                if !fits {
                    return None;
                }
                let bits = (u128::from(window_start) << (2 * SWC_COUNT_BITS))
                    | (u128::from(curr) << SWC_COUNT_BITS)
                    | u128::from(prev);
                (CellKind::SlidingWindowCounter, bits)
            }
            _ => return None,
        })
    }

    #[inline]
    pub(crate) fn decode(self, bits: u128) -> State {
        let (hi, lo) = unpack(bits);
        match self {
            CellKind::Gcra => State::Gcra(gcra::State { tat: bits as u64 }),
            CellKind::TokenBucket => State::TokenBucket(token_bucket::State {
                tokens: hi,
                last_ms: lo,
            }),
            CellKind::LeakyBucket => State::LeakyBucket(leaky_bucket::State {
                level: hi,
                last_ms: lo,
            }),
            CellKind::FixedWindow => State::FixedWindow(fixed_window::State {
                window_start: hi,
                count: lo,
            }),
            CellKind::SlidingWindowCounter => {
                let mask = (1u128 << SWC_COUNT_BITS) - 1;
                State::SlidingWindowCounter(sliding_window_counter::State {
                    window_start: (bits >> (2 * SWC_COUNT_BITS)) as u64,
                    curr: ((bits >> SWC_COUNT_BITS) & mask) as u64,
                    prev: (bits & mask) as u64,
                })
            }
        }
    }
}

impl Cell {
    pub(crate) fn new(kind: CellKind, bits: u128) -> Self {
        match kind {
            CellKind::Gcra => Cell::Gcra(AtomicU64::new(bits as u64)),
            kind => Cell::Pair(kind, AtomicU128::new(bits)),
        }
    }

    pub(crate) fn kind(&self) -> CellKind {
        match self {
            Cell::Gcra(_) => CellKind::Gcra,
            Cell::Pair(kind, _) => *kind,
        }
    }

    /// The word and the state it holds.
    #[inline]
    pub(crate) fn read(&self) -> (u128, State) {
        let bits = Word::load(self);
        (bits, self.kind().decode(bits))
    }

    /// Overwrites the word (under the write lock).
    pub(crate) fn set(&mut self, bits: u128) {
        match self {
            Cell::Gcra(w) => *w.get_mut() = bits as u64,
            Cell::Pair(_, w) => *w.get_mut() = bits,
        }
    }
}

/// Whether a state whose rest time is `rest` is live at `now`: its rest time is after `now`
/// (see the module docs). `rest` is [`rest_time`]'s, or that of the per-algorithm function it
/// dispatches to; a state whose rest time does not follow from it (`None`) is never in a cell.
#[inline]
pub(crate) fn is_live(rest: Option<Timestamp>, now: Timestamp) -> bool {
    rest.is_some_and(|at| at > now)
}

/// An atomic word holding one algorithm's state, as the read path changes it.
pub(crate) trait Word {
    /// The state the word holds.
    type State;
    /// The word's bits.
    type Bits: Copy;
    /// The word now.
    fn load(&self) -> Self::Bits;
    /// The state in `bits`.
    fn decode(&self, bits: Self::Bits) -> Self::State;
    /// The bits of `state`, or `None` when it does not fit this word (the write path then
    /// stores it).
    fn encode(&self, state: &Self::State) -> Option<Self::Bits>;
    /// Replaces `seen` with `new` unless another thread changed the word since.
    fn swap(&self, seen: Self::Bits, new: Self::Bits) -> bool;
    /// When `state`, written under `algorithm`, is back at rest (for the liveness rule):
    /// the algorithm's own rest time, without building a general [`State`].
    fn rest_time(state: &Self::State, algorithm: &Algorithm) -> Option<Timestamp>;
}

/// Decides a check on the read path from `word`, which holds a state written under
/// `algorithm`: `decide` runs on the word's state; a new state is written with one
/// compare-and-swap, deciding again from the new word when another thread swapped first.
/// `None` sends the check to the write path: the state is not live ([`is_live`]), the
/// algorithm deletes it, or the new state does not fit the word.
#[inline]
pub(crate) fn decide_in<W: Word>(
    word: &W,
    algorithm: &Algorithm,
    now: Timestamp,
    decide: impl Fn(&W::State) -> Outcome<W::State>,
) -> Option<Decision> {
    loop {
        let seen = word.load();
        let state = word.decode(seen);
        let outcome = decide(&state);
        match outcome.update {
            Update::Keep => {
                return is_live(W::rest_time(&state, algorithm), now).then_some(outcome.decision);
            }
            Update::Put { state, .. } => {
                let bits = word.encode(&state)?;
                if word.swap(seen, bits) {
                    return Some(outcome.decision);
                }
            }
            Update::Delete => return None,
        }
    }
}

/// GCRA's 64-bit word: its TAT.
pub(crate) struct GcraWord<'a>(pub(crate) &'a AtomicU64);

impl Word for GcraWord<'_> {
    type State = gcra::State;
    type Bits = u64;
    #[inline]
    fn load(&self) -> u64 {
        self.0.load(Ordering::Acquire)
    }
    #[inline]
    fn decode(&self, tat: u64) -> gcra::State {
        gcra::State { tat }
    }
    #[inline]
    fn encode(&self, state: &gcra::State) -> Option<u64> {
        Some(state.tat)
    }
    #[inline]
    fn swap(&self, seen: u64, new: u64) -> bool {
        self.0
            .compare_exchange_weak(seen, new, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
    }
    #[inline]
    fn rest_time(state: &gcra::State, _: &Algorithm) -> Option<Timestamp> {
        Some(gcra::rest_time(state))
    }
}

/// A token bucket's word: tokens in the upper half, `last_ms` in the lower.
pub(crate) struct TokenBucketWord<'a>(pub(crate) &'a AtomicU128);

impl Word for TokenBucketWord<'_> {
    type State = token_bucket::State;
    type Bits = u128;
    #[inline]
    fn load(&self) -> u128 {
        self.0.load(Ordering::Acquire)
    }
    #[inline]
    fn decode(&self, bits: u128) -> token_bucket::State {
        let (tokens, last_ms) = unpack(bits);
        token_bucket::State { tokens, last_ms }
    }
    #[inline]
    fn encode(&self, state: &token_bucket::State) -> Option<u128> {
        Some(pack(state.tokens, state.last_ms))
    }
    #[inline]
    fn swap(&self, seen: u128, new: u128) -> bool {
        self.0
            .compare_exchange_weak(seen, new, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
    }
    #[inline]
    fn rest_time(state: &token_bucket::State, algorithm: &Algorithm) -> Option<Timestamp> {
        match algorithm {
            Algorithm::TokenBucket { capacity, rate } => {
                Some(token_bucket::rest_time(state, *capacity, *rate))
            }
            _ => None,
        }
    }
}

/// Any cell, through the general [`State`].
impl Word for Cell {
    type State = State;
    type Bits = u128;
    #[inline]
    fn load(&self) -> u128 {
        match self {
            Cell::Gcra(w) => u128::from(w.load(Ordering::Acquire)),
            Cell::Pair(_, w) => w.load(Ordering::Acquire),
        }
    }
    #[inline]
    fn decode(&self, bits: u128) -> State {
        self.kind().decode(bits)
    }
    #[inline]
    fn encode(&self, state: &State) -> Option<u128> {
        match CellKind::encode(state) {
            Some((kind, bits)) if kind == self.kind() => Some(bits),
            _ => None,
        }
    }
    #[inline]
    fn swap(&self, seen: u128, new: u128) -> bool {
        match self {
            Cell::Gcra(w) => w
                .compare_exchange_weak(seen as u64, new as u64, Ordering::AcqRel, Ordering::Acquire)
                .is_ok(),
            Cell::Pair(_, w) => w
                .compare_exchange_weak(seen, new, Ordering::AcqRel, Ordering::Acquire)
                .is_ok(),
        }
    }
    #[inline]
    fn rest_time(state: &State, algorithm: &Algorithm) -> Option<Timestamp> {
        rest_time(algorithm, state)
    }
}

impl Cell {
    /// Decides a one-limit check at `cost` of a state written under `algorithm` on the read
    /// path ([`decide_in`]); GCRA and the token bucket on their own words.
    #[inline]
    pub(crate) fn decide(
        &self,
        algorithm: &Algorithm,
        now: Timestamp,
        cost: u64,
    ) -> Option<Decision> {
        match (self, algorithm) {
            (Cell::Gcra(w), Algorithm::Gcra { rate, burst }) => {
                decide_in(&GcraWord(w), algorithm, now, |s| {
                    gcra::decide(Some(s), *rate, *burst, now, cost)
                })
            }
            (Cell::Pair(CellKind::TokenBucket, w), Algorithm::TokenBucket { capacity, rate }) => {
                decide_in(&TokenBucketWord(w), algorithm, now, |s| {
                    token_bucket::decide(Some(s), *capacity, *rate, now, cost)
                })
            }
            _ => decide_in(self, algorithm, now, |s| {
                sluice_core::algorithm::decide(algorithm, Some(s), now, cost, None)
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_two_field_state_round_trips_through_its_cell() {
        let states = [
            State::Gcra(gcra::State { tat: u64::MAX - 1 }),
            State::TokenBucket(token_bucket::State {
                tokens: u64::MAX,
                last_ms: 1_700_000_000_000,
            }),
            State::LeakyBucket(leaky_bucket::State {
                level: 3,
                last_ms: u64::MAX,
            }),
            State::FixedWindow(fixed_window::State {
                window_start: 1_700_000_000_000,
                count: 0,
            }),
            State::SlidingWindowCounter(sliding_window_counter::State {
                window_start: (1 << 48) - 1,
                curr: (1 << 40) - 1,
                prev: 12,
            }),
        ];
        for state in states {
            let (kind, bits) = CellKind::encode(&state).unwrap();
            assert_eq!(kind.decode(bits), state);
        }
        // Counts beyond 40 bits are boxed, not truncated.
        let big = State::SlidingWindowCounter(sliding_window_counter::State {
            window_start: 1_700_000_000_000,
            curr: 1 << 40,
            prev: 0,
        });
        assert!(CellKind::encode(&big).is_none());
    }

    /// The liveness rule at its boundary, for every algorithm kept in a cell: a peek answers
    /// on the read path 1 µs before the state's rest time and defers to the write path at
    /// and after it, and GCRA's and the token bucket's own words answer exactly what the
    /// general cell does. Two loops with their own rule (`tat >= now` for GCRA, say) fail
    /// here.
    #[test]
    fn every_word_defers_a_state_at_rest_and_agrees_with_the_general_cell() {
        use sluice_core::{LeakyMode, Rate};
        let now0: Timestamp = 1_700_000_000_123_000;
        let now_ms = now0 / 1000;
        let cases = [
            (
                Algorithm::Gcra {
                    rate: Rate::per_second(5),
                    burst: 2,
                },
                State::Gcra(gcra::State {
                    tat: now0 + 300_000,
                }),
            ),
            (
                Algorithm::TokenBucket {
                    capacity: 5,
                    rate: Rate::per_second(1),
                },
                State::TokenBucket(token_bucket::State {
                    tokens: 2_000,
                    last_ms: now_ms,
                }),
            ),
            (
                Algorithm::LeakyBucket {
                    capacity: 5,
                    rate: Rate::per_second(1),
                    mode: LeakyMode::Policing,
                },
                State::LeakyBucket(leaky_bucket::State {
                    level: 2_000,
                    last_ms: now_ms,
                }),
            ),
            (
                Algorithm::FixedWindow {
                    limit: 5,
                    window_ms: 1000,
                },
                State::FixedWindow(fixed_window::State {
                    window_start: now_ms / 1000 * 1000,
                    count: 2,
                }),
            ),
            (
                Algorithm::SlidingWindowCounter {
                    limit: 5,
                    window_ms: 1000,
                },
                State::SlidingWindowCounter(sliding_window_counter::State {
                    window_start: now_ms / 1000 * 1000,
                    curr: 2,
                    prev: 1,
                }),
            ),
        ];
        for (algorithm, state) in cases {
            let rest = rest_time(&algorithm, &state).expect("a cell state has a rest time");
            assert!(rest > now0, "{algorithm:?}");
            let (kind, bits) = CellKind::encode(&state).unwrap();
            for (now, live) in [(rest - 1, true), (rest, false), (rest + 1, false)] {
                let cell = Cell::new(kind, bits);
                let answer = cell.decide(&algorithm, now, 0);
                assert_eq!(
                    answer.is_some(),
                    live,
                    "{algorithm:?} at rest {rest} - {now}"
                );
                assert_eq!(is_live(rest_time(&algorithm, &state), now), live);
                let general = decide_in(&cell, &algorithm, now, |s| {
                    sluice_core::algorithm::decide(&algorithm, Some(s), now, 0, None)
                });
                assert_eq!(answer, general, "{algorithm:?} at {now}");
            }
        }
    }
}
