//! The algorithms, each a pure function of `(state, params, now, cost)`.
//!
//! Each module exposes `decide(state: Option<&S>, params..., now, cost) -> Outcome<S>`;
//! [`decide`] dispatches on [`Algorithm`] over the type-erased [`State`]. The formulas and
//! bounds are in `docs/algorithms.md`; the Lua scripts in `crates/store-redis/lua/` implement
//! the same functions and a differential test holds them equal. [`registry`] names them;
//! [`shape`] says what their parameters amount to (quota, scaling, the numbers a store's
//! scripts take), so the stores ask instead of matching on [`Algorithm`] themselves.

pub mod adjust;
pub mod bound;
pub mod calendar;
pub mod concurrency;
pub mod fixed_window;
pub mod gcra;
pub mod leaky_bucket;
mod params;
pub mod registry;
pub mod shape;
pub mod sliding_window_counter;
pub mod sliding_window_log;
pub mod token_bucket;
mod validate;

use crate::clock::Timestamp;
use crate::decision::{Decision, LeaseId};
use crate::policy::{Algorithm, Rate};

pub use adjust::{AdjustError, Adjustment, adjust};
pub use registry::{
    ALGORITHMS, AlgorithmInfo, AlgorithmKind, Param, ParamError, Params, UnknownAlgorithm,
};

/// What a decision does to the stored state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Update<S> {
    /// Leave the stored state as it is (denials, peeks).
    Keep,
    /// Store `state`; it is back to the initial state at `expires_at` (µs) and may be dropped then.
    Put { state: S, expires_at: Timestamp },
    /// The state is back to its initial value: drop it.
    Delete,
}

/// A decision and what it does to the state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome<S> {
    /// The answer.
    pub decision: Decision,
    /// The state change, to apply only if the whole (multi-limit) check is admitted.
    pub update: Update<S>,
}

impl<S> Outcome<S> {
    fn map<T>(self, f: impl FnOnce(S) -> T) -> Outcome<T> {
        let update = match self.update {
            Update::Keep => Update::Keep,
            Update::Delete => Update::Delete,
            Update::Put { state, expires_at } => Update::Put {
                state: f(state),
                expires_at,
            },
        };
        Outcome {
            decision: self.decision,
            update,
        }
    }
}

/// The state of any algorithm, as the embedded store keeps it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum State {
    TokenBucket(token_bucket::State),
    Gcra(gcra::State),
    LeakyBucket(leaky_bucket::State),
    FixedWindow(fixed_window::State),
    SlidingWindowCounter(sliding_window_counter::State),
    SlidingWindowLog(sliding_window_log::State),
    Concurrency(concurrency::State),
}

/// Evaluates `algorithm` for one request. A stored state of another algorithm (the policy
/// changed) is treated as absent. `lease` names the lease a concurrency check takes if admitted.
pub fn decide(
    algorithm: &Algorithm,
    state: Option<&State>,
    now: Timestamp,
    cost: u64,
    lease: Option<&LeaseId>,
) -> Outcome<State> {
    match *algorithm {
        Algorithm::TokenBucket { capacity, rate } => {
            let s = match state {
                Some(State::TokenBucket(s)) => Some(s),
                _ => None,
            };
            token_bucket::decide(s, capacity, rate, now, cost).map(State::TokenBucket)
        }
        Algorithm::Gcra { rate, burst } => {
            let s = match state {
                Some(State::Gcra(s)) => Some(s),
                _ => None,
            };
            gcra::decide(s, rate, burst, now, cost).map(State::Gcra)
        }
        Algorithm::LeakyBucket {
            capacity,
            rate,
            mode,
        } => {
            let s = match state {
                Some(State::LeakyBucket(s)) => Some(s),
                _ => None,
            };
            leaky_bucket::decide(s, capacity, rate, mode, now, cost).map(State::LeakyBucket)
        }
        Algorithm::FixedWindow { limit, window_ms } => {
            let s = match state {
                Some(State::FixedWindow(s)) => Some(s),
                _ => None,
            };
            fixed_window::decide(s, limit, window_ms, now, cost).map(State::FixedWindow)
        }
        Algorithm::CalendarWindow { limit, period } => {
            let s = match state {
                Some(State::FixedWindow(s)) => Some(s),
                _ => None,
            };
            fixed_window::decide_calendar(s, limit, period, now, cost).map(State::FixedWindow)
        }
        Algorithm::SlidingWindowCounter { limit, window_ms } => {
            let s = match state {
                Some(State::SlidingWindowCounter(s)) => Some(s),
                _ => None,
            };
            sliding_window_counter::decide(s, limit, window_ms, now, cost)
                .map(State::SlidingWindowCounter)
        }
        Algorithm::SlidingWindowLog { limit, window_ms } => {
            let s = match state {
                Some(State::SlidingWindowLog(s)) => Some(s),
                _ => None,
            };
            sliding_window_log::decide(s, limit, window_ms, now, cost).map(State::SlidingWindowLog)
        }
        Algorithm::Concurrency { limit, lease_ms } => {
            let s = match state {
                Some(State::Concurrency(s)) => Some(s),
                _ => None,
            };
            concurrency::decide(s, limit, lease_ms, now, cost, lease).map(State::Concurrency)
        }
    }
}

