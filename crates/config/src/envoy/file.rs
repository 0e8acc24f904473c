//! The envoyproxy/ratelimit YAML format: domains, nested descriptors and `rate_limit` blocks,
//! checked while they are read so every mistake carries the file's line.
//!
//! Files written for envoyproxy/ratelimit load unchanged: `domain`, nested `descriptors` with
//! `key`, optional `value` (a trailing `*` matches by prefix), `rate_limit` (`unit`,
//! `requests_per_unit`, `unlimited`, `name`, `replaces`), `shadow_mode`, and the metric options
//! `detailed_metric`, `value_to_metric` and `share_threshold` (accepted, no effect here). Two
//! extensions: `rate_limit.algorithm` picks another sluice algorithm for the same quota (without
//! it a limit keeps its fixed-window meaning), and `rate_limit.mode: leased` (with `lease_ttl`)
//! decides it from slices of the quota, as `mode = "leased"` does for a sluice.toml policy.

use serde::Deserialize;
use sluice::core::DecisionMode;
use sluice::core::algorithm::AlgorithmKind;
use sluice::core::policy::{format_duration_ms, parse_duration_ms};

/// A time unit of a `rate_limit` (case-insensitive in files, as in the reference service).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Unit {
    /// One second.
    Second,
    /// One minute.
    Minute,
    /// One hour.
    Hour,
    /// One day.
    Day,
    /// Seven days.
    Week,
    /// Thirty days (the reference service's month).
    Month,
    /// 365 days.
    Year,
}

impl Unit {
    /// The unit's length in milliseconds.
    pub fn ms(self) -> u64 {
        const S: u64 = 1000;
        match self {
            Unit::Second => S,
            Unit::Minute => 60 * S,
            Unit::Hour => 3600 * S,
            Unit::Day => 86_400 * S,
            Unit::Week => 7 * 86_400 * S,
            Unit::Month => 30 * 86_400 * S,
            Unit::Year => 365 * 86_400 * S,
        }
    }

    /// The value of `envoy.service.ratelimit.v3.RateLimitResponse.RateLimit.Unit`.
    pub fn response_proto(self) -> i32 {
        match self {
            Unit::Second => 1,
            Unit::Minute => 2,
            Unit::Hour => 3,
            Unit::Day => 4,
            Unit::Month => 5,
            Unit::Year => 6,
            Unit::Week => 7,
        }
    }

    /// From `envoy.type.v3.RateLimitUnit` (the unit of a per-descriptor limit override).
    pub fn from_override_proto(v: i32) -> Option<Unit> {
        match v {
            1 => Some(Unit::Second),
            2 => Some(Unit::Minute),
            3 => Some(Unit::Hour),
            4 => Some(Unit::Day),
            5 => Some(Unit::Month),
            6 => Some(Unit::Year),
            // Not in envoy.type.v3 today, but the response enum has it; accept it if it comes.
            7 => Some(Unit::Week),
            _ => None,
        }
    }

    /// The lower-case name.
    pub fn name(self) -> &'static str {
        match self {
            Unit::Second => "second",
            Unit::Minute => "minute",
            Unit::Hour => "hour",
            Unit::Day => "day",
            Unit::Week => "week",
            Unit::Month => "month",
            Unit::Year => "year",
        }
    }
}

impl std::str::FromStr for Unit {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Ok(match s.to_ascii_lowercase().as_str() {
            "second" => Unit::Second,
            "minute" => Unit::Minute,
            "hour" => Unit::Hour,
            "day" => Unit::Day,
            "week" => Unit::Week,
            "month" => Unit::Month,
            "year" => Unit::Year,
            _ => {
                return Err(format!(
                    "invalid rate limit unit {s:?}: expected second, minute, hour, day, week, month or year"
                ));
            }
        })
    }
}

/// The algorithms `rate_limit.algorithm` can name: those with a quota form
/// ([`AlgorithmKind::for_quota`]), so every one but concurrency, which has no period.
pub fn quota_algorithms() -> Vec<AlgorithmKind> {
    AlgorithmKind::ALL
        .into_iter()
        .filter(|k| k.for_quota(1, 1000).is_some())
        .collect()
}

/// One domain as written in a file.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DomainFile {
    /// The domain name Envoy sends (`domain` of the ratelimit filter).
    pub domain: String,
    /// The top-level descriptors.
    #[serde(default)]
    pub descriptors: DescriptorList,
}

