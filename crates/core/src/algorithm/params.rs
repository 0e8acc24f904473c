//! Parameter values as a reader (config file, CLI flags, `--expect` specs) collected them,
//! and the errors the registry answers about them. Apart from the registry table so the
//! table reads on its own.

use std::fmt;

use super::registry::{AlgorithmKind, Param};
use crate::policy::{Algorithm, LeakyMode, Rate, format_duration_ms};

/// Parameter values as given, already parsed; absent ones are `None`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Params {
    /// `capacity`.
    pub capacity: Option<u64>,
    /// `rate`.
    pub rate: Option<Rate>,
    /// `burst`.
    pub burst: Option<u64>,
    /// `limit`.
    pub limit: Option<u64>,
    /// `window`, in milliseconds.
    pub window_ms: Option<u64>,
    /// `mode`.
    pub mode: Option<LeakyMode>,
    /// `lease`, in milliseconds.
    pub lease_ms: Option<u64>,
}

impl Params {
    /// True when `param` has a value.
    pub fn has(&self, param: Param) -> bool {
        match param {
            Param::Capacity => self.capacity.is_some(),
            Param::Rate => self.rate.is_some(),
            Param::Burst => self.burst.is_some(),
            Param::Limit => self.limit.is_some(),
            Param::Window => self.window_ms.is_some(),
            Param::Mode => self.mode.is_some(),
            Param::Lease => self.lease_ms.is_some(),
        }
    }

    /// The parameters with a value, in [`Param::ALL`] order.
    pub fn given(&self) -> impl Iterator<Item = Param> + '_ {
        Param::ALL.into_iter().filter(|p| self.has(*p))
    }
}

impl Algorithm {
    /// The parameters this algorithm is built from, as [`AlgorithmKind::build`] takes them
    /// (a calendar window's `window` is its longest length; [`fmt::Display`] names the
    /// calendar period instead).
    pub fn params(&self) -> Params {
        let mut p = Params::default();
        match *self {
            Algorithm::TokenBucket { capacity, rate } => {
                p.capacity = Some(capacity);
                p.rate = Some(rate);
            }
            Algorithm::Gcra { rate, burst } => {
                p.rate = Some(rate);
                p.burst = Some(burst);
            }
            Algorithm::LeakyBucket {
                capacity,
                rate,
                mode,
            } => {
                p.capacity = Some(capacity);
                p.rate = Some(rate);
                p.mode = Some(mode);
            }
            Algorithm::FixedWindow { limit, window_ms }
            | Algorithm::SlidingWindowCounter { limit, window_ms }
            | Algorithm::SlidingWindowLog { limit, window_ms } => {
                p.limit = Some(limit);
                p.window_ms = Some(window_ms);
            }
            Algorithm::CalendarWindow { limit, period } => {
                p.limit = Some(limit);
                p.window_ms = Some(period.max_ms());
            }
            Algorithm::Concurrency { limit, lease_ms } => {
                p.limit = Some(limit);
                p.lease_ms = Some(lease_ms);
            }
        }
        p
    }
}

/// `<name> <param>=<value> ...` in the registry's parameter order, each value spelled as the
/// config file and the CLI flags read it: `token-bucket capacity=10 rate=5/s`,
/// `fixed-window limit=100 window="1 month"`.
impl fmt::Display for Algorithm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.kind())?;
        let p = self.params();
        for &param in self.algorithm_kind().params() {
            write!(f, " {param}=")?;
            match (param, self) {
                (Param::Window, Algorithm::CalendarWindow { period, .. }) => {
                    write!(f, "\"{period}\"")?
                }
                (Param::Capacity, _) => write!(f, "{}", p.capacity.unwrap_or_default())?,
                (Param::Burst, _) => write!(f, "{}", p.burst.unwrap_or_default())?,
                (Param::Limit, _) => write!(f, "{}", p.limit.unwrap_or_default())?,
                (Param::Rate, _) => match p.rate {
                    Some(r) => write!(f, "{r}")?,
                    None => f.write_str("?")?,
                },
                (Param::Window, _) => {
                    f.write_str(&format_duration_ms(p.window_ms.unwrap_or_default()))?
                }
                (Param::Lease, _) => {
                    f.write_str(&format_duration_ms(p.lease_ms.unwrap_or_default()))?
                }
                (Param::Mode, _) => f.write_str(match p.mode {
                    Some(LeakyMode::Shaping) => "shaping",
                    _ => "policing",
                })?,
            }
        }
        Ok(())
    }
}

