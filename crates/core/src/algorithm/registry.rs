//! Every algorithm by name: its spellings, the parameters it takes, the short code the Redis
//! scripts dispatch on and the traits the stores ask about (whether its Lua is a step the
//! batch loop runs, whether it takes leases, whether an admission stores a unique member),
//! written down once. What its parameters amount to (quota, scaling, the numbers a store's
//! scripts take) is in [`super::shape`], their bounds in `validate.rs`, the inverse of
//! [`AlgorithmKind::build`] and the display form in `params.rs`.
//!
//! The config file, the CLI flags and `--expect` specs, the Envoy `rate_limit.algorithm`
//! extension and the Redis script assembly all read this table, so an algorithm cannot be
//! spelled one way in one place and another way elsewhere, and "gcra takes no capacity" reads
//! the same wherever it is reported.

use std::fmt;
use std::str::FromStr;

use crate::policy::{Algorithm, LeakyMode, Rate};

pub use super::params::{ParamError, Params, UnknownAlgorithm};

/// An algorithm without its parameters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AlgorithmKind {
    /// [`Algorithm::TokenBucket`].
    TokenBucket,
    /// [`Algorithm::Gcra`].
    Gcra,
    /// [`Algorithm::LeakyBucket`].
    LeakyBucket,
    /// [`Algorithm::FixedWindow`].
    FixedWindow,
    /// [`Algorithm::SlidingWindowCounter`].
    SlidingWindowCounter,
    /// [`Algorithm::SlidingWindowLog`].
    SlidingWindowLog,
    /// [`Algorithm::Concurrency`].
    Concurrency,
}

/// A parameter of an algorithm, named as the config file, the CLI flags (`--NAME`) and
/// `--expect` specs (`NAME=value`) spell it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Param {
    /// Bucket size.
    Capacity,
    /// Refill, drain or emission rate such as `5/s`.
    Rate,
    /// GCRA's extra requests beyond the steady rate (default 0).
    Burst,
    /// Requests per window, or leases held at once.
    Limit,
    /// Window length such as `10s`.
    Window,
    /// Leaky bucket `policing` (default) or `shaping`.
    Mode,
    /// How long a concurrency lease lives unless released (default 30 s).
    Lease,
}

/// The GCRA burst when none is given.
pub const DEFAULT_BURST: u64 = 0;
/// The leaky bucket mode when none is given.
pub const DEFAULT_MODE: LeakyMode = LeakyMode::Policing;
/// The concurrency lease timeout when none is given, in milliseconds.
pub const DEFAULT_LEASE_MS: u64 = 30_000;

impl Param {
    /// Every parameter, in the order errors list them.
    pub const ALL: [Param; 7] = [
        Param::Capacity,
        Param::Rate,
        Param::Burst,
        Param::Limit,
        Param::Window,
        Param::Mode,
        Param::Lease,
    ];

    /// The name in files, flags and specs.
    pub fn name(self) -> &'static str {
        match self {
            Param::Capacity => "capacity",
            Param::Rate => "rate",
            Param::Burst => "burst",
            Param::Limit => "limit",
            Param::Window => "window",
            Param::Mode => "mode",
            Param::Lease => "lease",
        }
    }

    /// False for the parameters with a default (`burst`, `mode`, `lease`).
    pub fn is_required(self) -> bool {
        !matches!(self, Param::Burst | Param::Mode | Param::Lease)
    }

    /// An example of the value, for "needs" messages.
    pub fn example(self) -> Option<&'static str> {
        match self {
            Param::Rate => Some("5/s, 300/min"),
            Param::Window | Param::Lease => Some("10s, 1m"),
            _ => None,
        }
    }
}

impl fmt::Display for Param {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// What the registry knows about one algorithm.
#[derive(Debug)]
pub struct AlgorithmInfo {
    /// Which algorithm.
    pub kind: AlgorithmKind,
    /// The stable name: keys, metrics, headers, the config file.
    pub name: &'static str,
    /// Other accepted spellings (snake_case, long and short forms).
    pub aliases: &'static [&'static str],
    /// The parameters it takes, in the order messages list them.
    pub params: &'static [Param],
    /// The code the Redis scripts register the algorithm under (`CHECK.<code>` in Lua).
    pub lua_code: &'static str,
    /// Its state is one string the Redis scripts read and write whole, so its Lua is a step
    /// (`STEP.<code>`: stored value in, decision and new value out) that the one-key check,
    /// the one-policy batch loop and the charge/refund all run.
    pub step: bool,
    /// An admission takes a lease that a release gives back.
    pub leases: bool,
    /// An admission stores an entry under a unique member (a log entry or a lease).
    pub members: bool,
    /// After a denial nothing but time makes room (other clients only consume), so the
    /// `retry_after` the store answered holds for every process: the deny cache's exact mode
    /// caches these denials (`sluice::DenyCacheMode`).
    pub denial_holds: bool,
}

