//! Parameter values as a reader (config file, CLI flags, `--expect` specs) collected them,
//! and the errors the registry answers about them. Apart from the registry table so the
//! table reads on its own.

use super::registry::{AlgorithmKind, Param};
use crate::policy::{LeakyMode, Rate};

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
