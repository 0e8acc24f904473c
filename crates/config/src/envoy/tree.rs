//! Descriptor matching: the configured domains compiled into one tree per domain, looked up the
//! way the reference service does.
//!
//! For each entry of a request descriptor look up `key_value`, then a wildcard `key_prefix*`,
//! then `key` alone (any value); a limit applies only when the match reaches the descriptor's
//! last entry.

use std::collections::HashMap;
use std::sync::Arc;

use sluice::core::DecisionMode;
use sluice::core::algorithm::AlgorithmKind;
use sluice::{Algorithm, FailureMode, Policy};

use super::file::{DescriptorFile, DomainFile, Unit};

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

/// Builds the policy of `rpu` per `unit` (`None` when `rpu` is 0), decided in `mode`.
pub fn build_policy(
    name: Option<&str>,
    alg: AlgorithmKind,
    rpu: u32,
    unit: Unit,
    shadow: bool,
    mode: DecisionMode,
) -> Option<Arc<Policy>> {
    let algorithm = alg.for_quota(u64::from(rpu), unit.ms())?;
    let policy = Policy {
        name: policy_name(name, &algorithm, rpu, unit),
        algorithm,
        failure_mode: FailureMode::Open,
        shadow,
        shards: 1,
        mode,
    };
    policy.validate().ok()?;
    Some(Arc::new(policy))
}

impl Domains {
    /// True when every limit is in shadow mode.
    pub fn global_shadow(&self) -> bool {
        self.global_shadow
    }

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

    /// The policy of some limit of some domain named `name` (see [`policy_name`]), so the
    /// admin API reaches the policies of the Envoy limits too.
    pub fn policy(&self, name: &str) -> Option<Arc<Policy>> {
        fn find(node: &Node, name: &str) -> Option<Arc<Policy>> {
            if let Some(p) = node.limit.as_ref().and_then(|l| l.policy.as_ref())
                && p.name == name
            {
                return Some(Arc::clone(p));
            }
            node.children.values().find_map(|c| find(c, name))
        }
        self.roots.values().find_map(|root| find(root, name))
    }

    /// True when `domain` is configured.
    pub fn has(&self, domain: &str) -> bool {
        self.roots.contains_key(domain)
    }

    /// The limit configured for a request descriptor, as the reference service finds it.
    pub fn lookup(&self, domain: &str, entries: &[(&str, &str)]) -> Option<Arc<Limit>> {
        let mut level = self.roots.get(domain)?;
        let mut found = None;
        // The `key_value` name of an entry is built in a stack buffer when it fits (most do):
        // a formatted `String` per entry was an allocation and a trip through `fmt` per call.
        let mut buf = [0u8; 128];
        let mut long = String::new();
        for (i, (key, value)) in entries.iter().enumerate() {
            let exact = key_value(&mut buf, &mut long, key, value);
            let next = level
                .children
                .get(exact)
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

/// `{key}_{value}`, in `buf` when it fits, else in `long`.
fn key_value<'b>(buf: &'b mut [u8; 128], long: &'b mut String, key: &str, value: &str) -> &'b str {
    let len = key.len() + 1 + value.len();
    if len <= buf.len() {
        buf[..key.len()].copy_from_slice(key.as_bytes());
        buf[key.len()] = b'_';
        buf[key.len() + 1..len].copy_from_slice(value.as_bytes());
        // Two `str`s joined by an ASCII byte are UTF-8.
        if let Ok(joined) = std::str::from_utf8(&buf[..len]) {
            return joined;
        }
    }
    long.clear();
    long.push_str(key);
    long.push('_');
    long.push_str(value);
    long
}

fn load(node: &mut Node, parent: &str, descriptors: &[DescriptorFile], global_shadow: bool) {
    for d in descriptors {
        let shadow = d.shadow_mode || global_shadow;
        let ck = d.composite_key();
        let full_key = format!("{parent}.{ck}");
        let limit = d.rate_limit.as_ref().map(|rl| {
            let policy = rl.limit.and_then(|(rpu, unit)| {
                build_policy(rl.name.as_deref(), rl.algorithm, rpu, unit, shadow, rl.mode)
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
#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub(crate) fn domains(yaml: &str) -> Domains {
        let f: DomainFile = serde_yaml::from_str(yaml).unwrap();
        Domains::compile(&[f], false).unwrap()
    }

    pub(crate) const REFERENCE: &str = r#"
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

    #[test]
    fn a_leased_rate_limit_builds_a_leased_policy() {
        let d = domains(
            "domain: edge\ndescriptors:\n  - key: user\n    rate_limit: { unit: minute, requests_per_unit: 600, mode: leased, lease_ttl: 2s }\n  - key: ip\n    rate_limit: { unit: minute, requests_per_unit: 600 }\n",
        );
        let mode = |k: &str| {
            let l = d.lookup("edge", &[(k, "x")]).unwrap();
            l.policy.as_ref().unwrap().mode
        };
        assert_eq!(mode("user"), DecisionMode::Leased { ttl_ms: 2000 });
        assert_eq!(mode("ip"), DecisionMode::Exact);
    }
}
