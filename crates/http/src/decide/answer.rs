//! What the [`super::Decider`] answers: an [`Outcome`] name per event, a [`Refusal`] to send
//! as it is, or an [`Admission`] to finish with the application's status, which settles a
//! count-by-outcome reservation and gives the [`Finished`] headers and leases.
//!
//! Apart from the decision steps (the parent module) because these are what a front end
//! holds and hands back across the request's lifetime, while the steps run once, up front.

use std::sync::Arc;

use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue, Response, StatusCode};
use sluice::{Checked, Identity, Verdict};

use super::Decider;
use crate::body::LeaseGuard;
use crate::count::{self, Count, Settled};
use crate::headers::{self, HeaderOptions};

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

    pub(super) fn from_response(
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
pub(super) struct Reserved {
    pub(super) identity: Identity,
    pub(super) cost: u64,
    pub(super) count: Count,
}

/// A request let through: the ticket to finish with its response status.
///
/// Dropped unfinished (the client went away, the application failed), the request keeps
/// its charge and its leases are released as [`LeaseGuard`] says.
#[derive(Debug)]
pub struct Admission {
    pub(super) outcome: Outcome,
    pub(super) identity: Option<Identity>,
    /// `None` when unlimited.
    pub(super) checked: Option<Checked>,
    pub(super) reserved: Option<Reserved>,
    pub(super) leases: Option<LeaseGuard>,
    pub(super) decider: Arc<Decider>,
}

impl Admission {
    pub(super) fn unlimited(decider: Arc<Decider>) -> Self {
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
