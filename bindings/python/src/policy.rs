//! `Policy`: a named limit, built with one constructor per algorithm or read from a
//! `sluice.toml` by the configuration crate's own reader.
//!
//! Every constructor fills the core registry's [`Params`] and lets
//! [`AlgorithmKind::build`] and [`Policy::validate`] judge them, so a Python policy is
//! refused with the same words as a `sluice.toml` entry or a `sluice check` flag ("gcra
//! takes no capacity", "rate must be at least 1").

use std::str::FromStr;
use std::sync::Arc;

use pyo3::prelude::*;
use sluice::core::algorithm::{AlgorithmKind, Params};
use sluice::core::policy::parse_duration_ms;
use sluice::{DecisionMode, FailureMode, LeakyMode, Policy, Rate};

use crate::{ConfigError, PolicyError};

/// A duration as Python code writes it: `"10s"`, `"500ms"`, `"1m"`, or whole seconds.
#[derive(Debug, FromPyObject)]
pub(crate) enum DurationArg {
    Seconds(u64),
    Text(String),
}

impl DurationArg {
    fn millis(&self, what: &str) -> PyResult<u64> {
        match self {
            DurationArg::Seconds(s) => s
                .checked_mul(1000)
                .ok_or_else(|| PolicyError::new_err(format!("{what} is too long"))),
            DurationArg::Text(t) => {
                parse_duration_ms(t).map_err(|e| PolicyError::new_err(format!("{what}: {e}")))
            }
        }
    }
}

fn rate(text: &str) -> PyResult<Rate> {
    Rate::from_str(text).map_err(|e| PolicyError::new_err(e.to_string()))
}

fn failure_mode(text: &str) -> PyResult<FailureMode> {
    // FailureMode's own FromStr: one spelling of the modes everywhere.
    text.parse()
        .map_err(|e| PolicyError::new_err(format!("failure_mode: {e}")))
}

/// `mode` and `lease_ttl` as `sluice.toml` spells them: `"exact"` (one store call per check)
/// or `"leased"` (slices of the quota spent locally, each for at most `lease_ttl`).
fn decision_mode(mode: &str, lease_ttl: Option<&DurationArg>) -> PyResult<DecisionMode> {
    match (mode, lease_ttl) {
        ("exact", None) => Ok(DecisionMode::Exact),
        ("exact", Some(_)) => Err(PolicyError::new_err(
            "lease_ttl: only a policy with mode=\"leased\" takes lease_ttl",
        )),
        ("leased", None) => Ok(DecisionMode::leased()),
        ("leased", Some(ttl)) => Ok(DecisionMode::Leased {
            ttl_ms: ttl.millis("lease_ttl")?,
        }),
        (other, _) => Err(PolicyError::new_err(format!(
            "mode must be \"exact\" or \"leased\", not {other:?}"
        ))),
    }
}

/// The settings every algorithm shares.
struct Common<'a> {
    failure_mode: &'a str,
    shadow: bool,
    shards: u32,
    mode: DecisionMode,
}

/// Builds and validates a policy from registry parameters.
fn build(name: &str, kind: AlgorithmKind, params: &Params, common: Common<'_>) -> PyResult<Policy> {
    let algorithm = kind.build(params).map_err(|errors| {
        let text: Vec<String> = errors.iter().map(ToString::to_string).collect();
        PolicyError::new_err(text.join("; "))
    })?;
    let policy = Policy {
        name: name.to_string(),
        algorithm,
        failure_mode: failure_mode(common.failure_mode)?,
        shadow: common.shadow,
        shards: common.shards,
        mode: common.mode,
    };
    policy
        .validate()
        .map_err(|e| PolicyError::new_err(format!("policy {name:?}: {e}")))?;
    Ok(policy)
}

/// A named limit: an algorithm with its parameters, a failure mode, shadow and shards.
#[pyclass(name = "Policy", module = "sluice", frozen)]
#[derive(Debug, Clone)]
pub struct PyPolicy {
    pub(crate) inner: Arc<Policy>,
}

impl PyPolicy {
    fn of(p: Policy) -> Self {
        Self { inner: Arc::new(p) }
    }
}

#[pymethods]
impl PyPolicy {
    /// A bucket of `capacity` tokens refilled at `rate` (`"5/s"`).
    #[staticmethod]
    #[allow(clippy::too_many_arguments)]
    #[pyo3(signature = (name, *, capacity, rate, mode="exact", lease_ttl=None, failure_mode="open", shadow=false, shards=1))]
    fn token_bucket(
        name: &str,
        capacity: u64,
        rate: &str,
        mode: &str,
        lease_ttl: Option<DurationArg>,
        failure_mode: &str,
        shadow: bool,
        shards: u32,
    ) -> PyResult<Self> {
        let params = Params {
            capacity: Some(capacity),
            rate: Some(self::rate(rate)?),
            ..Params::default()
        };
        let common = Common {
            failure_mode,
            shadow,
            shards,
            mode: decision_mode(mode, lease_ttl.as_ref())?,
        };
        build(name, AlgorithmKind::TokenBucket, &params, common).map(Self::of)
    }

