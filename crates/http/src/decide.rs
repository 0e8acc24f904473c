//! [`Decider`]: the rate-limit answer to one HTTP request, from its method, target, headers
//! and peer address, for every front end sluice has.
//!
//! The tower layer ([`crate::RateLimitLayer`]), the reverse proxy of `sluice serve` (through
//! the layer) and the Python and Node middleware all decide here, so a request is answered
//! the same whichever of them it meets: the same 400 for a path with no safe normal form,
//! the same 403 for a deny-listed client, 429 for a banned one or one over its limit, the
//! same fail-closed status, the same `RateLimit` / `RateLimit-Policy` / `Retry-After` fields
//! and problem+json bodies, and the same count-by-outcome refunds.
//!
//! # Usage
//!
//! ```no_run
//! # async fn f() -> Result<(), Box<dyn std::error::Error>> {
//! use sluice::{Algorithm, Limiter, Policy, Rate};
//! use sluice_http::decide::{Answer, RequestHead};
//! use sluice_http::{IdentitySource, RateLimitLayer};
//!
//! let burst = Policy::new("burst", Algorithm::TokenBucket { capacity: 10, rate: Rate::per_second(5) })?;
//! // Built like the layer (rules, identities, headers, fail-closed status).
//! let decider = RateLimitLayer::builder(Limiter::memory())
//!     .policy(burst)
//!     .identity(IdentitySource::api_key("x-api-key"))
//!     .build_decider();
//!
//! // What any framework has: method, target (path and query), headers, peer address.
//! let head = RequestHead::from_raw("GET", "/hello?x=1", [("x-api-key", "k-1")], Some("203.0.113.7"));
//! let answer = match head {
//!     Ok(head) => decider.decide_head(head).await,
//!     Err(bad_request) => Answer::Refuse(bad_request),
//! };
//! match answer {
//!     // Send exactly this: status, headers, body bytes (problem+json).
//!     Answer::Refuse(refusal) => { let _ = (refusal.status, refusal.headers, refusal.body); }
//!     Answer::Admit(admission) => {
//!         // ... run the application, which answers with some status ...
//!         let finished = admission.finish(200).await;
//!         // Add these to the response's headers before it is sent.
//!         let _added = finished.headers();
//!         // Keep the concurrency leases until the response body has been sent, then:
//!         finished.release().await;
//!     }
//! }
//! # Ok(()) }
//! ```
//!
//! The steps of [`Decider::decide`]:
//! 1. normalize the path ([`crate::path`]); one with no safe normal form is refused `400`;
//! 2. pick the [`Rule`] for the path and method (longest prefix wins); no rule, or a rule
//!    without policies, admits without limiting;
//! 3. derive the identity ([`crate::identity`]);
//! 4. check every policy of the rule at once (all or nothing); the limiter's control plane
//!    (deny and allow lists, bans) answers inside this check;
//! 5. refuse a denial: `403` for a deny-listed identity, `429` with the ban's time left for a
//!    banned one, `429` with `Retry-After` for a used-up limit, the fail-closed status when
//!    the store failed and a policy fails closed; or wait out a shaping delay and admit.
//!
//! An [`Admission`] is a ticket for the request in flight. It must be finished with the
//! response status ([`Admission::finish`]): a rule that counts by outcome ([`crate::count`])
//! reserved its cost at the check and gives it back when the status is not counted, and the
//! headers to send then describe the state after the refund. An admission dropped without
//! being finished (client gone, application error) keeps the charge. Concurrency leases are
//! held by the admission and then by [`Finished`] until the response ends: dropped inside a
//! tokio runtime they are released in the background, [`Finished::release`] releases them at
//! once (for callers outside a runtime), and an unreleased lease expires after its policy's
//! lease timeout.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::request::Parts;
use http::{HeaderMap, HeaderName, HeaderValue, Method, Response, StatusCode, Uri};
use sluice::{Checked, DenyReason, Identity, Limiter, Policy, Verdict};

use crate::body::LeaseGuard;
use crate::count::{self, Count, Settled};
use crate::headers::{self, HeaderOptions};
use crate::identity::IdentityResolver;
use crate::rule::Rule;
use crate::stats::RateLimitStats;

