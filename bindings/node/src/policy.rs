//! `Policy`: a named limit, built from an algorithm name and an options object.
//!
//! `index.js` gives each algorithm its own constructor (`Policy.tokenBucket(name, opts)`);
//! all of them land in [`Policy::create`], which fills the core registry's [`Params`] and
//! lets [`AlgorithmKind::build`] and [`sluice::Policy::validate`] judge them, so a JS policy
//! is refused with the same words as a `sluice.toml` entry ("gcra takes no capacity").

use std::str::FromStr;
use std::sync::Arc;

use napi::Either;
use napi_derive::napi;
use sluice::core::algorithm::{AlgorithmKind, Params};
use sluice::core::policy::parse_duration_ms;
use sluice::{DecisionMode, FailureMode, LeakyMode, Rate};

use crate::{invalid, number, whole};

/// Every option any algorithm takes, plus the ones all share.
#[napi(object)]
#[derive(Debug, Default)]
pub struct PolicyOptions {
    /// Bucket size (token and leaky bucket).
    pub capacity: Option<f64>,
    /// Refill, drain or emission rate: `"5/s"`, `"300/min"`.
    pub rate: Option<String>,
    /// GCRA: extra requests beyond the steady rate (default 0).
    pub burst: Option<f64>,
    /// Requests per window, or leases held at once.
    pub limit: Option<f64>,
    /// Window length: `"10s"`, `"1m"`, or a number of seconds.
    pub window: Option<Either<String, f64>>,
    /// The decision mode, `"exact"` (default) or `"leased"` (slices of the quota spent
    /// locally, as `mode = "leased"` in `sluice.toml`); a leaky bucket's `"policing"`
    /// (default) or `"shaping"`.
    pub mode: Option<String>,
    /// Leased mode: the longest an instance spends a slice (`"1s"` default, or seconds).
    pub lease_ttl: Option<Either<String, f64>>,
    /// Concurrency: how long an unreleased lease lives (`"30s"` default, or seconds).
    pub lease: Option<Either<String, f64>>,
    /// `"open"` (default), `"closed"` or `"local"`.
    pub failure_mode: Option<String>,
    /// Count but never deny.
    pub shadow: Option<bool>,
    /// Split each identity's state over this many keys (hot keys on Redis Cluster).
    pub shards: Option<u32>,
}

fn duration_ms(value: &Either<String, f64>, what: &str) -> napi::Result<u64> {
    match value {
        Either::A(text) => parse_duration_ms(text).map_err(|e| invalid(format!("{what}: {e}"))),
        Either::B(secs) => {
            let ms = secs * 1000.0;
            whole(ms, what).map_err(|_| {
                invalid(format!(
                    "{what} must be a duration such as \"10s\" or a positive number of seconds, not {secs}"
                ))
            })
        }
    }
}

/// `mode` and `leaseTtl` split as `sluice.toml` splits them: `"exact"` and `"leased"` are the
/// decision mode of any algorithm, any other `mode` is a leaky bucket's policing or shaping.
fn modes(
    kind: AlgorithmKind,
    mode: Option<&str>,
    lease_ttl: Option<&Either<String, f64>>,
) -> napi::Result<(DecisionMode, Option<LeakyMode>)> {
    let decision = match mode {
        Some("leased") => DecisionMode::Leased {
            ttl_ms: match lease_ttl {
                None => DecisionMode::DEFAULT_LEASE_TTL_MS,
                Some(ttl) => duration_ms(ttl, "leaseTtl")?,
            },
        },
        _ if lease_ttl.is_some() => {
            return Err(invalid(
                "leaseTtl: only a policy with mode: \"leased\" takes leaseTtl",
            ));
        }
        _ => DecisionMode::Exact,
    };
    let leaky = match mode {
        None | Some("exact" | "leased") => None,
        Some(m) if kind == AlgorithmKind::LeakyBucket => {
            Some(LeakyMode::from_str(m).map_err(|e| invalid(format!("mode: {e}")))?)
        }
        Some(m) => {
            return Err(invalid(format!(
                "mode must be \"exact\" or \"leased\", not {m:?}"
            )));
        }
    };
    Ok((decision, leaky))
}

fn failure_mode(text: Option<&str>) -> napi::Result<FailureMode> {
    // FailureMode's own FromStr: one spelling of the modes everywhere.
    text.unwrap_or("open")
        .parse()
        .map_err(|e| invalid(format!("failureMode: {e}")))
}

