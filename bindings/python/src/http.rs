//! `HttpGuard`: the request handling of the Python web middleware, which is the Rust
//! layer's own.
//!
//! The ASGI and WSGI middleware and the FastAPI dependency hand it the method, target, header
//! list and socket peer of a request and get back what to do: refuse it with a status, headers
//! and body, or let it through and, once the application has answered, finish it with the
//! response status to learn the headers to add. Every step is
//! [`sluice_config::middleware::Middleware`], that is `sluice-http`'s [`Decider`], the
//! function the tower layer and the `sluice serve` proxy answer with: the same 400 for a path
//! with no safe normal form, 403 for a deny-listed client, 429 for a banned one or one over
//! its limit, the fail-closed status, count-by-outcome refunds, and the same fields and
//! problem+json bodies. Built from a `sluice.toml` ([`HttpGuard::from_config`]) it limits
//! each route as the proxy does; built from rules given in code, as a `RateLimitLayer` with
//! those rules.
//!
//! [`Decider`]: sluice_http::Decider

use std::sync::Arc;

use http::{HeaderMap, HeaderName, Method, StatusCode};
use parking_lot::Mutex;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyBytes;
use sluice::{Policy, Verdict};
use sluice_config::middleware::{Admitted, Done, Middleware, Pass};
use sluice_http::{
    ClientIpConfig, HeaderOptions, IdentitySource, RateLimitLayer, RequestHead, Rule,
    TrustedProxies,
};

use crate::limiter::{PyLimiter, config_of, hash_key_from_hex};
use crate::policy::PyPolicy;

/// A rule as Python passes it: `(prefix, methods or None, [Policy, ...], cost)`.
type RuleArg<'py> = (String, Option<Vec<String>>, Vec<Bound<'py, PyPolicy>>, u64);

/// Which socket peers may set forwarding headers: a list of networks or a hop count.
#[derive(Debug, FromPyObject)]
pub(crate) enum TrustedArg {
    Hops(usize),
    Cidrs(Vec<String>),
}

/// Rate limiting for HTTP requests, shared by the Python middleware.
#[pyclass(module = "sluice", frozen)]
#[derive(Debug)]
pub struct HttpGuard {
    middleware: Arc<Middleware>,
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
    /// The answer's status on a refusal (400, 403, 429 or the fail-closed status); 200
    /// otherwise.
    #[pyo3(get)]
    status: u16,
    /// On a refusal, every header of the answer; once finished, those to add.
    headers: Arc<Mutex<Vec<(String, String)>>>,
    body: Vec<u8>,
    /// The identity the request was limited as (`key:h...`, `ip:203.0.113.7`, ...).
    #[pyo3(get)]
    identity: Option<String>,
    /// `decided`, `failed_open` or `failed_closed`; `None` when not limited.
    #[pyo3(get)]
    verdict: Option<&'static str>,
    /// When admitted: the normalized path the request was matched and limited as, if it
    /// differs from the path received (percent-encoded, no query). The middleware hand the
    /// application this path, as `sluice serve`'s proxy forwards it.
    #[pyo3(get)]
    path: Option<String>,
    /// The admission until `finish`.
    admitted: Mutex<Option<Admitted>>,
    /// The leases after `finish`, until `release`.
    done: Arc<Mutex<Option<Done>>>,
}

fn verdict_name(v: &Verdict) -> &'static str {
    v.as_str()
}

fn pairs(headers: &HeaderMap) -> Vec<(String, String)> {
    headers
        .iter()
        .map(|(n, v)| {
            (
                n.as_str().to_string(),
                String::from_utf8_lossy(v.as_bytes()).into_owned(),
            )
        })
        .collect()
}

impl HttpVerdict {
    fn of(pass: Pass) -> Self {
        match pass {
            Pass::Refuse(r) => Self {
                allowed: false,
                limited: true,
                status: r.status.as_u16(),
                headers: Arc::new(Mutex::new(pairs(&r.headers))),
                body: r.body.to_vec(),
                identity: r.identity.map(|i| i.as_str().to_string()),
                verdict: r.verdict.as_ref().map(verdict_name),
                path: None,
                admitted: Mutex::new(None),
                done: Arc::default(),
            },
            Pass::Admit(a) => Self {
                allowed: true,
                limited: a.is_limited(),
                status: 200,
                headers: Arc::default(),
                body: Vec::new(),
                identity: a.identity().map(|i| i.as_str().to_string()),
                verdict: a.verdict().map(verdict_name),
                path: a.normalized_path().map(str::to_string),
                admitted: Mutex::new(Some(a)),
                done: Arc::default(),
            },
        }
    }

