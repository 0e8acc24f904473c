//! GCRA, the generic cell rate algorithm, with the parameters and answers of redis-cell's
//! `CL.THROTTLE`: one stored theoretical arrival time (`tat`) per key instead of a level and a
//! timestamp, so a check is a single comparison.
//!
//! It works in microseconds (not milliseconds like the buckets) because the emission interval
//! of fast rates is below a millisecond; answers are rounded up to whole milliseconds.
//! [`reference`] is a separate, literal model of `CL.THROTTLE` written from redis-cell's
//! README; a property test holds [`decide`] equal to it on every step.

use super::{Outcome, Update};
use crate::clock::Timestamp;
use crate::decision::{Decision, ceil_ms};
use crate::policy::Rate;

/// Stored state: the theoretical arrival time of the next request, µs since the epoch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct State {
    /// Theoretical arrival time, µs.
    pub tat: u64,
}

/// The emission interval `T` in µs: one request is "earned" every `T` µs (never below 1).
#[inline]
pub fn emission_interval_us(rate: Rate) -> u64 {
    let amount = rate.amount.max(1);
    // The same quotient in u64 when the product fits (a 128-bit division is a library call),
    // and none at all for one request per period.
    match rate.per_ms.checked_mul(1000) {
        Some(us) if amount == 1 => us.max(1),
        Some(us) => (us / amount).max(1),
        None => ((rate.per_ms as u128 * 1000) / amount as u128).max(1) as u64,
    }
}

/// When a state is back at rest: its TAT (a TAT in the past means the same as none).
#[inline]
pub fn rest_time(state: &State) -> Timestamp {
    state.tat
}

/// Decides one request (see `docs/algorithms.md`, "GCRA").
///
/// In 64-bit integers when every intermediate value fits (any realistic rate, burst, cost
/// and clock), else in [`decide_wide`]'s 128-bit arithmetic; both answer the same (a property
/// test holds them equal, and both to [`reference`]). The 64-bit form is the embedded
/// store's hot path: a denial of cost 1 does no division and writes nothing.
#[inline]
pub fn decide(
    state: Option<&State>,
    rate: Rate,
    burst: u64,
    now: Timestamp,
    cost: u64,
) -> Outcome<State> {
    let Some(Terms {
        t,
        limit,
        tolerance,
        increment,
        tat,
        new_tat,
        horizon,
    }) = Terms::of(state, rate, burst, now, cost)
    else {
        return decide_wide(state, rate, burst, now, cost);
    };
    // Let through when `new_tat - tolerance <= now`, written as `new_tat <= now + tolerance`
    // so no value goes below zero; a denial's wait is the difference. `tat >= now`, so the
    // TTLs are not negative either.
    if new_tat > horizon {
        let ttl = tat - now;
        let remaining = whole_intervals(tolerance.saturating_sub(ttl), t);
        let reset = ceil_ms(ttl);
        let decision = if increment <= tolerance {
            Decision::limited(limit, remaining, ceil_ms(new_tat - horizon), reset)
        } else {
            Decision::cost_exceeds_limit(limit, remaining, reset)
        };
        return Outcome {
            decision,
            update: Update::Keep,
        };
    }
    let ttl = new_tat - now;
    let decision = Decision::allow(limit, whole_intervals(tolerance - ttl, t), ceil_ms(ttl));
    let update = if cost == 0 {
        Update::Keep
    } else {
        Update::Put {
            state: State { tat: new_tat },
            expires_at: new_tat,
        }
    };
    Outcome { decision, update }
}

/// `floor(next / t)`, without the division below one interval (every denial of cost 1).
#[inline]
fn whole_intervals(next: u64, t: u64) -> u64 {
    if next < t { 0 } else { next / t }
}

/// The terms of one decision in 64-bit integers (µs), when every one fits.
struct Terms {
    /// The emission interval.
    t: u64,
    /// `burst + 1`.
    limit: u64,
    /// `t * (burst + 1)`.
    tolerance: u64,
    /// `t * cost`.
    increment: u64,
    /// The stored TAT, or `now` when it is in the past or absent.
    tat: u64,
    /// `tat + increment`.
    new_tat: u64,
    /// `now + tolerance`: the latest `new_tat` that is let through.
    horizon: u64,
}

impl Terms {
    /// `None` when one would overflow 64 bits (then [`decide_wide`] decides).
    #[inline]
    fn of(
        state: Option<&State>,
        rate: Rate,
        burst: u64,
        now: Timestamp,
        cost: u64,
    ) -> Option<Self> {
        let t = emission_interval_us(rate);
        let limit = burst.checked_add(1)?;
        let tolerance = t.checked_mul(limit)?;
        let increment = t.checked_mul(cost)?;
        let tat = state.map_or(now, |s| s.tat.max(now));
        Some(Self {
            t,
            limit,
            tolerance,
            increment,
            tat,
            new_tat: tat.checked_add(increment)?,
            horizon: now.checked_add(tolerance)?,
        })
    }
}