/// What became of a request, one name per event; the names are the `outcome` label of
/// `sluice_http_requests_total` and the counters of [`crate::StatsSnapshot`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Outcome {
    /// No rule (or a rule without policies) covers the request.
    Unlimited,
    /// The limiter admitted it (shadow denials included).
    Allowed,
    /// The store failed and every policy fails open: admitted undecided.
    FailedOpen,
    /// A limit is used up: 429.
    Denied,
    /// The control plane refused it: 403 (deny list) or 429 (ban).
    ControlRefused,
    /// The store failed and a policy fails closed: the fail-closed status.
    FailedClosed,
    /// The path has no safe normal form (or the request head could not be read): 400.
    BadPath,
}

impl Outcome {
    /// `unlimited`, `allowed`, `failed_open`, `denied`, `control_refused`, `failed_closed`
    /// or `bad_path`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Unlimited => "unlimited",
            Self::Allowed => "allowed",
            Self::FailedOpen => "failed_open",
            Self::Denied => "denied",
            Self::ControlRefused => "control_refused",
            Self::FailedClosed => "failed_closed",
            Self::BadPath => "bad_path",
        }
    }
}

impl std::fmt::Display for Outcome {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A request head as any framework has it, owned so it can move to the runtime that decides.
#[derive(Debug, Clone)]
pub struct RequestHead {
    /// The method.
    pub method: Method,
    /// The target as received: the path (not percent-decoded) and the query.
    pub uri: Uri,
    /// Every header line.
    pub headers: HeaderMap,
    /// The socket peer; `None` (a Unix socket, a test client) limits by `ip:unknown` when no
    /// other identity source applies.
    pub peer: Option<SocketAddr>,
}

impl RequestHead {
    /// A head from what a Python or Node framework hands over: the method, the raw target
    /// (`/path?query`, not percent-decoded), the raw header list and the peer's address
    /// (`203.0.113.7`, `::ffff:127.0.0.1`, `[2001:db8::1]` or with a port). A header the
    /// `http` crate cannot represent is skipped (no identity source could read it); a peer
    /// that is not an address counts as none. An invalid method or a target that is not a
    /// request target gives the `400` problem+json refusal to send back.
    pub fn from_raw<N, V>(
        method: &str,
        target: &str,
        headers: impl IntoIterator<Item = (N, V)>,
        peer: Option<&str>,
    ) -> Result<Self, Refusal>
    where
        N: AsRef<[u8]>,
        V: AsRef<[u8]>,
    {
        let method = Method::from_bytes(method.as_bytes())
            .map_err(|_| Refusal::bad_request(&format!("invalid HTTP method {method:?}")))?;
        let uri = target
            .parse::<Uri>()
            .ok()
            .filter(|u| target.starts_with('/') || u.scheme().is_some())
            .ok_or_else(|| Refusal::bad_request(&format!("invalid request target {target:?}")))?;
        let mut map = HeaderMap::new();
        for (n, v) in headers {
            if let (Ok(n), Ok(v)) = (
                HeaderName::from_bytes(n.as_ref()),
                HeaderValue::from_bytes(v.as_ref()),
            ) {
                map.append(n, v);
            }
        }
        Ok(Self {
            method,
            uri,
            headers: map,
            peer: peer.and_then(parse_peer),
        })
    }

    /// The [`Parts`] of a request with this head (the peer as a `SocketAddr` extension, where
    /// the client-IP identity looks for it).
    pub fn into_parts(self) -> Parts {
        let mut req = http::Request::new(());
        *req.method_mut() = self.method;
        *req.uri_mut() = self.uri;
        *req.headers_mut() = self.headers;
        if let Some(peer) = self.peer {
            req.extensions_mut().insert(peer);
        }
        req.into_parts().0
    }
}

/// `203.0.113.7`, `[::1]`, `[::1]:8080`, `203.0.113.7:80`, `::ffff:127.0.0.1`.
fn parse_peer(peer: &str) -> Option<SocketAddr> {
    let peer = peer.trim();
    if let Ok(addr) = peer.parse::<SocketAddr>() {
        return Some(addr);
    }
    peer.trim_matches(['[', ']'])
        .parse::<IpAddr>()
        .ok()
        .map(|ip| SocketAddr::new(ip, 0))
}

/// The answer to a request: refuse it now, or let it through and finish it later.
#[derive(Debug)]
pub enum Answer {
    /// Answer with this status, headers and body; the application is not called.
    Refuse(Refusal),
    /// Call the application, then [`Admission::finish`] with its status.
    Admit(Admission),
}

/// A request refused: send `status`, `headers` and `body` as they are.
#[derive(Debug, Clone)]
pub struct Refusal {
    /// 400, 403, 429 or the fail-closed status.
    pub status: StatusCode,
    /// Every header of the answer (`Content-Type: application/problem+json`,
    /// `Cache-Control: no-store`, `Retry-After` and the RateLimit fields where they apply).
    pub headers: HeaderMap,
    /// The problem+json body.
    pub body: Bytes,
    /// Which refusal this is.
    pub outcome: Outcome,
    /// The identity the request was limited as (`None` for a 400).
    pub identity: Option<Identity>,
    /// How the verdict was reached (`None` for a 400).
    pub verdict: Option<Verdict>,
}

impl Refusal {
    /// The 400 problem+json answer for a request head that cannot be limited safely.
    pub fn bad_request(detail: &str) -> Self {
        Self::from_response(
            headers::problem(StatusCode::BAD_REQUEST, detail),
            Outcome::BadPath,
            None,
            None,
        )
    }

