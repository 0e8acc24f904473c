//! The bodies of the fuzz targets, shared by `fuzz/` (cargo-fuzz, libFuzzer) and by the
//! regression tests in `tests/suite/fuzz_regressions.rs` (random inputs plus every input that once
//! crashed, so CI replays them without a nightly toolchain).
//!
//! Each takes arbitrary bytes and panics only when an invariant breaks:
//! - [`config`]: the configuration parser never panics; every error names `FILE:LINE`.
//! - [`headers`]: RateLimit header formatting gives valid header values that read back.
//! - [`forwarded`]: forwarding-header parsing never panics and the client it finds is the
//!   socket peer or an address from the headers.
//! - [`api_json`]: the decision API answers any body with 200 or a 4xx problem, never 5xx.
//! - [`algorithms`]: a sequence of checks on every algorithm keeps its documented bound, and
//!   waiting `retry_after_ms` is never early.

use std::net::IpAddr;
use std::sync::OnceLock;

use sluice_core::algorithm::{self, State, Update};
use sluice_core::{Algorithm, Decision, DenyReason, LeakyMode, LeaseId, Policy, Rate};

/// Reads fuzz bytes as numbers; past the end every read is 0.
#[derive(Debug)]
pub struct Bytes<'a>(&'a [u8]);

impl<'a> Bytes<'a> {
    /// Wraps `data`.
    pub fn new(data: &'a [u8]) -> Self {
        Self(data)
    }
    /// Bytes left.
    pub fn len(&self) -> usize {
        self.0.len()
    }
    /// Whether nothing is left.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
    /// One byte.
    pub fn u8(&mut self) -> u8 {
        match self.0.split_first() {
            Some((b, rest)) => {
                self.0 = rest;
                *b
            }
            None => 0,
        }
    }
    /// Two bytes.
    pub fn u16(&mut self) -> u16 {
        u16::from(self.u8()) << 8 | u16::from(self.u8())
    }
    /// Four bytes.
    pub fn u32(&mut self) -> u32 {
        u32::from(self.u16()) << 16 | u32::from(self.u16())
    }
    /// Eight bytes.
    pub fn u64(&mut self) -> u64 {
        u64::from(self.u32()) << 32 | u64::from(self.u32())
    }
    /// Up to `max` bytes, the length read first.
    pub fn slice(&mut self, max: usize) -> &'a [u8] {
        let n = (self.u8() as usize).min(max).min(self.0.len());
        let (a, b) = self.0.split_at(n);
        self.0 = b;
        a
    }
}

/// The configuration parser.
pub fn config(data: &[u8]) {
    let Ok(src) = std::str::from_utf8(data) else {
        return;
    };
    if let Err(errors) = sluice_server::Config::parse(src, "fuzz.toml", None) {
        assert!(!errors.0.is_empty());
        for e in &errors.0 {
            let text = e.to_string();
            assert!(text.starts_with("fuzz.toml:"), "{text}");
            assert!(
                e.line
                    .is_some_and(|l| l >= 1 && l <= src.lines().count().max(1) + 1),
                "{text}"
            );
        }
    }
}

/// An algorithm with small, valid parameters from fuzz bytes (`None` when invalid).
pub fn algorithm(b: &mut Bytes<'_>) -> Option<Algorithm> {
    let small = |b: &mut Bytes<'_>| u64::from(b.u16() % 2000) + 1;
    let rate = |b: &mut Bytes<'_>| {
        Rate::new(
            u64::from(b.u8() % 50) + 1,
            [1, 10, 250, 1000, 60_000][usize::from(b.u8() % 5)],
        )
    };
    let window = |b: &mut Bytes<'_>| [1u64, 7, 100, 1000, 60_000][usize::from(b.u8() % 5)];
    let a = match b.u8() % 8 {
        0 => Algorithm::TokenBucket {
            capacity: small(b),
            rate: rate(b),
        },
        1 => Algorithm::Gcra {
            rate: rate(b),
            burst: small(b) - 1,
        },
        2 => Algorithm::LeakyBucket {
            capacity: small(b),
            rate: rate(b),
            mode: LeakyMode::Policing,
        },
        3 => Algorithm::LeakyBucket {
            capacity: small(b),
            rate: rate(b),
            mode: LeakyMode::Shaping,
        },
        4 => Algorithm::FixedWindow {
            limit: small(b),
            window_ms: window(b),
        },
        5 => Algorithm::SlidingWindowCounter {
            limit: small(b),
            window_ms: window(b),
        },
        6 => Algorithm::SlidingWindowLog {
            limit: small(b) % 64 + 1,
            window_ms: window(b),
        },
        _ => Algorithm::Concurrency {
            limit: small(b) % 16 + 1,
            lease_ms: window(b),
        },
    };
    a.validate().ok().map(|()| a)
}