    /// GCRA (redis-cell's parameters): a steady `rate` plus `burst` extra requests.
    #[staticmethod]
    #[allow(clippy::too_many_arguments)]
    #[pyo3(signature = (name, *, rate, burst=0, mode="exact", lease_ttl=None, failure_mode="open", shadow=false, shards=1))]
    fn gcra(
        name: &str,
        rate: &str,
        burst: u64,
        mode: &str,
        lease_ttl: Option<DurationArg>,
        failure_mode: &str,
        shadow: bool,
        shards: u32,
    ) -> PyResult<Self> {
        let params = Params {
            rate: Some(self::rate(rate)?),
            burst: Some(burst),
            ..Params::default()
        };
        let common = Common {
            failure_mode,
            shadow,
            shards,
            mode: decision_mode(mode, lease_ttl.as_ref())?,
        };
        build(name, AlgorithmKind::Gcra, &params, common).map(Self::of)
    }

    /// A bucket of `capacity` draining at `rate`; `mode` is `"policing"` or `"shaping"` (or the
    /// decision mode `"exact"`, with policing, as `sluice.toml` reads it).
    #[staticmethod]
    #[pyo3(signature = (name, *, capacity, rate, mode="policing", lease_ttl=None, failure_mode="open", shadow=false, shards=1))]
    #[allow(clippy::too_many_arguments)]
    fn leaky_bucket(
        name: &str,
        capacity: u64,
        rate: &str,
        mode: &str,
        lease_ttl: Option<DurationArg>,
        failure_mode: &str,
        shadow: bool,
        shards: u32,
    ) -> PyResult<Self> {
        // "exact" and "leased" name the decision mode; anything else the bucket's own.
        let (leaky, decision) = match mode {
            "exact" | "leased" => (
                LeakyMode::Policing,
                decision_mode(mode, lease_ttl.as_ref())?,
            ),
            other => (
                LeakyMode::from_str(other).map_err(|e| PolicyError::new_err(e.to_string()))?,
                decision_mode("exact", lease_ttl.as_ref())?,
            ),
        };
        let params = Params {
            capacity: Some(capacity),
            rate: Some(self::rate(rate)?),
            mode: Some(leaky),
            ..Params::default()
        };
        let common = Common {
            failure_mode,
            shadow,
            shards,
            mode: decision,
        };
        build(name, AlgorithmKind::LeakyBucket, &params, common).map(Self::of)
    }

    /// `limit` requests per `window`, windows aligned to the Unix epoch.
    #[staticmethod]
    #[allow(clippy::too_many_arguments)]
    #[pyo3(signature = (name, *, limit, window, mode="exact", lease_ttl=None, failure_mode="open", shadow=false, shards=1))]
    fn fixed_window(
        name: &str,
        limit: u64,
        window: DurationArg,
        mode: &str,
        lease_ttl: Option<DurationArg>,
        failure_mode: &str,
        shadow: bool,
        shards: u32,
    ) -> PyResult<Self> {
        let common = Common {
            failure_mode,
            shadow,
            shards,
            mode: decision_mode(mode, lease_ttl.as_ref())?,
        };
        windowed(name, AlgorithmKind::FixedWindow, limit, &window, common)
    }

    /// `limit` per sliding `window`, estimated from the current and previous fixed windows.
    #[staticmethod]
    #[allow(clippy::too_many_arguments)]
    #[pyo3(signature = (name, *, limit, window, mode="exact", lease_ttl=None, failure_mode="open", shadow=false, shards=1))]
    fn sliding_counter(
        name: &str,
        limit: u64,
        window: DurationArg,
        mode: &str,
        lease_ttl: Option<DurationArg>,
        failure_mode: &str,
        shadow: bool,
        shards: u32,
    ) -> PyResult<Self> {
        let common = Common {
            failure_mode,
            shadow,
            shards,
            mode: decision_mode(mode, lease_ttl.as_ref())?,
        };
        windowed(
            name,
            AlgorithmKind::SlidingWindowCounter,
            limit,
            &window,
            common,
        )
    }

    /// Exactly `limit` per sliding `window` (a log of admitted requests).
    #[staticmethod]
    #[allow(clippy::too_many_arguments)]
    #[pyo3(signature = (name, *, limit, window, mode="exact", lease_ttl=None, failure_mode="open", shadow=false, shards=1))]
    fn sliding_log(
        name: &str,
        limit: u64,
        window: DurationArg,
        mode: &str,
        lease_ttl: Option<DurationArg>,
        failure_mode: &str,
        shadow: bool,
        shards: u32,
    ) -> PyResult<Self> {
        let common = Common {
            failure_mode,
            shadow,
            shards,
            mode: decision_mode(mode, lease_ttl.as_ref())?,
        };
        windowed(
            name,
            AlgorithmKind::SlidingWindowLog,
            limit,
            &window,
            common,
        )
    }