    fn from_response(
        res: Response<Bytes>,
        outcome: Outcome,
        identity: Option<Identity>,
        verdict: Option<Verdict>,
    ) -> Self {
        let (parts, body) = res.into_parts();
        Self {
            status: parts.status,
            headers: parts.headers,
            body,
            outcome,
            identity,
            verdict,
        }
    }

    /// The answer as an `http` response.
    pub fn into_response(self) -> Response<Bytes> {
        let mut res = Response::new(self.body);
        *res.status_mut() = self.status;
        *res.headers_mut() = self.headers;
        res
    }
}

/// What the check reserved for a rule that counts by outcome, to settle on the status.
#[derive(Debug)]
struct Reserved {
    identity: Identity,
    cost: u64,
    count: Count,
}

/// A request let through: the ticket to finish with its response status.
///
/// Dropped unfinished (the client went away, the application failed), the request keeps
/// its charge and its leases are released as [`LeaseGuard`] says.
#[derive(Debug)]
pub struct Admission {
    outcome: Outcome,
    identity: Option<Identity>,
    /// `None` when unlimited.
    checked: Option<Checked>,
    reserved: Option<Reserved>,
    leases: Option<LeaseGuard>,
    decider: Arc<Decider>,
}

impl Admission {
    fn unlimited(decider: Arc<Decider>) -> Self {
        Self {
            outcome: Outcome::Unlimited,
            identity: None,
            checked: None,
            reserved: None,
            leases: None,
            decider,
        }
    }

    /// `Unlimited`, `Allowed` or `FailedOpen`.
    pub fn outcome(&self) -> Outcome {
        self.outcome
    }

    /// False when no rule (or a rule without policies) covers the request.
    pub fn is_limited(&self) -> bool {
        self.checked.is_some()
    }

    /// The identity the request was limited as (`None` when unlimited).
    pub fn identity(&self) -> Option<&Identity> {
        self.identity.as_ref()
    }

    /// How the verdict was reached (`None` when unlimited).
    pub fn verdict(&self) -> Option<&Verdict> {
        self.checked.as_ref().map(|c| &c.verdict)
    }

    /// True when the rule counts by outcome, so [`Admission::finish`] may refund.
    pub fn counts_by_outcome(&self) -> bool {
        self.reserved.is_some()
    }

    /// How many concurrency leases the request holds.
    pub fn leases(&self) -> usize {
        self.leases.as_ref().map_or(0, LeaseGuard::len)
    }

    /// Settles the request by the status the application answered and gives what to add to
    /// the response. A rule counting every request has nothing to settle (no store call); a
    /// rule counting by outcome keeps the charge for a counted status and refunds it
    /// otherwise. A status that is not a valid HTTP status keeps the charge.
    pub async fn finish(self, status: u16) -> Finished {
        match StatusCode::from_u16(status) {
            Ok(status) => self.settle(Some(status)).await,
            Err(_) => self.settle(None).await,
        }
    }

    /// Settles a request whose answer is not the application's but a stand-in for its failure
    /// (a proxy's 502 or 504): the charge is kept whatever the rule counts, since the
    /// application may have acted on the request.
    pub async fn finish_upstream_failed(self) -> Finished {
        self.settle(None).await
    }