    /// Settles the admission by `status`; keeps its leases in `done` and its headers in
    /// `headers`, and gives the headers.
    async fn settle(
        admitted: Option<Admitted>,
        status: u16,
        headers: Arc<Mutex<Vec<(String, String)>>>,
        done: Arc<Mutex<Option<Done>>>,
    ) -> Vec<(String, String)> {
        let Some(a) = admitted else {
            return headers.lock().clone();
        };
        let finished = a.finish(status).await;
        let added = pairs(&finished.headers);
        *headers.lock() = added.clone();
        *done.lock() = Some(finished);
        added
    }

    /// What `release` gives back: the leases of the finished request, and an admission never
    /// finished (the application failed before answering), which keeps its charge.
    fn take_for_release(&self) -> (Option<Admitted>, Option<Done>) {
        (self.admitted.lock().take(), self.done.lock().take())
    }
}

async fn release(admitted: Option<Admitted>, done: Option<Done>) -> usize {
    // Dropped inside the runtime, an unfinished admission's leases are released there.
    drop(admitted);
    match done {
        Some(d) => d.release().await,
        None => 0,
    }
}

#[pymethods]
impl HttpVerdict {
    /// The problem+json body of a refusal (empty when allowed).
    #[getter]
    fn body<'py>(&self, py: Python<'py>) -> Bound<'py, PyBytes> {
        PyBytes::new(py, &self.body)
    }
    /// On a refusal, every header of the answer; once finished, the headers to add to the
    /// response (empty before).
    #[getter]
    fn headers(&self) -> Vec<(String, String)> {
        self.headers.lock().clone()
    }
    /// How many concurrency leases the request holds until `release`.
    #[getter]
    fn leases(&self) -> usize {
        let admitted = self.admitted.lock().as_ref().map_or(0, Admitted::leases);
        let done = self
            .done
            .lock()
            .as_ref()
            .map_or(0, |d| d.leases.iter().map(|g| g.len()).sum());
        admitted + done
    }
    /// Settles an admitted request by its response `status` (a route counting by outcome
    /// gives back what it does not count) and gives the `(name, value)` headers to add to the
    /// response (awaitable). Call it when the response starts.
    fn finish<'py>(&self, py: Python<'py>, status: u16) -> PyResult<Bound<'py, PyAny>> {
        let admitted = self.admitted.lock().take();
        let (headers, done) = (Arc::clone(&self.headers), Arc::clone(&self.done));
        crate::completion::spawn(py, async move {
            Ok(Self::settle(admitted, status, headers, done).await)
        })
    }
    /// `finish` at once for a request whose route counts every request (no store call to wait
    /// for); `None` when it counts by outcome, for `finish` to settle.
    fn finish_now(&self, status: u16) -> Option<Vec<(String, String)>> {
        let Some(admitted) = self.admitted.lock().take() else {
            return Some(self.headers.lock().clone());
        };
        match admitted.finish_now(status) {
            Ok(done) => {
                let added = pairs(&done.headers);
                *self.headers.lock() = added.clone();
                *self.done.lock() = Some(done);
                Some(added)
            }
            Err(admitted) => {
                *self.admitted.lock() = Some(admitted);
                None
            }
        }
    }
    /// `finish` for WSGI code; the GIL is released meanwhile.
    fn finish_sync(&self, py: Python<'_>, status: u16) -> Vec<(String, String)> {
        let admitted = self.admitted.lock().take();
        let (headers, done) = (Arc::clone(&self.headers), Arc::clone(&self.done));
        py.detach(|| {
            pyo3_async_runtimes::tokio::get_runtime()
                .block_on(Self::settle(admitted, status, headers, done))
        })
    }
    /// Releases the request's concurrency leases (awaitable); call when the response ends.
    fn release<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let (admitted, done) = self.take_for_release();
        crate::completion::spawn(py, async move { Ok(release(admitted, done).await) })
    }
    /// `release` for WSGI code; the GIL is released meanwhile.
    fn release_sync(&self, py: Python<'_>) -> usize {
        let (admitted, done) = self.take_for_release();
        if admitted.is_none() && done.is_none() {
            return 0;
        }
        py.detach(|| pyo3_async_runtimes::tokio::get_runtime().block_on(release(admitted, done)))
    }
    fn __repr__(&self) -> String {
        format!(
            "HttpVerdict(allowed={}, status={}, identity={:?})",
            self.allowed, self.status, self.identity
        )
    }
}

