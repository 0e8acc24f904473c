//! What each algorithm's parameters amount to, written once next to the registry: the quota
//! and window clients are shown, the same algorithm at a scaled quota (a shard of a hot key,
//! an instance's local share), the numbers a store's scripts take, and the traits the limiter,
//! the HTTP layer and the tools ask about (leases, whether a denial holds until its retry,
//! how a bucket refills, a calendar period). They ask these methods instead of matching on
//! [`Algorithm`] themselves, so a new algorithm is described
//! here and in its own module, not again in every store.

use crate::algorithm::calendar::CalendarPeriod;
use crate::policy::{Algorithm, LeakyMode, PolicyError, Rate};

impl Algorithm {
    /// The short, stable name used in keys, metrics and the CLI (`token-bucket`, `gcra`, ...).
    pub fn kind(&self) -> &'static str {
        self.algorithm_kind().name()
    }

    /// The quota shown to clients (`q` of `RateLimit-Policy`).
    pub fn quota(&self) -> u64 {
        match *self {
            Algorithm::TokenBucket { capacity, .. } | Algorithm::LeakyBucket { capacity, .. } => {
                capacity
            }
            Algorithm::Gcra { burst, .. } => burst + 1,
            Algorithm::FixedWindow { limit, .. }
            | Algorithm::CalendarWindow { limit, .. }
            | Algorithm::SlidingWindowCounter { limit, .. }
            | Algorithm::SlidingWindowLog { limit, .. }
            | Algorithm::Concurrency { limit, .. } => limit,
        }
    }

    /// The window shown to clients (`w` of `RateLimit-Policy`), in milliseconds: for buckets,
    /// the time to refill the whole quota (a bucket of 10 at 5/s is "10 per 2 s").
    pub fn window_ms(&self) -> u64 {
        match *self {
            Algorithm::TokenBucket { capacity, rate }
            | Algorithm::LeakyBucket { capacity, rate, .. } => {
                (capacity as u128 * rate.per_ms as u128).div_ceil(rate.amount as u128) as u64
            }
            Algorithm::Gcra { rate, burst } => {
                ((burst + 1) as u128 * rate.per_ms as u128).div_ceil(rate.amount as u128) as u64
            }
            Algorithm::FixedWindow { window_ms, .. }
            | Algorithm::SlidingWindowCounter { window_ms, .. }
            | Algorithm::SlidingWindowLog { window_ms, .. } => window_ms,
            // The longest the period lasts; the reset of each answer is exact.
            Algorithm::CalendarWindow { period, .. } => period.max_ms(),
            Algorithm::Concurrency { lease_ms, .. } => lease_ms,
        }
    }

    /// This fixed window counted per calendar `period` instead of per fixed length (what
    /// `window = "1 month"` builds). Only a fixed window has a calendar form: the sliding
    /// windows weigh or log time continuously, which a calendar boundary does not change.
    pub fn on_calendar(&self, period: CalendarPeriod) -> Result<Algorithm, PolicyError> {
        match *self {
            Algorithm::FixedWindow { limit, .. } | Algorithm::CalendarWindow { limit, .. } => {
                Ok(Algorithm::CalendarWindow { limit, period })
            }
            _ => Err(PolicyError::Invalid(format!(
                "window = \"{period}\" is a calendar window, only for fixed-window; {} needs \
                 a length such as \"30d\"",
                self.kind()
            ))),
        }
    }

    /// The same algorithm with every quantity it admits mapped by `scale`: capacity, limit,
    /// the rate's amount and GCRA's `burst + 1` (what it admits at once); durations, periods
    /// and the leaky bucket's mode are kept. Sharding ([`Self::per_shard`]) and the local
    /// fallback's share both scale through here, so the two agree on what "the quota" is.
    pub fn scaled(&self, scale: impl Fn(u64) -> u64) -> Algorithm {
        let rate = |r: Rate| Rate::new(scale(r.amount), r.per_ms);
        match *self {
            Algorithm::TokenBucket { capacity, rate: r } => Algorithm::TokenBucket {
                capacity: scale(capacity),
                rate: rate(r),
            },
            Algorithm::Gcra { rate: r, burst } => Algorithm::Gcra {
                rate: rate(r),
                burst: scale(burst.saturating_add(1)).max(1) - 1,
            },
            Algorithm::LeakyBucket {
                capacity,
                rate: r,
                mode,
            } => Algorithm::LeakyBucket {
                capacity: scale(capacity),
                rate: rate(r),
                mode,
            },
            Algorithm::FixedWindow { limit, window_ms } => Algorithm::FixedWindow {
                limit: scale(limit),
                window_ms,
            },
            Algorithm::CalendarWindow { limit, period } => Algorithm::CalendarWindow {
                limit: scale(limit),
                period,
            },
            Algorithm::SlidingWindowCounter { limit, window_ms } => {
                Algorithm::SlidingWindowCounter {
                    limit: scale(limit),
                    window_ms,
                }
            }
            Algorithm::SlidingWindowLog { limit, window_ms } => Algorithm::SlidingWindowLog {
                limit: scale(limit),
                window_ms,
            },
            Algorithm::Concurrency { limit, lease_ms } => Algorithm::Concurrency {
                limit: scale(limit),
                lease_ms,
            },
        }
    }

    /// The parameters of one shard when a hot identity's state is split over `n` sub-keys:
    /// quota and rate amount are divided by `n`, rounded up (so the sum over shards is never
    /// below the configured limit, and exceeds it by less than `n`), at least 1.
    pub fn per_shard(&self, n: u32) -> Algorithm {
        let n = u64::from(n.max(1));
        self.scaled(|v| v.div_ceil(n).max(1))
    }

    /// The four numbers `p1..p4` the Redis scripts take for this algorithm (after the code
    /// of [`crate::algorithm::AlgorithmKind::lua_code`]); each script's header in
    /// `crates/store-redis/lua/` says what they mean. Rates go reduced, so the scripts'
    /// integer arithmetic stays small; GCRA goes as its emission interval in µs.
    pub fn store_params(&self) -> [u64; 4] {
        match *self {
            Algorithm::TokenBucket { capacity, rate } => {
                let r = rate.reduced();
                [capacity, r.amount, r.per_ms, 0]
            }
            Algorithm::Gcra { rate, burst } => [emission_interval_us(rate), burst, 0, 0],
            Algorithm::LeakyBucket {
                capacity,
                rate,
                mode,
            } => {
                let r = rate.reduced();
                let shaping = u64::from(mode == LeakyMode::Shaping);
                [capacity, r.amount, r.per_ms, shaping]
            }
            Algorithm::FixedWindow { limit, window_ms } => [limit, window_ms, 0, 0],
            // A fixed window whose bounds the script computes from the calendar (p3).
            Algorithm::CalendarWindow { limit, period } => {
                [limit, period.max_ms(), period.lua_code(), 0]
            }
            Algorithm::SlidingWindowCounter { limit, window_ms }
            | Algorithm::SlidingWindowLog { limit, window_ms } => [limit, window_ms, 0, 0],
            Algorithm::Concurrency { limit, lease_ms } => [limit, lease_ms, 0, 0],
        }
    }

    /// The lease timeout of a concurrency limit; `None` for every algorithm without leases.
    pub fn lease_ms(&self) -> Option<u64> {
        match *self {
            Algorithm::Concurrency { lease_ms, .. } => Some(lease_ms),
            _ => None,
        }
    }

    /// Whether admissions take leases that a release gives back (concurrency): such a
    /// policy is about requests in flight, so it is neither reserved from nor settled by a
    /// response's outcome, and its denials are never cached.
    pub fn holds_leases(&self) -> bool {
        self.algorithm_kind().info().leases
    }

    /// Whether, after a denial, only time makes room ([`crate::algorithm::registry::AlgorithmInfo::denial_holds`]:
    /// token bucket, GCRA, fixed and calendar windows).
    pub fn denial_holds(&self) -> bool {
        self.algorithm_kind().info().denial_holds
    }

    /// The calendar period of a calendar window; `None` for every other algorithm.
    pub fn calendar_period(&self) -> Option<CalendarPeriod> {
        match *self {
            Algorithm::CalendarWindow { period, .. } => Some(period),
            _ => None,
        }
    }

    /// How a token bucket or GCRA refills, for bounding what was taken from it: `None` for
    /// the others (the windows empty at their end; the leaky bucket's level is its own).
    pub fn token_refill(&self) -> Option<TokenRefill> {
        match *self {
            // The token bucket refills by whole milliseconds since its last update, which
            // may credit up to 1 ms more than the time elapsed.
            Algorithm::TokenBucket { capacity, rate } => Some(TokenRefill {
                capacity,
                rate,
                slack_us: 1000,
            }),
            // GCRA admits `burst + 1` at once and counts µs.
            Algorithm::Gcra { rate, burst } => Some(TokenRefill {
                capacity: burst + 1,
                rate,
                slack_us: 0,
            }),
            _ => None,
        }
    }

    /// Whether an admission at `cost` takes a lease, which a release gives back.
    pub fn takes_lease(&self, cost: u64) -> bool {
        cost > 0 && self.algorithm_kind().info().leases
    }

    /// Whether an admission at `cost` stores an entry under a unique member (a log entry or a
    /// lease), which the store then has to name.
    pub fn stores_member(&self, cost: u64) -> bool {
        cost > 0 && self.algorithm_kind().info().members
    }
}

