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
//!
//! # Layout
//! - this module: the header fields themselves, and merging them when two layers describe
//!   one response;
//! - [`lead`]: which decision leads an answer, how long to wait, and the numbers shown for a
//!   (possibly sharded) policy;
//! - [`problem`]: problem+json bodies, the 429 and the fail-closed answers.

mod lead;
mod problem;

use bytes::{BufMut, Bytes, BytesMut};
use http::header::{CACHE_CONTROL, Entry, RETRY_AFTER};
use http::{HeaderMap, HeaderName, HeaderValue};
use sluice::{Checked, Decision, Policy, Verdict};

pub use lead::{Lead, Shown, denying_policy, lead, lead_of, shown};
pub use problem::{
    problem, problem_json, store_error_status, store_unavailable, too_many_requests,
};

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

/// A header value from bytes known to be visible ASCII (names are validated policy names,
/// the rest digits and punctuation).
fn value(bytes: Bytes) -> HeaderValue {
    HeaderValue::from_maybe_shared(bytes).unwrap_or_else(|_| HeaderValue::from_static(""))
}

/// Header names as clients usually write them (the decision API's `headers` object and the
/// Envoy service use these spellings; HTTP itself ignores case).
pub fn display_header_name(n: &str) -> String {
    match n {
        "ratelimit" => "RateLimit".into(),
        "ratelimit-policy" => "RateLimit-Policy".into(),
        "retry-after" => "Retry-After".into(),
        "cache-control" => "Cache-Control".into(),
        "x-ratelimit-limit" => "X-RateLimit-Limit".into(),
        "x-ratelimit-remaining" => "X-RateLimit-Remaining".into(),
        "x-ratelimit-reset" => "X-RateLimit-Reset".into(),
        other => other.to_string(),
    }
}