/// Descriptors of one level, with distinct composite keys.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(try_from = "Vec<DescriptorFile>")]
pub struct DescriptorList(pub Vec<DescriptorFile>);

impl TryFrom<Vec<DescriptorFile>> for DescriptorList {
    type Error = String;
    fn try_from(v: Vec<DescriptorFile>) -> Result<Self, String> {
        let mut seen = std::collections::HashSet::new();
        for d in &v {
            if !seen.insert(d.composite_key()) {
                return Err(format!(
                    "duplicate descriptor composite key {:?}",
                    d.composite_key()
                ));
            }
        }
        Ok(DescriptorList(v))
    }
}

/// One descriptor as written in a file.
#[derive(Debug, Clone, Deserialize)]
#[serde(try_from = "RawDescriptor")]
pub struct DescriptorFile {
    /// The entry key.
    pub key: String,
    /// The entry value; absent means any value, each with its own counter.
    pub value: Option<String>,
    /// The limit applied when a request descriptor ends here.
    pub rate_limit: Option<RateLimitFile>,
    /// Deeper levels.
    pub descriptors: DescriptorList,
    /// Count over-limit requests but answer OK.
    pub shadow_mode: bool,
}

impl DescriptorFile {
    /// `key` or `key_value`, as the reference service indexes descriptors.
    pub fn composite_key(&self) -> String {
        match &self.value {
            Some(v) => format!("{}_{}", self.key, v),
            None => self.key.clone(),
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawDescriptor {
    key: String,
    #[serde(default)]
    value: Option<String>,
    #[serde(default)]
    rate_limit: Option<RateLimitFile>,
    #[serde(default)]
    descriptors: DescriptorList,
    #[serde(default)]
    shadow_mode: bool,
    // Metric options of the reference service: accepted, no effect here.
    #[serde(default)]
    #[allow(dead_code)]
    detailed_metric: bool,
    #[serde(default)]
    #[allow(dead_code)]
    value_to_metric: bool,
    #[serde(default)]
    #[allow(dead_code)]
    share_threshold: bool,
}

impl TryFrom<RawDescriptor> for DescriptorFile {
    type Error = String;
    fn try_from(r: RawDescriptor) -> Result<Self, String> {
        if r.key.is_empty() {
            return Err("descriptor has empty key".into());
        }
        let value = r.value.filter(|v| !v.is_empty());
        Ok(DescriptorFile {
            key: r.key,
            value,
            rate_limit: r.rate_limit,
            descriptors: r.descriptors,
            shadow_mode: r.shadow_mode,
        })
    }
}

/// A `rate_limit` block, checked.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(try_from = "RawRateLimit")]
pub struct RateLimitFile {
    /// `requests_per_unit` per `unit`; `None` when unlimited.
    pub limit: Option<(u32, Unit)>,
    /// The algorithm (sluice extension; fixed window unless named), enforcing
    /// `requests_per_unit` per `unit` as [`AlgorithmKind::for_quota`] says.
    pub algorithm: AlgorithmKind,
    /// The limit's name, referenced by `replaces` of other limits.
    pub name: Option<String>,
    /// Names of limits this one replaces when both match one request.
    pub replaces: Vec<String>,
    /// How the limit is decided (sluice extension; exact unless `mode: leased`).
    pub mode: DecisionMode,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRateLimit {
    #[serde(default)]
    unit: Option<String>,
    #[serde(default)]
    requests_per_unit: Option<u32>,
    #[serde(default)]
    unlimited: bool,
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    replaces: Vec<RawReplace>,
    #[serde(default)]
    algorithm: Option<String>,
    #[serde(default)]
    mode: Option<String>,
    #[serde(default)]
    lease_ttl: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawReplace {
    name: String,
}

impl TryFrom<RawRateLimit> for RateLimitFile {
    type Error = String;
    fn try_from(r: RawRateLimit) -> Result<Self, String> {
        let algorithm = match &r.algorithm {
            Some(a) => {
                AlgorithmKind::parse_among(a, &quota_algorithms()).map_err(|e| e.to_string())?
            }
            None => AlgorithmKind::FixedWindow,
        };
        let name = r.name.filter(|n| !n.is_empty());
        let limit = if r.unlimited {
            if let Some(u) = &r.unit
                && u.parse::<Unit>().is_ok()
            {
                return Err("should not specify rate limit unit when unlimited".into());
            }
            None
        } else {
            let unit: Unit =
                match &r.unit {
                    Some(u) => u.parse()?,
                    None => return Err(
                        "rate_limit needs a unit (second, minute, hour, day, week, month, year)"
                            .into(),
                    ),
                };
            let rpu = r.requests_per_unit.unwrap_or(0);
            if let Some(a) = algorithm.for_quota(u64::from(rpu), unit.ms()) {
                a.validate()
                    .map_err(|e| format!("requests_per_unit {rpu} per {}: {e}", unit.name()))?;
            }
            Some((rpu, unit))
        };
        let mode = decision_mode(r.mode.as_deref(), r.lease_ttl.as_deref(), algorithm, limit)?;
        let mut replaces = Vec::with_capacity(r.replaces.len());
        for rep in r.replaces {
            if rep.name.is_empty() {
                return Err("should not have an empty replaces entry".into());
            }
            if name.as_deref() == Some(rep.name.as_str()) {
                return Err("replaces should not contain name of same descriptor".into());
            }
            replaces.push(rep.name);
        }
        Ok(RateLimitFile {
            limit,
            algorithm,
            name,
            replaces,
            mode,
        })
    }
}

/// `mode` (`exact` or `leased`) and `lease_ttl` of a `rate_limit`, refused with the field's
/// name where leasing cannot serve the limit: the rules of a sluice.toml policy's `mode`.
fn decision_mode(
    mode: Option<&str>,
    lease_ttl: Option<&str>,
    algorithm: AlgorithmKind,
    limit: Option<(u32, Unit)>,
) -> Result<DecisionMode, String> {
    match mode {
        None | Some("exact") => {
            if lease_ttl.is_some() {
                return Err(
                    "rate_limit.lease_ttl: only a rate_limit with mode: leased takes lease_ttl"
                        .into(),
                );
            }
            return Ok(DecisionMode::Exact);
        }
        Some("leased") => {}
        Some(other) => {
            return Err(format!(
                "rate_limit.mode: unknown mode {other:?}: expected exact or leased"
            ));
        }
    }
    let ttl_ms = match lease_ttl {
        None => DecisionMode::DEFAULT_LEASE_TTL_MS,
        Some(t) => match parse_duration_ms(t) {
            Ok(ms) if (1..=DecisionMode::MAX_LEASE_TTL_MS).contains(&ms) => ms,
            Ok(_) => {
                return Err(format!(
                    "rate_limit.lease_ttl: {t:?} must be between 1ms and {}",
                    format_duration_ms(DecisionMode::MAX_LEASE_TTL_MS)
                ));
            }
            Err(e) => return Err(format!("rate_limit.lease_ttl: {e}")),
        },
    };
    let Some((rpu, unit)) = limit else {
        return Err("rate_limit.mode: an unlimited rate_limit has no quota to lease".into());
    };
    let leased = DecisionMode::Leased { ttl_ms };
    // A quota of 0 is always over limit and never reaches the store: nothing to check.
    if let Some(a) = algorithm.for_quota(u64::from(rpu), unit.ms()) {
        // The same rule as a sluice.toml policy's, told in this file's syntax.
        leased.check(&a).map_err(|e| {
            format!(
                "rate_limit.mode: {}",
                e.to_string().replacen("mode = \"leased\"", "leased", 1)
            )
        })?;
    }
    Ok(leased)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn file_errors_carry_lines() {
        let bad = "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: fortnight\n      requests_per_unit: 1\n";
        let e = serde_yaml::from_str::<DomainFile>(bad).unwrap_err();
        assert!(e.to_string().contains("fortnight"), "{e}");
        assert!(e.location().is_some());
        let dup = "domain: d\ndescriptors:\n  - key: k\n  - key: k\n";
        let e = serde_yaml::from_str::<DomainFile>(dup).unwrap_err();
        assert!(e.to_string().contains("duplicate"), "{e}");
        let unknown = "domain: d\ndescriptors:\n  - key: k\n    rate_limits: {}\n";
        let e = serde_yaml::from_str::<DomainFile>(unknown).unwrap_err();
        assert_eq!(e.location().unwrap().line(), 4, "{e}");
        let unl = "domain: d\ndescriptors:\n  - key: k\n    rate_limit: { unlimited: true, unit: second }\n";
        let lease = "domain: d\ndescriptors:\n  - key: k\n    rate_limit: { unit: second, requests_per_unit: 1, algorithm: concurrency }\n";
        let e = serde_yaml::from_str::<DomainFile>(lease).unwrap_err();
        assert!(
            e.to_string().contains(
                "unknown algorithm \"concurrency\": expected token-bucket, gcra, leaky-bucket, \
                 fixed-window, sliding-counter or sliding-log"
            ),
            "{e}"
        );
        let alias = "domain: d\ndescriptors:\n  - key: k\n    rate_limit: { unit: second, requests_per_unit: 1, algorithm: sliding_window_log }\n";
        let f = serde_yaml::from_str::<DomainFile>(alias).unwrap();
        assert_eq!(
            f.descriptors.0[0].rate_limit.as_ref().unwrap().algorithm,
            AlgorithmKind::SlidingWindowLog
        );
        assert!(
            serde_yaml::from_str::<DomainFile>(unl)
                .unwrap_err()
                .to_string()
                .contains("unlimited")
        );
    }

    fn rate_limit(fields: &str) -> Result<RateLimitFile, String> {
        let yaml = format!("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {{ {fields} }}\n");
        serde_yaml::from_str::<DomainFile>(&yaml)
            .map(|f| f.descriptors.0[0].rate_limit.clone().unwrap())
            .map_err(|e| e.to_string())
    }

    #[test]
    fn leased_mode_and_its_lifetime() {
        let quota = "unit: second, requests_per_unit: 100";
        assert_eq!(rate_limit(quota).unwrap().mode, DecisionMode::Exact);
        assert_eq!(
            rate_limit(&format!("{quota}, mode: exact")).unwrap().mode,
            DecisionMode::Exact
        );
        assert_eq!(
            rate_limit(&format!("{quota}, mode: leased")).unwrap().mode,
            DecisionMode::leased()
        );
        assert_eq!(
            rate_limit(&format!(
                "{quota}, mode: leased, lease_ttl: 250ms, algorithm: gcra"
            ))
            .unwrap()
            .mode,
            DecisionMode::Leased { ttl_ms: 250 }
        );
        // A quota of 0 never reaches the store: leased or not, it is always over.
        assert!(rate_limit("unit: second, requests_per_unit: 0, mode: leased").is_ok());
        let refused = |fields: &str, want: &str| {
            let e = rate_limit(&format!("{quota}, {fields}")).unwrap_err();
            assert!(e.contains(want), "{fields}: {e}");
            assert!(e.contains("line 3"), "{fields}: {e}");
        };
        refused(
            "mode: approximate",
            "rate_limit.mode: unknown mode \"approximate\": expected exact or leased",
        );
        refused(
            "lease_ttl: 1s",
            "rate_limit.lease_ttl: only a rate_limit with mode: leased takes lease_ttl",
        );
        refused(
            "mode: exact, lease_ttl: 1s",
            "only a rate_limit with mode: leased",
        );
        refused(
            "mode: leased, lease_ttl: 2m",
            "rate_limit.lease_ttl: \"2m\" must be between 1ms and 1m",
        );
        refused("mode: leased, lease_ttl: 0ms", "must be between 1ms");
        refused(
            "mode: leased, lease_ttl: soon",
            "rate_limit.lease_ttl: invalid duration \"soon\"",
        );
        refused(
            "mode: leased, algorithm: sliding-log",
            "rate_limit.mode: leased supports token-bucket, gcra and fixed-window, not sliding-log",
        );
        let e = rate_limit("unlimited: true, mode: leased").unwrap_err();
        assert!(
            e.contains("rate_limit.mode: an unlimited rate_limit has no quota to lease"),
            "{e}"
        );
    }

    #[test]
    fn a_mode_error_names_file_line_and_field() {
        let yaml = "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: second\n      requests_per_unit: 5\n      mode: leased\n      lease_ttl: 5m\n";
        let e = crate::load_domain_yaml(yaml, "edge.yaml").unwrap_err();
        assert_eq!(
            e.to_string(),
            "edge.yaml:3: descriptors[0].rate_limit.lease_ttl: \"5m\" must be between 1ms and 1m"
        );
    }
}
