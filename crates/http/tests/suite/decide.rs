//! The decision function itself ([`sluice_http::Decider`]), called with framework-neutral
//! request heads as the Python and Node middleware call it, on the embedded store and on a
//! real Redis. Every refusal is also requested over real HTTP through the tower layer built
//! on the same decider, and the two answers must agree (status, problem+json body, header
//! names): the layer and the bindings cannot drift apart.

use crate::support;

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::routing::get as route;
use http::StatusCode;
use sluice::{Algorithm, Limiter, ListEntry, ListKind, Policy, StoreOptions};
use sluice_http::decide::{Answer, Outcome, Refusal, RequestHead};
use sluice_http::{Admission, Count, RateLimitLayer, Rule};
use sluice_testkit::servers::RedisServer;
use support::get;

/// Every test request comes from here, over HTTP and in the heads handed to the decider.
const PEER: &str = "127.0.0.1";
const ME: &str = "ip:127.0.0.1";

fn fixed(name: &str, limit: u64) -> Policy {
    Policy::new(
        name,
        Algorithm::FixedWindow {
            limit,
            window_ms: 3_600_000,
        },
    )
    .unwrap()
}

fn head(target: &str, headers: &[(&str, &str)]) -> RequestHead {
    RequestHead::from_raw("GET", target, headers.iter().copied(), Some(PEER)).unwrap()
}

fn refused(a: Answer) -> Refusal {
    match a {
        Answer::Refuse(r) => r,
        Answer::Admit(a) => panic!("admitted ({:?})", a.outcome()),
    }
}

fn admitted(a: Answer) -> Admission {
    match a {
        Answer::Admit(a) => a,
        Answer::Refuse(r) => panic!("refused {} {:?}", r.status, r.body),
    }
}

fn header<'a>(h: &'a http::HeaderMap, name: &str) -> Option<&'a str> {
    h.get(name).map(|v| v.to_str().unwrap())
}

/// The `r` (remaining) of the one item of a `RateLimit` field (fixed windows are aligned to
/// the clock, so `t` depends on when the test runs).
fn remaining(h: &http::HeaderMap, policy: &str) -> Option<u64> {
    let v = header(h, "ratelimit")?;
    let rest = v.strip_prefix(&format!("\"{policy}\";r="))?;
    rest.split(';').next()?.parse().ok()
}

fn problem_type(body: &[u8]) -> String {
    let v: serde_json::Value = serde_json::from_slice(body).unwrap();
    v["type"].as_str().unwrap_or_default().to_string()
}

/// The same refusal over HTTP through the layer: same status, same problem type, same header
/// names (values such as `Retry-After` may have moved on by a second).
async fn layer_agrees(addr: std::net::SocketAddr, target: &str, refusal: &Refusal) {
    let r = get(addr, target, &[]).await;
    assert_eq!(r.status, refusal.status, "{target}: {}", r.text());
    assert_eq!(
        problem_type(&r.body),
        problem_type(&refusal.body),
        "{target}"
    );
    let names = |h: &http::HeaderMap| {
        let mut v: Vec<String> = h
            .keys()
            .map(|k| k.as_str().to_string())
            .filter(|k| k != "content-length" && k != "date")
            .collect();
        v.sort();
        v
    };
    assert_eq!(names(&r.headers), names(&refusal.headers), "{target}");
}