    /// `None`: keep the charge.
    async fn settle(mut self, status: Option<StatusCode>) -> Finished {
        let stats = &self.decider.stats;
        if let Some(reserved) = self.reserved.take()
            && let Some(checked) = self.checked.take()
        {
            let counted = status.is_none_or(|s| reserved.count.counts(s));
            let after = if counted {
                stats.count(&stats.charged, "charged");
                checked
            } else {
                let limiter = &self.decider.limiter;
                match count::refund(limiter, &reserved.identity, checked, reserved.cost).await {
                    Settled::Refunded(after) => {
                        stats.count(&stats.refunded, "refunded");
                        after
                    }
                    Settled::RefundFailed(after) => {
                        stats.count(&stats.refund_failed, "refund_failed");
                        after
                    }
                }
            };
            self.checked = Some(after);
        }
        Finished {
            checked: self.checked.take(),
            leases: self.leases.take().filter(|g| !g.is_empty()),
            headers: self.decider.headers,
        }
    }
}

/// A finished request: the headers to add to its response, and its concurrency leases until
/// the response has been sent.
#[derive(Debug)]
pub struct Finished {
    /// The check as settled (`None` when unlimited).
    checked: Option<Checked>,
    leases: Option<LeaseGuard>,
    headers: HeaderOptions,
}

impl Finished {
    /// The RateLimit fields to add to the response (none when unlimited or failed open).
    pub fn headers(&self) -> Vec<(HeaderName, HeaderValue)> {
        match &self.checked {
            Some(c) => headers::rate_limit_headers(c, &self.headers),
            None => Vec::new(),
        }
    }

    /// Adds the RateLimit fields to `headers`, merged with those another sluice layer already
    /// set there ([`headers::merge_rate_limit_headers`]).
    pub fn merge_into(&self, headers: &mut HeaderMap) {
        if let Some(c) = &self.checked {
            headers::merge_rate_limit_headers(c, &self.headers, headers);
        }
    }

    /// The concurrency leases, to hold until the response ends (`None` when there are none).
    pub fn into_leases(mut self) -> Option<LeaseGuard> {
        self.leases.take()
    }

    /// Releases the concurrency leases now, waiting for the store; returns how many the store
    /// released. Call it when the response has been sent.
    pub async fn release(mut self) -> usize {
        match self.leases.take() {
            Some(g) => g.release().await,
            None => 0,
        }
    }
}

/// Everything a front end needs to answer requests: the limiter, the rules (in precedence
/// order), the identity resolver, which headers to send, the fail-closed status and the
/// counts. Built by [`crate::RateLimitLayerBuilder::build_decider`].
#[derive(Debug)]
pub struct Decider {
    pub(crate) limiter: Limiter,
    pub(crate) rules: Vec<Rule>,
    pub(crate) resolver: IdentityResolver,
    pub(crate) headers: HeaderOptions,
    pub(crate) fail_closed_status: StatusCode,
    pub(crate) stats: Arc<RateLimitStats>,
}

impl Decider {
    /// The limiter it checks with.
    pub fn limiter(&self) -> &Limiter {
        &self.limiter
    }

    /// What it has decided so far.
    pub fn stats(&self) -> Arc<RateLimitStats> {
        Arc::clone(&self.stats)
    }

    /// The identity resolver.
    pub fn identity_resolver(&self) -> &IdentityResolver {
        &self.resolver
    }

    /// The rule that applies to a request with this method and normalized path.
    pub fn rule(&self, method: &Method, path: &str) -> Option<&Rule> {
        self.rules.iter().find(|r| r.matches(method, path))
    }

    /// [`Decider::decide`] for a framework-neutral head.
    pub async fn decide_head(self: &Arc<Self>, head: RequestHead) -> Answer {
        self.decide(&mut head.into_parts()).await
    }

