//! Policies: what a limit is. A [`Policy`] names an [`Algorithm`] with its parameters and how
//! failures of the store are handled. Parsing of the human forms (`5/s`, `300/min`, `10s`)
//! lives here so the CLI, the config file and the HTTP layer all accept the same spelling.

use serde::{Deserialize, Serialize};
use std::fmt;

pub use crate::algorithm::calendar::CalendarPeriod;
use std::str::FromStr;

// `Algorithm`'s methods live with the algorithms: what its parameters amount to in
// `algorithm/shape.rs`, their bounds in `algorithm/validate.rs`, names in
// `algorithm/registry.rs`.

/// The largest integer every store can represent exactly (Lua numbers are doubles).
pub const MAX_EXACT: u64 = 1 << 53;

/// A rate: `amount` units per `per_ms` milliseconds (`5/s` is `{amount: 5, per_ms: 1000}`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Rate {
    /// Units admitted (or refilled) per period.
    pub amount: u64,
    /// The period in milliseconds.
    pub per_ms: u64,
}

impl Rate {
    /// `amount` per `per_ms` milliseconds.
    pub const fn new(amount: u64, per_ms: u64) -> Self {
        Self { amount, per_ms }
    }
    /// `amount` per second.
    pub const fn per_second(amount: u64) -> Self {
        Self::new(amount, 1000)
    }
    /// The same rate with amount and period divided by their greatest common divisor, so the
    /// scaled integer arithmetic of the algorithms stays as small as possible.
    #[inline]
    pub fn reduced(self) -> Self {
        let g = gcd(self.amount, self.per_ms).max(1);
        if g == 1 {
            return self;
        }
        Self::new(self.amount / g, self.per_ms / g)
    }
}

/// Binary GCD (Stein's): shifts and subtractions instead of one division per step, since the
/// token and leaky buckets reduce their rate on every decision.
#[inline]
fn gcd(mut a: u64, mut b: u64) -> u64 {
    if a == 0 || b == 0 {
        return a | b;
    }
    let shift = (a | b).trailing_zeros();
    a >>= a.trailing_zeros();
    loop {
        b >>= b.trailing_zeros();
        if a > b {
            std::mem::swap(&mut a, &mut b);
        }
        b -= a;
        if b == 0 {
            return a << shift;
        }
    }
}

impl fmt::Display for Rate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.per_ms {
            1000 => write!(f, "{}/s", self.amount),
            60_000 => write!(f, "{}/min", self.amount),
            3_600_000 => write!(f, "{}/h", self.amount),
            86_400_000 => write!(f, "{}/d", self.amount),
            ms => write!(f, "{}/{}", self.amount, format_duration_ms(ms)),
        }
    }
}

impl FromStr for Rate {
    type Err = PolicyError;
    /// Parses `5/s`, `300/min`, `1000/day`, `10/2s`, `7/500ms`.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = || {
            PolicyError::Parse(format!(
                "invalid rate {s:?}: expected AMOUNT/UNIT such as 5/s, 300/min, 10/2s"
            ))
        };
        let (amount, unit) = s.trim().split_once('/').ok_or_else(bad)?;
        let amount: u64 = amount.trim().parse().map_err(|_| bad())?;
        let unit = unit.trim();
        let per_ms = match unit {
            "ms" => 1,
            "s" | "sec" | "second" => 1000,
            "m" | "min" | "minute" => 60_000,
            "h" | "hour" => 3_600_000,
            "d" | "day" => 86_400_000,
            "mo" | "mon" | "month" | "months" => {
                return Err(PolicyError::Parse(format!(
                    "invalid rate {s:?}: a month has no fixed length; for a quota per calendar \
                     month use algorithm = \"fixed-window\" with limit = {amount} and \
                     window = \"1 month\""
                )));
            }
            other => parse_duration_ms(other).map_err(|_| bad())?,
        };
        if amount == 0 || per_ms == 0 {
            return Err(PolicyError::Invalid(format!("rate {s:?} must be positive")));
        }
        Ok(Rate::new(amount, per_ms))
    }
}