/// Every row on one limiter, each on its own route and policy.
async fn every_answer(limiter: Limiter) {
    let layer = RateLimitLayer::builder(limiter.clone())
        .rule(Rule::new("/limited").policy(fixed("limited", 2)))
        .rule(Rule::new("/denied").policy(fixed("denied", 100)))
        .rule(Rule::new("/banned").policy(fixed("banned", 100)))
        .rule(
            Rule::new("/login")
                .policy(fixed("login", 2))
                .count(Count::statuses([401]).unwrap()),
        )
        .rule(
            Rule::new("/one-at-a-time").policy(
                Policy::new(
                    "one-at-a-time",
                    Algorithm::Concurrency {
                        limit: 1,
                        lease_ms: 60_000,
                    },
                )
                .unwrap(),
            ),
        )
        .rule(Rule::new("/health"))
        .build();
    let decider = Arc::clone(layer.decider());
    let ok = || async { "ok" };
    let app = Router::new()
        .route("/limited", route(ok))
        .route("/denied", route(ok))
        .route("/banned", route(ok))
        .layer(layer.clone());
    let addr = support::serve(app).await;

    // Unlimited: no rule, or a rule without policies.
    for target in ["/nowhere", "/health/x"] {
        let a = admitted(decider.decide_head(head(target, &[])).await);
        assert_eq!(a.outcome(), Outcome::Unlimited);
        assert!(!a.is_limited() && a.identity().is_none());
        assert!(a.finish(200).await.headers().is_empty());
    }

    // A used-up limit: 429 with the RateLimit fields and Retry-After.
    for left in [1, 0] {
        let a = admitted(decider.decide_head(head("/limited", &[])).await);
        assert_eq!(a.outcome(), Outcome::Allowed);
        assert_eq!(a.identity().map(|i| i.as_str()), Some(ME));
        let done = a.finish(200).await;
        let h: http::HeaderMap = done.headers().into_iter().collect();
        assert_eq!(remaining(&h, "limited"), Some(left));
    }
    let r = refused(decider.decide_head(head("/limited", &[])).await);
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(r.outcome, Outcome::Denied);
    assert_eq!(remaining(&r.headers, "limited"), Some(0));
    let wait: u64 = header(&r.headers, "retry-after").unwrap().parse().unwrap();
    assert!((1..=3600).contains(&wait), "{wait}");
    assert_eq!(
        header(&r.headers, "content-type"),
        Some("application/problem+json")
    );
    assert!(
        std::str::from_utf8(&r.body)
            .unwrap()
            .contains("\"limited\"")
    );
    layer_agrees(addr, "/limited", &r).await;

    // A path is normalized before the rule is picked; one with no normal form is a 400.
    let r = refused(decider.decide_head(head("/x/..//limited", &[])).await);
    assert_eq!(r.outcome, Outcome::Denied);
    let r = refused(decider.decide_head(head("/a%2Fb", &[])).await);
    assert_eq!(
        (r.status, r.outcome),
        (StatusCode::BAD_REQUEST, Outcome::BadPath)
    );

    // A deny-listed client: 403 without Retry-After (waiting will not help).
    let control = limiter.control();
    let me = ListEntry::parse(ME).unwrap();
    control.list_add(ListKind::Deny, &me, None).await.unwrap();
    let r = refused(decider.decide_head(head("/denied", &[])).await);
    assert_eq!(r.status, StatusCode::FORBIDDEN);
    assert_eq!(r.outcome, Outcome::ControlRefused);
    assert_eq!(header(&r.headers, "retry-after"), None);
    assert_eq!(header(&r.headers, "cache-control"), Some("no-store"));
    layer_agrees(addr, "/denied", &r).await;
    control.list_remove(ListKind::Deny, &me).await.unwrap();
    admitted(decider.decide_head(head("/denied", &[])).await);

    // A banned client: 429 with the ban's time left, naming the ban.
    control
        .ban(ME, Duration::from_secs(120), Some(vec!["banned".into()]))
        .await
        .unwrap();
    let r = refused(decider.decide_head(head("/banned", &[])).await);
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(r.outcome, Outcome::ControlRefused);
    let wait: u64 = header(&r.headers, "retry-after").unwrap().parse().unwrap();
    assert!((119..=120).contains(&wait), "{wait}");
    assert!(
        std::str::from_utf8(&r.body)
            .unwrap()
            .contains("banned from rate limit \\\"banned\\\"")
    );
    layer_agrees(addr, "/banned", &r).await;
    // Another policy is not banned.
    admitted(decider.decide_head(head("/denied", &[])).await);

    // Count by outcome: an uncounted status gives the reservation back, and the headers to
    // send describe the state after the refund.
    for _ in 0..5 {
        let a = admitted(decider.decide_head(head("/login", &[])).await);
        assert!(a.counts_by_outcome());
        let h: http::HeaderMap = a.finish(200).await.headers().into_iter().collect();
        assert_eq!(remaining(&h, "login"), Some(2));
    }
    let a = admitted(decider.decide_head(head("/login", &[])).await);
    let h: http::HeaderMap = a.finish(401).await.headers().into_iter().collect();
    assert_eq!(remaining(&h, "login"), Some(1));
    // Dropped unfinished (client gone): the charge stays.
    drop(admitted(decider.decide_head(head("/login", &[])).await));
    let r = refused(decider.decide_head(head("/login", &[])).await);
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS);
    let s = decider.stats().snapshot();
    assert_eq!((s.refunded, s.charged), (5, 1));

    // A concurrency lease is held past `finish` until the response has been sent.
    let first = admitted(decider.decide_head(head("/one-at-a-time", &[])).await);
    assert_eq!(first.leases(), 1);
    let finished = first.finish(200).await;
    refused(decider.decide_head(head("/one-at-a-time", &[])).await);
    assert_eq!(finished.release().await, 1);
    let again = admitted(decider.decide_head(head("/one-at-a-time", &[])).await);
    assert_eq!(again.finish(200).await.release().await, 1);
}

#[tokio::test]
async fn every_answer_on_the_embedded_store() {
    every_answer(Limiter::memory()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_answer_on_redis() {
    let redis = RedisServer::redis();
    let options = StoreOptions {
        timeout: Duration::from_millis(500),
        ..Default::default()
    };
    let limiter = Limiter::connect(&redis.url(), options).await.unwrap();
    every_answer(limiter).await;
}