/// The registry, in the order the algorithms are listed everywhere.
pub static ALGORITHMS: [AlgorithmInfo; 7] = [
    AlgorithmInfo {
        kind: AlgorithmKind::TokenBucket,
        name: "token-bucket",
        aliases: &["token_bucket", "tb"],
        params: &[Param::Capacity, Param::Rate],
        lua_code: "tb",
        step: true,
        leases: false,
        members: false,
        denial_holds: true,
    },
    AlgorithmInfo {
        kind: AlgorithmKind::Gcra,
        name: "gcra",
        aliases: &[],
        params: &[Param::Rate, Param::Burst],
        lua_code: "gcra",
        step: true,
        leases: false,
        members: false,
        denial_holds: true,
    },
    AlgorithmInfo {
        kind: AlgorithmKind::LeakyBucket,
        name: "leaky-bucket",
        aliases: &["leaky_bucket", "lb"],
        params: &[Param::Capacity, Param::Rate, Param::Mode],
        lua_code: "lb",
        step: true,
        leases: false,
        members: false,
        denial_holds: false,
    },
    AlgorithmInfo {
        kind: AlgorithmKind::FixedWindow,
        name: "fixed-window",
        aliases: &["fixed_window", "fw"],
        params: &[Param::Limit, Param::Window],
        lua_code: "fw",
        step: true,
        leases: false,
        members: false,
        denial_holds: true,
    },
    AlgorithmInfo {
        kind: AlgorithmKind::SlidingWindowCounter,
        name: "sliding-counter",
        aliases: &["sliding-window-counter", "sliding_window_counter"],
        params: &[Param::Limit, Param::Window],
        lua_code: "swc",
        step: true,
        leases: false,
        members: false,
        denial_holds: false,
    },
    AlgorithmInfo {
        kind: AlgorithmKind::SlidingWindowLog,
        name: "sliding-log",
        aliases: &["sliding-window-log", "sliding_window_log", "sw"],
        params: &[Param::Limit, Param::Window],
        lua_code: "swl",
        step: false,
        leases: false,
        members: true,
        denial_holds: false,
    },
    AlgorithmInfo {
        kind: AlgorithmKind::Concurrency,
        name: "concurrency",
        aliases: &[],
        params: &[Param::Limit, Param::Lease],
        lua_code: "cc",
        step: false,
        leases: true,
        members: true,
        denial_holds: false,
    },
];

impl AlgorithmKind {
    /// Every algorithm, in registry order.
    pub const ALL: [AlgorithmKind; 7] = [
        AlgorithmKind::TokenBucket,
        AlgorithmKind::Gcra,
        AlgorithmKind::LeakyBucket,
        AlgorithmKind::FixedWindow,
        AlgorithmKind::SlidingWindowCounter,
        AlgorithmKind::SlidingWindowLog,
        AlgorithmKind::Concurrency,
    ];

    /// The position in [`ALGORITHMS`] (and [`Self::ALL`]).
    pub fn index(self) -> usize {
        self as usize
    }

