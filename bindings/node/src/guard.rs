//! `HttpGuard`: the request handling of the Express and Fastify middleware, which is the
//! Rust layer's own.
//!
//! The middleware hands over a request's method, target, raw header list and socket peer and
//! gets back what to do: refuse it with a status, headers and body, or let it through with a
//! ticket that, once the application has answered, is finished with the response status to
//! learn the headers to add, and released when the response ends. Every step is
//! [`sluice_config::middleware::Middleware`], that is `sluice-http`'s [`Decider`], the
//! function the tower layer and the `sluice serve` proxy answer with: the same 400 for a path
//! with no safe normal form, 403 for a deny-listed client, 429 for a banned one or one over
//! its limit, the fail-closed status, count-by-outcome refunds, and the same fields and
//! problem+json bodies. Built from a `sluice.toml` (`HttpGuard.fromConfig`) it limits each
//! route as the proxy does; built from rules given in code, as a `RateLimitLayer` with those
//! rules.
//!
//! [`Decider`]: sluice_http::Decider

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use http::{HeaderMap, HeaderName, Method, StatusCode};
use napi::Env;
use napi::bindgen_prelude::{ClassInstance, Either, PromiseRaw};
use napi_derive::napi;
use sluice_config::middleware::{Admitted, Done, Middleware, Pass};
use sluice_http::headers::display_header_name;
use sluice_http::{
    ClientIpConfig, HeaderOptions, IdentitySource, RateLimitLayer, RateLimitLayerBuilder,
    RequestHead, Rule, TrustedProxies,
};

use crate::config::Config;
use crate::decision::verdict_name;
use crate::limiter::{Limiter, hash_key_from_hex};
use crate::policy::Policy;
use crate::{invalid, number, whole};

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
    /// The answer's status on a refusal (400, 403, 429 or the fail-closed status); 200
    /// otherwise.
    pub status: u32,
    /// On a refusal every header of the answer: `[name, value, ...]` (empty when admitted:
    /// `guard.finish` gives those to add).
    pub headers: Vec<String>,
    /// The problem+json body of a refusal.
    pub body: Option<String>,
    /// The identity the request was limited as (`key:h...`, `ip:203.0.113.7`).
    pub identity: Option<String>,
    /// `decided`, `failed_open` or `failed_closed`; `null` when not limited.
    pub verdict: Option<String>,
    /// An admitted, limited request's ticket for `guard.finish` and `guard.release`.
    pub ticket: Option<u32>,
    /// When admitted: the normalized path the request was matched and limited as, if it
    /// differs from the path received (percent-encoded, no query). The middleware hand the
    /// application this path, as `sluice serve`'s proxy forwards it.
    pub path: Option<String>,
}

/// What `guard.finish` gives: the headers to add, and whether leases wait for `release`.
#[napi(object)]
#[derive(Debug, Clone)]
pub struct GuardFinished {
    /// `[name, value, ...]`: the RateLimit fields of the response.
    pub headers: Vec<String>,
    /// Concurrency leases held until `guard.release(ticket)`.
    pub leases: u32,
}

fn flatten(headers: &HeaderMap) -> Vec<String> {
    let mut out = Vec::with_capacity(headers.len() * 2);
    for (n, v) in headers {
        out.push(display_header_name(n.as_str()));
        out.push(String::from_utf8_lossy(v.as_bytes()).into_owned());
    }
    out
}

/// A request between `decide` and `release`.
#[derive(Debug)]
enum Ticket {
    Admitted(Admitted),
    Done(Done),
}

/// The guard's middleware: rules still being added, or built.
enum State {
    Building(Option<RateLimitLayerBuilder>),
    Ready(Arc<Middleware>),
}

impl std::fmt::Debug for State {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            State::Building(_) => "Building",
            State::Ready(_) => "Ready",
        })
    }
}

/// Rate limiting for HTTP requests, shared by the Express and Fastify middleware.
#[napi]
#[derive(Debug)]
pub struct HttpGuard {
    state: Mutex<State>,
    tickets: Arc<Mutex<HashMap<u32, Ticket>>>,
    next_ticket: Arc<AtomicU32>,
}

impl HttpGuard {
    fn of(state: State) -> Self {
        Self {
            state: Mutex::new(state),
            tickets: Arc::default(),
            next_ticket: Arc::new(AtomicU32::new(1)),
        }
    }

