//! `[[routes]]` and `[proxy]`: what the reverse proxy forwards where, and under which
//! policies.

use std::time::Duration;

use serde::Deserialize;
use sluice_http::{Count, TrustedProxies};
use toml::Spanned;

use super::check::duration;
use super::error::Checker;
use super::raw::{RawConfig, RawProxy};
use super::{Config, IdentitySource, PolicyConfig, ProxyConfig, Route};

/// `count` as written: `"all" | "successes" | "failures"` or a list of statuses.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub(super) enum RawCount {
    Named(String),
    Statuses(Vec<i64>),
}

/// The route's [`Count`]; an unknown name or a status outside 100..=599 is an error.
fn check_count(raw: &RawCount) -> Result<Count, String> {
    match raw {
        RawCount::Named(name) => Count::named(name),
        RawCount::Statuses(list) => {
            let statuses = list
                .iter()
                .map(|&s| {
                    u16::try_from(s).map_err(|_| format!("invalid status {s}: expected 100 to 599"))
                })
                .collect::<Result<Vec<u16>, String>>()?;
            Count::statuses(statuses)
        }
    }
}

/// `[routes.reserve]` as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawReserve {
    pub policy: Spanned<String>,
    pub json_field: Option<Spanned<String>>,
    pub header: Option<Spanned<String>>,
    pub default: Option<Spanned<i64>>,
    pub usage: Option<Spanned<String>>,
    pub ttl: Option<Spanned<super::raw::RawDuration>>,
}

/// A route's reservation: an existing policy that is not a concurrency limit, the maximum
/// from exactly one of a JSON field or a header, a ttl within the reservation bounds.
fn check_reserve(
    ck: &mut Checker<'_>,
    raw: &RawConfig,
    r: &Spanned<RawReserve>,
    field: &str,
) -> Option<sluice_http::settle::ReserveSpec> {
    use sluice::reservation::{MAX_TTL, MIN_TTL};
    use sluice_http::settle::{MaxCostFrom, ReserveSpec};
    let rr = r.get_ref();
    let mut ok = true;
    let policy = rr.policy.get_ref();
    match raw.policies.iter().find(|(k, _)| k.get_ref() == policy) {
        None => {
            ck.at(
                rr.policy.span(),
                format!("{field}.policy"),
                format!("unknown policy {policy:?}"),
            );
            ok = false;
        }
        Some((_, p))
            if p.get_ref()
                .algorithm
                .get_ref()
                .parse::<sluice::core::algorithm::AlgorithmKind>()
                .is_ok_and(|k| k.info().leases) =>
        {
            ck.at(
                rr.policy.span(),
                format!("{field}.policy"),
                format!("policy {policy:?} is a concurrency limit: it holds leases, not costs, so it cannot be reserved from"),
            );
            ok = false;
        }
        Some(_) => {}
    }
    let from = match (&rr.json_field, &rr.header) {
        (Some(f), None) if !f.get_ref().is_empty() => {
            Some(MaxCostFrom::JsonField(f.get_ref().clone()))
        }
        (None, Some(h)) => match http::HeaderName::from_bytes(h.get_ref().as_bytes()) {
            Ok(name) => Some(MaxCostFrom::Header(name)),
            Err(_) => {
                ck.at(
                    h.span(),
                    format!("{field}.header"),
                    format!("invalid header name {:?}", h.get_ref()),
                );
                None
            }
        },
        (Some(f), None) => {
            ck.at(f.span(), format!("{field}.json_field"), "must not be empty");
            None
        }
        _ => {
            ck.at(
                r.span(),
                field.to_string(),
                "give exactly one of json_field (e.g. \"max_tokens\") or header, where a request declares its maximum cost",
            );
            None
        }
    };
    let default_max = match &rr.default {
        None => None,
        Some(d) => match u64::try_from(*d.get_ref()) {
            Ok(v) if v <= sluice::core::policy::MAX_EXACT => Some(v),
            _ => {
                ck.at(
                    d.span(),
                    format!("{field}.default"),
                    "must be a whole number from 0 to 2^53",
                );
                ok = false;
                None
            }
        },
    };
    let ttl = ck.duration(&rr.ttl, &format!("{field}.ttl"), Duration::from_secs(300));
    if let Some(t) = &rr.ttl
        && !(MIN_TTL..=MAX_TTL).contains(&ttl)
    {
        ck.at(
            t.span(),
            format!("{field}.ttl"),
            format!(
                "must be between {} ms and {} s",
                MIN_TTL.as_millis(),
                MAX_TTL.as_secs()
            ),
        );
        ok = false;
    }
    let usage_field = rr
        .usage
        .as_ref()
        .map_or("total_tokens".to_string(), |u| u.get_ref().clone());
    Some(ReserveSpec {
        policy: policy.clone(),
        from: from?,
        default_max,
        usage_field,
        ttl,
    })
    .filter(|_| ok)
}

