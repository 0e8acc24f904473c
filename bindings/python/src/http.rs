//! `HttpGuard`: the tower layer's per-request work for Python web frameworks.
//!
//! The ASGI and WSGI middleware and the FastAPI dependency hand it the method, path, header
//! list and socket peer of a request and get back what to do: pass (with the headers to
//! add), or answer with a status, headers and body. Everything in between is the Rust
//! layer's own code: rules are matched with [`sluice_http::Rule`], the identity comes from
//! [`IdentityResolver`] (hashed API keys and bearer tokens, the client IP through trusted
//! proxies only, IPv6 grouped by prefix), the check is [`Limiter::check_many`] and the
//! answers are [`headers::too_many_requests`], [`headers::store_unavailable`] and
//! [`headers::rate_limit_headers`]. A Python app therefore answers exactly like an axum app
//! with `RateLimitLayer` and limits the same identities.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use http::{HeaderName, HeaderValue, Method, StatusCode};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyBytes;
use sluice::{Identity, Lease, Limiter, Policy, Verdict};
use sluice_http::headers;
use sluice_http::{
    ClientIpConfig, HeaderOptions, IdentityResolver, IdentitySource, Rule, TrustedProxies,
};

use crate::StoreError;
use crate::decision::release_all;
use crate::limiter::{PyLimiter, hash_key_from_hex};
use crate::policy::PyPolicy;

/// One rule: the matcher of the Rust layer plus the policies and cost it applies.
#[derive(Debug)]
struct GuardRule {
    matcher: Rule,
    policies: Vec<Arc<Policy>>,
    cost: u64,
}

/// A rule as Python passes it: `(prefix, methods or None, [Policy, ...], cost)`.
type RuleArg<'py> = (String, Option<Vec<String>>, Vec<Bound<'py, PyPolicy>>, u64);

/// Which socket peers may set forwarding headers: a list of networks or a hop count.
#[derive(Debug, FromPyObject)]
pub(crate) enum TrustedArg {
    Hops(usize),
    Cidrs(Vec<String>),
}

#[derive(Debug)]
struct Shared {
    limiter: Limiter,
    rules: Vec<GuardRule>,
    resolver: IdentityResolver,
    headers: HeaderOptions,
    fail_closed_status: StatusCode,
}

/// Rate limiting for HTTP requests, shared by the Python middleware.
#[pyclass(module = "sluice", frozen)]
#[derive(Debug)]
pub struct HttpGuard {
    shared: Arc<Shared>,
}

/// What the middleware does with a request.
#[pyclass(module = "sluice", frozen)]
#[derive(Debug)]
pub struct HttpVerdict {
    /// False when the request must be answered with `status`, `headers`, `body`.
    #[pyo3(get)]
    allowed: bool,
    /// False when no rule (or a rule without policies) covers the request.
    #[pyo3(get)]
    limited: bool,
    /// The answer's status on a denial (429, or the fail-closed status); 200 otherwise.
    #[pyo3(get)]
    status: u16,
    /// On a denial, every header of the answer; otherwise those to add to the response.
    #[pyo3(get)]
    headers: Vec<(String, String)>,
    body: Vec<u8>,
    /// The identity the request was limited as (`key:h...`, `ip:203.0.113.7`, ...).
    #[pyo3(get)]
    identity: Option<String>,
    /// `decided`, `failed_open` or `failed_closed`; `None` when not limited.
    #[pyo3(get)]
    verdict: Option<&'static str>,
    limiter: Limiter,
    leases: parking_lot::Mutex<Vec<Lease>>,
}

#[pymethods]
impl HttpVerdict {
    /// The problem+json body of a denial (empty when allowed).
    #[getter]
    fn body<'py>(&self, py: Python<'py>) -> Bound<'py, PyBytes> {
        PyBytes::new(py, &self.body)
    }
    /// How many concurrency leases the request holds until `release`.
    #[getter]
    fn leases(&self) -> usize {
        self.leases.lock().len()
    }
    /// Releases the request's concurrency leases (awaitable); call when the response ends.
    fn release<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let leases = std::mem::take(&mut *self.leases.lock());
        let limiter = self.limiter.clone();
        crate::completion::spawn(py, async move {
            release_all(&limiter, &leases)
                .await
                .map_err(StoreError::new_err)
        })
    }
    /// `release` for WSGI code; the GIL is released meanwhile.
    fn release_sync(&self, py: Python<'_>) -> PyResult<usize> {
        let leases = std::mem::take(&mut *self.leases.lock());
        if leases.is_empty() {
            return Ok(0);
        }
        let limiter = self.limiter.clone();
        py.detach(|| {
            pyo3_async_runtimes::tokio::get_runtime()
                .block_on(release_all(&limiter, &leases))
                .map_err(StoreError::new_err)
        })
    }
    fn __repr__(&self) -> String {
        format!(
            "HttpVerdict(allowed={}, status={}, identity={:?})",
            self.allowed, self.status, self.identity
        )
    }
}