/// The longest duration sluice accepts anywhere (configuration, API, command line): 36,500
/// days, about a century. Anything longer is a typo or an attempt to overflow an expiry
/// (`now + duration`), and one ceiling means one answer wherever a duration is read.
pub const MAX_DURATION_MS: u64 = 36_500 * 86_400_000;

/// [`MAX_DURATION_MS`] as a [`std::time::Duration`].
pub const MAX_DURATION: std::time::Duration = std::time::Duration::from_millis(MAX_DURATION_MS);

/// `ms` when it is at most [`MAX_DURATION_MS`], else the error every duration reader gives.
pub fn within_max_duration(ms: u64) -> Result<u64, PolicyError> {
    if ms > MAX_DURATION_MS {
        return Err(PolicyError::Invalid(format!(
            "duration of {ms} ms is longer than the longest accepted, 36500d (100 years)"
        )));
    }
    Ok(ms)
}

/// Parses a duration such as `500ms`, `10s`, `1m`, `2h`, `1d` (or a bare number of seconds)
/// into milliseconds; at most [`MAX_DURATION_MS`].
pub fn parse_duration_ms(s: &str) -> Result<u64, PolicyError> {
    let s = s.trim();
    let bad = || {
        PolicyError::Parse(format!(
            "invalid duration {s:?}: expected e.g. 500ms, 10s, 1m, 2h, 1d"
        ))
    };
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let n: u64 = num.parse().map_err(|_| bad())?;
    let mult = match unit.trim() {
        "ms" => 1,
        "" | "s" | "sec" => 1000,
        "m" | "min" => 60_000,
        "h" => 3_600_000,
        "d" => 86_400_000,
        _ => return Err(bad()),
    };
    let too_long = || {
        PolicyError::Invalid(format!(
            "duration {s:?} is longer than the longest accepted, 36500d (100 years)"
        ))
    };
    match n.checked_mul(mult) {
        Some(ms) if ms <= MAX_DURATION_MS => Ok(ms),
        _ => Err(too_long()),
    }
}

/// Formats milliseconds the way [`parse_duration_ms`] reads them.
pub fn format_duration_ms(ms: u64) -> String {
    if ms.is_multiple_of(86_400_000) {
        format!("{}d", ms / 86_400_000)
    } else if ms.is_multiple_of(3_600_000) {
        format!("{}h", ms / 3_600_000)
    } else if ms.is_multiple_of(60_000) {
        format!("{}m", ms / 60_000)
    } else if ms.is_multiple_of(1000) {
        format!("{}s", ms / 1000)
    } else {
        format!("{ms}ms")
    }
}

/// How a leaky bucket treats requests that fit in the bucket.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LeakyMode {
    /// Admit at once while the bucket has room (nginx `limit_req ... nodelay`).
    Policing,
    /// Admit with a delay so requests leave at the bucket's rate (nginx `limit_req` without
    /// `nodelay`); the decision carries the delay. The capacity bounds the queueing delay.
    Shaping,
}

impl FromStr for LeakyMode {
    type Err = PolicyError;
    /// `policing` or `shaping`.
    fn from_str(s: &str) -> Result<Self, PolicyError> {
        match s {
            "policing" => Ok(LeakyMode::Policing),
            "shaping" => Ok(LeakyMode::Shaping),
            other => Err(PolicyError::Parse(format!(
                "unknown leaky-bucket mode {other:?}: expected policing or shaping (or the decision mode, exact or leased)"
            ))),
        }
    }
}

