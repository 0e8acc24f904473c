//! Envoy rate limit domains in the YAML format of envoyproxy/ratelimit, and descriptor matching.
//!
//! Files written for envoyproxy/ratelimit load unchanged: `domain`, nested `descriptors` with
//! `key`, optional `value` (a trailing `*` matches by prefix), `rate_limit` (`unit`,
//! `requests_per_unit`, `unlimited`, `name`, `replaces`), `shadow_mode`, and the metric options
//! `detailed_metric`, `value_to_metric` and `share_threshold` (accepted, no effect here). One
//! extension: `rate_limit.algorithm` picks another sluice algorithm for the same quota; without
//! it a limit keeps its fixed-window meaning.
//!
//! Matching follows the reference service: for each entry of a request descriptor look up
//! `key_value`, then a wildcard `key_prefix*`, then `key` alone (any value); a limit applies
//! only when the match reaches the descriptor's last entry. Each distinct set of values gets
//! its own counter, because the identity is built from the request's own entries.
//!
//! This module is pure: no sockets, no store. [`crate::rls`] turns a plan into store calls.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::sync::Arc;

use serde::Deserialize;
use sluice::{Algorithm, FailureMode, Identity, LeakyMode, Policy, Rate};

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

/// The sluice extension `rate_limit.algorithm`: how `requests_per_unit` per `unit` is enforced.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum EnvoyAlgorithm {
    /// The reference service's meaning: a counter per window aligned to the clock.
    #[default]
    FixedWindow,
    /// Sliding window counter: the previous window weighted by its overlap.
    SlidingCounter,
    /// Exact sliding window log.
    SlidingLog,
    /// A bucket of `requests_per_unit` tokens refilled at `requests_per_unit` per unit.
    TokenBucket,
    /// GCRA with burst `requests_per_unit - 1`.
    Gcra,
    /// A policing leaky bucket of `requests_per_unit` draining at the same rate.
    LeakyBucket,
}

impl std::str::FromStr for EnvoyAlgorithm {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Ok(match s {
            "fixed-window" | "fixed_window" => EnvoyAlgorithm::FixedWindow,
            "sliding-counter" | "sliding-window-counter" | "sliding_window_counter" => {
                EnvoyAlgorithm::SlidingCounter
            }
            "sliding-log" | "sliding-window-log" | "sliding_window_log" => {
                EnvoyAlgorithm::SlidingLog
            }
            "token-bucket" | "token_bucket" => EnvoyAlgorithm::TokenBucket,
            "gcra" => EnvoyAlgorithm::Gcra,
            "leaky-bucket" | "leaky_bucket" => EnvoyAlgorithm::LeakyBucket,
            other => {
                return Err(format!(
                    "unknown algorithm {other:?}: expected fixed-window, sliding-counter, sliding-log, \
                     token-bucket, gcra or leaky-bucket"
                ));
            }
        })
    }
}

impl EnvoyAlgorithm {
    /// The sluice algorithm enforcing `rpu` per `unit_ms`.
    pub fn algorithm(self, rpu: u64, unit_ms: u64) -> Algorithm {
        let rate = Rate::new(rpu, unit_ms);
        match self {
            EnvoyAlgorithm::FixedWindow => Algorithm::FixedWindow {
                limit: rpu,
                window_ms: unit_ms,
            },
            EnvoyAlgorithm::SlidingCounter => Algorithm::SlidingWindowCounter {
                limit: rpu,
                window_ms: unit_ms,
            },
            EnvoyAlgorithm::SlidingLog => Algorithm::SlidingWindowLog {
                limit: rpu,
                window_ms: unit_ms,
            },
            EnvoyAlgorithm::TokenBucket => Algorithm::TokenBucket {
                capacity: rpu,
                rate,
            },
            EnvoyAlgorithm::Gcra => Algorithm::Gcra {
                rate,
                burst: rpu - 1,
            },
            EnvoyAlgorithm::LeakyBucket => Algorithm::LeakyBucket {
                capacity: rpu,
                rate,
                mode: LeakyMode::Policing,
            },
        }
    }
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
    /// The algorithm (sluice extension).
    pub algorithm: EnvoyAlgorithm,
    /// The limit's name, referenced by `replaces` of other limits.
    pub name: Option<String>,
    /// Names of limits this one replaces when both match one request.
    pub replaces: Vec<String>,
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
            Some(a) => a.parse()?,
            None => EnvoyAlgorithm::default(),
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
            if rpu > 0 {
                algorithm
                    .algorithm(u64::from(rpu), unit.ms())
                    .validate()
                    .map_err(|e| format!("requests_per_unit {rpu} per {}: {e}", unit.name()))?;
            }
            Some((rpu, unit))
        };
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
        })
    }
}

