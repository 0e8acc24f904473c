//! The Envoy rate limit service: `envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit`.
//!
//! Envoy's `envoy.filters.http.ratelimit` filter (and the network filter) send a domain and a
//! list of descriptors; [`crate::envoy::plan`] finds each one's limit and this module
//! asks the limiter, in one all-or-nothing `check_many`, then answers with a status per
//! descriptor. Every status is filled (code, current_limit, limit_remaining,
//! duration_until_reset) so Envoy can emit its own `x-ratelimit-*` headers, and
//! `response_headers_to_add` carries the draft RateLimit fields and `Retry-After`, from the
//! same `sluice_http::headers` logic as every HTTP answer (a sharded policy shown whole,
//! `Retry-After` only where retrying can cure the denial).
//!
//! A check refused by the limiter's control plane (a ban, the deny list) is `OVER_LIMIT`
//! with an `X-Sluice-Reason: banned|denied` header.
//!
//! When the store does not answer the call fails with `UNAVAILABLE` instead of guessing:
//! Envoy's own `failure_mode_deny` then decides, which is where that choice belongs for
//! traffic behind Envoy.

use envoy_types::pb::envoy::config::core::v3::HeaderValue as EnvoyHeader;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{
    Code, DescriptorStatus, RateLimit,
};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::{
    RateLimitService, RateLimitServiceServer,
};
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use envoy_types::pb::google::protobuf::Duration as ProtoDuration;
use sluice::core::{Clock, SystemClock};
use sluice::{Decision, DenyReason, Verdict};
use sluice_http::headers::{HeaderOptions, Shown, display_header_name, rate_limit_headers};
use std::collections::HashMap;
use std::sync::Arc;
use tonic::{Request, Response, Status};

use crate::envoy::{Limit, LimitCheck, Plan, RequestDescriptor, plan};
use crate::state::Shared;

/// The most descriptors accepted in one call.
pub const MAX_DESCRIPTORS: usize = 64;

/// The gRPC service.
#[derive(Debug, Clone)]
pub struct RlsService {
    shared: Shared,
    counters: Arc<RequestCounters>,
}

impl RlsService {
    /// A service answering from `shared`'s current configuration.
    pub fn new(shared: Shared) -> Self {
        Self {
            shared,
            counters: Arc::default(),
        }
    }

    /// The tonic server wrapping it.
    pub fn server(self) -> RateLimitServiceServer<Self> {
        RateLimitServiceServer::new(self)
    }
}

/// The answer codes `sluice_rls_requests_total` counts.
#[derive(Debug, Clone, Copy)]
enum Answer {
    Ok,
    OverLimit,
    Unavailable,
}

/// The handles of `sluice_rls_requests_total{domain, code}`, made once per domain: building a
/// labelled metric key (the domain copied, the labels hashed, the registry searched) on every
/// call cost more than the rest of the answer's bookkeeping. The domains are the configured
/// ones plus `unknown`, so the map stays as small as the configuration.
#[derive(Debug, Default)]
struct RequestCounters {
    by_domain: parking_lot::RwLock<HashMap<String, Arc<[metrics::Counter; 3]>>>,
}

impl RequestCounters {
    fn count(&self, domain: &str, answer: Answer) {
        let found = self.by_domain.read().get(domain).cloned();
        let counters = found.unwrap_or_else(|| {
            let made = Arc::new(["ok", "over_limit", "unavailable"].map(|code| {
                metrics::counter!("sluice_rls_requests_total", "domain" => domain.to_string(), "code" => code)
            }));
            self.by_domain
                .write()
                .entry(domain.to_string())
                .or_insert(made)
                .clone()
        });
        counters[answer as usize].increment(1);
    }
}

fn proto_duration(ms: u64) -> ProtoDuration {
    ProtoDuration {
        seconds: (ms / 1000) as i64,
        nanos: ((ms % 1000) * 1_000_000) as i32,
    }
}