/// [`decide`] in 128-bit arithmetic, for the parameters whose intermediate values do not fit
/// 64 bits (public so the property tests can hold the two forms equal).
#[inline(never)]
pub fn decide_wide(
    state: Option<&State>,
    rate: Rate,
    burst: u64,
    now: Timestamp,
    cost: u64,
) -> Outcome<State> {
    // i128: `increment` for an absurd cost and `tat - now` for a clock gone backwards must not
    // overflow or wrap.
    let t = emission_interval_us(rate) as i128;
    let tolerance = t * (burst as i128 + 1);
    let increment = t * cost as i128;
    let limit = burst + 1;
    let now_i = now as i128;
    // A TAT in the past means the same as none (redis-cell's key would have expired then).
    let tat = state.map_or(now_i, |s| (s.tat as i128).max(now_i));
    let new_tat = tat + increment;
    let allow_at = new_tat - tolerance;
    let diff = now_i - allow_at;
    let remaining_for = |ttl: i128| {
        let next = tolerance - ttl;
        // The same quotient in u64 when it fits (it nearly always does): a 128-bit division
        // is a library call several times slower.
        match (u64::try_from(next), u64::try_from(t)) {
            // Below one interval (every denial of cost 1): no division at all.
            (Ok(n), Ok(d)) if n < d => 0,
            (Ok(n), Ok(d)) => n / d,
            _ if next > 0 => (next / t) as u64,
            _ => 0,
        }
    };
    let ms = |us: i128| ceil_ms(us.max(0) as u64);

    if diff < 0 {
        let ttl = tat - now_i;
        let (remaining, reset) = (remaining_for(ttl), ms(ttl));
        let decision = if increment <= tolerance {
            Decision::limited(limit, remaining, ms(-diff), reset)
        } else {
            Decision::cost_exceeds_limit(limit, remaining, reset)
        };
        return Outcome {
            decision,
            update: Update::Keep,
        };
    }
    let ttl = new_tat - now_i;
    let decision = Decision::allow(limit, remaining_for(ttl), ms(ttl));
    let update = if cost == 0 {
        Update::Keep
    } else {
        Update::Put {
            state: State {
                tat: new_tat as u64,
            },
            expires_at: new_tat as u64,
        }
    };
    Outcome { decision, update }
}

/// What `CL.THROTTLE` answers, in its own terms (durations in µs here instead of seconds).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ThrottleReply {
    /// 0 allowed, 1 limited.
    pub limited: bool,
    /// The total limit of the key (`max_burst + 1`).
    pub limit: i64,
    /// The remaining limit of the key.
    pub remaining: i64,
    /// Time until the caller should retry; always -1 when the action was allowed (and when it
    /// can never be allowed).
    pub retry_after: i64,
    /// Time until the limit resets to its maximum capacity.
    pub reset_after: i64,
}

/// A stored redis-cell key: the TAT and the absolute time its TTL runs out, both µs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReferenceKey {
    /// Theoretical arrival time.
    pub tat: i64,
    /// When the key's TTL expires.
    pub expires_at: i64,
}

