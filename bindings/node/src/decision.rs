//! A check's verdict as the plain object JS is given.
//!
//! The numbers are read the way `sluice serve`'s decision API reads them: from the leading
//! decision of [`sluice_http::headers::lead_of`] (the denial with the longest wait, else the
//! decision with the least remaining), scaled for sharded policies by its `Shown`. The header
//! values are [`sluice_http::headers::rate_limit_headers`]' own, so `RateLimit`,
//! `RateLimit-Policy` and `Retry-After` match the Rust layer byte for byte.

use std::collections::BTreeMap;

use napi_derive::napi;
use sluice::{Checked, DenyReason, LeaseToken, Verdict};
use sluice_http::HeaderOptions;
use sluice_http::headers::{display_header_name, lead_of, rate_limit_headers};

use crate::number;

/// What `limiter.check` resolves to (before `index.js` adds `release`): a [`Checked`] as JS
/// reads it, named `Checked` in JS as in Rust and Python.
#[napi(object)]
#[derive(Debug, Clone)]
pub struct CheckedJs {
    /// Whether to let the request through (shadow denials and fail-open admit).
    pub allowed: bool,
    /// How many more cost-1 requests would be admitted now.
    pub remaining: f64,
    /// The policy's quota (0 when the store failed).
    pub limit: f64,
    /// How long to wait before retrying, in ms (0 when admitted).
    pub retry_after_ms: f64,
    /// How long until the limit is back to full, in ms.
    pub reset_after_ms: f64,
    /// A shaping leaky bucket's delay before passing the request on, in ms.
    pub delay_ms: f64,
    /// `decided`, `failed_open` or `failed_closed`.
    pub verdict: String,
    /// Why it was denied: `limited`, `cost_exceeds_limit` or `store_unavailable`.
    pub reason: Option<String>,
    /// `RateLimit-Policy`, `RateLimit` and, on a denial, `Retry-After`.
    pub headers: BTreeMap<String, String>,
    /// The concurrency leases taken, as text for `limiter.release` (`null` when none).
    pub lease_token: Option<String>,
}

/// `decided`, `failed_open` or `failed_closed`.
pub(crate) fn verdict_name(verdict: &Verdict) -> &'static str {
    verdict.as_str()
}

/// The reason's name as `sluice serve`'s JSON spells it (its serde name: `limited`,
/// `cost_exceeds_limit`, `banned`, ...), so new reasons need no change here.
fn reason_name(reason: DenyReason) -> String {
    match serde_json::to_value(reason) {
        Ok(serde_json::Value::String(name)) => name,
        _ => format!("{reason:?}"),
    }
}

/// Why `checked` was denied, as [`CheckedJs::reason`] says it (`None` when admitted);
/// `leader_reason` is the reason of the leading decision.
pub(crate) fn reason_of(checked: &Checked, leader_reason: Option<DenyReason>) -> Option<String> {
    match checked.verdict {
        Verdict::FailedClosed(_) => Some("store_unavailable".to_string()),
        _ if checked.allowed => None,
        _ => leader_reason.map(reason_name),
    }
}

impl CheckedJs {
    /// The result of `checked`, with headers as `opts` says.
    pub(crate) fn of(checked: &Checked, opts: &HeaderOptions) -> Self {
        let lead = lead_of(checked);
        let leader = lead.leader;
        let reason = reason_of(checked, leader.and_then(|s| s.decision.reason));
        let headers = rate_limit_headers(checked, opts)
            .into_iter()
            .map(|(n, v)| {
                (
                    display_header_name(n.as_str()),
                    String::from_utf8_lossy(v.as_bytes()).into_owned(),
                )
            })
            .collect();
        Self {
            allowed: checked.allowed,
            remaining: number(leader.map_or(0, |s| s.remaining())),
            limit: number(leader.map_or(0, |s| s.limit())),
            retry_after_ms: number(lead.wait_ms()),
            reset_after_ms: number(leader.map_or(0, |s| s.decision.reset_after_ms)),
            delay_ms: number(checked.delay_ms()),
            verdict: verdict_name(&checked.verdict).to_string(),
            reason,
            headers,
            lease_token: LeaseToken::from_checked(checked).map(|t| t.encode()),
        }
    }
}
