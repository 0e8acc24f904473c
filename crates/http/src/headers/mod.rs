//! Response headers and the 429 answer, usable without the tower layer.
//!
//! The layer, `sluice serve`'s HTTP API, the reverse proxy and the Envoy service all tell
//! clients about limits the same way, so the formatting lives here, apart from any I/O:
//!
//! - `RateLimit-Policy: "burst";q=10;w=2` and `RateLimit: "burst";r=0;t=2`, per
//!   draft-ietf-httpapi-ratelimit-headers: the item name is the policy name, `q` the quota
//!   ([`Algorithm::quota`]), `w` the window in seconds (`ceil(window_ms / 1000)`), `r` the
//!   remaining quota and `t` the seconds until the limit is back to full
//!   (`ceil(reset_after_ms / 1000)`). Several policies are a comma-separated list.
//! - Optionally the legacy `X-RateLimit-Limit`, `X-RateLimit-Remaining` and
//!   `X-RateLimit-Reset` (delta seconds), for clients written before the draft. They can
//!   carry one policy only: the one that denied, else the one with the least remaining.
//! - `Retry-After` on a denial: whole seconds rounded **up** and never below 1, so a client
//!   that honours it is never early and never retries in a tight loop.
//! - The denial itself ([`too_many_requests`]): `429`, `Cache-Control: no-store` (RFC 6585
//!   says a 429 must not be cached) and an `application/problem+json` body (RFC 9457) that
//!   names the policy exceeded.
//!
//! Shadow policies never appear: they are being tried out and must not change what clients
//! see. Values are written into one buffer per call and handed to [`HeaderValue`] as shared
//! slices of it, so a call allocates the buffer and the returned list, nothing per number.

use bytes::{BufMut, Bytes, BytesMut};
use http::header::{CACHE_CONTROL, CONTENT_TYPE, RETRY_AFTER};
use http::{HeaderMap, HeaderName, HeaderValue, Response, StatusCode};
use http_body_util::Full;
use sluice::{Checked, Decision, DenyReason, Policy, Verdict};

/// `RateLimit-Policy`: quota and window of each policy.
pub const RATELIMIT_POLICY: HeaderName = HeaderName::from_static("ratelimit-policy");
/// `RateLimit`: remaining quota and time to reset of each policy.
pub const RATELIMIT: HeaderName = HeaderName::from_static("ratelimit");
/// Legacy `X-RateLimit-Limit`.
pub const X_RATELIMIT_LIMIT: HeaderName = HeaderName::from_static("x-ratelimit-limit");
/// Legacy `X-RateLimit-Remaining`.
pub const X_RATELIMIT_REMAINING: HeaderName = HeaderName::from_static("x-ratelimit-remaining");
/// Legacy `X-RateLimit-Reset`, in seconds from now.
pub const X_RATELIMIT_RESET: HeaderName = HeaderName::from_static("x-ratelimit-reset");

/// The `Content-Type` of denial bodies (RFC 9457).
pub const PROBLEM_JSON: &str = "application/problem+json";

/// Which informational headers to send. `Retry-After` on a denial is not optional: it is
/// part of what a 429 means.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HeaderOptions {
    /// `RateLimit-Policy` and `RateLimit` (default on).
    pub ratelimit: bool,
    /// `X-RateLimit-Limit`, `X-RateLimit-Remaining`, `X-RateLimit-Reset` (default off).
    pub legacy: bool,
}

impl Default for HeaderOptions {
    fn default() -> Self {
        Self {
            ratelimit: true,
            legacy: false,
        }
    }
}

impl HeaderOptions {
    /// No informational headers (denials still carry `Retry-After`).
    pub const fn none() -> Self {
        Self {
            ratelimit: false,
            legacy: false,
        }
    }
    /// The draft's headers and the legacy ones.
    pub const fn all() -> Self {
        Self {
            ratelimit: true,
            legacy: true,
        }
    }
}

/// `Retry-After` seconds for a wait of `ms`: rounded up, never below 1.
pub fn retry_after_secs(ms: u64) -> u64 {
    ms.div_ceil(1000).max(1)
}

