//! Planning: what each descriptor of a request asks of the limiter (nothing, always OK, always
//! over, or a check of one policy for one identity at one cost).
//!
//! Each distinct set of descriptor values gets its own counter, because the identity is built
//! from the request's own entries. `sluice_server::rls` turns a plan into store calls.

use std::collections::HashSet;
use std::fmt::Write as _;
use std::sync::Arc;

use sluice::core::algorithm::AlgorithmKind;
use sluice::{Identity, Policy};

use super::file::Unit;
use super::tree::{Domains, Limit, build_policy};

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

/// The descriptor key Envoy's `remote_address` action writes the downstream address under.
pub const REMOTE_ADDRESS: &str = "remote_address";

/// The identity of one request descriptor: `envoy:<domain>:<k1>=<v1>/<k2>=<v2>`, each part
/// escaped; the key scheme escapes the whole again for the hash tag. A descriptor with a
/// `remote_address` entry holding an address (the last one, if several) carries that
/// address, typed, so the control plane's network lists match it without reading the text.
pub fn envoy_identity(domain: &str, entries: &[(&str, &str)]) -> Identity {
    let identity = envoy_identity_text(domain, entries);
    match entries
        .iter()
        .rev()
        .find(|(k, _)| *k == REMOTE_ADDRESS)
        .and_then(|(_, v)| v.parse::<std::net::IpAddr>().ok())
    {
        Some(addr) => identity.with_network(sluice::core::ClientNet::host(addr)),
        None => identity,
    }
}

fn envoy_identity_text(domain: &str, entries: &[(&str, &str)]) -> Identity {
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
    /// Ask the limiter.
    Check(LimitCheck),
}

/// One limiter check a descriptor asks for: `policy` for `identity` at `cost`.
#[derive(Debug, Clone)]
pub struct LimitCheck {
    /// The limit (for the status's `current_limit`).
    pub limit: Arc<Limit>,
    /// The limit's policy.
    pub policy: Arc<Policy>,
    /// Who is counted.
    pub identity: Identity,
    /// Units to consume (0 only checks).
    pub cost: u64,
}

impl LimitCheck {
    /// The check as one item of the limiter's `check_many`.
    pub fn limiter_item(&self) -> (&Identity, &Arc<Policy>, u64) {
        (&self.identity, &self.policy, self.cost)
    }
}

/// A request descriptor with the limit it matched, before `replaces` is applied.
struct Matched<'d, 'a> {
    descriptor: &'d RequestDescriptor<'a>,
    limit: Option<Arc<Limit>>,
}

/// The limit of a per-descriptor override (`None` for an unknown unit). As in the reference
/// service it is a fixed window with no name and no shadow mode (unless everything is shadow),
/// and [`plan`] applies it only within a configured domain.
fn override_limit(domains: &Domains, domain: &str, rpu: u32, unit: i32) -> Option<Arc<Limit>> {
    let unit = Unit::from_override_proto(unit)?;
    let shadow = domains.global_shadow();
    Some(Arc::new(Limit {
        full_key: format!("{domain}.override"),
        name: None,
        limit: Some((rpu, unit)),
        replaces: vec![],
        shadow,
        policy: build_policy(
            Some("override"),
            AlgorithmKind::FixedWindow,
            rpu,
            unit,
            shadow,
            sluice::core::DecisionMode::Exact,
        ),
    }))
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
    let matched: Vec<Matched<'_, '_>> = descriptors
        .iter()
        .map(|descriptor| Matched {
            descriptor,
            limit: match descriptor.limit_override {
                Some((rpu, unit)) if domains.has(domain) => {
                    override_limit(domains, domain, rpu, unit)
                }
                _ => domains.lookup(domain, &descriptor.entries),
            },
        })
        .collect();
    let replaced: HashSet<&str> = matched
        .iter()
        .filter_map(|m| m.limit.as_deref())
        .filter(|l| l.limit.is_some())
        .flat_map(|l| l.replaces.iter().map(String::as_str))
        .collect();
    matched
        .iter()
        .map(|m| {
            let Some(limit) = &m.limit else {
                return Plan::NoLimit;
            };
            if limit.limit.is_none() {
                return Plan::Unlimited;
            }
            if limit.name.as_deref().is_some_and(|n| replaced.contains(n)) {
                return Plan::NoLimit;
            }
            let Some(policy) = &limit.policy else {
                return Plan::Zero(Arc::clone(limit));
            };
            Plan::Check(LimitCheck {
                limit: Arc::clone(limit),
                policy: Arc::clone(policy),
                identity: envoy_identity(domain, &m.descriptor.entries),
                cost: m.descriptor.hits_addend.unwrap_or(request_cost),
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::envoy::tree::tests::{REFERENCE, domains};

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
            Plan::Check(c) => c.cost,
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
        let Plan::Check(LimitCheck { limit, .. }) = &p[0] else {
            panic!()
        };
        assert_eq!(limit.limit, Some((3, Unit::Minute)));
        // Even where nothing is configured, but only in a known domain.
        let mut unmatched = desc(&[("nothing", "x")]);
        unmatched.limit_override = Some((7, 1));
        assert!(matches!(
            plan(&d, "edge", 0, &[unmatched.clone()])[0],
            Plan::Check(_)
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
        assert!(matches!(p[1], Plan::Check(_)));
        assert!(matches!(plan(&d, "edge", 0, &[login])[0], Plan::Check(_)));
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
        let Plan::Check(LimitCheck { limit, .. }) = &p[0] else {
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
    fn a_remote_address_entry_is_carried_typed() {
        let ip = |s: &str| Some(sluice::core::ClientNet::host(s.parse().unwrap()));
        let v4 = envoy_identity("edge", &[("path", "/a"), ("remote_address", "10.0.0.1")]);
        assert_eq!(v4.as_str(), "envoy:edge:path=%2Fa/remote_address=10.0.0.1");
        assert_eq!(v4.network(), ip("10.0.0.1"));
        let v6 = envoy_identity("edge", &[("remote_address", "2001:db8::1")]);
        assert_eq!(v6.as_str(), "envoy:edge:remote_address=2001%3Adb8%3A%3A1");
        assert_eq!(v6.network(), ip("2001:db8::1"));
        // Only the key Envoy writes the address under; other entries are text.
        assert_eq!(
            envoy_identity("edge", &[("user", "10.0.0.1")]).network(),
            None
        );
        assert_eq!(
            envoy_identity("edge", &[("remote_address", "not-an-address")]).network(),
            None
        );
        // A value long enough to be hashed keeps the address.
        let long = "x".repeat(600);
        let hashed = envoy_identity("edge", &[("path", &long), ("remote_address", "10.0.0.2")]);
        assert!(hashed.as_str().starts_with("envoy:edge:h"));
        assert_eq!(hashed.network(), ip("10.0.0.2"));
    }
}