/// A rate-limiting algorithm with its parameters. The semantics of each are in
/// `docs/algorithms.md` and in the module of the same name under [`crate::algorithm`]; names,
/// aliases and parameters are in [`crate::algorithm::registry`].
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(tag = "algorithm", rename_all = "kebab-case")]
pub enum Algorithm {
    /// Bucket of `capacity` tokens refilled at `rate`; a new key starts full.
    TokenBucket { capacity: u64, rate: Rate },
    /// Generic cell rate algorithm with the parameters of redis-cell's `CL.THROTTLE`:
    /// `burst` extra requests beyond the steady `rate` (so `burst + 1` at once).
    Gcra { rate: Rate, burst: u64 },
    /// Bucket of `capacity` draining at `rate`; see [`LeakyMode`].
    LeakyBucket {
        capacity: u64,
        rate: Rate,
        mode: LeakyMode,
    },
    /// `limit` per window of `window_ms`, windows aligned to the Unix epoch.
    FixedWindow { limit: u64, window_ms: u64 },
    /// `limit` per calendar day, ISO week or month in UTC (a fixed window aligned to the
    /// calendar; configured as `algorithm = "fixed-window"`, `window = "1 month"`).
    CalendarWindow { limit: u64, period: CalendarPeriod },
    /// Current window plus the previous one weighted by its overlap with the sliding window.
    SlidingWindowCounter { limit: u64, window_ms: u64 },
    /// Exact: a log of admitted requests; never more than `limit` in any `window_ms`.
    SlidingWindowLog { limit: u64, window_ms: u64 },
    /// At most `limit` leases held at once; a lease expires after `lease_ms`.
    Concurrency { limit: u64, lease_ms: u64 },
}

/// What happens when the store cannot answer within its timeout.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FailureMode {
    /// Admit the request (counted in a metric, logged at most once per interval).
    #[default]
    Open,
    /// Deny the request with reason [`crate::DenyReason::StoreUnavailable`].
    Closed,
    /// Decide from an embedded in-memory store, local to this instance, at the policy's limit
    /// (scaled by the limiter's local share) until the store answers again.
    Local,
}

impl FailureMode {
    /// `open`, `closed` or `local`: its one spelling in `sluice.toml`, the HTTP API and the
    /// Python and Node packages.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Open => "open",
            Self::Closed => "closed",
            Self::Local => "local",
        }
    }
}

impl fmt::Display for FailureMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for FailureMode {
    type Err = String;

    /// `open`, `closed` or `local`; anything else is an error naming the choices.
    fn from_str(s: &str) -> Result<Self, String> {
        [Self::Open, Self::Closed, Self::Local]
            .into_iter()
            .find(|m| m.as_str() == s)
            .ok_or_else(|| format!("unknown failure mode {s:?}: expected open, closed or local"))
    }
}

/// How an instance decides a policy's checks.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DecisionMode {
    /// Every check is one atomic store call (the default).
    #[default]
    Exact,
    /// The instance reserves a slice of a key's quota in one store call and spends it locally;
    /// a slice lives at most `ttl_ms`. Never admits more than the limit; may under-admit by
    /// what other instances hold (`docs/leased-mode.md`).
    Leased {
        /// The longest a slice is spent before it goes back.
        ttl_ms: u64,
    },
}

impl DecisionMode {
    /// The default lifetime of a slice.
    pub const DEFAULT_LEASE_TTL_MS: u64 = 1000;
    /// The longest lifetime a slice may have.
    pub const MAX_LEASE_TTL_MS: u64 = 60_000;

    /// True for [`DecisionMode::Exact`].
    pub fn is_exact(&self) -> bool {
        matches!(self, DecisionMode::Exact)
    }

    /// Leased mode with the default slice lifetime.
    pub const fn leased() -> Self {
        DecisionMode::Leased {
            ttl_ms: Self::DEFAULT_LEASE_TTL_MS,
        }
    }

