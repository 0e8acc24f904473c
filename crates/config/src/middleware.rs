//! [`Middleware`]: the request handling of the Python and Node middleware, for a whole
//! `sluice.toml` or for rules given in code.
//!
//! The ASGI, WSGI, Express and Fastify middleware hand over what their framework has (method,
//! target, headers, peer) and get back what to send. Every step is `sluice-http`'s
//! [`Decider`], the function the tower layer and `sluice serve`'s proxy answer with, so a
//! deny-listed client gets the same 403, a banned one the same 429, and a route counting by
//! outcome the same refund in every front end. What this module adds is only the nesting the
//! proxy gets from tower: a route whose policies take their identities from different sources
//! is one decider per source ([`crate::route_deciders`]), asked outermost first; the first
//! refusal is the answer, and the deciders that admitted before it are finished with the
//! refusal's status, as an outer layer sees an inner layer's answer.

use std::future::Future;
use std::sync::Arc;

use http::HeaderMap;
use sluice::{Identity, Limiter, Verdict};
use sluice_http::{Admission, Answer, Decider, LeaseGuard, Refusal, RequestHead, Rule};

use crate::{Config, route_deciders, route_rule};

/// The routes of a middleware: each matcher with its deciders, outermost first, in the order
/// [`Rule::precedence`] tries them.
#[derive(Debug)]
pub struct Middleware {
    routes: Vec<(Rule, Vec<Arc<Decider>>)>,
}

/// What to do with a request.
#[derive(Debug)]
pub enum Pass {
    /// Answer with this status, headers and body; the application is not called.
    Refuse(Refusal),
    /// Call the application, then [`Admitted::finish`] with its status.
    Admit(Admitted),
}

/// A request let through by every decider of its route.
#[derive(Debug)]
pub struct Admitted {
    /// Outermost first.
    admissions: Vec<Admission>,
    /// The normalized path, when it differs from the one received.
    normalized_path: Option<String>,
}

/// A request finished: what to add to its response, and its leases until the response ends.
#[derive(Debug, Default)]
pub struct Done {
    /// The RateLimit fields of every decider of the route, merged.
    pub headers: HeaderMap,
    /// The concurrency leases, to release once the response has been sent.
    pub leases: Vec<LeaseGuard>,
}

impl Middleware {
    /// The `[[routes]]` of a configuration, limited as `sluice serve`'s proxy limits them.
    /// A request no route matches is not limited.
    pub fn from_config(config: &Config, limiter: &Limiter) -> Self {
        let mut routes: Vec<(Rule, Vec<Arc<Decider>>)> = config
            .routes
            .iter()
            .map(|r| (route_rule(config, r), route_deciders(config, r, limiter)))
            .collect();
        routes.sort_by(|a, b| a.0.precedence(&b.0));
        Self { routes }
    }

    /// One decider for every request: the middleware built from rules given in code (the
    /// decider picks its rule itself).
    pub fn single(decider: Arc<Decider>) -> Self {
        Self {
            routes: vec![(Rule::new("/"), vec![decider])],
        }
    }

    /// The answer to a request with this head. An admitted request's path is matched, and
    /// must reach the application, in its normal form ([`Admitted::normalized_path`]).
    pub async fn decide(&self, head: RequestHead) -> Pass {
        let normalized_path = match sluice_http::path::normalize_uri(&head.uri) {
            Ok(None) => None,
            Ok(Some(normal)) => Some(normal.path().to_string()),
            Err(e) => return Pass::Refuse(Refusal::bad_request(e.message())),
        };
        let path = normalized_path.as_deref().unwrap_or(head.uri.path());
        let Some((_, deciders)) = self
            .routes
            .iter()
            .find(|(rule, _)| rule.matches(&head.method, path))
        else {
            return Pass::Admit(Admitted {
                admissions: Vec::new(),
                normalized_path,
            });
        };
        let mut admissions = Vec::with_capacity(deciders.len());
        for decider in deciders {
            match decider.decide_head(head.clone()).await {
                Answer::Admit(a) => admissions.push(a),
                Answer::Refuse(mut refusal) => {
                    // The outer deciders see this answer as an outer layer sees an inner
                    // layer's response: settled by its status, their fields merged into it.
                    let status = refusal.status.as_u16();
                    // Their leases are released in the background when dropped here.
                    drop(finish_into(admissions, status, &mut refusal.headers).await);
                    return Pass::Refuse(refusal);
                }
            }
        }
        Pass::Admit(Admitted {
            admissions,
            normalized_path,
        })
    }
}