/// A plain model of `CL.THROTTLE <key> <max_burst> <count> <period> <quantity>` as redis-cell's
/// README describes it, with `count per period` given as `rate`. Takes the key as stored
/// (expired keys count as absent) and returns the reply and the key as stored afterwards.
///
/// Written independently of [`decide`], as the README's algorithm reads: the emission interval
/// is the period divided by the count; the delay variation tolerance is one interval per unit
/// of `max_burst + 1`; a request is let through when its new TAT minus the tolerance is not in
/// the future, and then the new TAT is stored with a TTL that ends exactly at it.
pub fn reference(
    key: Option<ReferenceKey>,
    rate: Rate,
    max_burst: i64,
    now: i64,
    quantity: i64,
) -> (ThrottleReply, Option<ReferenceKey>) {
    let emission_interval = ((rate.per_ms as i64) * 1000 / rate.amount as i64).max(1);
    let delay_variation_tolerance = emission_interval * (max_burst + 1);
    let limit = max_burst + 1;
    let increment = emission_interval * quantity;

    let live = key.filter(|k| k.expires_at > now);
    let tat = match live {
        Some(k) => k.tat,
        None => now,
    };
    let new_tat = if now > tat {
        now + increment
    } else {
        tat + increment
    };
    let allow_at = new_tat - delay_variation_tolerance;
    let diff = now - allow_at;

    let mut retry_after = -1;
    let limited;
    let ttl;
    let mut stored = live;
    if diff < 0 {
        if increment <= delay_variation_tolerance {
            retry_after = -diff;
        }
        ttl = tat - now;
        limited = true;
    } else {
        ttl = new_tat - now;
        stored = if ttl > 0 {
            Some(ReferenceKey {
                tat: new_tat,
                expires_at: now + ttl,
            })
        } else {
            None
        };
        limited = false;
    }
    let next = delay_variation_tolerance - ttl;
    let mut remaining = 0;
    if next > -emission_interval {
        remaining = next / emission_interval; // integer division truncates towards zero
    }
    (
        ThrottleReply {
            limited,
            limit,
            remaining,
            retry_after,
            reset_after: ttl,
        },
        stored,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decision::DenyReason;

    const T0: Timestamp = 1_700_000_000_000_000;

    fn run(
        state: &mut Option<State>,
        rate: Rate,
        burst: u64,
        now: Timestamp,
        cost: u64,
    ) -> Decision {
        let o = decide(state.as_ref(), rate, burst, now, cost);
        if let Update::Put { state: s, .. } = o.update {
            *state = Some(s);
        }
        o.decision
    }

    #[test]
    fn one_per_second_burst_2() {
        let (rate, mut s) = (Rate::per_second(1), None);
        for (i, want) in [2, 1, 0].into_iter().enumerate() {
            let d = run(&mut s, rate, 2, T0, 1);
            assert!(d.allowed);
            assert_eq!(
                (d.limit, d.remaining, d.reset_after_ms),
                (3, want, 1000 * (i as u64 + 1))
            );
        }
        let d = run(&mut s, rate, 2, T0, 1);
        assert_eq!(
            (d.allowed, d.remaining, d.retry_after_ms, d.reset_after_ms),
            (false, 0, 1000, 3000)
        );
        assert_eq!(d.reason, Some(DenyReason::Limited));
        // 999 ms later still 1 ms early; at 1000 ms one more fits.
        let d = run(&mut s, rate, 2, T0 + 999_000, 1);
        assert_eq!((d.allowed, d.retry_after_ms), (false, 1));
        let d = run(&mut s, rate, 2, T0 + 1_000_000, 1);
        assert_eq!((d.allowed, d.remaining, d.reset_after_ms), (true, 0, 3000));
        // Idle for the whole tolerance: back to the initial state.
        let d = run(&mut s, rate, 2, T0 + 4_000_000, 1);
        assert_eq!((d.allowed, d.remaining, d.reset_after_ms), (true, 2, 1000));
    }

    #[test]
    fn cost_zero_peeks_and_oversized_cost_is_final() {
        let rate = Rate::per_second(10);
        let o = decide(None, rate, 4, T0, 0);
        assert_eq!(
            (o.decision.allowed, o.decision.remaining, o.update),
            (true, 5, Update::Keep)
        );
        let o = decide(None, rate, 4, T0, 6);
        assert_eq!(o.decision.reason, Some(DenyReason::CostExceedsLimit));
        assert_eq!((o.decision.retry_after_ms, o.update), (0, Update::Keep));
        // Exactly burst + 1 fits on a fresh key.
        assert!(decide(None, rate, 4, T0, 5).decision.allowed);
    }

    #[test]
    fn sub_millisecond_intervals_round_up() {
        // 3000/s: T = 333 µs; after 2 requests with burst 0 the wait is 333 µs -> 1 ms.
        let (rate, mut s) = (Rate::per_second(3000), None);
        assert!(run(&mut s, rate, 0, T0, 1).allowed);
        let d = run(&mut s, rate, 0, T0, 1);
        assert_eq!(
            (d.allowed, d.retry_after_ms, d.reset_after_ms),
            (false, 1, 1)
        );
        assert!(run(&mut s, rate, 0, T0 + 333, 1).allowed);
    }

    #[test]
    fn reference_matches_the_readme_example() {
        // README: CL.THROTTLE user123 15 30 60 1 -> 0, 16, 15, -1, 2 (seconds).
        let (r, k) = reference(None, Rate::new(30, 60_000), 15, 0, 1);
        assert_eq!(
            (r.limited, r.limit, r.remaining, r.retry_after),
            (false, 16, 15, -1)
        );
        assert_eq!(r.reset_after, 2_000_000);
        assert_eq!(
            k,
            Some(ReferenceKey {
                tat: 2_000_000,
                expires_at: 2_000_000
            })
        );
    }
}