    /// Whether `algorithm` can be decided in this mode: leasing needs an algorithm whose
    /// quota can be taken ahead and given back (token bucket, GCRA, fixed and calendar
    /// windows); a shaping delay, a sliding window and concurrency leases cannot.
    pub fn check(&self, algorithm: &Algorithm) -> Result<(), PolicyError> {
        let DecisionMode::Leased { ttl_ms } = *self else {
            return Ok(());
        };
        if ttl_ms == 0 || ttl_ms > Self::MAX_LEASE_TTL_MS {
            return Err(PolicyError::Invalid(format!(
                "lease_ttl must be between 1ms and {}",
                format_duration_ms(Self::MAX_LEASE_TTL_MS)
            )));
        }
        match algorithm {
            Algorithm::TokenBucket { .. }
            | Algorithm::Gcra { .. }
            | Algorithm::FixedWindow { .. }
            | Algorithm::CalendarWindow { .. } => Ok(()),
            other => Err(PolicyError::Invalid(format!(
                "mode = \"leased\" supports token-bucket, gcra and fixed-window, not {}: {}",
                other.kind(),
                match other {
                    Algorithm::Concurrency { .. } =>
                        "a concurrency lease is held per request and cannot be spent ahead",
                    Algorithm::LeakyBucket { .. } =>
                        "its shaping delay depends on each request's arrival at the store",
                    _ =>
                        "a sliding window weighs each admission by its time, which a slice taken ahead does not keep",
                }
            ))),
        }
    }
}

/// A named limit.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Policy {
    /// The name, used in key names, headers and metrics. ASCII letters, digits, `-`, `_`, `.`.
    pub name: String,
    /// The algorithm and its parameters.
    #[serde(flatten)]
    pub algorithm: Algorithm,
    /// What to do when the store fails.
    #[serde(default)]
    pub failure_mode: FailureMode,
    /// Compute and count decisions, but never deny.
    #[serde(default)]
    pub shadow: bool,
    /// Split each identity's state over this many sub-keys (hot keys on Redis Cluster), each
    /// with 1/N of the quota and rate. 1 = no sharding.
    #[serde(default = "one")]
    pub shards: u32,
    /// Exact (one store call per check) or leased (slices spent locally).
    #[serde(default, skip_serializing_if = "DecisionMode::is_exact")]
    pub mode: DecisionMode,
}

fn one() -> u32 {
    1
}

impl Policy {
    /// A policy with the defaults: fail open, not shadow, one shard.
    pub fn new(name: impl Into<String>, algorithm: Algorithm) -> Result<Self, PolicyError> {
        let p = Self {
            name: name.into(),
            algorithm,
            failure_mode: FailureMode::Open,
            shadow: false,
            shards: 1,
            mode: DecisionMode::Exact,
        };
        p.validate()?;
        Ok(p)
    }

    /// The algorithm each shard of this policy runs: [`Algorithm::per_shard`] of its
    /// `shards`, or the algorithm itself when the policy is not sharded.
    pub fn shard_algorithm(&self) -> Algorithm {
        if self.shards > 1 {
            self.algorithm.per_shard(self.shards)
        } else {
            self.algorithm.clone()
        }
    }

    /// Checks the name and the parameters.
    pub fn validate(&self) -> Result<(), PolicyError> {
        validate_policy_name(&self.name)?;
        if self.shards == 0 {
            return Err(PolicyError::Invalid("shards must be at least 1".into()));
        }
        self.algorithm.validate()?;
        self.mode.check(&self.algorithm)
    }
}

/// Policy names go into key names and header values, so they are restricted to a safe
/// alphabet: ASCII letters, digits, `-`, `_`, `.`; 1 to 64 characters.
pub fn validate_policy_name(name: &str) -> Result<(), PolicyError> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'));
    if ok {
        Ok(())
    } else {
        Err(PolicyError::Invalid(format!(
            "policy name {name:?} must be 1-64 characters of A-Z a-z 0-9 - _ ."
        )))
    }
}

/// An invalid policy.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PolicyError {
    /// Text that could not be parsed.
    #[error("{0}")]
    Parse(String),
    /// Parameters out of range.
    #[error("{0}")]
    Invalid(String),
}

