//! Rules that count by outcome, over real HTTP on 127.0.0.1:0: a login route that counts only
//! 401s, a route that counts only successes, the reservation that keeps concurrent and
//! abandoned requests counted, and a refund the store fails after the response.

use crate::support;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::routing::get as route;
use http::StatusCode;
use sluice::{Algorithm, FailureMode, Limiter, Policy};
use sluice_http::{Count, RateLimitLayer, Rule};
use support::get;

/// `limit` per sliding minute. A sliding log rather than a fixed window: a fixed window is
/// aligned to the epoch, so a test that happened to straddle a minute boundary would see the
/// count reset mid-test and admit twice the limit.
fn per_minute(name: &str, limit: u64) -> Policy {
    Policy::new(
        name,
        Algorithm::SlidingWindowLog {
            limit,
            window_ms: 60_000,
        },
    )
    .unwrap()
}

/// 200 for the right password, 401 for any other.
async fn login(uri: http::Uri) -> StatusCode {
    if uri.query() == Some("password=right") {
        StatusCode::OK
    } else {
        StatusCode::UNAUTHORIZED
    }
}

fn app(rule: Rule) -> (Router, RateLimitLayer) {
    let layer = RateLimitLayer::builder(Limiter::memory())
        .rule(rule)
        .build();
    let router = Router::new()
        .route("/login", route(login))
        .route("/ok", route(|| async { "ok" }))
        .route(
            "/broken",
            route(|| async { StatusCode::INTERNAL_SERVER_ERROR }),
        )
        .layer(layer.clone());
    (router, layer)
}

#[tokio::test]
async fn a_login_route_counting_401s_admits_any_number_of_successes_and_stops_after_3_failures() {
    let rule = Rule::new("/login")
        .policy(per_minute("login", 3))
        .count(Count::statuses([401]).unwrap());
    let (router, layer) = app(rule);
    let addr = support::serve(router).await;

    for _ in 0..50 {
        let r = get(addr, "/login?password=right", &[]).await;
        assert_eq!(r.status, StatusCode::OK);
        assert!(
            r.header("ratelimit").unwrap().contains(";r=3;"),
            "{:?}",
            r.header("ratelimit")
        );
    }
    for left in [2, 1, 0] {
        let r = get(addr, "/login?password=wrong", &[]).await;
        assert_eq!(r.status, StatusCode::UNAUTHORIZED);
        // The headers describe the state after this response's charge.
        let header = r.header("ratelimit").unwrap();
        assert!(header.contains(&format!(";r={left};")), "{header}");
    }
    // The fourth request is refused before the upstream sees it, whatever it would answer.
    for password in ["right", "wrong"] {
        let r = get(addr, &format!("/login?password={password}"), &[]).await;
        assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS);
        let retry: u64 = r.header("retry-after").unwrap().parse().unwrap();
        assert!((1..=60).contains(&retry), "{retry}");
    }
    let stats = layer.stats().snapshot();
    assert_eq!((stats.allowed, stats.denied, stats.charged), (53, 2, 3));
}