/// `ceil(amount * elapsed_us / (per_ms * 1000))`: what a rate can refill in `elapsed_us`.
fn refill(rate: Rate, elapsed_us: u64) -> u64 {
    (u128::from(rate.amount) * u128::from(elapsed_us)).div_ceil(u128::from(rate.per_ms) * 1000)
        as u64
}

/// The most cost `algorithm` may admit between `t0` and `t1` (µs, inclusive), or `None` when
/// the algorithm's bound is not a simple function of the interval. The algorithms count time
/// in whole milliseconds or finer, so the interval is taken as its whole milliseconds plus one.
fn bound(algorithm: &Algorithm, t0: u64, t1: u64) -> Option<u64> {
    let elapsed = (t1 / 1000 - t0 / 1000 + 1) * 1000;
    match *algorithm {
        Algorithm::TokenBucket { capacity, rate } => Some(capacity + refill(rate, elapsed)),
        Algorithm::LeakyBucket { capacity, rate, .. } => Some(capacity + refill(rate, elapsed)),
        Algorithm::Gcra { rate, burst } => Some(burst + 1 + refill(rate, elapsed)),
        _ => None,
    }
}

/// Checks every algorithm's invariants over a sequence of requests.
pub fn algorithms(data: &[u8]) {
    let mut b = Bytes::new(data);
    let Some(alg) = algorithm(&mut b) else { return };
    let quota = alg.quota();
    let mut state: Option<(State, u64)> = None;
    let mut now: u64 = 1_700_000_000_000_000 + u64::from(b.u32());
    // (time, cost) of every admitted request; concurrency: (time, lease).
    let mut admitted: Vec<(u64, u64)> = Vec::new();
    let mut leases: Vec<(u64, LeaseId)> = Vec::new();
    for step in 0..200 {
        if b.len() < 3 {
            break;
        }
        let unit = [1u64, 1000, 100_000][usize::from(b.u8() % 3)];
        now += u64::from(b.u8()) * unit;
        let op = b.u8();
        let snapshot = state.clone();
        let current = snapshot
            .as_ref()
            .filter(|(_, exp)| *exp > now)
            .map(|(s, _)| s);
        if let Algorithm::Concurrency { .. } = alg
            && op.is_multiple_of(4)
            && !leases.is_empty()
        {
            let (_, id) = leases.remove(usize::from(op) % leases.len());
            let (_, update) = algorithm::release(current, now, &id);
            apply(&mut state, update, current.is_none());
            continue;
        }
        let cost = match op % 8 {
            0 => 0,
            1 => quota + 1 + u64::from(op),
            _ => u64::from(op) % quota.min(8) + 1,
        };
        let lease = LeaseId(format!("l{step}"));
        let out = algorithm::decide(&alg, current, now, cost, Some(&lease));
        let d = &out.decision;
        generic_invariants(&alg, d, cost);
        // Waiting retry_after_ms is never early.
        if d.reason == Some(DenyReason::Limited)
            && !matches!(
                alg,
                Algorithm::SlidingWindowCounter { .. } | Algorithm::Concurrency { .. }
            )
        {
            let later = now + d.retry_after_ms * 1000;
            let st = state
                .as_ref()
                .filter(|(_, exp)| *exp > later)
                .map(|(s, _)| s);
            let retry = algorithm::decide(&alg, st, later, cost, None);
            assert!(
                retry.decision.allowed,
                "{alg:?}: denied again after waiting {} ms: {:?}",
                d.retry_after_ms, retry.decision
            );
        }
        let allowed = d.allowed;
        apply(&mut state, out.update, current.is_none());
        if allowed && cost > 0 {
            admitted.push((now, cost));
            if let Algorithm::Concurrency { .. } = alg {
                leases.push((now, lease));
            }
        }
        check_bounds(&alg, &admitted, &leases, now);
    }
}