#[cfg(test)]
mod tests {
    #[test]
    fn binary_gcd_agrees_with_euclid() {
        fn euclid(mut a: u64, mut b: u64) -> u64 {
            while b != 0 {
                (a, b) = (b, a % b);
            }
            a
        }
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        for _ in 0..20_000 {
            let (a, b) = (next() % 1_000_000_007, next() >> (next() % 64));
            assert_eq!(super::gcd(a, b), euclid(a, b), "{a} {b}");
            let k = next() % 5000 + 1;
            assert_eq!(
                super::gcd(a % 10_000 * k, b % 10_000 * k),
                euclid(a % 10_000 * k, b % 10_000 * k)
            );
        }
        for (a, b) in [
            (0, 0),
            (0, 7),
            (7, 0),
            (1, 1000),
            (5, 1000),
            (u64::MAX, u64::MAX - 1),
        ] {
            assert_eq!(super::gcd(a, b), euclid(a, b), "{a} {b}");
        }
    }

    use super::*;

    #[test]
    fn parses_rates_and_durations() {
        assert_eq!("5/s".parse::<Rate>().unwrap(), Rate::new(5, 1000));
        assert_eq!("300/min".parse::<Rate>().unwrap(), Rate::new(300, 60_000));
        assert_eq!("10/2s".parse::<Rate>().unwrap(), Rate::new(10, 2000));
        assert_eq!("7/500ms".parse::<Rate>().unwrap(), Rate::new(7, 500));
        assert!("0/s".parse::<Rate>().is_err());
        assert!("5 per s".parse::<Rate>().is_err());
        assert_eq!(parse_duration_ms("10s").unwrap(), 10_000);
        assert_eq!(parse_duration_ms("1m").unwrap(), 60_000);
        assert_eq!(parse_duration_ms("500ms").unwrap(), 500);
        assert!(parse_duration_ms("ten").is_err());
        // One ceiling, whatever the unit: an overflowing product and a huge count of
        // milliseconds get the same answer.
        assert_eq!(parse_duration_ms("36500d").unwrap(), MAX_DURATION_MS);
        for long in [
            "36501d",
            "9223372036854775807ms",
            "1000000000000d",
            "18446744073709551615",
        ] {
            let e = parse_duration_ms(long).unwrap_err().to_string();
            assert!(e.contains("longest accepted, 36500d"), "{long}: {e}");
        }
        assert!(within_max_duration(MAX_DURATION_MS).is_ok());
        assert!(within_max_duration(MAX_DURATION_MS + 1).is_err());
    }

    #[test]
    fn bucket_window_matches_the_guide() {
        let a = Algorithm::TokenBucket {
            capacity: 10,
            rate: Rate::per_second(5),
        };
        assert_eq!((a.quota(), a.window_ms()), (10, 2000));
    }

    #[test]
    fn shard_algorithm_divides_only_sharded_policies() {
        let alg = Algorithm::FixedWindow {
            limit: 10,
            window_ms: 1000,
        };
        let mut p = Policy::new("p", alg.clone()).unwrap();
        assert_eq!(p.shard_algorithm(), alg);
        p.shards = 4;
        assert_eq!(
            p.shard_algorithm(),
            Algorithm::FixedWindow {
                limit: 3,
                window_ms: 1000
            }
        );
    }

    #[test]
    fn leaky_modes_parse() {
        assert_eq!("shaping".parse::<LeakyMode>().unwrap(), LeakyMode::Shaping);
        assert!(
            "queue"
                .parse::<LeakyMode>()
                .unwrap_err()
                .to_string()
                .contains("expected policing or shaping")
        );
    }

    #[test]
    fn rejects_unsafe_names() {
        assert!(validate_policy_name("per-user.minute_1").is_ok());
        for bad in ["", "a b", "a{b}", "a:b", "é"] {
            assert!(validate_policy_name(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn zero_durations_name_their_unit() {
        let window = Algorithm::FixedWindow {
            limit: 3,
            window_ms: 0,
        };
        let e = window.validate().unwrap_err().to_string();
        assert!(e.contains("window must be at least 1ms"), "{e}");
        let lease = Algorithm::Concurrency {
            limit: 3,
            lease_ms: 0,
        };
        let e = lease.validate().unwrap_err().to_string();
        assert!(e.contains("lease timeout must be at least 1ms"), "{e}");
    }
}