    /// The registry entry.
    pub fn info(self) -> &'static AlgorithmInfo {
        &ALGORITHMS[self.index()]
    }

    /// The stable name (`token-bucket`, `gcra`, ...).
    pub fn name(self) -> &'static str {
        self.info().name
    }

    /// The code the Redis scripts dispatch on.
    pub fn lua_code(self) -> &'static str {
        self.info().lua_code
    }

    /// The parameters it takes.
    pub fn params(self) -> &'static [Param] {
        self.info().params
    }

    /// True when it takes `param`.
    pub fn takes(self, param: Param) -> bool {
        self.params().contains(&param)
    }

    /// `Err` when it does not take `param`.
    pub fn check_param(self, param: Param) -> Result<(), ParamError> {
        if self.takes(param) {
            Ok(())
        } else {
            Err(ParamError::TakesNo {
                algorithm: self,
                param,
            })
        }
    }

    /// The name or alias `s` among `allowed`; the error lists the stable names of `allowed`.
    pub fn parse_among(s: &str, allowed: &[AlgorithmKind]) -> Result<Self, UnknownAlgorithm> {
        allowed
            .iter()
            .copied()
            .find(|k| k.name() == s || k.info().aliases.contains(&s))
            .ok_or_else(|| UnknownAlgorithm {
                given: s.to_string(),
                expected: allowed.iter().map(|k| k.name()).collect(),
            })
    }

    /// The algorithm enforcing a quota of `amount` per `period_ms`, so that
    /// [`Algorithm::quota`] and [`Algorithm::window_ms`] give them back: windows of
    /// `period_ms`, buckets of `amount` refilled at `amount` per period, GCRA with burst
    /// `amount - 1`, a policing leaky bucket. `None` for concurrency (no period) or an
    /// `amount` of 0.
    pub fn for_quota(self, amount: u64, period_ms: u64) -> Option<Algorithm> {
        if amount == 0 {
            return None;
        }
        let rate = Rate::new(amount, period_ms);
        Some(match self {
            AlgorithmKind::TokenBucket => Algorithm::TokenBucket {
                capacity: amount,
                rate,
            },
            AlgorithmKind::Gcra => Algorithm::Gcra {
                rate,
                burst: amount - 1,
            },
            AlgorithmKind::LeakyBucket => Algorithm::LeakyBucket {
                capacity: amount,
                rate,
                mode: LeakyMode::Policing,
            },
            AlgorithmKind::FixedWindow => Algorithm::FixedWindow {
                limit: amount,
                window_ms: period_ms,
            },
            AlgorithmKind::SlidingWindowCounter => Algorithm::SlidingWindowCounter {
                limit: amount,
                window_ms: period_ms,
            },
            AlgorithmKind::SlidingWindowLog => Algorithm::SlidingWindowLog {
                limit: amount,
                window_ms: period_ms,
            },
            AlgorithmKind::Concurrency => return None,
        })
    }

    /// The algorithm with parameters `params`: every given parameter must be one it takes,
    /// every required one must be given, the rest take their defaults. The errors come in
    /// [`Param::ALL`] order, "takes no" before "needs". The result is not yet validated
    /// ([`Algorithm::validate`]).
    pub fn build(self, params: &Params) -> Result<Algorithm, Vec<ParamError>> {
        let mut errors: Vec<ParamError> = params
            .given()
            .filter_map(|p| self.check_param(p).err())
            .collect();
        errors.extend(
            self.params()
                .iter()
                .filter(|p| p.is_required() && !params.has(**p))
                .map(|&param| ParamError::Needs {
                    algorithm: self,
                    param,
                }),
        );
        if !errors.is_empty() {
            return Err(errors);
        }
        // Every required value is present past this point; the fallbacks are never used.
        let rate = params.rate.unwrap_or(Rate::per_second(1));
        let limit = params.limit.unwrap_or(1);
        let capacity = params.capacity.unwrap_or(1);
        let window_ms = params.window_ms.unwrap_or(1);
        Ok(match self {
            AlgorithmKind::TokenBucket => Algorithm::TokenBucket { capacity, rate },
            AlgorithmKind::Gcra => Algorithm::Gcra {
                rate,
                burst: params.burst.unwrap_or(DEFAULT_BURST),
            },
            AlgorithmKind::LeakyBucket => Algorithm::LeakyBucket {
                capacity,
                rate,
                mode: params.mode.unwrap_or(DEFAULT_MODE),
            },
            AlgorithmKind::FixedWindow => Algorithm::FixedWindow { limit, window_ms },
            AlgorithmKind::SlidingWindowCounter => {
                Algorithm::SlidingWindowCounter { limit, window_ms }
            }
            AlgorithmKind::SlidingWindowLog => Algorithm::SlidingWindowLog { limit, window_ms },
            AlgorithmKind::Concurrency => Algorithm::Concurrency {
                limit,
                lease_ms: params.lease_ms.unwrap_or(DEFAULT_LEASE_MS),
            },
        })
    }
}

impl fmt::Display for AlgorithmKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for AlgorithmKind {
    type Err = UnknownAlgorithm;
    /// A stable name or an alias of any algorithm.
    fn from_str(s: &str) -> Result<Self, UnknownAlgorithm> {
        Self::parse_among(s, &Self::ALL)
    }
}