fn apply(state: &mut Option<(State, u64)>, update: Update<State>, absent: bool) {
    match update {
        Update::Put {
            state: s,
            expires_at,
        } => *state = Some((s, expires_at)),
        Update::Delete => *state = None,
        Update::Keep if absent => *state = None,
        Update::Keep => {}
    }
}

fn generic_invariants(alg: &Algorithm, d: &Decision, cost: u64) {
    assert_eq!(d.limit, alg.quota(), "{alg:?}: {d:?}");
    assert!(d.remaining <= d.limit, "{alg:?}: {d:?}");
    if d.allowed {
        assert_eq!(d.retry_after_ms, 0, "{alg:?}: {d:?}");
        assert!(d.reason.is_none(), "{alg:?}: {d:?}");
    } else {
        assert!(d.reason.is_some(), "{alg:?}: {d:?}");
        assert!(d.lease.is_none(), "{alg:?}: {d:?}");
        if d.reason == Some(DenyReason::Limited) {
            assert!(d.retry_after_ms >= 1, "{alg:?}: {d:?}");
        }
    }
    if cost > alg.quota() {
        assert!(
            !d.allowed,
            "{alg:?}: cost {cost} above the quota admitted: {d:?}"
        );
    }
    if d.delay_ms > 0 {
        assert!(
            matches!(
                alg,
                Algorithm::LeakyBucket {
                    mode: LeakyMode::Shaping,
                    ..
                }
            ),
            "{alg:?}: {d:?}"
        );
    }
}

fn check_bounds(alg: &Algorithm, admitted: &[(u64, u64)], leases: &[(u64, LeaseId)], now: u64) {
    match *alg {
        Algorithm::FixedWindow { limit, window_ms } => {
            let w = window_ms * 1000;
            let in_window: u64 = admitted
                .iter()
                .filter(|(t, _)| t / w == now / w)
                .map(|(_, c)| c)
                .sum();
            assert!(in_window <= limit, "{alg:?}: {in_window} in one window");
        }
        // The logs and leases keep whole milliseconds (docs/algorithms.md): a window is
        // (now_ms - W, now_ms].
        Algorithm::SlidingWindowLog { limit, window_ms } => {
            let in_window: u64 = admitted
                .iter()
                .filter(|(t, _)| t / 1000 + window_ms > now / 1000)
                .map(|(_, c)| c)
                .sum();
            assert!(
                in_window <= limit,
                "{alg:?}: {in_window} in a sliding window"
            );
        }
        Algorithm::Concurrency { limit, lease_ms } => {
            let live = leases
                .iter()
                .filter(|(t, _)| t / 1000 + lease_ms > now / 1000)
                .count() as u64;
            assert!(live <= limit, "{alg:?}: {live} leases held");
        }
        Algorithm::SlidingWindowCounter { limit, window_ms } => {
            // At most twice the limit in any window (the counter's documented worst case).
            let in_window: u64 = admitted
                .iter()
                .filter(|(t, _)| t / 1000 + window_ms > now / 1000)
                .map(|(_, c)| c)
                .sum();
            assert!(
                in_window <= 2 * limit,
                "{alg:?}: {in_window} in a sliding window"
            );
        }
        _ => {
            for (i, &(t0, _)) in admitted.iter().enumerate() {
                let sum: u64 = admitted[i..].iter().map(|(_, c)| c).sum();
                let max = bound(alg, t0, now).expect("bucket bound");
                assert!(
                    sum <= max,
                    "{alg:?}: {sum} admitted since {t0}, bound {max}"
                );
            }
        }
    }
}

