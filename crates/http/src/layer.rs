//! The tower [`RateLimitLayer`] and its [`RateLimit`] service: [`crate::decide`] as tower
//! middleware.
//!
//! The decision is made in `call`, and a refusal is answered there at once: `poll_ready` only
//! asks the inner service. A limiter that stalled in `poll_ready` would hold every caller of
//! a shared service (axum treats services as always ready, so it would not even work there),
//! and a client over its limit must learn so now, with a `Retry-After`, not after a queue.
//!
//! Per request the service asks its [`Decider`] ([`Decider::decide`]: path normalization,
//! rule, identity, control plane, policies, shaping delay). A refusal (400, 403, 429, the
//! fail-closed status) is the response. An admitted request goes to the inner service with
//! the normalized target and a [`RateLimitIdentity`] extension; its response status finishes
//! the admission ([`crate::decide::Admission::finish`], which refunds a rule counting by
//! outcome when the status is not counted; a response carrying
//! [`crate::count::UpstreamFailed`] keeps the charge), and the RateLimit headers of the
//! settled check are merged into the response. A request that never gets its status (client
//! gone, inner service error) keeps its reservation.
//!
//! Concurrency policies hold a lease while the request runs. The lease sits in a
//! [`LeaseGuard`] that releases it when dropped; the guard lives in the request's future and
//! then in the response body ([`RateLimitBody`]), so it is released when the body ends, and
//! also when the inner service errors, when the future is dropped (client gone, timeout) and
//! when the handler panics (unwinding drops the future). A lease whose release never happens
//! (process killed) expires after the policy's lease timeout.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body::Body;
use sluice::{Identity, Limiter, Policy};

pub use crate::body::{LeaseGuard, RateLimitBody};
use crate::count::UpstreamFailed;
use crate::decide::{Answer, Decider};
use crate::headers::HeaderOptions;
use crate::identity::{ClientIpConfig, IdentityResolver, IdentitySource, TrustedProxies};
pub use crate::rule::Rule;
pub use crate::stats::{RateLimitStats, StatsSnapshot};

/// The identity the layer limited a request as, inserted into the request's extensions for
/// the handler (logging, per-tenant answers).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RateLimitIdentity(pub Identity);

/// Settings of a [`RateLimitLayer`].
#[derive(Debug)]
pub struct RateLimitLayerBuilder {
    limiter: Limiter,
    rules: Vec<Rule>,
    sources: Vec<IdentitySource>,
    hash_key: [u8; 32],
    client_ip: ClientIpConfig,
    headers: HeaderOptions,
    fail_closed_status: StatusCode,
}

impl RateLimitLayerBuilder {
    /// Adds a rule.
    pub fn rule(mut self, rule: Rule) -> Self {
        self.rules.push(rule);
        self
    }
    /// Adds a policy for every request (to the rule for `/`, any method).
    pub fn policy(mut self, policy: impl Into<Arc<Policy>>) -> Self {
        match self
            .rules
            .iter_mut()
            .find(|r| r.prefix == "/" && r.methods.is_empty())
        {
            Some(r) => r.policies.push(policy.into()),
            None => self.rules.push(Rule::new("/").policy(policy)),
        }
        self
    }
    /// Adds an identity source, tried in the order added; the client IP comes last.
    pub fn identity(mut self, source: IdentitySource) -> Self {
        self.sources.push(source);
        self
    }
    /// The secret that API keys and bearer tokens are hashed with. Set one per deployment
    /// (the same on every instance, or identities will not match across them).
    pub fn hash_key(mut self, key: [u8; 32]) -> Self {
        self.hash_key = key;
        self
    }
    /// All client IP settings at once.
    pub fn client_ip(mut self, config: ClientIpConfig) -> Self {
        self.client_ip = config;
        self
    }
    /// Which socket peers may set `Forwarded` / `X-Forwarded-For` / `X-Real-IP`.
    pub fn trusted_proxies(mut self, trusted: TrustedProxies) -> Self {
        self.client_ip.trusted = trusted;
        self
    }
    /// The prefix IPv6 clients are grouped by (default 64).
    pub fn ipv6_prefix(mut self, bits: u8) -> Self {
        self.client_ip.ipv6_prefix = bits.min(128);
        self
    }
    /// Which informational headers to send (default: the draft's `RateLimit` fields only).
    pub fn headers(mut self, options: HeaderOptions) -> Self {
        self.headers = options;
        self
    }
    /// The status answered when the store fails and a policy fails closed: 503 (default,
    /// the server cannot decide) or 429 (for clients that only back off on 429).
    pub fn fail_closed_status(mut self, status: StatusCode) -> Self {
        self.fail_closed_status = status;
        self
    }
    /// Builds the layer.
    pub fn build(self) -> RateLimitLayer {
        RateLimitLayer {
            decider: self.build_decider(),
        }
    }
    /// Builds the [`Decider`] alone, for a front end that is not a tower service (the Python
    /// and Node middleware): the same rules, identities, headers and fail-closed status.
    pub fn build_decider(self) -> Arc<Decider> {
        let mut rules = self.rules;
        rules.sort_by(Rule::precedence);
        Arc::new(Decider {
            limiter: self.limiter,
            rules,
            resolver: IdentityResolver::new(self.sources, self.hash_key, self.client_ip),
            headers: self.headers,
            fail_closed_status: self.fail_closed_status,
            stats: Arc::new(RateLimitStats::default()),
        })
    }
}