/// Checks every `[[routes]]`; a route's policies must exist. Sorted longest prefix first.
pub(super) fn check_routes(ck: &mut Checker<'_>, raw: &RawConfig) -> Vec<Route> {
    let mut routes = Vec::new();
    for (i, r) in raw.routes.iter().enumerate() {
        let field = format!("routes[{i}]");
        let rr = r.get_ref();
        let mut ok = true;
        let prefix = rr.prefix.get_ref();
        if !prefix.starts_with('/') {
            ck.at(
                rr.prefix.span(),
                format!("{field}.prefix"),
                "must start with /",
            );
            ok = false;
        } else {
            // Requests are matched by their normalized path, so a prefix in any other form
            // would never match.
            match sluice_http::path::normalize(prefix) {
                Ok(normal) if normal == prefix.as_str() => {}
                Ok(normal) => {
                    ck.at(
                        rr.prefix.span(),
                        format!("{field}.prefix"),
                        format!(
                            "{prefix:?} is not a normalized path and would never match: write {normal:?}"
                        ),
                    );
                    ok = false;
                }
                Err(e) => {
                    ck.at(
                        rr.prefix.span(),
                        format!("{field}.prefix"),
                        format!("{prefix:?} would never match: {e}"),
                    );
                    ok = false;
                }
            }
        }
        let mut methods = Vec::new();
        for m in &rr.methods {
            match http::Method::from_bytes(m.get_ref().to_ascii_uppercase().as_bytes()) {
                Ok(method) => methods.push(method),
                Err(_) => {
                    ck.at(
                        m.span(),
                        format!("{field}.methods"),
                        format!("invalid method {:?}", m.get_ref()),
                    );
                    ok = false;
                }
            }
        }
        for p in &rr.policies {
            if !raw.policies.keys().any(|k| k.get_ref() == p.get_ref()) {
                ck.at(
                    p.span(),
                    format!("{field}.policies"),
                    format!("unknown policy {:?}", p.get_ref()),
                );
                ok = false;
            }
        }
        let upstream = match rr.upstream.get_ref().parse::<http::Uri>() {
            Ok(u)
                if u.scheme_str() == Some("http")
                    && u.authority().is_some()
                    && u.query().is_none() =>
            {
                Some(u)
            }
            Ok(u) if u.scheme_str() == Some("https") => {
                ck.at(
                    rr.upstream.span(),
                    format!("{field}.upstream"),
                    format!(
                        "{u}: https upstreams are not supported; terminate TLS in front of the \
                         upstream or use plain http on a private network"
                    ),
                );
                None
            }
            _ => {
                ck.at(
                    rr.upstream.span(),
                    format!("{field}.upstream"),
                    format!(
                        "invalid upstream {:?}: expected http://HOST:PORT[/base]",
                        rr.upstream.get_ref()
                    ),
                );
                None
            }
        };
        let count = match &rr.count {
            None => Count::All,
            Some(c) => check_count(c.get_ref()).unwrap_or_else(|e| {
                ck.at(c.span(), format!("{field}.count"), e);
                ok = false;
                Count::All
            }),
        };
        let reserve = rr
            .reserve
            .as_ref()
            .and_then(|r| check_reserve(ck, raw, r, &format!("{field}.reserve")));
        ok &= rr.reserve.is_none() || reserve.is_some();
        if let (true, Some(upstream)) = (ok, upstream) {
            routes.push(Route {
                prefix: rr.prefix.get_ref().clone(),
                methods,
                policies: rr.policies.iter().map(|p| p.get_ref().clone()).collect(),
                upstream,
                count,
                case_insensitive: rr.case_insensitive,
                reserve,
            });
        }
    }
    routes.sort_by_key(|r| std::cmp::Reverse(r.prefix.len()));
    routes
}