/// The middleware's answer to a request head, or the 400 for one that cannot be read.
async fn decide(
    middleware: Arc<Middleware>,
    head: Result<RequestHead, sluice_http::Refusal>,
) -> HttpVerdict {
    match head {
        Ok(head) => HttpVerdict::of(middleware.decide(head).await),
        Err(bad) => HttpVerdict::of(Pass::Refuse(bad)),
    }
}

fn head(
    method: &str,
    target: &str,
    headers: Vec<(Vec<u8>, Vec<u8>)>,
    client: Option<&str>,
) -> Result<RequestHead, sluice_http::Refusal> {
    RequestHead::from_raw(method, target, headers, client)
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
        let mut builder = RateLimitLayer::builder(limiter.limiter.clone());
        for (prefix, methods, policies, cost) in rules {
            let mut rule = Rule::new(prefix).cost(cost);
            if let Some(methods) = methods {
                let parsed = methods
                    .iter()
                    .map(|m| {
                        Method::from_bytes(m.to_ascii_uppercase().as_bytes()).map_err(|_| {
                            PyValueError::new_err(format!("invalid HTTP method {m:?}"))
                        })
                    })
                    .collect::<PyResult<Vec<_>>>()?;
                rule = rule.methods(parsed);
            }
            for p in &policies {
                rule = rule.policy(Arc::<Policy>::clone(&p.get().inner));
            }
            builder = builder.rule(rule);
        }
        if let Some(h) = api_key_header {
            let name = HeaderName::from_bytes(h.to_ascii_lowercase().as_bytes())
                .map_err(|_| PyValueError::new_err(format!("invalid header name {h:?}")))?;
            builder = builder.identity(IdentitySource::ApiKey(name));
        }
        if bearer {
            builder = builder.identity(IdentitySource::Bearer);
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
        let decider = builder
            .hash_key(hash_key)
            .client_ip(ClientIpConfig {
                trusted,
                ipv6_prefix: ipv6_prefix.min(128),
                ipv4_prefix: ipv4_prefix.min(32),
            })
            .headers(HeaderOptions {
                ratelimit: ratelimit_headers,
                legacy: legacy_headers,
            })
            .fail_closed_status(fail_closed_status)
            .build_decider();
        Ok(Self {
            middleware: Arc::new(Middleware::single(decider)),
        })
    }

    /// The `[[routes]]` of a `sluice.toml` (a `Config` or a path), limited on `limiter` as
    /// `sluice serve`'s proxy limits them: each route's policies by their own identities,
    /// with the file's hash key, trusted proxies, headers and `count`.
    #[staticmethod]
    fn from_config(limiter: &PyLimiter, config: &Bound<'_, PyAny>) -> PyResult<Self> {
        let config = config_of(config)?;
        Ok(Self {
            middleware: Arc::new(Middleware::from_config(&config, &limiter.limiter)),
        })
    }

    /// Decides a request (awaitable, giving an `HttpVerdict`). `target` is the path as sent
    /// (not percent-decoded), with its query if any; `headers` the ASGI list of `(name,
    /// value)` byte pairs; `client` the socket peer's address, if any.
    #[pyo3(signature = (method, target, headers, client=None))]
    fn decide<'py>(
        &self,
        py: Python<'py>,
        method: &str,
        target: &str,
        headers: Vec<(Vec<u8>, Vec<u8>)>,
        client: Option<&str>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let head = head(method, target, headers, client);
        let middleware = Arc::clone(&self.middleware);
        crate::completion::spawn(py, async move { Ok(decide(middleware, head).await) })
    }

    /// `decide` for WSGI code; the GIL is released while the store answers.
    #[pyo3(signature = (method, target, headers, client=None))]
    fn decide_sync(
        &self,
        py: Python<'_>,
        method: &str,
        target: &str,
        headers: Vec<(Vec<u8>, Vec<u8>)>,
        client: Option<&str>,
    ) -> HttpVerdict {
        let head = head(method, target, headers, client);
        let middleware = Arc::clone(&self.middleware);
        py.detach(|| pyo3_async_runtimes::tokio::get_runtime().block_on(decide(middleware, head)))
    }
}
