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
//!
//! The request head frameworks hand over is read in `head.rs`; what the decider answers
//! (refusal, admission, finished request) is in `answer.rs`.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::request::Parts;
use http::{Method, Response, StatusCode};
use sluice::{Checked, DenyReason, Identity, Limiter, Policy, Verdict};

use crate::body::LeaseGuard;
use crate::headers::{self, HeaderOptions};
use crate::identity::IdentityResolver;
use crate::rule::Rule;
use crate::stats::RateLimitStats;

mod answer;
mod head;

use answer::Reserved;
pub use answer::{Admission, Answer, Finished, Outcome, Refusal};
pub use head::RequestHead;

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