/// A configured limit, ready to check.
#[derive(Debug, Clone)]
pub struct Limit {
    /// `domain.key_value.key...` as in the reference service (logs).
    pub full_key: String,
    /// The `name` of the rate_limit, if any.
    pub name: Option<String>,
    /// `requests_per_unit` per `unit`; `None` when unlimited.
    pub limit: Option<(u32, Unit)>,
    /// Names of limits this one replaces.
    pub replaces: Vec<String>,
    /// Shadow mode: never over limit.
    pub shadow: bool,
    /// The policy checked; `None` when unlimited or `requests_per_unit` is 0 (always over).
    pub policy: Option<Arc<Policy>>,
}

#[derive(Debug, Default)]
struct Node {
    children: HashMap<String, Node>,
    /// Composite keys ending with `*`, in file order, without the `*`.
    wildcards: Vec<String>,
    limit: Option<Arc<Limit>>,
}

/// Every configured domain, compiled for lookups.
#[derive(Debug, Default)]
pub struct Domains {
    roots: HashMap<String, Node>,
    global_shadow: bool,
}

/// Characters allowed in policy names.
fn policy_safe(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.')
}

/// The policy name of an Envoy limit: its name (or `envoy`) with the algorithm and parameters,
/// so editing a limit never reuses state written under other parameters.
pub fn policy_name(name: Option<&str>, algorithm: &Algorithm, rpu: u32, unit: Unit) -> String {
    let base: String = name
        .unwrap_or("envoy")
        .chars()
        .map(|c| if policy_safe(c) { c } else { '_' })
        .take(24)
        .collect();
    format!("{base}.{}.{rpu}.{}", algorithm.kind(), unit.name())
}

/// Builds the policy of `rpu` per `unit` (`None` when `rpu` is 0).
pub fn build_policy(
    name: Option<&str>,
    alg: EnvoyAlgorithm,
    rpu: u32,
    unit: Unit,
    shadow: bool,
) -> Option<Arc<Policy>> {
    if rpu == 0 {
        return None;
    }
    let algorithm = alg.algorithm(u64::from(rpu), unit.ms());
    let policy = Policy {
        name: policy_name(name, &algorithm, rpu, unit),
        algorithm,
        failure_mode: FailureMode::Open,
        shadow,
        shards: 1,
    };
    policy.validate().ok()?;
    Some(Arc::new(policy))
}

impl Domains {
    /// Compiles domain files. Errors name the duplicate domain.
    /// With `global_shadow`, every limit is in shadow mode.
    pub fn compile(files: &[DomainFile], global_shadow: bool) -> Result<Domains, String> {
        let mut roots = HashMap::new();
        for f in files {
            if f.domain.is_empty() {
                return Err("config file cannot have empty domain".into());
            }
            if roots.contains_key(&f.domain) {
                return Err(format!("duplicate domain {:?}", f.domain));
            }
            let mut root = Node::default();
            load(&mut root, &f.domain, &f.descriptors.0, global_shadow);
            roots.insert(f.domain.clone(), root);
        }
        Ok(Domains {
            roots,
            global_shadow,
        })
    }

    /// The domain names.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.roots.keys().map(String::as_str)
    }

    /// True when `domain` is configured.
    pub fn has(&self, domain: &str) -> bool {
        self.roots.contains_key(domain)
    }

    /// The limit configured for a request descriptor, as the reference service finds it.
    pub fn lookup(&self, domain: &str, entries: &[(&str, &str)]) -> Option<Arc<Limit>> {
        let mut level = self.roots.get(domain)?;
        let mut found = None;
        for (i, (key, value)) in entries.iter().enumerate() {
            let exact = format!("{key}_{value}");
            let next = level
                .children
                .get(&exact)
                .or_else(|| {
                    level
                        .wildcards
                        .iter()
                        .find(|w| exact.starts_with(w.as_str()))
                        .and_then(|w| {
                            let mut k = w.clone();
                            k.push('*');
                            level.children.get(&k)
                        })
                })
                .or_else(|| level.children.get(*key));
            let Some(next) = next else { break };
            if let Some(limit) = &next.limit
                && i == entries.len() - 1
            {
                found = Some(Arc::clone(limit));
            }
            if next.children.is_empty() {
                break;
            }
            level = next;
        }
        found
    }
}