/// A parameter given to an algorithm that does not take it, or a required one missing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ParamError {
    /// `param` was given but `algorithm` does not take it.
    #[error("{algorithm} takes no {param} (it takes {})", list(algorithm.params()))]
    TakesNo {
        /// The algorithm.
        algorithm: AlgorithmKind,
        /// The parameter it does not take.
        param: Param,
    },
    /// `algorithm` needs `param`, which has no default.
    #[error("{algorithm} needs {param}{}", param.example().map(|e| format!(" (such as {e})")).unwrap_or_default())]
    Needs {
        /// The algorithm.
        algorithm: AlgorithmKind,
        /// The missing parameter.
        param: Param,
    },
}

impl ParamError {
    /// The parameter the error is about.
    pub fn param(&self) -> Param {
        match *self {
            ParamError::TakesNo { param, .. } | ParamError::Needs { param, .. } => param,
        }
    }
}

fn list(params: &[Param]) -> String {
    params
        .iter()
        .map(|p| p.name())
        .collect::<Vec<_>>()
        .join(", ")
}

/// A name that is no algorithm's name or alias.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown algorithm {given:?}: expected {}", one_of(expected))]
pub struct UnknownAlgorithm {
    /// What was given.
    pub given: String,
    /// The stable names that were allowed.
    pub expected: Vec<&'static str>,
}

/// `a, b or c`.
fn one_of(names: &[&str]) -> String {
    match names.split_last() {
        None => String::new(),
        Some((last, [])) => (*last).to_string(),
        Some((last, rest)) => format!("{} or {last}", rest.join(", ")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algorithm::calendar::CalendarPeriod;

    #[test]
    fn params_build_the_same_algorithm_back_and_display_in_registry_order() {
        let cases = [
            (
                Algorithm::TokenBucket {
                    capacity: 10,
                    rate: Rate::per_second(5),
                },
                "token-bucket capacity=10 rate=5/s",
            ),
            (
                Algorithm::Gcra {
                    rate: Rate::new(300, 60_000),
                    burst: 2,
                },
                "gcra rate=300/min burst=2",
            ),
            (
                Algorithm::LeakyBucket {
                    capacity: 4,
                    rate: Rate::per_second(2),
                    mode: LeakyMode::Shaping,
                },
                "leaky-bucket capacity=4 rate=2/s mode=shaping",
            ),
            (
                Algorithm::SlidingWindowLog {
                    limit: 3,
                    window_ms: 10_000,
                },
                "sliding-log limit=3 window=10s",
            ),
            (
                Algorithm::Concurrency {
                    limit: 2,
                    lease_ms: 30_000,
                },
                "concurrency limit=2 lease=30s",
            ),
        ];
        for (a, shown) in cases {
            assert_eq!(a.algorithm_kind().build(&a.params()).unwrap(), a);
            assert_eq!(a.to_string(), shown);
        }
        let month = Algorithm::CalendarWindow {
            limit: 100,
            period: CalendarPeriod::Month,
        };
        assert_eq!(
            month.to_string(),
            "fixed-window limit=100 window=\"1 month\""
        );
        assert!(
            Algorithm::Concurrency {
                limit: 1,
                lease_ms: 1
            }
            .holds_leases()
        );
        assert!(!month.holds_leases());
    }
}