/// When `state`, written under `algorithm`, is back to its initial value, derived from the
/// state and the parameters alone: the `expires_at` [`decide`] gives with that state. A store
/// that keeps the state without its expiry (the embedded store's atomic cells) judges
/// liveness by it. `None` where the state alone does not tell (a sliding log, leases,
/// calendar windows: their expiry is stored with them) or the state is another algorithm's.
pub fn rest_time(algorithm: &Algorithm, state: &State) -> Option<Timestamp> {
    let ms = |last_ms: u64, wait_ms: u64| last_ms.saturating_add(wait_ms).saturating_mul(1000);
    match (state, algorithm) {
        (State::Gcra(s), Algorithm::Gcra { .. }) => Some(gcra::rest_time(s)),
        (State::TokenBucket(s), Algorithm::TokenBucket { capacity, rate }) => {
            Some(token_bucket::rest_time(s, *capacity, *rate))
        }
        (State::LeakyBucket(s), Algorithm::LeakyBucket { rate, .. }) => Some(ms(
            s.last_ms,
            s.level.div_ceil(reduced(*rate).amount.max(1)),
        )),
        (State::FixedWindow(s), Algorithm::FixedWindow { window_ms, .. }) => {
            let (_, end) = fixed_window::epoch_bounds((*window_ms).max(1), s.window_start);
            Some(end.saturating_mul(1000))
        }
        (State::SlidingWindowCounter(s), Algorithm::SlidingWindowCounter { window_ms, .. }) => {
            Some(
                s.window_start
                    .saturating_add(window_ms.saturating_mul(2))
                    .saturating_mul(1000),
            )
        }
        _ => None,
    }
}

/// Releases a concurrency lease; `(was held, update)`. Other algorithms hold no leases.
pub fn release(state: Option<&State>, now: Timestamp, lease: &LeaseId) -> (bool, Update<State>) {
    match state {
        Some(State::Concurrency(s)) => {
            let (held, update) = concurrency::release(s, now, lease);
            let update = match update {
                Update::Keep => Update::Keep,
                Update::Delete => Update::Delete,
                Update::Put { state, expires_at } => Update::Put {
                    state: State::Concurrency(state),
                    expires_at,
                },
            };
            (held, update)
        }
        _ => (false, Update::Keep),
    }
}

/// `rate` in lowest terms ([`Rate::reduced`]), without its GCD loop when the rate is in
/// lowest terms by its form: one unit per period (`1/h`, `1/s`) or a period of 1 ms. The
/// buckets reduce their rate on every decision; this is their hot path.
#[inline]
pub(crate) fn reduced(rate: Rate) -> Rate {
    if rate.amount == 1 || rate.per_ms == 1 {
        rate
    } else {
        rate.reduced()
    }
}

/// `ceil(a / b)` for the algorithms' integer arithmetic. A reduced rate of one unit per
/// period (any amount that divides its period, such as 100/min) divides by 1, which needs no
/// division instruction.
#[inline]
pub(crate) fn div_ceil(a: u64, b: u64) -> u64 {
    if b == 1 { a } else { a.div_ceil(b) }
}