/// Finishes admissions innermost first, merging each one's fields into `headers`; gives
/// their leases.
async fn finish_into(
    admissions: Vec<Admission>,
    status: u16,
    headers: &mut HeaderMap,
) -> Vec<LeaseGuard> {
    let mut leases = Vec::new();
    for a in admissions.into_iter().rev() {
        let finished = a.finish(status).await;
        finished.merge_into(headers);
        leases.extend(finished.into_leases());
    }
    leases
}

impl Admitted {
    /// The path the request was matched and limited as ([`sluice_http::path::normalize`]:
    /// unreserved characters decoded, dot segments resolved, repeated slashes merged), when
    /// it differs from the path received; `None` when the received path is already normal.
    /// The middleware hand the application this path, as `sluice serve`'s proxy forwards
    /// it, so the application routes the request that was limited and not another spelling.
    pub fn normalized_path(&self) -> Option<&str> {
        self.normalized_path.as_deref()
    }

    /// False when no route (or a route without policies) covers the request.
    pub fn is_limited(&self) -> bool {
        self.admissions.iter().any(Admission::is_limited)
    }

    /// The identity of the outermost decider that limited the request.
    pub fn identity(&self) -> Option<&Identity> {
        self.admissions.iter().find_map(Admission::identity)
    }

    /// `FailedOpen` when any decider admitted undecided, else the first verdict.
    pub fn verdict(&self) -> Option<&Verdict> {
        let mut verdicts = self.admissions.iter().filter_map(Admission::verdict);
        let first = verdicts.clone().next();
        verdicts
            .find(|v| matches!(v, Verdict::FailedOpen(_)))
            .or(first)
    }

    /// How many concurrency leases the request holds.
    pub fn leases(&self) -> usize {
        self.admissions.iter().map(Admission::leases).sum()
    }

    /// True when a route counting by outcome may refund at [`Admitted::finish`] (a store
    /// call); otherwise [`Admitted::finish_now`] settles without waiting.
    pub fn counts_by_outcome(&self) -> bool {
        self.admissions.iter().any(Admission::counts_by_outcome)
    }

    /// [`Admitted::finish`] without a runtime, for a request whose route counts every request
    /// (nothing to refund, so nothing to wait for): the Python and Node middleware set the
    /// fields on the response head at once instead of a round trip through the runtime.
    /// Gives the admission back when it counts by outcome.
    pub fn finish_now(self, status: u16) -> Result<Done, Admitted> {
        if self.counts_by_outcome() {
            return Err(self);
        }
        let mut finishing = std::pin::pin!(self.finish(status));
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        // Settling a request that counts every request makes no store call and awaits
        // nothing, so the first poll is ready.
        match finishing.as_mut().poll(&mut cx) {
            std::task::Poll::Ready(done) => Ok(done),
            std::task::Poll::Pending => {
                unreachable!("settling a request that counts every request waits for nothing")
            }
        }
    }

    /// Settles the request by the status the application answered (refunding what a route
    /// counting by outcome does not count) and gives the fields to add to the response.
    pub async fn finish(self, status: u16) -> Done {
        let mut headers = HeaderMap::new();
        let leases = finish_into(self.admissions, status, &mut headers).await;
        Done { headers, leases }
    }
}

impl Done {
    /// Releases the leases now, waiting for the store; returns how many the store released.
    pub async fn release(self) -> usize {
        let mut released = 0;
        for guard in self.leases {
            released += guard.release().await;
        }
        released
    }
}
