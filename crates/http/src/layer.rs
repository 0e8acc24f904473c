//! The tower [`RateLimitLayer`] and its [`RateLimit`] service.
//!
//! The decision is made in `call`, and a denial is answered there at once: `poll_ready` only
//! asks the inner service. A limiter that stalled in `poll_ready` would hold every caller of
//! a shared service (axum treats services as always ready, so it would not even work there),
//! and a client over its limit must learn so now, with a `Retry-After`, not after a queue.
//!
//! Per request the service
//! 1. normalizes the path ([`crate::path`]): a path that cannot be normalized safely is
//!    answered `400` (problem+json), and the inner service sees the normalized target, so
//!    the path that was limited is the path that is served;
//! 2. picks the [`Rule`] for the path and method (longest prefix wins); no rule, no limit;
//! 3. derives the identity ([`crate::identity`]);
//! 4. checks every policy of the rule at once with [`Limiter::check_many`] (all or nothing);
//! 5. answers a denial itself (429, the fail-closed status, 403 for an identity on the deny
//!    list of the limiter's control plane), or sleeps the shaping delay
//!    and calls the inner service, adding the RateLimit headers to its response.
//!
//! A rule that counts by outcome ([`crate::count`]) reserves its cost in step 4 like any
//! other rule and, once the inner service has answered with a status it does not count,
//! refunds it; the headers then describe the state after the refund. A request that never
//! gets its status (client gone, inner service error) or whose response carries
//! [`crate::count::UpstreamFailed`] keeps its reservation.
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
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll, ready};
use std::time::Duration;

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode};
use http_body::{Body, Frame, SizeHint};
use sluice::{Checked, DenyReason, Identity, Lease, Limiter, Policy, Verdict};

use crate::count::{self, Settled, UpstreamFailed};
use crate::headers::{self, HeaderOptions};
use crate::identity::{ClientIpConfig, IdentityResolver, IdentitySource, TrustedProxies};
pub use crate::rule::Rule;

/// Counts of what the layer did, for tests, health pages and alerts (the same events are
/// also `sluice_http_requests_total{outcome}` metrics).
#[derive(Debug, Default)]
pub struct RateLimitStats {
    allowed: AtomicU64,
    denied: AtomicU64,
    failed_open: AtomicU64,
    failed_closed: AtomicU64,
    unlimited: AtomicU64,
    charged: AtomicU64,
    refunded: AtomicU64,
    refund_failed: AtomicU64,
    bad_path: AtomicU64,
}

/// A copy of [`RateLimitStats`] at one moment.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StatsSnapshot {
    /// Requests admitted by the limiter (shadow denials included).
    pub allowed: u64,
    /// Requests answered 429 because a limit was used up.
    pub denied: u64,
    /// Requests let through because the store failed and the policies fail open.
    pub failed_open: u64,
    /// Requests refused because the store failed and a policy fails closed.
    pub failed_closed: u64,
    /// Requests no rule applied to.
    pub unlimited: u64,
    /// Rules that count by outcome: responses whose reservation was kept (a counted status,
    /// or a stand-in for an upstream failure).
    pub charged: u64,
    /// Rules that count by outcome: responses with an uncounted status, whose reservation
    /// was given back.
    pub refunded: u64,
    /// Refunds the store failed (the request then stays counted).
    pub refund_failed: u64,
    /// Requests answered 400 because their path cannot be normalized safely.
    pub bad_path: u64,
}

impl RateLimitStats {
    /// The current counts.
    pub fn snapshot(&self) -> StatsSnapshot {
        StatsSnapshot {
            allowed: self.allowed.load(Ordering::Relaxed),
            denied: self.denied.load(Ordering::Relaxed),
            failed_open: self.failed_open.load(Ordering::Relaxed),
            failed_closed: self.failed_closed.load(Ordering::Relaxed),
            unlimited: self.unlimited.load(Ordering::Relaxed),
            charged: self.charged.load(Ordering::Relaxed),
            refunded: self.refunded.load(Ordering::Relaxed),
            refund_failed: self.refund_failed.load(Ordering::Relaxed),
            bad_path: self.bad_path.load(Ordering::Relaxed),
        }
    }

    fn count(&self, counter: &AtomicU64, outcome: &'static str) {
        counter.fetch_add(1, Ordering::Relaxed);
        requests_total(outcome);
    }
}