/// A request as the middleware saw it, owned so it can move to the runtime.
struct RequestHead {
    method: Method,
    path: String,
    headers: http::HeaderMap,
    peer: Option<IpAddr>,
}

impl Shared {
    fn verdict(&self, allowed: bool, limited: bool) -> HttpVerdict {
        HttpVerdict {
            allowed,
            limited,
            status: 200,
            headers: Vec::new(),
            body: Vec::new(),
            identity: None,
            verdict: None,
            limiter: self.limiter.clone(),
            leases: parking_lot::Mutex::new(Vec::new()),
        }
    }

    /// The layer's `call`, without the inner service.
    async fn decide(&self, head: RequestHead) -> HttpVerdict {
        let Some(rule) = self
            .rules
            .iter()
            .find(|r| r.matcher.matches(&head.method, &head.path))
        else {
            return self.verdict(true, false);
        };
        if rule.policies.is_empty() {
            return self.verdict(true, false);
        }
        let mut req = http::Request::new(());
        *req.method_mut() = head.method;
        *req.headers_mut() = head.headers;
        if let Some(ip) = head.peer {
            req.extensions_mut().insert(SocketAddr::new(ip, 0));
        }
        let (parts, ()) = req.into_parts();
        let identity = self.resolver.resolve(&parts);
        let items: Vec<(&Identity, &Arc<Policy>, u64)> = rule
            .policies
            .iter()
            .map(|p| (&identity, p, rule.cost))
            .collect();
        let mut checked = self.limiter.check_many(&items).await;
        let mut out = self.verdict(checked.allowed, true);
        out.identity = Some(identity.as_str().to_string());
        out.verdict = Some(match checked.verdict {
            Verdict::Decided => "decided",
            Verdict::FailedOpen(_) => "failed_open",
            Verdict::FailedClosed(_) => "failed_closed",
        });
        *out.leases.lock() = std::mem::take(&mut checked.leases);
        if !checked.allowed {
            let res = if matches!(checked.verdict, Verdict::FailedClosed(_)) {
                headers::store_unavailable(&checked, self.fail_closed_status)
            } else {
                headers::too_many_requests(&checked, &self.headers)
            };
            out.status = res.status().as_u16();
            out.headers = pairs(res.headers().iter());
            out.body = res.into_body().to_vec();
            return out;
        }
        let delay = checked.delay_ms();
        if delay > 0 {
            tokio::time::sleep(Duration::from_millis(delay)).await;
        }
        let added = headers::rate_limit_headers(&checked, &self.headers);
        out.headers = pairs(added.iter().map(|(n, v)| (n, v)));
        out
    }
}

fn pairs<'a>(it: impl Iterator<Item = (&'a HeaderName, &'a HeaderValue)>) -> Vec<(String, String)> {
    it.map(|(n, v)| {
        (
            n.as_str().to_string(),
            String::from_utf8_lossy(v.as_bytes()).into_owned(),
        )
    })
    .collect()
}

/// Reads the request head from what the middleware passes.
fn head(
    method: &str,
    path: &str,
    raw_headers: Vec<(Vec<u8>, Vec<u8>)>,
    client: Option<&str>,
) -> PyResult<RequestHead> {
    let method = Method::from_bytes(method.as_bytes())
        .map_err(|_| PyValueError::new_err(format!("invalid HTTP method {method:?}")))?;
    let mut headers = http::HeaderMap::with_capacity(raw_headers.len());
    for (n, v) in raw_headers {
        // A header the http crate cannot represent is one no identity source reads; skip it
        // rather than refuse the request.
        if let (Ok(n), Ok(v)) = (HeaderName::from_bytes(&n), HeaderValue::from_bytes(&v)) {
            headers.append(n, v);
        }
    }
    // A peer that is not an IP address (a Unix socket, a test client) has no address to
    // limit by: the request falls to `ip:unknown`, as in the Rust layer.
    let peer = client.and_then(|c| c.trim_matches(['[', ']']).parse::<IpAddr>().ok());
    Ok(RequestHead {
        method,
        path: path.to_string(),
        headers,
        peer,
    })
}