impl Algorithm {
    /// Which algorithm this is.
    pub fn algorithm_kind(&self) -> AlgorithmKind {
        match self {
            Algorithm::TokenBucket { .. } => AlgorithmKind::TokenBucket,
            Algorithm::Gcra { .. } => AlgorithmKind::Gcra,
            Algorithm::LeakyBucket { .. } => AlgorithmKind::LeakyBucket,
            Algorithm::FixedWindow { .. } | Algorithm::CalendarWindow { .. } => {
                AlgorithmKind::FixedWindow
            }
            Algorithm::SlidingWindowCounter { .. } => AlgorithmKind::SlidingWindowCounter,
            Algorithm::SlidingWindowLog { .. } => AlgorithmKind::SlidingWindowLog,
            Algorithm::Concurrency { .. } => AlgorithmKind::Concurrency,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_are_in_kind_order_and_names_are_unique() {
        let mut names = std::collections::HashSet::new();
        let mut codes = std::collections::HashSet::new();
        for (i, info) in ALGORITHMS.iter().enumerate() {
            assert_eq!(info.kind.index(), i);
            assert_eq!(AlgorithmKind::ALL[i], info.kind);
            for n in std::iter::once(&info.name).chain(info.aliases) {
                assert!(names.insert(*n), "{n} is listed twice");
            }
            assert!(
                codes.insert(info.lua_code),
                "{} is listed twice",
                info.lua_code
            );
        }
    }

    #[test]
    fn names_and_aliases_parse_and_kind_names_match() {
        for info in &ALGORITHMS {
            assert_eq!(info.name.parse::<AlgorithmKind>().unwrap(), info.kind);
            for a in info.aliases {
                assert_eq!(a.parse::<AlgorithmKind>().unwrap(), info.kind);
            }
        }
        assert_eq!(
            "token_bucket".parse::<AlgorithmKind>().unwrap(),
            AlgorithmKind::TokenBucket
        );
        let e = "leaky-buckets".parse::<AlgorithmKind>().unwrap_err();
        assert_eq!(
            e.to_string(),
            "unknown algorithm \"leaky-buckets\": expected token-bucket, gcra, leaky-bucket, \
             fixed-window, sliding-counter, sliding-log or concurrency"
        );
        let e = AlgorithmKind::parse_among(
            "concurrency",
            &[AlgorithmKind::FixedWindow, AlgorithmKind::Gcra],
        )
        .unwrap_err();
        assert!(
            e.to_string().ends_with("expected fixed-window or gcra"),
            "{e}"
        );
    }

    #[test]
    fn build_reports_foreign_and_missing_parameters() {
        let p = Params {
            rate: Some(Rate::per_second(1)),
            capacity: Some(4),
            ..Params::default()
        };
        let e = AlgorithmKind::Gcra.build(&p).unwrap_err();
        assert_eq!(e.len(), 1);
        assert_eq!(
            e[0].to_string(),
            "gcra takes no capacity (it takes rate, burst)"
        );
        let e = AlgorithmKind::TokenBucket
            .build(&Params::default())
            .unwrap_err();
        let msgs: Vec<String> = e.iter().map(ToString::to_string).collect();
        assert_eq!(
            msgs,
            [
                "token-bucket needs capacity",
                "token-bucket needs rate (such as 5/s, 300/min)"
            ]
        );
        let e = AlgorithmKind::FixedWindow
            .build(&Params {
                limit: Some(3),
                ..Params::default()
            })
            .unwrap_err();
        assert_eq!(
            e[0].to_string(),
            "fixed-window needs window (such as 10s, 1m)"
        );
    }

    #[test]
    fn build_fills_defaults() {
        let c = AlgorithmKind::Concurrency
            .build(&Params {
                limit: Some(2),
                ..Params::default()
            })
            .unwrap();
        assert_eq!(
            c,
            Algorithm::Concurrency {
                limit: 2,
                lease_ms: 30_000
            }
        );
        let g = AlgorithmKind::Gcra
            .build(&Params {
                rate: Some(Rate::per_second(5)),
                ..Params::default()
            })
            .unwrap();
        assert_eq!(
            g,
            Algorithm::Gcra {
                rate: Rate::per_second(5),
                burst: 0
            }
        );
        for kind in AlgorithmKind::ALL {
            let full = Params {
                capacity: Some(3),
                rate: Some(Rate::per_second(3)),
                limit: Some(3),
                window_ms: Some(1000),
                ..Params::default()
            };
            let only_taken = Params {
                capacity: full.capacity.filter(|_| kind.takes(Param::Capacity)),
                rate: full.rate.filter(|_| kind.takes(Param::Rate)),
                limit: full.limit.filter(|_| kind.takes(Param::Limit)),
                window_ms: full.window_ms.filter(|_| kind.takes(Param::Window)),
                ..Params::default()
            };
            let a = kind.build(&only_taken).unwrap();
            assert_eq!(a.algorithm_kind(), kind);
            assert_eq!(a.kind(), kind.name());
        }
    }

    #[test]
    fn for_quota_round_trips_through_quota_and_window() {
        for kind in AlgorithmKind::ALL {
            match kind.for_quota(7, 60_000) {
                Some(a) => {
                    assert_eq!(a.algorithm_kind(), kind);
                    assert_eq!((a.quota(), a.window_ms()), (7, 60_000), "{kind}");
                    a.validate().unwrap();
                }
                None => assert_eq!(kind, AlgorithmKind::Concurrency),
            }
            assert!(kind.for_quota(0, 1000).is_none());
        }
    }
}