/// `sluice_http_requests_total{outcome}` + 1. A literal label makes the metric key a static
/// one (no allocation per request), so each outcome the layer counts is spelled out here.
fn requests_total(outcome: &'static str) {
    macro_rules! literal {
        ($($name:literal),*) => {
            match outcome {
                $($name => metrics::counter!("sluice_http_requests_total", "outcome" => $name).increment(1),)*
                other => metrics::counter!("sluice_http_requests_total", "outcome" => other).increment(1),
            }
        };
    }
    literal!(
        "allowed",
        "denied",
        "control_refused",
        "failed_open",
        "failed_closed",
        "unlimited",
        "charged",
        "refunded",
        "refund_failed",
        "bad_path"
    );
}

/// The identity the layer limited a request as, inserted into the request's extensions for
/// the handler (logging, per-tenant answers).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RateLimitIdentity(pub Identity);

#[derive(Debug)]
struct Shared {
    limiter: Limiter,
    rules: Vec<Rule>,
    resolver: IdentityResolver,
    headers: HeaderOptions,
    fail_closed_status: StatusCode,
    stats: Arc<RateLimitStats>,
}

impl Shared {
    fn rule(&self, method: &Method, path: &str) -> Option<&Rule> {
        self.rules.iter().find(|r| r.matches(method, path))
    }
}

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
        let mut rules = self.rules;
        rules.sort_by(Rule::precedence);
        RateLimitLayer {
            shared: Arc::new(Shared {
                limiter: self.limiter,
                rules,
                resolver: IdentityResolver::new(self.sources, self.hash_key, self.client_ip),
                headers: self.headers,
                fail_closed_status: self.fail_closed_status,
                stats: Arc::new(RateLimitStats::default()),
            }),
        }
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
    shared: Arc<Shared>,
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
        Arc::clone(&self.shared.stats)
    }

    /// The identity resolver, for code that needs the same identities outside the layer.
    pub fn identity_resolver(&self) -> &IdentityResolver {
        &self.shared.resolver
    }
}

impl<S> tower::Layer<S> for RateLimitLayer {
    type Service = RateLimit<S>;
    fn layer(&self, inner: S) -> RateLimit<S> {
        RateLimit {
            inner,
            shared: Arc::clone(&self.shared),
        }
    }
}

/// The rate-limiting service made by [`RateLimitLayer`].
#[derive(Debug, Clone)]
pub struct RateLimit<S> {
    inner: S,
    shared: Arc<Shared>,
}

/// Holds concurrency leases and releases them when dropped (on a spawned task, since `Drop`
/// cannot wait). Outside a tokio runtime the leases are left to expire.
#[derive(Debug)]
pub struct LeaseGuard {
    limiter: Limiter,
    leases: Vec<Lease>,
}

impl LeaseGuard {
    /// A guard over `leases`.
    pub fn new(limiter: Limiter, leases: Vec<Lease>) -> Self {
        Self { limiter, leases }
    }
}

impl Drop for LeaseGuard {
    fn drop(&mut self) {
        if self.leases.is_empty() {
            return;
        }
        let leases = std::mem::take(&mut self.leases);
        let limiter = self.limiter.clone();
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(async move {
                for lease in &leases {
                    if let Err(e) = limiter.release(lease).await {
                        tracing::debug!(error = %e, key = %lease.key, "lease release failed; it will expire");
                    }
                }
            });
        }
    }
}

pin_project_lite::pin_project! {
    /// The response body of [`RateLimit`]: the inner service's body (holding the request's
    /// concurrency leases until it ends), or the layer's own problem+json denial.
    ///
    /// It is an `http_body::Body<Data = Bytes>` whose error is the inner body's, so axum
    /// (`Response<RateLimitBody<axum::body::Body>>: IntoResponse`) and hyper serve it as is.
    pub struct RateLimitBody<B> {
        #[pin]
        kind: Kind<B>,
        guard: Option<LeaseGuard>,
    }
}

pin_project_lite::pin_project! {
    #[project = KindProj]
    enum Kind<B> {
        Inner { #[pin] body: B },
        Full { data: Option<Bytes> },
    }
}

impl<B> std::fmt::Debug for RateLimitBody<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RateLimitBody")
            .field("holds_leases", &self.guard.is_some())
            .finish_non_exhaustive()
    }
}

impl<B> RateLimitBody<B> {
    fn inner(body: B, guard: Option<LeaseGuard>) -> Self {
        Self {
            kind: Kind::Inner { body },
            guard,
        }
    }
    fn full(data: Bytes) -> Self {
        Self {
            kind: Kind::Full { data: Some(data) },
            guard: None,
        }
    }
}