/// How long the proxy waits for an upstream's response headers unless configured.
pub const DEFAULT_UPSTREAM_TIMEOUT: Duration = Duration::from_secs(30);
/// How long the proxy waits for a TCP connection to an upstream unless configured.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// Checks `[proxy]`.
pub(super) fn check_proxy(ck: &mut Checker<'_>, p: &RawProxy) -> ProxyConfig {
    let mut trusted = Vec::new();
    for t in &p.trusted_proxies {
        let v = t.get_ref();
        if TrustedProxies::cidrs(&[v]).is_ok() {
            trusted.push(v.clone());
        } else {
            ck.at(
                t.span(),
                "proxy.trusted_proxies",
                format!("invalid network {v:?}: expected an address or CIDR such as 10.0.0.0/8"),
            );
        }
    }
    // On by default; `"0s"` turns it off.
    let upstream_timeout = match &p.upstream_timeout {
        None => Some(DEFAULT_UPSTREAM_TIMEOUT),
        Some(t) => match duration(t.get_ref()) {
            Ok(d) if !d.is_zero() => Some(d),
            Ok(_) => None,
            Err(e) => {
                ck.at(t.span(), "proxy.upstream_timeout", e);
                Some(DEFAULT_UPSTREAM_TIMEOUT)
            }
        },
    };
    let connect_timeout = ck.positive_duration(
        &p.connect_timeout,
        "proxy.connect_timeout",
        DEFAULT_CONNECT_TIMEOUT,
    );
    ProxyConfig {
        // Every entry parsed above, so this cannot fail.
        trusted_proxies: TrustedProxies::cidrs(&trusted).unwrap_or_default(),
        upstream_timeout,
        connect_timeout,
    }
}

/// How an identity source is written in the file, when the client chooses its value: a
/// value sluice does not verify, so a client that sends a new one each time is a new identity
/// with a fresh limit each time. `None` for the client address, `global` and verified JWT
/// claims. A composite is client-chosen when any part is (changing that part is enough).
pub(super) fn client_chosen(source: &IdentitySource) -> Option<String> {
    match source {
        IdentitySource::Ip | IdentitySource::Global | IdentitySource::Jwt(_) => None,
        IdentitySource::Header(h) => Some(format!("header:{h}")),
        IdentitySource::ApiKey(h) => Some(format!("api-key:{h}")),
        IdentitySource::Bearer => Some("bearer".into()),
        IdentitySource::Cookie(c) => Some(format!("cookie:{c}")),
        IdentitySource::Query(q) => Some(format!("query:{q}")),
        IdentitySource::Composite(parts) => {
            let chosen: Vec<String> = parts.iter().filter_map(client_chosen).collect();
            (!chosen.is_empty()).then(|| format!("[{}]", chosen.join(", ")))
        }
    }
}

impl Config {
    /// Advice about a valid file, one line each: routes whose every enforced policy takes its
    /// identity from a value the client chooses (`sluice validate` prints them, `sluice serve`
    /// logs them). Such a route limits each value, not each client: without a per-IP (or
    /// verified) policy next to it, rotating the value walks past the limit.
    pub fn warnings(&self) -> Vec<String> {
        let mut out = Vec::new();
        for route in &self.routes {
            let enforced: Vec<&PolicyConfig> = route
                .policies
                .iter()
                .filter_map(|n| self.policies.get(n))
                .filter(|p| !p.policy.shadow && !self.shadow)
                .collect();
            if enforced.is_empty() {
                continue;
            }
            let chosen: Option<Vec<String>> = enforced
                .iter()
                .map(|p| client_chosen(&p.identity))
                .collect();
            let Some(mut chosen) = chosen else {
                continue;
            };
            chosen.dedup();
            let methods = if route.methods.is_empty() {
                String::new()
            } else {
                let m: Vec<&str> = route.methods.iter().map(http::Method::as_str).collect();
                format!(" ({})", m.join(", "))
            };
            out.push(format!(
                "route {:?}{methods}: its only identity is chosen by the client ({}); \
                 sluice does not verify it, so a client that sends a new value each time gets a \
                 fresh limit each time. Add a per-IP policy to the route (identity = \"ip\") \
                 as a ceiling across values, or limit by a verified identity (jwt:CLAIM, or a \
                 header that an authenticating gateway in front sets and overwrites) \
                 (docs/http.md, \"Identity sources\")",
                route.prefix,
                chosen.join(", ")
            ));
        }
        out
    }
}