fn load(node: &mut Node, parent: &str, descriptors: &[DescriptorFile], global_shadow: bool) {
    for d in descriptors {
        let shadow = d.shadow_mode || global_shadow;
        let ck = d.composite_key();
        let full_key = format!("{parent}.{ck}");
        let limit = d.rate_limit.as_ref().map(|rl| {
            let policy = rl.limit.and_then(|(rpu, unit)| {
                build_policy(rl.name.as_deref(), rl.algorithm, rpu, unit, shadow)
            });
            Arc::new(Limit {
                full_key: full_key.clone(),
                name: rl.name.clone(),
                limit: rl.limit,
                replaces: rl.replaces.clone(),
                shadow,
                policy,
            })
        });
        let mut child = Node {
            limit,
            ..Node::default()
        };
        load(&mut child, &full_key, &d.descriptors.0, global_shadow);
        if let Some(prefix) = ck.strip_suffix('*') {
            node.wildcards.push(prefix.to_string());
        }
        node.children.insert(ck, child);
    }
}

/// Escapes the separators of [`envoy_identity`] (and `%` itself) so distinct descriptors
/// never share an identity.
fn escape_part(out: &mut String, s: &str) {
    for c in s.chars() {
        match c {
            '%' | ':' | '/' | '=' => {
                let _ = write!(out, "%{:02X}", c as u32);
            }
            c => out.push(c),
        }
    }
}

/// The identity of one request descriptor: `envoy:<domain>:<k1>=<v1>/<k2>=<v2>`, each part
/// escaped; the key scheme escapes the whole again for the hash tag.
pub fn envoy_identity(domain: &str, entries: &[(&str, &str)]) -> Identity {
    let mut s = String::with_capacity(16 + domain.len() + entries.len() * 16);
    s.push_str("envoy:");
    escape_part(&mut s, domain);
    s.push(':');
    for (i, (k, v)) in entries.iter().enumerate() {
        if i > 0 {
            s.push('/');
        }
        escape_part(&mut s, k);
        s.push('=');
        escape_part(&mut s, v);
    }
    // Values come from the client (paths, headers): past the identity length limit, a keyed
    // hash keeps keys bounded and distinct, and a long value still meets its limit.
    if s.len() > sluice::core::key::MAX_IDENTITY_LEN {
        let mut kind = String::from("envoy:");
        escape_part(&mut kind, domain);
        return Identity::credential(&kind, s.as_bytes(), &sluice::core::key::default_hash_key());
    }
    Identity::new(s)
}

/// A request descriptor reduced to what planning needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestDescriptor<'a> {
    /// `(key, value)` entries.
    pub entries: Vec<(&'a str, &'a str)>,
    /// A per-descriptor limit override: `(requests_per_unit, envoy.type.v3.RateLimitUnit)`.
    pub limit_override: Option<(u32, i32)>,
    /// The per-descriptor `hits_addend`, when set.
    pub hits_addend: Option<u64>,
}

/// What to do for one descriptor.
#[derive(Debug, Clone)]
pub enum Plan {
    /// No limit applies (no match, unknown domain, or replaced by another limit): OK.
    NoLimit,
    /// The matched limit is unlimited: OK with `limit_remaining` at its maximum.
    Unlimited,
    /// `requests_per_unit` is 0: always over limit (unless shadow).
    Zero(Arc<Limit>),
    /// Check `policy` for `identity` with `cost`.
    Check {
        /// The limit (for the status's `current_limit`).
        limit: Arc<Limit>,
        /// Who is counted.
        identity: Identity,
        /// Units to consume (0 only checks).
        cost: u64,
    },
}