/// A named limit: an algorithm with its parameters, a failure mode, shadow and shards.
#[napi]
#[derive(Debug, Clone)]
pub struct Policy {
    pub(crate) inner: Arc<sluice::Policy>,
}

#[napi]
impl Policy {
    /// A policy of `algorithm` (a registry name such as `token-bucket`) named `name`.
    #[napi(factory)]
    pub fn create(
        algorithm: String,
        name: String,
        options: Option<PolicyOptions>,
    ) -> napi::Result<Self> {
        let o = options.unwrap_or_default();
        let kind = AlgorithmKind::from_str(&algorithm).map_err(|e| invalid(e.to_string()))?;
        let (decision_mode, leaky_mode) = modes(kind, o.mode.as_deref(), o.lease_ttl.as_ref())?;
        let params = Params {
            capacity: o.capacity.map(|v| whole(v, "capacity")).transpose()?,
            rate: o
                .rate
                .as_deref()
                .map(|r| Rate::from_str(r).map_err(|e| invalid(e.to_string())))
                .transpose()?,
            burst: o.burst.map(|v| whole(v, "burst")).transpose()?,
            limit: o.limit.map(|v| whole(v, "limit")).transpose()?,
            window_ms: o
                .window
                .as_ref()
                .map(|w| duration_ms(w, "window"))
                .transpose()?,
            mode: leaky_mode,
            lease_ms: o
                .lease
                .as_ref()
                .map(|l| duration_ms(l, "lease"))
                .transpose()?,
        };
        let algorithm = kind.build(&params).map_err(|errors| {
            let text: Vec<String> = errors.iter().map(ToString::to_string).collect();
            invalid(text.join("; "))
        })?;
        let policy = sluice::Policy {
            name: name.clone(),
            algorithm,
            failure_mode: failure_mode(o.failure_mode.as_deref())?,
            shadow: o.shadow.unwrap_or(false),
            shards: o.shards.unwrap_or(1),
            mode: decision_mode,
        };
        policy
            .validate()
            .map_err(|e| invalid(format!("policy {name:?}: {e}")))?;
        Ok(Self {
            inner: Arc::new(policy),
        })
    }

    /// The name (part of key names and header values).
    #[napi(getter)]
    pub fn name(&self) -> String {
        self.inner.name.clone()
    }

    /// The algorithm's stable name (`token-bucket`, `gcra`, ...).
    #[napi(getter)]
    pub fn algorithm(&self) -> String {
        self.inner.algorithm.kind().to_string()
    }

    /// The quota shown to clients (`q` of `RateLimit-Policy`).
    #[napi(getter)]
    pub fn quota(&self) -> f64 {
        number(self.inner.algorithm.quota())
    }

    /// The window shown to clients, in ms (`w` of `RateLimit-Policy` is it in seconds).
    #[napi(getter)]
    pub fn window_ms(&self) -> f64 {
        number(self.inner.algorithm.window_ms())
    }

    /// True when admissions take leases a release gives back (concurrency), as the core
    /// registry says.
    #[napi(getter)]
    pub fn holds_leases(&self) -> bool {
        self.inner.algorithm.holds_leases()
    }

    /// `open`, `closed` or `local`.
    #[napi(getter)]
    pub fn failure_mode(&self) -> String {
        self.inner.failure_mode.as_str().to_string()
    }

    /// True when the policy only counts and never denies.
    #[napi(getter)]
    pub fn shadow(&self) -> bool {
        self.inner.shadow
    }

    /// How many keys each identity's state is split over.
    #[napi(getter)]
    pub fn shards(&self) -> u32 {
        self.inner.shards
    }

    /// `exact` or `leased`: how an instance decides this policy's checks.
    #[napi(getter)]
    pub fn decision_mode(&self) -> String {
        match self.inner.mode {
            DecisionMode::Exact => "exact",
            DecisionMode::Leased { .. } => "leased",
        }
        .to_string()
    }

    /// Leased mode: the longest a slice is spent, in ms (`null` in exact mode).
    #[napi(getter)]
    pub fn lease_ttl_ms(&self) -> Option<f64> {
        match self.inner.mode {
            DecisionMode::Exact => None,
            DecisionMode::Leased { ttl_ms } => Some(number(ttl_ms)),
        }
    }
}
