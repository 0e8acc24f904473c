//! `HttpGuard`: the tower layer's per-request work, for the Express and Fastify middleware.
//!
//! The middleware hands over a request's method, path, raw header list and socket peer and
//! gets back what to do: pass (with the headers to add to the response), or answer with a
//! status, headers and body. Everything in between is the Rust layer's own code: rules are
//! matched and ordered by [`sluice_http::Rule`], the identity comes from
//! [`IdentityResolver`] (hashed API keys and bearer tokens, the client IP through trusted
//! proxies only, IPv6 grouped by prefix), the check is [`sluice::Limiter::check_many`] and
//! the answers are [`headers::too_many_requests`], [`headers::store_unavailable`] and
//! [`headers::rate_limit_headers`]. So an Express app answers exactly like an axum app with
//! `RateLimitLayer`, and limits the same identities under the same keys.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use http::{HeaderMap, HeaderName, HeaderValue, Method, StatusCode};
use napi::Env;
use napi::bindgen_prelude::{ClassInstance, Either, PromiseRaw};
use napi_derive::napi;
use sluice::{Identity, LeaseToken, Verdict};
use sluice_http::headers::{self, display_header_name};
use sluice_http::{
    ClientIpConfig, HeaderOptions, IdentityResolver, IdentitySource, Rule, TrustedProxies,
};

use crate::decision::verdict_name;
use crate::limiter::{Limiter, hash_key_from_hex};
use crate::policy::Policy;
use crate::{invalid, number, store_error, whole};

/// Options of a guard (the middleware's options, less the rules).
#[napi(object)]
#[derive(Debug, Default)]
pub struct GuardOptions {
    /// A header carrying an API key (e.g. `x-api-key`); its value is hashed.
    pub api_key_header: Option<String>,
    /// Limit `Authorization: Bearer <token>` by its (hashed) token.
    pub bearer: Option<bool>,
    /// Which socket peers may set `Forwarded` / `X-Forwarded-For` / `X-Real-IP`: a list of
    /// networks and addresses, or a number of proxy hops. Default: nobody.
    pub trusted_proxies: Option<Either<Vec<String>, u32>>,
    /// IPv6 clients are grouped by this prefix length (default 64).
    pub ipv6_prefix: Option<u32>,
    /// IPv4 clients are grouped by this prefix length (default 32).
    pub ipv4_prefix: Option<u32>,
    /// 64 hex digits; default: the limiter's hash key.
    pub hash_key: Option<String>,
    /// Send `RateLimit-Policy` and `RateLimit` (default true).
    pub ratelimit_headers: Option<bool>,
    /// Send `X-RateLimit-Limit`, `-Remaining`, `-Reset` (default false).
    pub legacy_headers: Option<bool>,
    /// The status when the store fails and a policy fails closed: 503 (default) or 429.
    pub fail_closed_status: Option<u32>,
}

/// What the middleware does with a request.
#[napi(object)]
#[derive(Debug, Clone)]
pub struct GuardVerdict {
    /// False when the request must be answered with `status`, `headers` and `body`.
    pub allowed: bool,
    /// False when no rule (or a rule without policies) covers the request.
    pub limited: bool,
    /// The answer's status on a denial; 200 otherwise.
    pub status: u32,
    /// On a denial every header of the answer, else those to add: `[name, value, ...]`.
    pub headers: Vec<String>,
    /// The problem+json body of a denial.
    pub body: Option<String>,
    /// The identity the request was limited as (`key:h...`, `ip:203.0.113.7`).
    pub identity: Option<String>,
    /// `decided`, `failed_open` or `failed_closed`; `null` when not limited.
    pub verdict: Option<String>,
    /// Concurrency leases held, for `guard.release` when the response ends.
    pub lease_token: Option<String>,
}

impl GuardVerdict {
    fn unlimited() -> Self {
        Self {
            allowed: true,
            limited: false,
            status: 200,
            headers: Vec::new(),
            body: None,
            identity: None,
            verdict: None,
            lease_token: None,
        }
    }
}

/// One rule: the Rust layer's matcher plus the policies and cost it applies.
#[derive(Debug, Clone)]
struct GuardRule {
    matcher: Rule,
    policies: Vec<Arc<sluice::Policy>>,
    cost: u64,
}

#[derive(Debug)]
struct Shared {
    limiter: sluice::Limiter,
    rules: Vec<GuardRule>,
    resolver: IdentityResolver,
    headers: HeaderOptions,
    fail_closed_status: StatusCode,
}

/// A request as the middleware saw it, owned so it can move to the runtime.
#[derive(Debug)]
struct RequestHead {
    method: Method,
    path: String,
    headers: HeaderMap,
    peer: Option<IpAddr>,
}