/// Writes every header for the enforced decisions `shown` into `sink`; `lead` says which
/// one the legacy fields describe and whether to send `Retry-After`.
fn build<'a, I>(
    shown: I,
    lead: &Lead<'a>,
    opts: &HeaderOptions,
    sink: &mut dyn FnMut(HeaderName, HeaderValue),
) where
    I: Iterator<Item = Shown<'a>> + Clone,
{
    let mut buf = BytesMut::with_capacity(128);
    if opts.ratelimit {
        let mut first = true;
        for s in shown.clone() {
            if !first {
                buf.put_slice(b", ");
            }
            first = false;
            buf.put_u8(b'"');
            buf.put_slice(s.policy.name.as_bytes());
            buf.put_slice(b"\";q=");
            put_u64(&mut buf, s.policy.algorithm.quota());
            buf.put_slice(b";w=");
            put_u64(&mut buf, ceil_secs(s.policy.algorithm.window_ms()));
        }
        if !first {
            sink(RATELIMIT_POLICY.clone(), value(buf.split().freeze()));
            for (i, s) in shown.clone().enumerate() {
                if i > 0 {
                    buf.put_slice(b", ");
                }
                buf.put_u8(b'"');
                buf.put_slice(s.policy.name.as_bytes());
                buf.put_slice(b"\";r=");
                put_u64(&mut buf, s.remaining());
                buf.put_slice(b";t=");
                put_u64(&mut buf, ceil_secs(s.decision.reset_after_ms));
            }
            sink(RATELIMIT.clone(), value(buf.split().freeze()));
        }
    }
    if opts.legacy
        && let Some(s) = lead.leader
    {
        put_u64(&mut buf, s.policy.algorithm.quota());
        sink(X_RATELIMIT_LIMIT.clone(), value(buf.split().freeze()));
        put_u64(&mut buf, s.remaining());
        sink(X_RATELIMIT_REMAINING.clone(), value(buf.split().freeze()));
        put_u64(&mut buf, ceil_secs(s.decision.reset_after_ms));
        sink(X_RATELIMIT_RESET.clone(), value(buf.split().freeze()));
    }
    if let Some(ms) = lead.retry_after_ms {
        put_u64(&mut buf, retry_after_secs(ms));
        sink(RETRY_AFTER, value(buf.split().freeze()));
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
    build(shown(checked), &lead_of(checked), opts, &mut |n, v| {
        out.push((n, v))
    });
    out
}

/// [`rate_limit_headers`] as `(name, value)` text, the names spelled as clients usually write
/// them ([`display_header_name`]): what the Python and Node bindings hand their callers.
pub fn rate_limit_header_pairs(checked: &Checked, opts: &HeaderOptions) -> Vec<(String, String)> {
    rate_limit_headers(checked, opts)
        .into_iter()
        .map(|(n, v)| {
            (
                display_header_name(n.as_str()),
                String::from_utf8_lossy(v.as_bytes()).into_owned(),
            )
        })
        .collect()
}

/// The same headers for a list of `(policy, decision)`, as a service that does not hold a
/// [`Checked`] has them. `Retry-After` is added when a decision denied.
pub fn rate_limit_headers_for(
    limits: &[(&Policy, &Decision)],
    opts: &HeaderOptions,
) -> Vec<(HeaderName, HeaderValue)> {
    let mut out = Vec::with_capacity(6);
    let shown = limits
        .iter()
        .filter(|(p, _)| !p.shadow)
        .map(|&(p, d)| Shown::new(p, d));
    build(shown.clone(), &lead(shown), opts, &mut |n, v| {
        out.push((n, v))
    });
    out
}

/// The headers of an answer to `checked`: [`rate_limit_headers`] and, when it denied,
/// `Cache-Control: no-store` (RFC 6585: a 429 must not be cached). The decision API returns
/// these for the caller to send; the layer's denials carry the same.
pub fn answer_headers(checked: &Checked, opts: &HeaderOptions) -> Vec<(HeaderName, HeaderValue)> {
    let mut out = rate_limit_headers(checked, opts);
    if !checked.allowed {
        out.push((CACHE_CONTROL, HeaderValue::from_static("no-store")));
    }
    out
}

/// Adds the headers of [`rate_limit_headers`] to `headers`, merging with those another
/// sluice layer (or the upstream) already set, so that nested layers describe every policy:
/// - `RateLimit-Policy` and `RateLimit` are lists: this check's items come first (the outer
///   layer's policies are listed first in a route), then the items already there;
/// - the legacy `X-RateLimit-*` fields describe one policy: the one already there stays if
///   the response is a denial (it has `Retry-After`) or has no more remaining than this one;
/// - `Retry-After` keeps the longer wait.
pub fn merge_rate_limit_headers(checked: &Checked, opts: &HeaderOptions, headers: &mut HeaderMap) {
    let ours = rate_limit_headers(checked, opts);
    let number = |v: Option<&HeaderValue>| v?.to_str().ok()?.trim().parse::<u64>().ok();
    // Only the legacy fields consult it: without them, two lookups per response are saved.
    let keep_legacy = opts.legacy
        && (headers.contains_key(RETRY_AFTER)
            || number(headers.get(&X_RATELIMIT_REMAINING)).is_some_and(|theirs| {
                let mine = ours.iter().find(|(n, _)| n == X_RATELIMIT_REMAINING);
                number(mine.map(|(_, v)| v)).is_none_or(|mine| theirs <= mine)
            }));
    for (name, ours) in ours {
        // One lookup for the usual response that has none of these fields yet.
        let mut slot = match headers.entry(name) {
            Entry::Vacant(slot) => {
                slot.insert(ours);
                continue;
            }
            Entry::Occupied(slot) => slot,
        };
        let theirs = slot.get();
        let merged = if slot.key() == RATELIMIT_POLICY || slot.key() == RATELIMIT {
            let mut buf = BytesMut::with_capacity(ours.len() + 2 + theirs.len());
            buf.put_slice(ours.as_bytes());
            buf.put_slice(b", ");
            buf.put_slice(theirs.as_bytes());
            value(buf.freeze())
        } else if slot.key() == RETRY_AFTER {
            if number(Some(theirs)) >= number(Some(&ours)) {
                continue;
            }
            ours
        } else if keep_legacy {
            continue;
        } else {
            ours
        };
        slot.insert(merged);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::StatusCode;
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
        let body: serde_json::Value = serde_json::from_slice(res.body()).unwrap();
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

    fn sharded(shards: u32) -> Arc<Policy> {
        let mut p = Policy::new(
            "hot",
            Algorithm::FixedWindow {
                limit: 8,
                window_ms: 60_000,
            },
        )
        .unwrap();
        p.shards = shards;
        Arc::new(p)
    }

    #[test]
    fn a_sharded_policy_is_shown_whole() {
        // 8 per minute over 4 shards: each shard holds 2, and this one has 1 left.
        let c = checked(vec![(sharded(4), Decision::allow(2, 1, 30_000))]);
        let h = rate_limit_headers(&c, &HeaderOptions::all());
        assert_eq!(get(&h, "ratelimit-policy"), Some("\"hot\";q=8;w=60"));
        assert_eq!(get(&h, "ratelimit"), Some("\"hot\";r=4;t=30"));
        assert_eq!(get(&h, "x-ratelimit-limit"), Some("8"));
        assert_eq!(get(&h, "x-ratelimit-remaining"), Some("4"));
        let s = lead_of(&c).leader.unwrap();
        assert_eq!((s.limit(), s.remaining()), (8, 4));
        // Rounded-up shards never show more than the whole quota: 10 over 4 is 3 per shard.
        let mut p = (*sharded(4)).clone();
        p.algorithm = Algorithm::FixedWindow {
            limit: 10,
            window_ms: 60_000,
        };
        let d = Decision::allow(3, 3, 0);
        let s = Shown::new(&p, &d);
        assert_eq!((s.limit(), s.remaining()), (10, 10));
        let d = Decision::limited(3, 0, 500, 500);
        assert_eq!(Shown::new(&p, &d).remaining(), 0);
        // One shard is shown exactly as decided.
        let one = sharded(1);
        let d = Decision::allow(8, 5, 0);
        assert_eq!(
            (
                Shown::new(&one, &d).limit(),
                Shown::new(&one, &d).remaining()
            ),
            (8, 5)
        );
    }

    #[test]
    fn lead_picks_the_longest_denial_then_the_least_remaining() {
        let (b, d) = (burst(), daily());
        let c = checked(vec![
            (b.clone(), Decision::allow(10, 3, 100)),
            (d.clone(), Decision::allow(1000, 900, 100)),
        ]);
        let l = lead_of(&c);
        assert_eq!(l.leader.unwrap().policy.name, "burst");
        assert_eq!(l.retry_after_ms, None);
        let c = checked(vec![
            (b.clone(), Decision::limited(10, 0, 400, 2000)),
            (d.clone(), Decision::limited(1000, 0, 9000, 9000)),
        ]);
        let l = lead_of(&c);
        assert_eq!(l.leader.unwrap().policy.name, "daily");
        assert_eq!(l.retry_after_ms, Some(9000));
        // A cost no policy can ever admit: nothing to wait for.
        let c = checked(vec![(b, Decision::cost_exceeds_limit(10, 10, 0))]);
        assert_eq!(lead_of(&c).retry_after_ms, None);
        assert_eq!(lead_of(&c).wait_ms(), 0);
    }

    #[test]
    fn nested_layers_merge_their_lists() {
        let inner = checked(vec![(daily(), Decision::allow(1000, 998, 3_600_001))]);
        let outer = checked(vec![(burst(), Decision::allow(10, 7, 600))]);
        let mut h = HeaderMap::new();
        merge_rate_limit_headers(&inner, &HeaderOptions::all(), &mut h);
        merge_rate_limit_headers(&outer, &HeaderOptions::all(), &mut h);
        assert_eq!(
            h["ratelimit-policy"],
            "\"burst\";q=10;w=2, \"daily\";q=1000;w=86400"
        );
        assert_eq!(h["ratelimit"], "\"burst\";r=7;t=1, \"daily\";r=998;t=3601");
        // The legacy fields describe the policy with the least remaining, whichever layer.
        assert_eq!(h["x-ratelimit-limit"], "10");
        assert_eq!(h["x-ratelimit-remaining"], "7");
        // An inner denial keeps its legacy fields and its Retry-After.
        let mut h = HeaderMap::new();
        let denied = checked(vec![(daily(), Decision::limited(1000, 0, 5000, 5000))]);
        for (n, v) in answer_headers(&denied, &HeaderOptions::all()) {
            h.insert(n, v);
        }
        merge_rate_limit_headers(&outer, &HeaderOptions::all(), &mut h);
        assert_eq!(h["x-ratelimit-limit"], "1000");
        assert_eq!(h["retry-after"], "5");
        assert_eq!(h["cache-control"], "no-store");
        assert!(
            h["ratelimit"]
                .to_str()
                .unwrap()
                .starts_with("\"burst\";r=7")
        );
    }

    #[test]
    fn only_denials_are_marked_uncacheable() {
        let ok = checked(vec![(burst(), Decision::allow(10, 9, 200))]);
        assert!(
            answer_headers(&ok, &HeaderOptions::default())
                .iter()
                .all(|(n, _)| n != CACHE_CONTROL)
        );
        let no = checked(vec![(burst(), Decision::limited(10, 0, 200, 2000))]);
        let h = answer_headers(&no, &HeaderOptions::default());
        assert_eq!(get(&h, "cache-control"), Some("no-store"));
        assert_eq!(display_header_name("cache-control"), "Cache-Control");
    }
}