/// Whole seconds, rounded up (`w` and `t`).
fn ceil_secs(ms: u64) -> u64 {
    ms.div_ceil(1000)
}

/// Appends the decimal digits of `n` without going through `fmt`.
fn put_u64(buf: &mut BytesMut, mut n: u64) {
    let mut digits = [0u8; 20];
    let mut i = digits.len();
    loop {
        i -= 1;
        digits[i] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    buf.put_slice(&digits[i..]);
}

/// Decimal text of `n` (for the rare paths that want a `String`).
fn itoa_u64(n: u64) -> String {
    let mut b = BytesMut::with_capacity(20);
    put_u64(&mut b, n);
    String::from_utf8_lossy(&b).into_owned()
}

/// A header value from bytes known to be visible ASCII (names are validated policy names,
/// the rest digits and punctuation).
fn value(bytes: Bytes) -> HeaderValue {
    HeaderValue::from_maybe_shared(bytes).unwrap_or_else(|_| HeaderValue::from_static(""))
}

/// The limits a client is told about: enforced policies that have a decision.
fn visible(checked: &Checked) -> impl Iterator<Item = (&Policy, &Decision)> + Clone {
    checked
        .limits
        .iter()
        .filter(|l| !l.policy.shadow)
        .filter_map(|l| l.decision.as_ref().map(|d| (&*l.policy, d)))
}

/// True when `d`, on its own, denied.
fn denies(d: &Decision) -> bool {
    !d.allowed && d.reason != Some(DenyReason::OtherLimitDenied)
}

/// Writes every header into `sink`. `retry_after_ms` is `Some` for a denial that retrying can
/// cure.
fn build<'a, I>(
    limits: I,
    retry_after_ms: Option<u64>,
    opts: &HeaderOptions,
    sink: &mut dyn FnMut(HeaderName, HeaderValue),
) where
    I: Iterator<Item = (&'a Policy, &'a Decision)> + Clone,
{
    let mut buf = BytesMut::with_capacity(128);
    if opts.ratelimit {
        let mut first = true;
        for (p, _) in limits.clone() {
            if !first {
                buf.put_slice(b", ");
            }
            first = false;
            buf.put_u8(b'"');
            buf.put_slice(p.name.as_bytes());
            buf.put_slice(b"\";q=");
            put_u64(&mut buf, p.algorithm.quota());
            buf.put_slice(b";w=");
            put_u64(&mut buf, ceil_secs(p.algorithm.window_ms()));
        }
        if !first {
            sink(RATELIMIT_POLICY.clone(), value(buf.split().freeze()));
            for (i, (p, d)) in limits.clone().enumerate() {
                if i > 0 {
                    buf.put_slice(b", ");
                }
                buf.put_u8(b'"');
                buf.put_slice(p.name.as_bytes());
                buf.put_slice(b"\";r=");
                put_u64(&mut buf, d.remaining);
                buf.put_slice(b";t=");
                put_u64(&mut buf, ceil_secs(d.reset_after_ms));
            }
            sink(RATELIMIT.clone(), value(buf.split().freeze()));
        }
    }
    if opts.legacy {
        // One policy only: the one that denied with the longest wait, else the least remaining.
        let pick = limits
            .clone()
            .filter(|(_, d)| denies(d))
            .max_by_key(|(_, d)| d.retry_after_ms)
            .or_else(|| limits.clone().min_by_key(|(_, d)| d.remaining));
        if let Some((p, d)) = pick {
            put_u64(&mut buf, p.algorithm.quota());
            sink(X_RATELIMIT_LIMIT.clone(), value(buf.split().freeze()));
            put_u64(&mut buf, d.remaining);
            sink(X_RATELIMIT_REMAINING.clone(), value(buf.split().freeze()));
            put_u64(&mut buf, ceil_secs(d.reset_after_ms));
            sink(X_RATELIMIT_RESET.clone(), value(buf.split().freeze()));
        }
    }
    if let Some(ms) = retry_after_ms {
        put_u64(&mut buf, retry_after_secs(ms));
        sink(RETRY_AFTER, value(buf.split().freeze()));
    }
}