#[pymethods]
impl HttpGuard {
    /// `rules`: `(prefix, methods or None, [Policy, ...], cost)` tuples; the longest prefix
    /// wins, a rule naming the method wins over one that does not, and a rule without
    /// policies exempts its prefix. Identities: `api_key_header` (hashed), `bearer` (the
    /// token of `Authorization: Bearer`, hashed), then the client IP; `trusted_proxies` is a
    /// list of networks (`["10.0.0.0/8"]`) or a hop count.
    #[new]
    #[pyo3(signature = (limiter, rules, *, api_key_header=None, bearer=false, trusted_proxies=None, ipv6_prefix=64, ipv4_prefix=32, hash_key=None, legacy_headers=false, ratelimit_headers=true, fail_closed_status=503))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        limiter: &PyLimiter,
        rules: Vec<RuleArg<'_>>,
        api_key_header: Option<&str>,
        bearer: bool,
        trusted_proxies: Option<TrustedArg>,
        ipv6_prefix: u8,
        ipv4_prefix: u8,
        hash_key: Option<&str>,
        legacy_headers: bool,
        ratelimit_headers: bool,
        fail_closed_status: u16,
    ) -> PyResult<Self> {
        let mut guard_rules = Vec::with_capacity(rules.len());
        for (prefix, methods, policies, cost) in rules {
            let mut matcher = Rule::new(prefix);
            if let Some(methods) = methods {
                let parsed = methods
                    .iter()
                    .map(|m| {
                        Method::from_bytes(m.to_ascii_uppercase().as_bytes()).map_err(|_| {
                            PyValueError::new_err(format!("invalid HTTP method {m:?}"))
                        })
                    })
                    .collect::<PyResult<Vec<_>>>()?;
                matcher = matcher.methods(parsed);
            }
            guard_rules.push(GuardRule {
                matcher,
                policies: policies
                    .iter()
                    .map(|p| Arc::clone(&p.get().inner))
                    .collect(),
                cost,
            });
        }
        guard_rules.sort_by(|a, b| a.matcher.precedence(&b.matcher));
        let mut sources = Vec::new();
        if let Some(h) = api_key_header {
            let name = HeaderName::from_bytes(h.to_ascii_lowercase().as_bytes())
                .map_err(|_| PyValueError::new_err(format!("invalid header name {h:?}")))?;
            sources.push(IdentitySource::ApiKey(name));
        }
        if bearer {
            sources.push(IdentitySource::Bearer);
        }
        let trusted = match trusted_proxies {
            None => TrustedProxies::None,
            Some(TrustedArg::Hops(n)) => TrustedProxies::Hops(n),
            Some(TrustedArg::Cidrs(list)) => TrustedProxies::cidrs(&list).map_err(|e| {
                PyValueError::new_err(format!(
                    "trusted_proxies: {e} (expected networks such as \"10.0.0.0/8\" or addresses)"
                ))
            })?,
        };
        let client_ip = ClientIpConfig {
            trusted,
            ipv6_prefix: ipv6_prefix.min(128),
            ipv4_prefix: ipv4_prefix.min(32),
        };
        let hash_key = match hash_key {
            Some(_) => hash_key_from_hex(hash_key)?,
            None => limiter.hash_key,
        };
        let fail_closed_status = StatusCode::from_u16(fail_closed_status)
            .ok()
            .filter(|s| s.is_client_error() || s.is_server_error())
            .ok_or_else(|| {
                PyValueError::new_err(format!(
                    "fail_closed_status must be a 4xx or 5xx status (503 or 429), not {fail_closed_status}"
                ))
            })?;
        Ok(Self {
            shared: Arc::new(Shared {
                limiter: limiter.limiter.clone(),
                rules: guard_rules,
                resolver: IdentityResolver::new(sources, hash_key, client_ip),
                headers: HeaderOptions {
                    ratelimit: ratelimit_headers,
                    legacy: legacy_headers,
                },
                fail_closed_status,
            }),
        })
    }

    /// Decides a request (awaitable, giving an `HttpVerdict`). `headers` is the ASGI list
    /// of `(name, value)` byte pairs; `client` the socket peer's address, if any.
    #[pyo3(signature = (method, path, headers, client=None))]
    fn decide<'py>(
        &self,
        py: Python<'py>,
        method: &str,
        path: &str,
        headers: Vec<(Vec<u8>, Vec<u8>)>,
        client: Option<&str>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let head = head(method, path, headers, client)?;
        let shared = Arc::clone(&self.shared);
        crate::completion::spawn(py, async move { Ok(shared.decide(head).await) })
    }

    /// `decide` for WSGI code; the GIL is released while the store answers.
    #[pyo3(signature = (method, path, headers, client=None))]
    fn decide_sync(
        &self,
        py: Python<'_>,
        method: &str,
        path: &str,
        headers: Vec<(Vec<u8>, Vec<u8>)>,
        client: Option<&str>,
    ) -> PyResult<HttpVerdict> {
        let head = head(method, path, headers, client)?;
        let shared = Arc::clone(&self.shared);
        Ok(py.detach(|| pyo3_async_runtimes::tokio::get_runtime().block_on(shared.decide(head))))
    }
}