    /// At most `limit` requests in flight; a lease not released expires after `lease`.
    #[staticmethod]
    #[allow(clippy::too_many_arguments)]
    #[pyo3(signature = (name, *, limit, lease=DurationArg::Seconds(30), mode="exact", lease_ttl=None, failure_mode="open", shadow=false, shards=1))]
    fn concurrency(
        name: &str,
        limit: u64,
        lease: DurationArg,
        mode: &str,
        lease_ttl: Option<DurationArg>,
        failure_mode: &str,
        shadow: bool,
        shards: u32,
    ) -> PyResult<Self> {
        let params = Params {
            limit: Some(limit),
            lease_ms: Some(lease.millis("lease")?),
            ..Params::default()
        };
        let common = Common {
            failure_mode,
            shadow,
            shards,
            mode: decision_mode(mode, lease_ttl.as_ref())?,
        };
        build(name, AlgorithmKind::Concurrency, &params, common).map(Self::of)
    }

    /// The one `[policies.NAME]` table of a TOML text, read by the `sluice.toml` reader
    /// (`sluice_config`), so it takes exactly what `sluice serve` takes.
    #[staticmethod]
    #[pyo3(signature = (text, *, file="<inline>"))]
    fn from_toml(text: &str, file: &str) -> PyResult<Self> {
        let mut all = all_from_toml(text, file)?;
        match all.len() {
            1 => Ok(all.remove(0)),
            n => Err(ConfigError::new_err(format!(
                "{file}: the TOML holds {n} policies; Policy.from_toml takes exactly one (Policy.all_from_toml reads several)"
            ))),
        }
    }

    /// Every `[policies.NAME]` table of a TOML text (a whole `sluice.toml` works), in name
    /// order, read by the `sluice.toml` reader itself. Errors raise `ConfigError` with one
    /// `FILE:LINE: field: message` line per problem (`file` names the text in them).
    #[staticmethod]
    #[pyo3(signature = (text, *, file="<inline>"))]
    fn all_from_toml(text: &str, file: &str) -> PyResult<Vec<Self>> {
        all_from_toml(text, file)
    }

    /// `"exact"` or `"leased"`: how an instance decides this policy's checks.
    #[getter]
    fn decision_mode(&self) -> &'static str {
        match self.inner.mode {
            DecisionMode::Exact => "exact",
            DecisionMode::Leased { .. } => "leased",
        }
    }
    /// Leased mode: the longest a slice is spent, in milliseconds (`None` in exact mode).
    #[getter]
    fn lease_ttl_ms(&self) -> Option<u64> {
        match self.inner.mode {
            DecisionMode::Exact => None,
            DecisionMode::Leased { ttl_ms } => Some(ttl_ms),
        }
    }
    /// The policy's name (part of key names and header values).
    #[getter]
    fn name(&self) -> &str {
        &self.inner.name
    }
    /// The algorithm's stable name: `token-bucket`, `gcra`, `leaky-bucket`, `fixed-window`,
    /// `sliding-counter`, `sliding-log` or `concurrency`.
    #[getter]
    fn algorithm(&self) -> &'static str {
        self.inner.algorithm.kind()
    }
    /// The quota shown to clients (`q` of `RateLimit-Policy`).
    #[getter]
    fn quota(&self) -> u64 {
        self.inner.algorithm.quota()
    }
    /// The window shown to clients, in milliseconds (`w` of `RateLimit-Policy`, in seconds).
    #[getter]
    fn window_ms(&self) -> u64 {
        self.inner.algorithm.window_ms()
    }
    /// `open`, `closed` or `local`.
    #[getter]
    fn failure_mode(&self) -> &'static str {
        self.inner.failure_mode.as_str()
    }
    /// True when the policy only counts and never denies.
    #[getter]
    fn shadow(&self) -> bool {
        self.inner.shadow
    }
    /// How many sub-keys each identity's state is split over.
    #[getter]
    fn shards(&self) -> u32 {
        self.inner.shards
    }

    fn __repr__(&self) -> String {
        format!(
            "Policy({:?}, algorithm={:?}, quota={}, window_ms={}, failure_mode={:?})",
            self.inner.name,
            self.inner.algorithm.kind(),
            self.inner.algorithm.quota(),
            self.inner.algorithm.window_ms(),
            self.failure_mode()
        )
    }

    fn __eq__(&self, other: &Self) -> bool {
        self.inner == other.inner
    }
}

fn windowed(
    name: &str,
    kind: AlgorithmKind,
    limit: u64,
    window: &DurationArg,
    common: Common<'_>,
) -> PyResult<PyPolicy> {
    let params = Params {
        limit: Some(limit),
        window_ms: Some(window.millis("window")?),
        ..Params::default()
    };
    build(name, kind, &params, common).map(PyPolicy::of)
}

/// The policies of a configuration text, by [`sluice_config::parse_policies`].
fn all_from_toml(text: &str, file: &str) -> PyResult<Vec<PyPolicy>> {
    let policies = sluice_config::parse_policies(text, file)
        .map_err(|e| ConfigError::new_err(e.to_string()))?;
    if policies.is_empty() {
        return Err(ConfigError::new_err(format!(
            "{file}: the TOML has no [policies.NAME] table"
        )));
    }
    Ok(policies
        .into_values()
        .map(|pc| PyPolicy { inner: pc.policy })
        .collect())
}