/// The wait to announce for a denied check: `None` when the check was admitted, or when the
/// only denials are costs the policy can never admit (retrying cannot help).
fn denial_wait(checked: &Checked) -> Option<u64> {
    if checked.allowed {
        return None;
    }
    match checked.verdict {
        Verdict::FailedClosed(_) => Some(1000),
        _ => {
            let ms = checked.retry_after_ms();
            let only_cost = checked.denials().all(|l| {
                l.decision
                    .as_ref()
                    .is_some_and(|d| d.reason == Some(DenyReason::CostExceedsLimit))
            });
            if only_cost && checked.denials().next().is_some() {
                None
            } else {
                Some(ms)
            }
        }
    }
}

/// The headers for a checked request: the RateLimit fields (as `opts` says) and, when the
/// check denied, `Retry-After`. A fail-open check gets none: nothing was decided.
pub fn rate_limit_headers(
    checked: &Checked,
    opts: &HeaderOptions,
) -> Vec<(HeaderName, HeaderValue)> {
    let mut out = Vec::with_capacity(6);
    if matches!(checked.verdict, Verdict::FailedOpen(_)) {
        return out;
    }
    build(visible(checked), denial_wait(checked), opts, &mut |n, v| {
        out.push((n, v))
    });
    out
}

/// The same headers for a list of `(policy, decision)`, as a service that does not hold a
/// [`Checked`] has them. `Retry-After` is added when a decision denied.
pub fn rate_limit_headers_for(
    limits: &[(&Policy, &Decision)],
    opts: &HeaderOptions,
) -> Vec<(HeaderName, HeaderValue)> {
    let mut out = Vec::with_capacity(6);
    let iter = limits
        .iter()
        .filter(|(p, _)| !p.shadow)
        .map(|&(p, d)| (p, d));
    let denying: Vec<&Decision> = iter.clone().map(|(_, d)| d).filter(|d| denies(d)).collect();
    let wait = if denying.is_empty()
        || denying
            .iter()
            .all(|d| d.reason == Some(DenyReason::CostExceedsLimit))
    {
        None
    } else {
        Some(denying.iter().map(|d| d.retry_after_ms).max().unwrap_or(0))
    };
    build(iter, wait, opts, &mut |n, v| out.push((n, v)));
    out
}

/// Sets the headers of [`rate_limit_headers`] on `headers`, replacing any already there.
pub fn insert_rate_limit_headers(checked: &Checked, opts: &HeaderOptions, headers: &mut HeaderMap) {
    if matches!(checked.verdict, Verdict::FailedOpen(_)) {
        return;
    }
    build(visible(checked), denial_wait(checked), opts, &mut |n, v| {
        headers.insert(n, v);
    });
}

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
    doc.push_str(&itoa_u64(u64::from(status.as_u16())));
    doc.push_str(",\"detail\":");
    doc.push_str(&quote(detail));
    if let Some(p) = policy {
        doc.push_str(",\"policy\":");
        doc.push_str(&quote(p));
    }
    if let Some(ms) = retry_after_ms {
        doc.push_str(",\"retry_after_ms\":");
        doc.push_str(&itoa_u64(ms));
    }
    doc.push('}');
    Bytes::from(doc)
}

/// The policy a denial is reported under: the enforced denial with the longest wait, else
/// (fail closed) the first enforced fail-closed policy.
pub fn denying_policy(checked: &Checked) -> Option<&Policy> {
    checked
        .denials()
        .filter_map(|l| l.decision.as_ref().map(|d| (&*l.policy, d.retry_after_ms)))
        .max_by_key(|&(_, ms)| ms)
        .map(|(p, _)| p)
        .or_else(|| {
            checked
                .limits
                .iter()
                .find(|l| !l.policy.shadow && l.policy.failure_mode == sluice::FailureMode::Closed)
                .map(|l| &*l.policy)
        })
}