/// A tower layer that rate-limits HTTP requests with a [`Limiter`].
///
/// ```no_run
/// # async fn f() -> Result<(), Box<dyn std::error::Error>> {
/// use sluice::{Algorithm, Limiter, Policy, Rate};
/// use sluice_http::{IdentitySource, RateLimitLayer};
///
/// let burst = Policy::new("burst", Algorithm::TokenBucket { capacity: 10, rate: Rate::per_second(5) })?;
/// let layer = RateLimitLayer::builder(Limiter::memory())
///     .policy(burst)
///     .identity(IdentitySource::api_key("x-api-key"))
///     .build();
/// let app: axum::Router = axum::Router::new()
///     .route("/hello", axum::routing::get(|| async { "hi" }))
///     .layer(layer);
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct RateLimitLayer {
    decider: Arc<Decider>,
}

impl RateLimitLayer {
    /// A builder on `limiter`, with no rules yet.
    pub fn builder(limiter: Limiter) -> RateLimitLayerBuilder {
        RateLimitLayerBuilder {
            limiter,
            rules: Vec::new(),
            sources: Vec::new(),
            hash_key: sluice::core::key::default_hash_key(),
            client_ip: ClientIpConfig::default(),
            headers: HeaderOptions::default(),
            fail_closed_status: StatusCode::SERVICE_UNAVAILABLE,
        }
    }

    /// What the layer (and every service it made) has done so far.
    pub fn stats(&self) -> Arc<RateLimitStats> {
        self.decider.stats()
    }

    /// The identity resolver, for code that needs the same identities outside the layer.
    pub fn identity_resolver(&self) -> &IdentityResolver {
        &self.decider.resolver
    }

    /// The decision function the layer calls per request.
    pub fn decider(&self) -> &Arc<Decider> {
        &self.decider
    }
}

impl<S> tower::Layer<S> for RateLimitLayer {
    type Service = RateLimit<S>;
    fn layer(&self, inner: S) -> RateLimit<S> {
        RateLimit {
            inner,
            decider: Arc::clone(&self.decider),
        }
    }
}

/// The rate-limiting service made by [`RateLimitLayer`].
#[derive(Debug, Clone)]
pub struct RateLimit<S> {
    inner: S,
    decider: Arc<Decider>,
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send + 'static>>;

impl<S, ReqB, ResB> tower::Service<Request<ReqB>> for RateLimit<S>
where
    S: tower::Service<Request<ReqB>, Response = Response<ResB>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: 'static,
    ReqB: Send + 'static,
    ResB: Body<Data = Bytes> + Send + 'static,
{
    type Response = Response<RateLimitBody<ResB>>;
    type Error = S::Error;
    type Future = BoxFuture<Result<Self::Response, S::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<ReqB>) -> Self::Future {
        // The service that was polled ready handles this request; the clone stays for the next.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let decider = Arc::clone(&self.decider);
        Box::pin(async move {
            let (mut parts, body) = req.into_parts();
            let admission = match decider.decide(&mut parts).await {
                Answer::Refuse(refusal) => {
                    return Ok(refusal.into_response().map(RateLimitBody::full));
                }
                Answer::Admit(admission) => admission,
            };
            if let Some(identity) = admission.identity() {
                parts.extensions.insert(RateLimitIdentity(identity.clone()));
            }
            // Dropped before the status arrives (client gone) or an inner error: the
            // admission is dropped unfinished, so the request stays counted.
            let mut res = inner.call(Request::from_parts(parts, body)).await?;
            let finished = if res.extensions().get::<UpstreamFailed>().is_some() {
                admission.finish_upstream_failed().await
            } else {
                admission.finish(res.status().as_u16()).await
            };
            // Merged, not replaced: an inner sluice layer (the proxy nests one per identity
            // source) has already described its own policies on this response.
            finished.merge_into(res.headers_mut());
            let guard = finished.into_leases();
            Ok(res.map(|b| RateLimitBody::inner(b, guard)))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::Method;

    #[test]
    fn longest_prefix_then_method_wins() {
        let p = |n: &str| {
            Policy::new(
                n,
                sluice::Algorithm::FixedWindow {
                    limit: 1,
                    window_ms: 1000,
                },
            )
            .unwrap()
        };
        let layer = RateLimitLayer::builder(Limiter::memory())
            .policy(p("all"))
            .rule(Rule::new("/api").policy(p("api")))
            .rule(
                Rule::new("/api")
                    .methods([Method::POST])
                    .policy(p("api-post")),
            )
            .rule(Rule::new("/api/health"))
            .build();
        let name = |m: Method, path: &str| {
            layer.decider.rule(&m, path).map(|r| {
                r.policies
                    .first()
                    .map(|p| p.name.clone())
                    .unwrap_or_default()
            })
        };
        assert_eq!(name(Method::GET, "/x").as_deref(), Some("all"));
        assert_eq!(name(Method::GET, "/api/v1").as_deref(), Some("api"));
        assert_eq!(name(Method::POST, "/api/v1").as_deref(), Some("api-post"));
        assert_eq!(name(Method::GET, "/api/health").as_deref(), Some(""));
    }
}