/// Plans a request: finds each descriptor's limit (or builds the override), applies
/// `replaces`, and works out the cost (`hits_addend` 0 means 1; a per-descriptor value wins,
/// and an explicit 0 there only checks).
pub fn plan(
    domains: &Domains,
    domain: &str,
    request_hits: u32,
    descriptors: &[RequestDescriptor<'_>],
) -> Vec<Plan> {
    let request_cost = if request_hits == 0 {
        1
    } else {
        u64::from(request_hits)
    };
    let mut limits: Vec<Option<Arc<Limit>>> = Vec::with_capacity(descriptors.len());
    for d in descriptors {
        let limit = match d.limit_override {
            // As in the reference service: an override applies within a configured domain,
            // with no shadow mode (unless everything is shadow) and no name.
            Some((rpu, unit)) if domains.has(domain) => {
                Unit::from_override_proto(unit).map(|unit| {
                    Arc::new(Limit {
                        full_key: format!("{domain}.override"),
                        name: None,
                        limit: Some((rpu, unit)),
                        replaces: vec![],
                        shadow: domains.global_shadow,
                        policy: build_policy(
                            Some("override"),
                            EnvoyAlgorithm::FixedWindow,
                            rpu,
                            unit,
                            domains.global_shadow,
                        ),
                    })
                })
            }
            _ => domains.lookup(domain, &d.entries),
        };
        limits.push(limit);
    }
    let replaced: std::collections::HashSet<&str> = limits
        .iter()
        .flatten()
        .filter(|l| l.limit.is_some())
        .flat_map(|l| l.replaces.iter().map(String::as_str))
        .collect();
    limits
        .iter()
        .zip(descriptors)
        .map(|(limit, d)| {
            let Some(limit) = limit else {
                return Plan::NoLimit;
            };
            if limit.limit.is_none() {
                return Plan::Unlimited;
            }
            if limit.name.as_deref().is_some_and(|n| replaced.contains(n)) {
                return Plan::NoLimit;
            }
            if limit.policy.is_none() {
                return Plan::Zero(Arc::clone(limit));
            }
            Plan::Check {
                limit: Arc::clone(limit),
                identity: envoy_identity(domain, &d.entries),
                cost: d.hits_addend.unwrap_or(request_cost),
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn domains(yaml: &str) -> Domains {
        let f: DomainFile = serde_yaml::from_str(yaml).unwrap();
        Domains::compile(&[f], false).unwrap()
    }

    const REFERENCE: &str = r#"
domain: edge
descriptors:
  - key: remote_address
    rate_limit: { unit: minute, requests_per_unit: 10 }
  - key: path
    value: /login
    rate_limit: { unit: SECOND, requests_per_unit: 2, name: login }
  - key: path
    value: /static/*
    rate_limit: { unlimited: true }
  - key: client
    descriptors:
      - key: plan
        value: gold
        rate_limit: { unit: hour, requests_per_unit: 1000, algorithm: token-bucket, replaces: [{ name: login }] }
      - key: plan
        rate_limit: { unit: hour, requests_per_unit: 10 }
  - key: banned
    rate_limit: { unit: second, requests_per_unit: 0 }
  - key: trial
    shadow_mode: true
    rate_limit: { unit: day, requests_per_unit: 5 }
"#;

    fn rpu(l: Option<Arc<Limit>>) -> Option<u32> {
        l.and_then(|l| l.limit.map(|(r, _)| r))
    }

    #[test]
    fn key_only_matches_any_value() {
        let d = domains(REFERENCE);
        assert_eq!(
            rpu(d.lookup("edge", &[("remote_address", "10.0.0.1")])),
            Some(10)
        );
        assert_eq!(
            rpu(d.lookup("edge", &[("remote_address", "10.0.0.2")])),
            Some(10)
        );
        assert!(d.lookup("other", &[("remote_address", "1")]).is_none());
    }

    #[test]
    fn exact_value_wins_and_unknown_values_do_not_match() {
        let d = domains(REFERENCE);
        assert_eq!(rpu(d.lookup("edge", &[("path", "/login")])), Some(2));
        assert!(d.lookup("edge", &[("path", "/other")]).is_none());
    }

    #[test]
    fn wildcard_matches_by_prefix() {
        let d = domains(REFERENCE);
        let l = d.lookup("edge", &[("path", "/static/app.js")]).unwrap();
        assert!(l.limit.is_none(), "unlimited");
        assert!(d.lookup("edge", &[("path", "/stat")]).is_none());
    }

    #[test]
    fn nested_limits_need_full_depth() {
        let d = domains(REFERENCE);
        assert_eq!(
            rpu(d.lookup("edge", &[("client", "a"), ("plan", "gold")])),
            Some(1000)
        );
        assert_eq!(
            rpu(d.lookup("edge", &[("client", "a"), ("plan", "free")])),
            Some(10)
        );
        // The descriptor stops above the limit: nothing applies.
        assert!(d.lookup("edge", &[("client", "a")]).is_none());
        // The request is deeper than the config: nothing applies.
        assert!(
            d.lookup("edge", &[("remote_address", "1"), ("x", "y")])
                .is_none()
        );
    }

    #[test]
    fn algorithm_extension_and_default() {
        let d = domains(REFERENCE);
        let gold = d
            .lookup("edge", &[("client", "a"), ("plan", "gold")])
            .unwrap();
        assert_eq!(
            gold.policy.as_ref().unwrap().algorithm.kind(),
            "token-bucket"
        );
        let ip = d.lookup("edge", &[("remote_address", "1")]).unwrap();
        assert_eq!(
            ip.policy.as_ref().unwrap().algorithm,
            Algorithm::FixedWindow {
                limit: 10,
                window_ms: 60_000
            }
        );
        assert_eq!(
            ip.policy.as_ref().unwrap().name,
            "envoy.fixed-window.10.minute"
        );
    }

    fn desc<'a>(entries: &[(&'a str, &'a str)]) -> RequestDescriptor<'a> {
        RequestDescriptor {
            entries: entries.to_vec(),
            limit_override: None,
            hits_addend: None,
        }
    }

    #[test]
    fn hits_addend_rules() {
        let d = domains(REFERENCE);
        let cost = |p: &Plan| match p {
            Plan::Check { cost, .. } => *cost,
            other => panic!("{other:?}"),
        };
        let ip = desc(&[("remote_address", "1")]);
        assert_eq!(
            cost(&plan(&d, "edge", 0, std::slice::from_ref(&ip))[0]),
            1,
            "0 means 1"
        );
        assert_eq!(cost(&plan(&d, "edge", 3, std::slice::from_ref(&ip))[0]), 3);
        let mut own = ip.clone();
        own.hits_addend = Some(5);
        assert_eq!(
            cost(&plan(&d, "edge", 3, &[own.clone()])[0]),
            5,
            "descriptor overrides request"
        );
        own.hits_addend = Some(0);
        assert_eq!(
            cost(&plan(&d, "edge", 3, &[own])[0]),
            0,
            "explicit 0 only checks"
        );
    }

    #[test]
    fn overrides_replace_the_configured_limit() {
        let d = domains(REFERENCE);
        let mut o = desc(&[("remote_address", "1")]);
        o.limit_override = Some((3, 2));
        let p = plan(&d, "edge", 0, &[o.clone()]);
        let Plan::Check { limit, .. } = &p[0] else {
            panic!()
        };
        assert_eq!(limit.limit, Some((3, Unit::Minute)));
        // Even where nothing is configured, but only in a known domain.
        let mut unmatched = desc(&[("nothing", "x")]);
        unmatched.limit_override = Some((7, 1));
        assert!(matches!(
            plan(&d, "edge", 0, &[unmatched.clone()])[0],
            Plan::Check { .. }
        ));
        assert!(matches!(
            plan(&d, "unknown", 0, &[unmatched])[0],
            Plan::NoLimit
        ));
    }

    #[test]
    fn replaces_drops_the_named_limit() {
        let d = domains(REFERENCE);
        let login = desc(&[("path", "/login")]);
        let gold = desc(&[("client", "a"), ("plan", "gold")]);
        let p = plan(&d, "edge", 0, &[login.clone(), gold]);
        assert!(matches!(p[0], Plan::NoLimit));
        assert!(matches!(p[1], Plan::Check { .. }));
        assert!(matches!(
            plan(&d, "edge", 0, &[login])[0],
            Plan::Check { .. }
        ));
    }

    #[test]
    fn unlimited_zero_and_shadow() {
        let d = domains(REFERENCE);
        assert!(matches!(
            plan(&d, "edge", 0, &[desc(&[("path", "/static/x")])])[0],
            Plan::Unlimited
        ));
        assert!(matches!(
            plan(&d, "edge", 0, &[desc(&[("banned", "x")])])[0],
            Plan::Zero(_)
        ));
        let p = plan(&d, "edge", 0, &[desc(&[("trial", "x")])]);
        let Plan::Check { limit, .. } = &p[0] else {
            panic!()
        };
        assert!(limit.shadow && limit.policy.as_ref().unwrap().shadow);
    }

    #[test]
    fn identities_are_injective() {
        let a = envoy_identity("d", &[("a", "b=c")]);
        let b = envoy_identity("d", &[("a=b", "c")]);
        assert_ne!(a, b);
        let c = envoy_identity("d", &[("a", "b"), ("c", "d")]);
        let e = envoy_identity("d", &[("a", "b/c=d")]);
        assert_ne!(c, e);
        assert_eq!(
            envoy_identity("edge", &[("remote_address", "10.0.0.1")]).as_str(),
            "envoy:edge:remote_address=10.0.0.1"
        );
    }

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
        assert!(
            serde_yaml::from_str::<DomainFile>(unl)
                .unwrap_err()
                .to_string()
                .contains("unlimited")
        );
    }
}