/// RateLimit header formatting.
pub fn headers(data: &[u8]) {
    use sluice_http::headers::{HeaderOptions, rate_limit_headers_for};
    let mut b = Bytes::new(data);
    let mut policies = Vec::new();
    let mut decisions = Vec::new();
    for i in 0..(b.u8() % 5) {
        let Some(alg) = algorithm(&mut b) else {
            continue;
        };
        let name_len = usize::from(b.u8() % 64) + 1;
        let name: String = (0..name_len)
            .map(|_| {
                let alphabet = b"abcXYZ019-_.";
                alphabet[usize::from(b.u8()) % alphabet.len()] as char
            })
            .collect();
        let Ok(mut p) = Policy::new(
            format!("{name}{i}").chars().take(64).collect::<String>(),
            alg,
        ) else {
            continue;
        };
        p.shadow = b.u8().is_multiple_of(4);
        let allowed = b.u8().is_multiple_of(2);
        let reason = if allowed {
            None
        } else {
            Some(
                [
                    DenyReason::Limited,
                    DenyReason::CostExceedsLimit,
                    DenyReason::OtherLimitDenied,
                ][usize::from(b.u8() % 3)],
            )
        };
        let d = Decision {
            allowed,
            limit: p.algorithm.quota(),
            remaining: b.u64() % (p.algorithm.quota() + 1),
            retry_after_ms: if allowed { 0 } else { b.u64() >> (b.u8() % 64) },
            reset_after_ms: b.u64() >> (b.u8() % 64),
            delay_ms: 0,
            reason,
            lease: None,
        };
        policies.push(p);
        decisions.push(d);
    }
    let legacy = b.u8().is_multiple_of(2);
    let pairs: Vec<(&Policy, &Decision)> = policies.iter().zip(&decisions).collect();
    let out = rate_limit_headers_for(
        &pairs,
        &HeaderOptions {
            ratelimit: true,
            legacy,
        },
    );
    let visible: Vec<&(&Policy, &Decision)> = pairs.iter().filter(|(p, _)| !p.shadow).collect();
    for (n, v) in &out {
        let text = v
            .to_str()
            .unwrap_or_else(|_| panic!("{n}: not visible ASCII: {v:?}"));
        match n.as_str() {
            "ratelimit-policy" => {
                for (p, _) in &visible {
                    let item = format!("\"{}\";q={};w=", p.name, p.algorithm.quota());
                    assert!(text.contains(&item), "{text} lacks {item}");
                }
            }
            "ratelimit" => {
                let items: Vec<&str> = text.split(", ").collect();
                assert_eq!(items.len(), visible.len(), "{text}");
                for (item, (p, d)) in items.iter().zip(&visible) {
                    let want = format!("\"{}\";r={};t=", p.name, d.remaining);
                    assert!(item.starts_with(&want), "{item} vs {want}");
                }
            }
            "retry-after" => {
                let secs: u64 = text.parse().expect("Retry-After is whole seconds");
                assert!(secs >= 1);
            }
            _ => {
                let _: u64 = text.parse().expect("legacy headers are numbers");
            }
        }
    }
    let denies = |d: &Decision| !d.allowed && d.reason != Some(DenyReason::OtherLimitDenied);
    let any_retryable = visible.iter().any(|(_, d)| denies(d))
        && !visible
            .iter()
            .filter(|(_, d)| denies(d))
            .all(|(_, d)| d.reason == Some(DenyReason::CostExceedsLimit));
    assert_eq!(
        out.iter().any(|(n, _)| n == "retry-after"),
        any_retryable,
        "{out:?}"
    );
    assert_eq!(
        out.iter().any(|(n, _)| n == "ratelimit"),
        !visible.is_empty()
    );
}