    /// The middleware, built from the rules added so far at the first request.
    fn middleware(&self) -> Arc<Middleware> {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        if let State::Building(builder) = &mut *state {
            let decider = builder
                .take()
                .expect("a guard being built holds its builder")
                .build_decider();
            *state = State::Ready(Arc::new(Middleware::single(decider)));
        }
        match &*state {
            State::Ready(m) => Arc::clone(m),
            State::Building(_) => unreachable!("built above"),
        }
    }
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
        let builder = RateLimitLayer::builder(limiter.limiter.clone())
            .hash_key(hash_key)
            .client_ip(client_ip)
            .headers(HeaderOptions {
                ratelimit: o.ratelimit_headers.unwrap_or(true),
                legacy: o.legacy_headers.unwrap_or(false),
            })
            .fail_closed_status(fail_closed_status);
        let builder = sources.into_iter().fold(builder, |b, s| b.identity(s));
        Ok(Self::of(State::Building(Some(builder))))
    }

    /// The `[[routes]]` of a checked `sluice.toml`, limited on `limiter` as `sluice serve`'s
    /// proxy limits them: each route's policies by their own identities, with the file's hash
    /// key, trusted proxies, headers and `count`.
    #[napi(factory)]
    pub fn from_config(limiter: &Limiter, config: &Config) -> Self {
        let middleware = Middleware::from_config(&config.inner, &limiter.limiter);
        Self::of(State::Ready(Arc::new(middleware)))
    }

    /// Adds a rule: `policies` apply to paths under `prefix` (segment-wise), for `methods`
    /// (all when `null`), each request costing `cost`. No policies exempts the prefix.
    #[napi]
    pub fn add_rule(
        &self,
        prefix: String,
        methods: Option<Vec<String>>,
        policies: Vec<ClassInstance<'_, Policy>>,
        cost: Option<f64>,
    ) -> napi::Result<()> {
        let mut rule = Rule::new(prefix);
        if let Some(methods) = methods {
            let parsed = methods
                .iter()
                .map(|m| {
                    Method::from_bytes(m.to_ascii_uppercase().as_bytes())
                        .map_err(|_| invalid(format!("invalid HTTP method {m:?}")))
                })
                .collect::<napi::Result<Vec<_>>>()?;
            rule = rule.methods(parsed);
        }
        rule = rule.cost(cost.map(|c| whole(c, "cost")).transpose()?.unwrap_or(1));
        for p in &policies {
            rule = rule.policy(Arc::clone(&p.inner));
        }
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        match &mut *state {
            State::Building(builder) => {
                let b = builder
                    .take()
                    .expect("a guard being built holds its builder");
                *builder = Some(b.rule(rule));
                Ok(())
            }
            State::Ready(_) => Err(invalid(
                "rules can only be added before the guard is in use",
            )),
        }
    }

    /// Decides a request; a Promise of a `GuardVerdict`. `target` is the path as sent (with
    /// its query), `rawHeaders` Node's `req.rawHeaders`, `peer` the socket's remote address.
    #[napi(ts_return_type = "Promise<GuardVerdict>")]
    pub fn decide<'env>(
        &self,
        env: &'env Env,
        method: String,
        target: String,
        raw_headers: Vec<String>,
        peer: Option<String>,
    ) -> napi::Result<PromiseRaw<'env, GuardVerdict>> {
        let pairs = raw_headers
            .chunks_exact(2)
            .map(|p| (p[0].as_bytes().to_vec(), p[1].as_bytes().to_vec()));
        let head = RequestHead::from_raw(&method, &target, pairs, peer.as_deref());
        let middleware = self.middleware();
        let tickets = Arc::clone(&self.tickets);
        let next = Arc::clone(&self.next_ticket);
        env.spawn_future(async move {
            let pass = match head {
                Ok(head) => middleware.decide(head).await,
                Err(bad) => Pass::Refuse(bad),
            };
            Ok(match pass {
                Pass::Refuse(r) => GuardVerdict {
                    allowed: false,
                    limited: true,
                    status: u32::from(r.status.as_u16()),
                    headers: flatten(&r.headers),
                    body: Some(String::from_utf8_lossy(&r.body).into_owned()),
                    identity: r.identity.map(|i| i.as_str().to_string()),
                    verdict: r.verdict.as_ref().map(|v| verdict_name(v).to_string()),
                    ticket: None,
                    path: None,
                },
                Pass::Admit(a) => {
                    let limited = a.is_limited();
                    let identity = a.identity().map(|i| i.as_str().to_string());
                    let verdict = a.verdict().map(|v| verdict_name(v).to_string());
                    let path = a.normalized_path().map(str::to_string);
                    let ticket = limited.then(|| {
                        let id = next.fetch_add(1, Ordering::Relaxed);
                        tickets
                            .lock()
                            .unwrap_or_else(PoisonError::into_inner)
                            .insert(id, Ticket::Admitted(a));
                        id
                    });
                    GuardVerdict {
                        allowed: true,
                        limited,
                        status: 200,
                        headers: Vec::new(),
                        body: None,
                        identity,
                        verdict,
                        ticket,
                        path,
                    }
                }
            })
        })
    }

    /// Settles an admitted request by its response `status` (a route counting by outcome
    /// gives back what it does not count); a Promise of the headers to add. Call it when the
    /// response starts.
    #[napi(ts_return_type = "Promise<GuardFinished>")]
    pub fn finish<'env>(
        &self,
        env: &'env Env,
        ticket: u32,
        status: u32,
    ) -> napi::Result<PromiseRaw<'env, GuardFinished>> {
        let admitted = match self
            .tickets
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&ticket)
        {
            Some(Ticket::Admitted(a)) => Some(a),
            Some(done @ Ticket::Done(_)) => {
                self.tickets
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .insert(ticket, done);
                None
            }
            None => None,
        };
        let tickets = Arc::clone(&self.tickets);
        env.spawn_future(async move {
            let Some(a) = admitted else {
                return Ok(GuardFinished {
                    headers: Vec::new(),
                    leases: 0,
                });
            };
            let done = a.finish(u16::try_from(status).unwrap_or(0)).await;
            let headers = flatten(&done.headers);
            let leases: usize = done.leases.iter().map(|g| g.len()).sum();
            if leases > 0 {
                tickets
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .insert(ticket, Ticket::Done(done));
            }
            Ok(GuardFinished {
                headers,
                leases: u32::try_from(leases).unwrap_or(u32::MAX),
            })
        })
    }

    /// `finish` at once for a request whose route counts every request (no store call to
    /// wait for); `null` when it counts by outcome, for `finish` to settle.
    #[napi]
    pub fn finish_now(&self, ticket: u32, status: u32) -> Option<GuardFinished> {
        let mut tickets = self.tickets.lock().unwrap_or_else(PoisonError::into_inner);
        let admitted = match tickets.remove(&ticket) {
            Some(Ticket::Admitted(a)) => a,
            Some(done @ Ticket::Done(_)) => {
                tickets.insert(ticket, done);
                return Some(GuardFinished {
                    headers: Vec::new(),
                    leases: 0,
                });
            }
            None => {
                return Some(GuardFinished {
                    headers: Vec::new(),
                    leases: 0,
                });
            }
        };
        match admitted.finish_now(u16::try_from(status).unwrap_or(0)) {
            Ok(done) => {
                let headers = flatten(&done.headers);
                let leases: usize = done.leases.iter().map(|g| g.len()).sum();
                if leases > 0 {
                    tickets.insert(ticket, Ticket::Done(done));
                }
                Some(GuardFinished {
                    headers,
                    leases: u32::try_from(leases).unwrap_or(u32::MAX),
                })
            }
            Err(admitted) => {
                tickets.insert(ticket, Ticket::Admitted(admitted));
                None
            }
        }
    }

    /// Ends a ticket (call when the response is over, sent or aborted): releases its
    /// concurrency leases, and an admission never finished keeps its charge. A Promise of how
    /// many leases the store released.
    #[napi(ts_return_type = "Promise<number>")]
    pub fn release<'env>(
        &self,
        env: &'env Env,
        ticket: u32,
    ) -> napi::Result<PromiseRaw<'env, f64>> {
        let entry = self
            .tickets
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&ticket);
        env.spawn_future(async move {
            let released = match entry {
                Some(Ticket::Done(done)) => done.release().await,
                // Dropped here, inside the runtime: its leases are released in the background.
                Some(Ticket::Admitted(a)) => {
                    drop(a);
                    0
                }
                None => 0,
            };
            Ok(number(released as u64))
        })
    }
}