fn current_limit(limit: &Limit) -> Option<RateLimit> {
    limit.limit.map(|(rpu, unit)| RateLimit {
        name: limit.name.clone().unwrap_or_default(),
        requests_per_unit: rpu,
        unit: unit.response_proto(),
    })
}

fn ok_status(remaining: u32) -> DescriptorStatus {
    DescriptorStatus {
        code: Code::Ok as i32,
        limit_remaining: remaining,
        ..Default::default()
    }
}

/// One descriptor of a request: its plan and, when it asks the limiter, its place among the
/// items of the one `check_many` call.
struct DescriptorItem<'p> {
    plan: &'p Plan,
    /// Index of this descriptor's item in the limiter call (and in its answer).
    check_index: Option<usize>,
}

impl<'p> DescriptorItem<'p> {
    /// The plans in request order, each check numbered in the order it is sent.
    fn number(plans: &'p [Plan]) -> Vec<Self> {
        let mut next = 0;
        plans
            .iter()
            .map(|plan| {
                let check_index = matches!(plan, Plan::Check(_)).then(|| {
                    next += 1;
                    next - 1
                });
                DescriptorItem { plan, check_index }
            })
            .collect()
    }

    fn check(&self) -> Option<&'p LimitCheck> {
        match self.plan {
            Plan::Check(c) => Some(c),
            _ => None,
        }
    }

    /// The descriptor's status, given the limiter's decision for its check (if it has one).
    fn status(&self, decision: Option<&Decision>, now_ms: u64) -> DescriptorStatus {
        match self.plan {
            Plan::NoLimit => ok_status(0),
            Plan::Unlimited => ok_status(u32::MAX),
            Plan::Zero(limit) => {
                let unit_ms = limit.limit.map_or(1000, |(_, u)| u.ms());
                let code = if limit.shadow {
                    Code::Ok
                } else {
                    Code::OverLimit
                };
                DescriptorStatus {
                    code: code as i32,
                    current_limit: current_limit(limit),
                    limit_remaining: 0,
                    duration_until_reset: Some(proto_duration(unit_ms - now_ms % unit_ms)),
                    ..Default::default()
                }
            }
            Plan::Check(LimitCheck { limit, policy, .. }) => match decision {
                None => DescriptorStatus {
                    current_limit: current_limit(limit),
                    ..ok_status(0)
                },
                Some(d) => {
                    let denied = d.denies();
                    let code = if denied && !limit.shadow {
                        Code::OverLimit
                    } else {
                        Code::Ok
                    };
                    let until = if denied {
                        d.reset_after_ms.max(d.retry_after_ms)
                    } else {
                        d.reset_after_ms
                    };
                    DescriptorStatus {
                        code: code as i32,
                        current_limit: current_limit(limit),
                        // The whole policy's remaining count, as the HTTP answers show it.
                        limit_remaining: Shown::new(policy, d).remaining().min(u64::from(u32::MAX))
                            as u32,
                        duration_until_reset: Some(proto_duration(until)),
                        ..Default::default()
                    }
                }
            },
        }
    }
}

/// `denied` (deny list) or `banned` when an enforced denial of the check came from the
/// limiter's control plane.
fn control_reason(checked: &sluice::Checked) -> Option<&'static str> {
    checked
        .denials()
        .find_map(|l| match l.decision.as_ref()?.reason? {
            DenyReason::Denied => Some("denied"),
            DenyReason::Banned => Some("banned"),
            _ => None,
        })
}

#[tonic::async_trait]
impl RateLimitService for RlsService {
    async fn should_rate_limit(
        &self,
        request: Request<RateLimitRequest>,
    ) -> Result<Response<RateLimitResponse>, Status> {
        // One span per call when `[telemetry]` is on; Envoy sends `traceparent` as metadata.
        let parent = request.metadata().get(crate::telemetry::TRACEPARENT);
        let span = self.shared.telemetry().start(
            crate::telemetry::Entry::Rls,
            parent.and_then(|v| v.to_str().ok()),
        );
        let status =
            |r: &Result<_, Status>| Some(r.as_ref().map_or_else(|s| s.code() as i64, |_| 0));
        span.run(self.decide(request), status).await
    }
}