/// A bucket that refills continuously ([`Algorithm::token_refill`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TokenRefill {
    /// The most it admits at once.
    pub capacity: u64,
    /// Units refilled per period.
    pub rate: Rate,
    /// How far ahead of the time elapsed the store's refill may credit, in µs.
    pub slack_us: u64,
}

/// The GCRA emission interval in µs, as `docs/algorithms.md` defines it (at least 1).
pub fn emission_interval_us(rate: Rate) -> u64 {
    (rate.per_ms as u128 * 1000 / rate.amount.max(1) as u128).max(1) as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn per_shard_and_local_share_scale_the_same_quantities() {
        let rate = Rate::per_second(10);
        let gcra = Algorithm::Gcra { rate, burst: 9 };
        assert_eq!(
            gcra.per_shard(4),
            Algorithm::Gcra {
                rate: Rate::per_second(3),
                burst: 2
            }
        );
        for a in [
            Algorithm::TokenBucket { capacity: 8, rate },
            Algorithm::LeakyBucket {
                capacity: 8,
                rate,
                mode: LeakyMode::Shaping,
            },
            Algorithm::FixedWindow {
                limit: 8,
                window_ms: 1000,
            },
            Algorithm::CalendarWindow {
                limit: 8,
                period: CalendarPeriod::Day,
            },
            Algorithm::SlidingWindowCounter {
                limit: 8,
                window_ms: 1000,
            },
            Algorithm::SlidingWindowLog {
                limit: 8,
                window_ms: 1000,
            },
            Algorithm::Concurrency {
                limit: 8,
                lease_ms: 1000,
            },
        ] {
            let half = a.per_shard(2);
            assert_eq!(half.quota(), 4, "{a:?}");
            assert_eq!(half.algorithm_kind(), a.algorithm_kind());
            assert_eq!(a.scaled(|v| v), a);
        }
    }

    #[test]
    fn store_params_reduce_rates_and_code_the_calendar() {
        let tb = Algorithm::TokenBucket {
            capacity: 5,
            rate: Rate::new(10, 1000),
        };
        assert_eq!(tb.store_params(), [5, 1, 100, 0]);
        let gcra = Algorithm::Gcra {
            rate: Rate::per_second(4),
            burst: 2,
        };
        assert_eq!(gcra.store_params(), [250_000, 2, 0, 0]);
        let cal = Algorithm::CalendarWindow {
            limit: 3,
            period: CalendarPeriod::Month,
        };
        assert_eq!(
            cal.store_params(),
            [
                3,
                CalendarPeriod::Month.max_ms(),
                CalendarPeriod::Month.lua_code(),
                0
            ]
        );
        let cc = Algorithm::Concurrency {
            limit: 2,
            lease_ms: 500,
        };
        assert!(cc.takes_lease(1) && !cc.takes_lease(0) && cc.stores_member(1));
        let log = Algorithm::SlidingWindowLog {
            limit: 2,
            window_ms: 500,
        };
        assert!(!log.takes_lease(1) && log.stores_member(2) && !log.stores_member(0));
        assert!(!tb.stores_member(1) && tb.lease_ms().is_none());
        assert_eq!(cc.lease_ms(), Some(500));
    }
}