/// Forwarding-header parsing and client IP selection.
pub fn forwarded(data: &[u8]) {
    use http::{HeaderMap, HeaderValue};
    use sluice_http::identity::forwarded_chain;
    use sluice_http::{ClientIpConfig, TrustedProxies};
    let mut b = Bytes::new(data);
    let peers: [IpAddr; 4] = [
        [127, 0, 0, 1].into(),
        [10, 0, 0, 7].into(),
        [203, 0, 113, 9].into(),
        "2001:db8::1".parse().expect("ip"),
    ];
    let peer = peers[usize::from(b.u8() % 4)];
    let trusted = match b.u8() % 4 {
        0 => TrustedProxies::None,
        1 => TrustedProxies::Hops(usize::from(b.u8() % 5)),
        2 => TrustedProxies::cidrs(&["127.0.0.1", "10.0.0.0/8"]).expect("cidrs"),
        _ => TrustedProxies::cidrs(&["0.0.0.0/0", "::/0"]).expect("cidrs"),
    };
    let mut headers = HeaderMap::new();
    for _ in 0..(b.u8() % 4) {
        let name = ["forwarded", "x-forwarded-for", "x-real-ip"][usize::from(b.u8() % 3)];
        if let Ok(v) = HeaderValue::from_bytes(b.slice(200)) {
            headers.append(name, v);
        }
    }
    let chain = forwarded_chain(&headers);
    let config = ClientIpConfig {
        trusted: trusted.clone(),
        ..ClientIpConfig::default()
    };
    let client = config.client_ip(peer, &headers);
    assert!(
        client == peer.to_canonical() || chain.contains(&Some(client)),
        "{client} from {chain:?} (peer {peer})"
    );
    if trusted == TrustedProxies::None {
        assert_eq!(client, peer.to_canonical());
    }
    let id = config.group(client);
    assert!(id.as_str().starts_with("ip:") || id.as_str().starts_with("ip6:"));
}

struct Api {
    runtime: tokio::runtime::Runtime,
    router: axum::Router,
}

fn api() -> &'static Api {
    static API: OnceLock<Api> = OnceLock::new();
    API.get_or_init(|| {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
        let config = sluice_server::Config::parse(
            "[policies.a]\nalgorithm = \"token-bucket\"\ncapacity = 5\nrate = \"1/s\"\n\
             [policies.b]\nalgorithm = \"concurrency\"\nlimit = 2\nlease = \"1s\"\n\
             [policies.c]\nalgorithm = \"leaky-bucket\"\ncapacity = 3\nrate = \"10/s\"\nmode = \"shaping\"\n\
             [server]\nmax_body_bytes = 4096\n",
            "fuzz.toml",
            None,
        )
        .expect("fuzz config");
        let limiter = runtime.block_on(sluice_server::state::build_limiter(&config)).expect("memory limiter");
        let router = sluice_server::api::router(sluice_server::Shared::new(config, limiter));
        Api { runtime, router }
    })
}

/// The decision API's JSON: any body gets 200 or a 4xx problem, and JSON either way.
pub fn api_json(data: &[u8]) {
    use tower::ServiceExt;
    let api = api();
    let path = if data.first().is_some_and(|b| b % 4 == 0) {
        "/v1/release"
    } else {
        "/v1/check"
    };
    let req = http::Request::post(path)
        .header("content-type", "application/json")
        .body(axum::body::Body::from(data.to_vec()))
        .expect("request");
    let res = api
        .runtime
        .block_on(api.router.clone().oneshot(req))
        .expect("infallible");
    let status = res.status().as_u16();
    assert!(
        status == 200 || (400..500).contains(&status),
        "status {status} for {:?}",
        String::from_utf8_lossy(data)
    );
    let body = api
        .runtime
        .block_on(axum::body::to_bytes(res.into_body(), 1 << 20))
        .expect("body");
    let v: serde_json::Value = serde_json::from_slice(&body).expect("the answer is JSON");
    if status == 200 && path == "/v1/check" {
        assert!(v["allowed"].is_boolean());
        assert!(v["headers"].is_object());
    } else if status != 200 {
        assert_eq!(v["status"], status);
    }
}

/// A fuzz target's body.
pub type Target = fn(&[u8]);

/// Every target by name, for the regression runner.
pub const TARGETS: [(&str, Target); 5] = [
    ("config", config),
    ("headers", headers),
    ("forwarded", forwarded),
    ("api_json", api_json),
    ("algorithms", algorithms),
];