fn flatten<'a>(pairs: impl Iterator<Item = (&'a HeaderName, &'a HeaderValue)>) -> Vec<String> {
    let mut out = Vec::new();
    for (n, v) in pairs {
        out.push(display_header_name(n.as_str()));
        out.push(String::from_utf8_lossy(v.as_bytes()).into_owned());
    }
    out
}

impl Shared {
    /// The layer's `call`, without the inner service.
    async fn decide(&self, head: RequestHead) -> GuardVerdict {
        let Some(rule) = self
            .rules
            .iter()
            .find(|r| r.matcher.matches(&head.method, &head.path))
        else {
            return GuardVerdict::unlimited();
        };
        if rule.policies.is_empty() {
            return GuardVerdict::unlimited();
        }
        let mut req = http::Request::new(());
        *req.method_mut() = head.method;
        *req.headers_mut() = head.headers;
        if let Some(ip) = head.peer {
            req.extensions_mut().insert(SocketAddr::new(ip, 0));
        }
        let (parts, ()) = req.into_parts();
        let identity = self.resolver.resolve(&parts);
        let items: Vec<(&Identity, &Arc<sluice::Policy>, u64)> = rule
            .policies
            .iter()
            .map(|p| (&identity, p, rule.cost))
            .collect();
        let checked = self.limiter.check_many(&items).await;
        let mut out = GuardVerdict {
            allowed: checked.allowed,
            limited: true,
            status: 200,
            headers: Vec::new(),
            body: None,
            identity: Some(identity.as_str().to_string()),
            verdict: Some(verdict_name(&checked.verdict).to_string()),
            lease_token: LeaseToken::from_checked(&checked).map(|t| t.encode()),
        };
        if !checked.allowed {
            let res = if matches!(checked.verdict, Verdict::FailedClosed(_)) {
                headers::store_unavailable(&checked, self.fail_closed_status)
            } else {
                headers::too_many_requests(&checked, &self.headers)
            };
            out.status = u32::from(res.status().as_u16());
            out.headers = flatten(res.headers().iter());
            out.body = Some(String::from_utf8_lossy(res.body()).into_owned());
            return out;
        }
        let delay = checked.delay_ms();
        if delay > 0 {
            tokio::time::sleep(Duration::from_millis(delay)).await;
        }
        let added = headers::rate_limit_headers(&checked, &self.headers);
        out.headers = flatten(added.iter().map(|(n, v)| (n, v)));
        out
    }
}

/// Rate limiting for HTTP requests, shared by the Express and Fastify middleware.
#[napi]
#[derive(Debug)]
pub struct HttpGuard {
    shared: Arc<Shared>,
}

/// Parses `[name, value, name, value, ...]` (Node's `rawHeaders`) into a header map;
/// entries that are not valid HTTP are left out, as a server would refuse them.
fn header_map(raw: &[String]) -> HeaderMap {
    let mut map = HeaderMap::with_capacity(raw.len() / 2);
    for pair in raw.chunks_exact(2) {
        if let (Ok(n), Ok(v)) = (
            HeaderName::from_bytes(pair[0].as_bytes()),
            HeaderValue::from_str(&pair[1]),
        ) {
            map.append(n, v);
        }
    }
    map
}

#[napi]
impl HttpGuard {
    /// A guard on `limiter` with no rules yet; `addRule` adds them.
    #[napi(constructor)]
    pub fn new(limiter: &Limiter, options: Option<GuardOptions>) -> napi::Result<Self> {
        let o = options.unwrap_or_default();
        let mut sources = Vec::new();
        if let Some(h) = &o.api_key_header {
            let name = HeaderName::from_bytes(h.to_ascii_lowercase().as_bytes())
                .map_err(|_| invalid(format!("apiKeyHeader: invalid header name {h:?}")))?;
            sources.push(IdentitySource::ApiKey(name));
        }
        if o.bearer.unwrap_or(false) {
            sources.push(IdentitySource::Bearer);
        }
        let trusted = match &o.trusted_proxies {
            None => TrustedProxies::None,
            Some(Either::B(hops)) => TrustedProxies::Hops(*hops as usize),
            Some(Either::A(list)) => TrustedProxies::cidrs(list).map_err(|e| {
                invalid(format!(
                    "trustedProxies: {e} (expected networks such as \"10.0.0.0/8\" or addresses)"
                ))
            })?,
        };
        let prefix = |v: Option<u32>, default: u8, max: u8, what: &str| match v {
            None => Ok(default),
            Some(p) if p <= u32::from(max) => Ok(p as u8),
            Some(p) => Err(invalid(format!("{what} must be at most {max}, not {p}"))),
        };
        let client_ip = ClientIpConfig {
            trusted,
            ipv6_prefix: prefix(o.ipv6_prefix, 64, 128, "ipv6Prefix")?,
            ipv4_prefix: prefix(o.ipv4_prefix, 32, 32, "ipv4Prefix")?,
        };
        let hash_key = match &o.hash_key {
            Some(hex) => hash_key_from_hex(Some(hex))?,
            None => limiter.hash_key,
        };
        let status = o.fail_closed_status.unwrap_or(503);
        let fail_closed_status = u16::try_from(status)
            .ok()
            .and_then(|s| StatusCode::from_u16(s).ok())
            .filter(|s| s.is_client_error() || s.is_server_error())
            .ok_or_else(|| {
                invalid(format!(
                    "failClosedStatus must be a 4xx or 5xx status (503 or 429), not {status}"
                ))
            })?;
        Ok(Self {
            shared: Arc::new(Shared {
                limiter: limiter.limiter.clone(),
                rules: Vec::new(),
                resolver: IdentityResolver::new(sources, hash_key, client_ip),
                headers: HeaderOptions {
                    ratelimit: o.ratelimit_headers.unwrap_or(true),
                    legacy: o.legacy_headers.unwrap_or(false),
                },
                fail_closed_status,
            }),
        })
    }