impl<B: Body<Data = Bytes>> Body for RateLimitBody<B> {
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        let this = self.project();
        match this.kind.project() {
            KindProj::Inner { mut body } => {
                let frame = ready!(body.as_mut().poll_frame(cx));
                // The body ended or failed (or this is its last frame): the request is over.
                // Releasing before the last bytes are written lets a client that sends its
                // next request as soon as this one completes find the capacity free.
                if !matches!(frame, Some(Ok(_))) || body.is_end_stream() {
                    this.guard.take();
                }
                Poll::Ready(frame)
            }
            KindProj::Full { data } => Poll::Ready(data.take().map(|d| Ok(Frame::data(d)))),
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.kind {
            Kind::Inner { body } => body.is_end_stream(),
            Kind::Full { data } => data.is_none(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.kind {
            Kind::Inner { body } => body.size_hint(),
            Kind::Full { data } => {
                SizeHint::with_exact(data.as_ref().map_or(0, |d| d.len() as u64))
            }
        }
    }
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
        let shared = Arc::clone(&self.shared);
        Box::pin(async move {
            let mut req = req;
            match crate::path::normalize_uri(req.uri()) {
                Ok(None) => {}
                Ok(Some(normal)) => *req.uri_mut() = normal,
                Err(e) => {
                    shared.stats.count(&shared.stats.bad_path, "bad_path");
                    let res = headers::problem(StatusCode::BAD_REQUEST, e.message());
                    return Ok(res.map(RateLimitBody::full));
                }
            }
            let Some(rule) = shared.rule(req.method(), req.uri().path()) else {
                shared.stats.count(&shared.stats.unlimited, "unlimited");
                return inner
                    .call(req)
                    .await
                    .map(|res| res.map(|b| RateLimitBody::inner(b, None)));
            };
            if rule.policies.is_empty() {
                shared.stats.count(&shared.stats.unlimited, "unlimited");
                return inner
                    .call(req)
                    .await
                    .map(|res| res.map(|b| RateLimitBody::inner(b, None)));
            }
            let (mut parts, body) = req.into_parts();
            let identity = shared.resolver.resolve(&parts);
            // Every rule consumes its cost here; one that counts by outcome gives it back
            // below once the status says so, so requests in flight hold their units.
            let mut checked = if let [policy] = rule.policies.as_slice() {
                // The common rule of one policy: no list to allocate.
                shared.limiter.check(&identity, policy, rule.cost).await
            } else {
                let items: Vec<(&Identity, &Arc<Policy>, u64)> = rule
                    .policies
                    .iter()
                    .map(|p| (&identity, p, rule.cost))
                    .collect();
                shared.limiter.check_many(&items).await
            };
            // From here on, leases are released whatever happens to this future.
            let guard =
                LeaseGuard::new(shared.limiter.clone(), std::mem::take(&mut checked.leases));

            if !checked.allowed {
                let res = if matches!(checked.verdict, Verdict::FailedClosed(_)) {
                    shared
                        .stats
                        .count(&shared.stats.failed_closed, "failed_closed");
                    headers::store_unavailable(&checked, shared.fail_closed_status)
                } else if let Some(res) = control_refusal(&checked, &shared.headers) {
                    shared.stats.count(&shared.stats.denied, "control_refused");
                    res
                } else {
                    shared.stats.count(&shared.stats.denied, "denied");
                    headers::too_many_requests(&checked, &shared.headers)
                };
                return Ok(res.map(RateLimitBody::full));
            }
            if matches!(checked.verdict, Verdict::FailedOpen(_)) {
                shared.stats.count(&shared.stats.failed_open, "failed_open");
            } else {
                shared.stats.count(&shared.stats.allowed, "allowed");
            }

            let delay = checked.delay_ms();
            if delay > 0 {
                tokio::time::sleep(Duration::from_millis(delay)).await;
            }
            let settle_as = (!rule.count.is_all()).then(|| identity.clone());
            parts.extensions.insert(RateLimitIdentity(identity));
            // Dropped before the status arrives (client gone) or an inner error: the
            // reservation stays, the request counted.
            let mut res = inner.call(Request::from_parts(parts, body)).await?;
            if let Some(identity) = settle_as {
                let stand_in = res.extensions().get::<UpstreamFailed>().is_some();
                if stand_in || rule.count.counts(res.status()) {
                    shared.stats.count(&shared.stats.charged, "charged");
                } else {
                    checked =
                        match count::refund(&shared.limiter, &identity, checked, rule.cost).await {
                            Settled::Refunded(after) => {
                                shared.stats.count(&shared.stats.refunded, "refunded");
                                after
                            }
                            Settled::RefundFailed(after) => {
                                shared
                                    .stats
                                    .count(&shared.stats.refund_failed, "refund_failed");
                                after
                            }
                        };
                }
            }
            // Merged, not replaced: an inner sluice layer (the proxy nests one per identity
            // source) has already described its own policies on this response.
            headers::merge_rate_limit_headers(&checked, &shared.headers, res.headers_mut());
            let guard = (!guard.leases.is_empty()).then_some(guard);
            Ok(res.map(|b| RateLimitBody::inner(b, guard)))
        })
    }
}

/// The answer to a check refused by the limiter's control plane: `403 Forbidden` for an
/// identity on the deny list (waiting will not help, so no `Retry-After`), `429` with the
/// ban's time left in `Retry-After` for a banned one. `None` for an ordinary denial.
fn control_refusal(checked: &Checked, opts: &HeaderOptions) -> Option<Response<Bytes>> {
    let refusal = checked
        .denials()
        .filter_map(|l| Some((l, l.decision.as_ref()?)))
        .find(|(_, d)| matches!(d.reason, Some(DenyReason::Denied | DenyReason::Banned)))?;
    let (limit, decision) = refusal;
    if decision.reason == Some(DenyReason::Denied) {
        let mut res = headers::problem(StatusCode::FORBIDDEN, "this client is on the deny list");
        res.headers_mut().insert(
            http::header::CACHE_CONTROL,
            http::HeaderValue::from_static("no-store"),
        );
        return Some(res);
    }
    let mut res = headers::too_many_requests(checked, opts);
    let wait = decision.retry_after_ms;
    let detail = format!(
        "banned from rate limit \"{}\" for {} s after repeated denials or by an operator",
        limit.policy.name,
        headers::retry_after_secs(wait)
    );
    *res.body_mut() = headers::problem_json(
        StatusCode::TOO_MANY_REQUESTS,
        &detail,
        Some(&limit.policy.name),
        Some(wait),
    );
    Some(res)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Notes the name and labels of every counter it is asked for.
    #[derive(Debug, Default)]
    struct CounterKeys(std::sync::Mutex<Vec<String>>);

    impl metrics::Recorder for CounterKeys {
        fn describe_counter(
            &self,
            _: metrics::KeyName,
            _: Option<metrics::Unit>,
            _: metrics::SharedString,
        ) {
        }
        fn describe_gauge(
            &self,
            _: metrics::KeyName,
            _: Option<metrics::Unit>,
            _: metrics::SharedString,
        ) {
        }
        fn describe_histogram(
            &self,
            _: metrics::KeyName,
            _: Option<metrics::Unit>,
            _: metrics::SharedString,
        ) {
        }
        fn register_counter(
            &self,
            key: &metrics::Key,
            _: &metrics::Metadata<'_>,
        ) -> metrics::Counter {
            let labels: Vec<String> = key
                .labels()
                .map(|l| format!("{}={}", l.key(), l.value()))
                .collect();
            self.0
                .lock()
                .unwrap()
                .push(format!("{}{{{}}}", key.name(), labels.join(",")));
            metrics::Counter::noop()
        }
        fn register_gauge(&self, _: &metrics::Key, _: &metrics::Metadata<'_>) -> metrics::Gauge {
            metrics::Gauge::noop()
        }
        fn register_histogram(
            &self,
            _: &metrics::Key,
            _: &metrics::Metadata<'_>,
        ) -> metrics::Histogram {
            metrics::Histogram::noop()
        }
    }

    #[test]
    fn every_outcome_is_counted_under_its_own_label() {
        let outcomes = [
            "allowed",
            "denied",
            "control_refused",
            "failed_open",
            "failed_closed",
            "unlimited",
            "charged",
            "refunded",
            "refund_failed",
            "bad_path",
            "some_new_outcome",
        ];
        let keys = CounterKeys::default();
        metrics::with_local_recorder(&keys, || outcomes.iter().for_each(|o| requests_total(o)));
        let want: Vec<String> = outcomes
            .iter()
            .map(|o| format!("sluice_http_requests_total{{outcome={o}}}"))
            .collect();
        assert_eq!(*keys.0.lock().unwrap(), want);
    }

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
            layer.shared.rule(&m, path).map(|r| {
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