    /// The answer to the request with these parts. `parts.uri` is replaced by its normalized
    /// form, so the application is called with the path that was limited. The identity is
    /// read from the headers, the query, the peer (`ConnectInfo<SocketAddr>` or `SocketAddr`
    /// extension) and any `Identity` extension, as the identity sources say.
    pub async fn decide(self: &Arc<Self>, parts: &mut Parts) -> Answer {
        let stats = &self.stats;
        match crate::path::normalize_uri(&parts.uri) {
            Ok(None) => {}
            Ok(Some(normal)) => parts.uri = normal,
            Err(e) => {
                stats.count(&stats.bad_path, "bad_path");
                return Answer::Refuse(Refusal::bad_request(e.message()));
            }
        }
        let rule = match self.rule(&parts.method, parts.uri.path()) {
            Some(rule) if !rule.policies.is_empty() => rule,
            _ => {
                stats.count(&stats.unlimited, "unlimited");
                return Answer::Admit(Admission::unlimited(Arc::clone(self)));
            }
        };
        let identity = self.resolver.resolve(parts);
        // Every rule consumes its cost here; one that counts by outcome gives it back in
        // `Admission::finish` once the status says so, so requests in flight hold their units.
        let mut checked = if let [policy] = rule.policies.as_slice() {
            // The common rule of one policy: no list to allocate.
            self.limiter.check(&identity, policy, rule.cost).await
        } else {
            let items: Vec<(&Identity, &Arc<Policy>, u64)> = rule
                .policies
                .iter()
                .map(|p| (&identity, p, rule.cost))
                .collect();
            self.limiter.check_many(&items).await
        };
        // From here on, leases are released whatever happens to the request.
        let leases = LeaseGuard::new(self.limiter.clone(), std::mem::take(&mut checked.leases));

        if !checked.allowed {
            let (res, outcome) = if matches!(checked.verdict, Verdict::FailedClosed(_)) {
                stats.count(&stats.failed_closed, "failed_closed");
                let res = headers::store_unavailable(&checked, self.fail_closed_status);
                (res, Outcome::FailedClosed)
            } else if let Some(res) = control_refusal(&checked, &self.headers) {
                stats.count(&stats.denied, "control_refused");
                (res, Outcome::ControlRefused)
            } else {
                stats.count(&stats.denied, "denied");
                (
                    headers::too_many_requests(&checked, &self.headers),
                    Outcome::Denied,
                )
            };
            return Answer::Refuse(Refusal::from_response(
                res,
                outcome,
                Some(identity),
                Some(checked.verdict),
            ));
        }
        let outcome = if matches!(checked.verdict, Verdict::FailedOpen(_)) {
            stats.count(&stats.failed_open, "failed_open");
            Outcome::FailedOpen
        } else {
            stats.count(&stats.allowed, "allowed");
            Outcome::Allowed
        };
        let delay = checked.delay_ms();
        if delay > 0 {
            tokio::time::sleep(Duration::from_millis(delay)).await;
        }
        let reserved = (!rule.count.is_all()).then(|| Reserved {
            identity: identity.clone(),
            cost: rule.cost,
            count: rule.count.clone(),
        });
        Answer::Admit(Admission {
            outcome,
            identity: Some(identity),
            checked: Some(checked),
            reserved,
            leases: Some(leases),
            decider: Arc::clone(self),
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

    #[test]
    fn peers_are_read_in_every_spelling_frameworks_use() {
        let ip = |s| parse_peer(s).map(|a| a.ip().to_string());
        assert_eq!(ip("203.0.113.7").as_deref(), Some("203.0.113.7"));
        assert_eq!(ip("203.0.113.7:8080").as_deref(), Some("203.0.113.7"));
        assert_eq!(ip("::ffff:127.0.0.1").as_deref(), Some("::ffff:127.0.0.1"));
        assert_eq!(ip("[2001:db8::1]").as_deref(), Some("2001:db8::1"));
        assert_eq!(ip("[2001:db8::1]:443").as_deref(), Some("2001:db8::1"));
        assert_eq!(ip("unix:/tmp/s"), None);
    }

    #[test]
    fn unreadable_heads_are_refused_with_400() {
        let none: [(&str, &str); 0] = [];
        let bad = RequestHead::from_raw("G ET", "/", none, None).unwrap_err();
        assert_eq!(bad.status, StatusCode::BAD_REQUEST);
        assert_eq!(bad.outcome, Outcome::BadPath);
        let bad = RequestHead::from_raw("GET", "no slash", none, None).unwrap_err();
        assert_eq!(bad.status, StatusCode::BAD_REQUEST);
        let ok =
            RequestHead::from_raw("GET", "/a?b=1", [("x-k", "v"), ("bad\n", "x")], Some("::1"))
                .unwrap();
        assert_eq!(ok.uri.path(), "/a");
        assert_eq!(ok.headers.len(), 1);
        assert_eq!(ok.peer.map(|p| p.ip().to_string()).as_deref(), Some("::1"));
    }
}