    /// Adds a rule: `policies` apply to paths under `prefix` (segment-wise), for `methods`
    /// (all when `null`), each request costing `cost`. No policies exempts the prefix.
    #[napi]
    pub fn add_rule(
        &mut self,
        prefix: String,
        methods: Option<Vec<String>>,
        policies: Vec<ClassInstance<'_, Policy>>,
        cost: Option<f64>,
    ) -> napi::Result<()> {
        let mut matcher = Rule::new(prefix);
        if let Some(methods) = methods {
            let parsed = methods
                .iter()
                .map(|m| {
                    Method::from_bytes(m.to_ascii_uppercase().as_bytes())
                        .map_err(|_| invalid(format!("invalid HTTP method {m:?}")))
                })
                .collect::<napi::Result<Vec<_>>>()?;
            matcher = matcher.methods(parsed);
        }
        let cost = cost.map(|c| whole(c, "cost")).transpose()?.unwrap_or(1);
        let shared = Arc::get_mut(&mut self.shared)
            .ok_or_else(|| invalid("rules can only be added before the guard is in use"))?;
        shared.rules.push(GuardRule {
            matcher,
            policies: policies.iter().map(|p| Arc::clone(&p.inner)).collect(),
            cost,
        });
        shared
            .rules
            .sort_by(|a, b| a.matcher.precedence(&b.matcher));
        Ok(())
    }

    /// Decides a request; a Promise of a `GuardVerdict`. `rawHeaders` is Node's
    /// `req.rawHeaders`, `peer` the socket's remote address.
    #[napi(ts_return_type = "Promise<GuardVerdict>")]
    pub fn decide<'env>(
        &self,
        env: &'env Env,
        method: String,
        path: String,
        raw_headers: Vec<String>,
        peer: Option<String>,
    ) -> napi::Result<PromiseRaw<'env, GuardVerdict>> {
        let method = Method::from_bytes(method.as_bytes())
            .map_err(|_| invalid(format!("invalid HTTP method {method:?}")))?;
        // The path without its query: rules match paths.
        let path = match path.split_once('?') {
            Some((p, _)) => p.to_string(),
            None => path,
        };
        let head = RequestHead {
            method,
            path,
            headers: header_map(&raw_headers),
            peer: peer.and_then(|p| p.parse::<IpAddr>().ok()),
        };
        let shared = Arc::clone(&self.shared);
        env.spawn_future(async move { Ok(shared.decide(head).await) })
    }

    /// Gives back the leases of a verdict's `leaseToken` (call when the response ends); a
    /// Promise of how many the store still held.
    #[napi(ts_return_type = "Promise<number>")]
    pub fn release<'env>(
        &self,
        env: &'env Env,
        lease_token: String,
    ) -> napi::Result<PromiseRaw<'env, f64>> {
        let token = LeaseToken::decode(&lease_token).map_err(|e| invalid(e.to_string()))?;
        let shared = Arc::clone(&self.shared);
        let find = |name: &str| {
            shared
                .rules
                .iter()
                .flat_map(|r| r.policies.iter())
                .find(|p| p.name == name)
                .map(|p| &**p)
        };
        let leases = token
            .leases(shared.limiter.key_scheme(), find, None)
            .map_err(|e| invalid(e.to_string()))?;
        let limiter = shared.limiter.clone();
        env.spawn_future(async move {
            let mut released = 0u64;
            for lease in &leases {
                match limiter.release(lease).await {
                    Ok(true) => released += 1,
                    Ok(false) => {}
                    Err(e) => return Err(store_error(format!("lease release failed: {e}"))),
                }
            }
            Ok(number(released))
        })
    }
}