impl RlsService {
    async fn decide(
        &self,
        request: Request<RateLimitRequest>,
    ) -> Result<Response<RateLimitResponse>, Status> {
        let req = request.into_inner();
        if req.descriptors.len() > MAX_DESCRIPTORS {
            return Err(Status::invalid_argument(format!(
                "at most {MAX_DESCRIPTORS} descriptors per request"
            )));
        }
        if req.domain.is_empty() {
            return Err(Status::invalid_argument(
                "the rate limit domain must not be empty",
            ));
        }
        let rt = self.shared.runtime();
        let descriptors: Vec<RequestDescriptor<'_>> = req
            .descriptors
            .iter()
            .map(|d| RequestDescriptor {
                entries: d
                    .entries
                    .iter()
                    .map(|e| (e.key.as_str(), e.value.as_str()))
                    .collect(),
                limit_override: d.limit.map(|l| (l.requests_per_unit, l.unit)),
                // A refund (is_negative_hits) cannot be expressed by every algorithm: only check.
                hits_addend: if d.is_negative_hits {
                    Some(0)
                } else {
                    d.hits_addend.as_ref().map(|h| h.value)
                },
            })
            .collect();
        let plans = plan(
            &rt.config.domains,
            &req.domain,
            req.hits_addend,
            &descriptors,
        );
        // Metric labels only carry configured domains: the request's own is unbounded.
        let domain_label = if rt.config.domains.has(&req.domain) {
            req.domain.as_str()
        } else {
            "unknown"
        };

        // One all-or-nothing check for every descriptor that has a limit.
        let items = DescriptorItem::number(&plans);
        let limiter_items: Vec<_> = items
            .iter()
            .filter_map(|item| item.check().map(LimitCheck::limiter_item))
            .collect();
        let checked = if limiter_items.is_empty() {
            None
        } else {
            Some(rt.limiter.check_many(&limiter_items).await)
        };
        if let Some(c) = &checked
            && let Verdict::FailedOpen(e) | Verdict::FailedClosed(e) = &c.verdict
        {
            self.counters.count(domain_label, Answer::Unavailable);
            return Err(Status::unavailable(format!("rate limit store: {e}")));
        }

        let now_ms = SystemClock.now() / 1000;
        let statuses: Vec<DescriptorStatus> = items
            .iter()
            .map(|item| {
                let decision = item
                    .check_index
                    .and_then(|k| checked.as_ref()?.limits.get(k)?.decision.as_ref());
                item.status(decision, now_ms)
            })
            .collect();
        let over = statuses.iter().any(|s| s.code == Code::OverLimit as i32);

        let mut headers = Vec::new();
        if let Some(c) = &checked {
            let opts = HeaderOptions {
                ratelimit: true,
                legacy: rt.config.legacy_headers,
            };
            // `Retry-After` comes from the shared lead: the longest wait among the enforced
            // denials that retrying can cure. A limit of 0 or a cost above the quota is never
            // cured, so (as in the HTTP answers) it gets none.
            for (n, v) in rate_limit_headers(c, &opts) {
                headers.push(EnvoyHeader {
                    key: display_header_name(n.as_str()),
                    value: v.to_str().unwrap_or("").to_string(),
                    raw_value: Vec::new(),
                });
            }
        }
        // A refusal of the control plane says which, so Envoy's access logs and the client
        // can tell a ban or the deny list from a used-up limit.
        if let Some(reason) = checked.as_ref().and_then(control_reason) {
            headers.push(EnvoyHeader {
                key: "X-Sluice-Reason".to_string(),
                value: reason.to_string(),
                raw_value: Vec::new(),
            });
        }
        let overall = if over { Code::OverLimit } else { Code::Ok };
        self.counters.count(
            domain_label,
            if over { Answer::OverLimit } else { Answer::Ok },
        );
        Ok(Response::new(RateLimitResponse {
            overall_code: overall as i32,
            statuses,
            response_headers_to_add: headers,
            ..Default::default()
        }))
    }
}
