//! RFC 9457 problem documents: the 429 and fail-closed answers of the layer, and every error
//! answer of `sluice serve`'s listeners.
//!
//! Bodies are plain [`Bytes`], so a caller wraps them in whatever body type its server uses
//! (`axum::body::Body::from`, `http_body_util::Full::new`) without polling anything.

use bytes::Bytes;
use http::header::{CACHE_CONTROL, CONTENT_TYPE, RETRY_AFTER};
use http::{HeaderName, HeaderValue, Response, StatusCode};
use sluice::{Checked, StoreError, Verdict};

use super::lead::{denying_policy, lead_of};
use super::{PROBLEM_JSON, ceil_secs, rate_limit_headers, retry_after_secs};
use crate::headers::HeaderOptions;

/// An RFC 9457 problem document. `policy` and `retry_after_ms` are extension members.
pub fn problem_json(
    status: StatusCode,
    detail: &str,
    policy: Option<&str>,
    retry_after_ms: Option<u64>,
) -> Bytes {
    // Written by hand to keep the members in the RFC's order; strings go through serde_json
    // for escaping. "about:blank": the status code says it all, the title is its phrase.
    let quote = |s: &str| serde_json::to_string(s).unwrap_or_else(|_| "\"\"".into());
    let mut doc = String::with_capacity(160 + detail.len());
    doc.push_str("{\"type\":\"about:blank\",\"title\":");
    doc.push_str(&quote(status.canonical_reason().unwrap_or("Error")));
    doc.push_str(",\"status\":");
    doc.push_str(&status.as_u16().to_string());
    doc.push_str(",\"detail\":");
    doc.push_str(&quote(detail));
    if let Some(p) = policy {
        doc.push_str(",\"policy\":");
        doc.push_str(&quote(p));
    }
    if let Some(ms) = retry_after_ms {
        doc.push_str(",\"retry_after_ms\":");
        doc.push_str(&ms.to_string());
    }
    doc.push('}');
    Bytes::from(doc)
}

/// An error answer: `status` with an `application/problem+json` body saying `detail`.
pub fn problem(status: StatusCode, detail: &str) -> Response<Bytes> {
    let mut res = Response::new(problem_json(status, detail, None, None));
    *res.status_mut() = status;
    res.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static(PROBLEM_JSON));
    res
}

/// A denial: `status`, `headers`, `Cache-Control: no-store` and a problem+json `body`.
fn denial(
    status: StatusCode,
    headers: Vec<(HeaderName, HeaderValue)>,
    body: Bytes,
) -> Response<Bytes> {
    let mut res = Response::new(body);
    *res.status_mut() = status;
    let h = res.headers_mut();
    for (n, v) in headers {
        h.insert(n, v);
    }
    h.insert(CACHE_CONTROL, HeaderValue::from_static("no-store"));
    h.insert(CONTENT_TYPE, HeaderValue::from_static(PROBLEM_JSON));
    res
}

/// The `429 Too Many Requests` answer to a denied check: the RateLimit headers, `Retry-After`,
/// `Cache-Control: no-store` and a problem+json body naming the policy exceeded.
///
/// The body is [`Bytes`]: axum users return `res.map(axum::body::Body::from)`, hyper users
/// `res.map(http_body_util::Full::new)`.
pub fn too_many_requests(checked: &Checked, opts: &HeaderOptions) -> Response<Bytes> {
    let status = StatusCode::TOO_MANY_REQUESTS;
    if matches!(checked.verdict, Verdict::FailedClosed(_)) {
        return store_unavailable(checked, status);
    }
    let headers = rate_limit_headers(checked, opts);
    let policy = denying_policy(checked);
    let wait = lead_of(checked).retry_after_ms;
    let detail = match (policy, wait) {
        (Some(p), Some(ms)) => format!(
            "rate limit \"{}\" exceeded ({} per {} s); retry after {} s",
            p.name,
            p.algorithm.quota(),
            ceil_secs(p.algorithm.window_ms()),
            retry_after_secs(ms)
        ),
        (Some(p), None) => format!(
            "the request costs more than rate limit \"{}\" can ever admit",
            p.name
        ),
        (None, _) => "rate limit exceeded".to_string(),
    };
    let body = problem_json(status, &detail, policy.map(|p| p.name.as_str()), wait);
    denial(status, headers, body)
}

/// The status that answers a store call that failed outside a check (a state read, a reset,
/// a charge, a control-plane change, a lease release): `400` when the store refused the
/// request itself as invalid (the caller can fix it), `503` when it did not answer (a timeout,
/// no connection, a script error, sluice saturated), which the caller may retry. One rule for
/// the HTTP API, the control API and the Python and Node packages.
pub fn store_error_status(e: &StoreError) -> StatusCode {
    match e {
        StoreError::Invalid(_) => StatusCode::BAD_REQUEST,
        StoreError::Timeout(_)
        | StoreError::Unavailable(_)
        | StoreError::Backend(_)
        | StoreError::Overloaded(_) => StatusCode::SERVICE_UNAVAILABLE,
    }
}

/// The answer when the store failed and a policy fails closed: `status` (429 or 503),
/// `Retry-After: 1`, no RateLimit headers (nothing was decided) and a problem+json body.
pub fn store_unavailable(checked: &Checked, status: StatusCode) -> Response<Bytes> {
    let policy = denying_policy(checked).map(|p| p.name.as_str());
    let detail = "the rate limit store is unavailable and this limit fails closed";
    let body = problem_json(status, detail, policy, Some(1000));
    denial(
        status,
        vec![(RETRY_AFTER, HeaderValue::from_static("1"))],
        body,
    )
}