fn problem_response(
    status: StatusCode,
    headers: Vec<(HeaderName, HeaderValue)>,
    body: Bytes,
) -> Response<Full<Bytes>> {
    let mut res = Response::new(Full::new(body));
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
/// The body is [`Full<Bytes>`]; axum users can return it as is (it implements
/// `IntoResponse`), others map it with `res.map(MyBody::new)`.
pub fn too_many_requests(checked: &Checked, opts: &HeaderOptions) -> Response<Full<Bytes>> {
    let status = StatusCode::TOO_MANY_REQUESTS;
    if matches!(checked.verdict, Verdict::FailedClosed(_)) {
        return store_unavailable(checked, status);
    }
    let headers = rate_limit_headers(checked, opts);
    let policy = denying_policy(checked);
    let wait = denial_wait(checked);
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
    problem_response(status, headers, body)
}

/// The answer when the store failed and a policy fails closed: `status` (429 or 503),
/// `Retry-After: 1`, no RateLimit headers (nothing was decided) and a problem+json body.
pub fn store_unavailable(checked: &Checked, status: StatusCode) -> Response<Full<Bytes>> {
    let policy = denying_policy(checked).map(|p| p.name.as_str());
    let detail = "the rate limit store is unavailable and this limit fails closed";
    let body = problem_json(status, detail, policy, Some(1000));
    problem_response(
        status,
        vec![(RETRY_AFTER, HeaderValue::from_static("1"))],
        body,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice::{Algorithm, LimitResult, Rate};
    use std::sync::Arc;

    fn burst() -> Arc<Policy> {
        Arc::new(
            Policy::new(
                "burst",
                Algorithm::TokenBucket {
                    capacity: 10,
                    rate: Rate::per_second(5),
                },
            )
            .unwrap(),
        )
    }
    fn daily() -> Arc<Policy> {
        Arc::new(
            Policy::new(
                "daily",
                Algorithm::FixedWindow {
                    limit: 1000,
                    window_ms: 86_400_000,
                },
            )
            .unwrap(),
        )
    }
    fn checked(limits: Vec<(Arc<Policy>, Decision)>) -> Checked {
        let allowed = limits.iter().all(|(p, d)| p.shadow || d.allowed);
        Checked {
            allowed,
            verdict: Verdict::Decided,
            limits: limits
                .into_iter()
                .map(|(policy, d)| LimitResult {
                    policy,
                    decision: Some(d),
                    key: String::new(),
                })
                .collect(),
            leases: vec![],
        }
    }
    fn get<'a>(h: &'a [(HeaderName, HeaderValue)], name: &str) -> Option<&'a str> {
        h.iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.to_str().unwrap())
    }

    #[test]
    fn guide_denial_headers() {
        let c = checked(vec![(burst(), Decision::limited(10, 0, 200, 1950))]);
        let h = rate_limit_headers(&c, &HeaderOptions::default());
        assert_eq!(get(&h, "ratelimit-policy"), Some("\"burst\";q=10;w=2"));
        assert_eq!(get(&h, "ratelimit"), Some("\"burst\";r=0;t=2"));
        assert_eq!(get(&h, "retry-after"), Some("1"));
        assert_eq!(get(&h, "x-ratelimit-limit"), None);
        assert_eq!(h.len(), 3);
    }

    #[test]
    fn several_policies_are_one_list() {
        let c = checked(vec![
            (burst(), Decision::allow(10, 7, 600)),
            (daily(), Decision::allow(1000, 998, 3_600_001)),
        ]);
        let h = rate_limit_headers(&c, &HeaderOptions::all());
        assert_eq!(
            get(&h, "ratelimit-policy"),
            Some("\"burst\";q=10;w=2, \"daily\";q=1000;w=86400")
        );
        assert_eq!(
            get(&h, "ratelimit"),
            Some("\"burst\";r=7;t=1, \"daily\";r=998;t=3601")
        );
        // Legacy headers carry the policy with the least remaining.
        assert_eq!(get(&h, "x-ratelimit-limit"), Some("10"));
        assert_eq!(get(&h, "x-ratelimit-remaining"), Some("7"));
        assert_eq!(get(&h, "x-ratelimit-reset"), Some("1"));
        assert_eq!(get(&h, "retry-after"), None);
    }

    #[test]
    fn retry_after_rounds_up_and_is_never_zero() {
        assert_eq!(retry_after_secs(0), 1);
        assert_eq!(retry_after_secs(1), 1);
        assert_eq!(retry_after_secs(999), 1);
        assert_eq!(retry_after_secs(1000), 1);
        assert_eq!(retry_after_secs(1001), 2);
        let c = checked(vec![(burst(), Decision::limited(10, 0, 3, 5))]);
        let h = rate_limit_headers(&c, &HeaderOptions::none());
        assert_eq!(h.len(), 1);
        assert_eq!(get(&h, "retry-after"), Some("1"));
    }

    #[test]
    fn shadow_policies_are_invisible() {
        let mut shadow = (*daily()).clone();
        shadow.shadow = true;
        let c = checked(vec![
            (burst(), Decision::allow(10, 9, 200)),
            (Arc::new(shadow), Decision::limited(1000, 0, 5000, 5000)),
        ]);
        assert!(c.allowed);
        let h = rate_limit_headers(&c, &HeaderOptions::all());
        assert_eq!(get(&h, "ratelimit-policy"), Some("\"burst\";q=10;w=2"));
        assert_eq!(get(&h, "retry-after"), None);
    }

    #[test]
    fn list_form_matches_checked_form() {
        let b = burst();
        let d = Decision::limited(10, 0, 1500, 2000);
        let a = rate_limit_headers_for(&[(&b, &d)], &HeaderOptions::all());
        let c = rate_limit_headers(
            &checked(vec![(b.clone(), d.clone())]),
            &HeaderOptions::all(),
        );
        assert_eq!(a, c);
        assert_eq!(get(&a, "retry-after"), Some("2"));
    }

    #[test]
    fn numbers_format_exactly() {
        for n in [0, 1, 9, 10, 99, 100, 12345, u64::MAX] {
            let mut b = BytesMut::new();
            put_u64(&mut b, n);
            assert_eq!(&b[..], n.to_string().as_bytes());
        }
    }

    #[test]
    fn denial_response_is_uncacheable_problem_json() {
        let c = checked(vec![
            (burst(), Decision::allow(10, 3, 100)),
            (daily(), Decision::limited(1000, 0, 2500, 2500)),
        ]);
        let res = too_many_requests(&c, &HeaderOptions::default());
        assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
        let h = res.headers();
        assert_eq!(h["cache-control"], "no-store");
        assert_eq!(h["content-type"], PROBLEM_JSON);
        assert_eq!(h["retry-after"], "3");
        let body: serde_json::Value = {
            use http_body_util::BodyExt;
            let b = futures::executor::block_on(res.into_body().collect())
                .unwrap()
                .to_bytes();
            serde_json::from_slice(&b).unwrap()
        };
        assert_eq!(body["status"], 429);
        assert_eq!(body["title"], "Too Many Requests");
        assert_eq!(body["policy"], "daily");
        assert_eq!(body["retry_after_ms"], 2500);
        assert!(body["detail"].as_str().unwrap().contains("daily"));
        let doc = problem_json(
            StatusCode::TOO_MANY_REQUESTS,
            "say \"hi\"",
            Some("p"),
            Some(7),
        );
        assert_eq!(
            &doc[..],
            br#"{"type":"about:blank","title":"Too Many Requests","status":429,"detail":"say \"hi\"","policy":"p","retry_after_ms":7}"#
        );
    }

    #[test]
    fn fail_open_has_no_headers_and_fail_closed_says_so() {
        let mut c = checked(vec![(burst(), Decision::allow(10, 9, 200))]);
        c.limits[0].decision = None;
        c.verdict = Verdict::FailedOpen(sluice::StoreError::Timeout(50));
        assert!(rate_limit_headers(&c, &HeaderOptions::all()).is_empty());
        c.verdict = Verdict::FailedClosed(sluice::StoreError::Timeout(50));
        c.allowed = false;
        let res = store_unavailable(&c, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(res.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(res.headers()["retry-after"], "1");
        assert!(res.headers().get("ratelimit").is_none());
    }
}