#[tokio::test]
async fn a_route_counting_successes_lets_errors_through_and_stops_after_3_successes() {
    let rule = Rule::new("/")
        .policy(per_minute("successes", 3))
        .count(Count::Successes);
    let (router, _layer) = app(rule);
    let addr = support::serve(router).await;

    for _ in 0..20 {
        let r = get(addr, "/broken", &[]).await;
        assert_eq!(r.status, StatusCode::INTERNAL_SERVER_ERROR);
    }
    for _ in 0..3 {
        assert_eq!(get(addr, "/ok", &[]).await.status, StatusCode::OK);
    }
    assert_eq!(
        get(addr, "/ok", &[]).await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
    assert_eq!(
        get(addr, "/broken", &[]).await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
}

#[tokio::test]
async fn a_cost_larger_than_what_is_left_is_refused_before_forwarding() {
    let rule = Rule::new("/")
        .policy(per_minute("failures", 5))
        .cost(2)
        .count(Count::Failures);
    let (router, _layer) = app(rule);
    let addr = support::serve(router).await;
    // 2 + 2 charged; 1 left is less than the cost of 2.
    for _ in 0..2 {
        assert_eq!(
            get(addr, "/broken", &[]).await.status,
            StatusCode::INTERNAL_SERVER_ERROR
        );
    }
    assert_eq!(
        get(addr, "/ok", &[]).await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
}

/// A route counting 401s whose handler stops the Redis server and then answers 200, so the
/// check (the reservation) reaches the store and the refund after the response does not.
async fn refund_fails(mode: FailureMode) -> (StatusCode, sluice_http::StatsSnapshot) {
    let server = Arc::new(Mutex::new(sluice_testkit::servers::RedisServer::redis()));
    let url = server.lock().unwrap().url();
    let store = sluice_redis::RedisStore::builder(url)
        .namespace("http-count-outcome")
        .connect()
        .await
        .unwrap();
    let limiter = Limiter::builder(Arc::new(store))
        .timeout(Duration::from_millis(100))
        .build();
    let mut policy = per_minute("login", 3);
    policy.failure_mode = mode;
    let layer = RateLimitLayer::builder(limiter)
        .rule(
            Rule::new("/")
                .policy(policy)
                .count(Count::statuses([401]).unwrap()),
        )
        .build();
    let stop = Arc::clone(&server);
    let router = Router::new()
        .route(
            "/stop",
            route(move || {
                let stop = Arc::clone(&stop);
                async move {
                    stop.lock().unwrap().stop();
                    StatusCode::OK
                }
            }),
        )
        .layer(layer.clone());
    let addr = support::serve(router).await;
    let status = get(addr, "/stop", &[]).await.status;
    (status, layer.stats().snapshot())
}

#[tokio::test]
async fn a_failed_refund_delivers_the_response_and_leaves_the_request_counted() {
    for mode in [FailureMode::Open, FailureMode::Closed] {
        let (status, stats) = refund_fails(mode).await;
        assert_eq!(status, StatusCode::OK, "{mode:?}");
        assert_eq!(
            (
                stats.allowed,
                stats.charged,
                stats.refunded,
                stats.refund_failed
            ),
            (1, 0, 0, 1),
            "{mode:?}"
        );
    }
}

/// Sends a GET on a fresh connection and closes it after `after`, before any answer.
async fn abandon(addr: std::net::SocketAddr, path: &str, after: Duration) {
    use tokio::io::AsyncWriteExt;
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    s.write_all(format!("GET {path} HTTP/1.1\r\nHost: t\r\n\r\n").as_bytes())
        .await
        .unwrap();
    tokio::time::sleep(after).await;
    drop(s);
}

/// An app whose handlers count how many requests reached them: `/login` is a password check
/// taking 100 ms (401 unless `password=right`), `/slow` acts on entry and answers after 300 ms.
fn counting_app(rule: Rule) -> (Router, Arc<AtomicU64>) {
    let reached = Arc::new(AtomicU64::new(0));
    let layer = RateLimitLayer::builder(Limiter::memory())
        .rule(rule)
        .build();
    let (a, b) = (Arc::clone(&reached), Arc::clone(&reached));
    let router = Router::new()
        .route(
            "/login",
            route(move |uri: http::Uri| {
                let reached = Arc::clone(&a);
                async move {
                    reached.fetch_add(1, Ordering::SeqCst);
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    login(uri).await
                }
            }),
        )
        .route(
            "/slow",
            route(move || {
                let reached = Arc::clone(&b);
                async move {
                    reached.fetch_add(1, Ordering::SeqCst);
                    tokio::time::sleep(Duration::from_millis(300)).await;
                    StatusCode::OK
                }
            }),
        )
        .layer(layer);
    (router, reached)
}

#[tokio::test]
async fn concurrent_wrong_passwords_cannot_pass_a_limit_of_5_together() {
    let rule = Rule::new("/login")
        .policy(per_minute("login", 5))
        .count(Count::statuses([401]).unwrap());
    let (router, reached) = counting_app(rule);
    let addr = support::serve(router).await;
    let replies =
        futures::future::join_all((0..250).map(|_| get(addr, "/login?password=wrong", &[]))).await;
    let unauthorized = replies
        .iter()
        .filter(|r| r.status == StatusCode::UNAUTHORIZED)
        .count();
    let limited = replies
        .iter()
        .filter(|r| r.status == StatusCode::TOO_MANY_REQUESTS)
        .count();
    assert_eq!((unauthorized, limited), (5, 245));
    assert_eq!(reached.load(Ordering::SeqCst), 5);
}

#[tokio::test]
async fn right_passwords_in_flight_hold_their_unit_and_give_it_back() {
    let rule = Rule::new("/login")
        .policy(per_minute("login", 5))
        .count(Count::statuses([401]).unwrap());
    let (router, _reached) = counting_app(rule);
    let addr = support::serve(router).await;
    // Sequential right passwords never use the limit up: each unit comes back.
    for _ in 0..10 {
        let r = get(addr, "/login?password=right", &[]).await;
        assert_eq!(r.status, StatusCode::OK);
        assert!(r.header("ratelimit").unwrap().contains(";r=5;"));
    }
}

#[tokio::test]
async fn requests_abandoned_before_their_status_stay_counted() {
    let rule = Rule::new("/slow")
        .policy(per_minute("successes", 3))
        .count(Count::Successes);
    let (router, reached) = counting_app(rule);
    let addr = support::serve(router).await;
    for _ in 0..20 {
        // The client gives up after 100 ms; the handler answers after 300 ms.
        abandon(addr, "/slow", Duration::from_millis(100)).await;
    }
    assert_eq!(reached.load(Ordering::SeqCst), 3);
    assert_eq!(
        get(addr, "/slow", &[]).await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
}
