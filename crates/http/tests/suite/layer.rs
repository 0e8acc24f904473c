//! The layer over real HTTP on 127.0.0.1:0, with real stores.

use crate::support;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::routing::get as route;
use axum::{Extension, Router};
use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::BodyExt;
use sluice::{Algorithm, FailureMode, LeakyMode, Limiter, Policy, Rate};
use sluice_http::{HeaderOptions, RateLimitIdentity, RateLimitLayer, Rule, TrustedProxies};
use support::{get, open, serve, until_ok};
use tower::{Layer, ServiceExt};

fn fixed(name: &str, limit: u64) -> Policy {
    Policy::new(
        name,
        Algorithm::FixedWindow {
            limit,
            window_ms: 60_000,
        },
    )
    .unwrap()
}

fn concurrency(limit: u64) -> Policy {
    Policy::new(
        "inflight",
        Algorithm::Concurrency {
            limit,
            lease_ms: 60_000,
        },
    )
    .unwrap()
}

async fn whoami(Extension(RateLimitIdentity(id)): Extension<RateLimitIdentity>) -> String {
    id.to_string()
}

async fn panics() -> &'static str {
    panic!("handler bug (expected by this test)")
}

fn routes() -> Router {
    Router::new()
        .route("/whoami", route(whoami))
        .route("/ok", route(|| async { "ok" }))
}

fn app(layer: RateLimitLayer) -> Router {
    routes().layer(layer)
}

#[tokio::test]
async fn several_policies_share_one_header_list() {
    let burst = Policy::new(
        "burst",
        Algorithm::TokenBucket {
            capacity: 10,
            rate: Rate::per_second(5),
        },
    )
    .unwrap();
    let layer = RateLimitLayer::builder(Limiter::memory())
        .rule(Rule::new("/").policy(burst).policy(fixed("minute", 100)))
        .headers(HeaderOptions::all())
        .build();
    let addr = serve(app(layer)).await;
    for _ in 0..2 {
        assert_eq!(get(addr, "/ok", &[]).await.status, StatusCode::OK);
    }
    let r = get(addr, "/ok", &[]).await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(
        r.header("ratelimit-policy"),
        Some("\"burst\";q=10;w=2, \"minute\";q=100;w=60")
    );
    let rl = r.header("ratelimit").unwrap();
    let (burst_item, minute_item) = rl.split_once(", ").unwrap();
    assert_eq!(burst_item, "\"burst\";r=7;t=1");
    // The fixed window resets at the next minute boundary: 1..=60 s away.
    let t: u64 = minute_item
        .strip_prefix("\"minute\";r=97;t=")
        .unwrap()
        .parse()
        .unwrap();
    assert!((1..=60).contains(&t), "{rl}");
    // Legacy headers describe the policy with the least remaining.
    assert_eq!(r.header("x-ratelimit-limit"), Some("10"));
    assert_eq!(r.header("x-ratelimit-remaining"), Some("7"));
    assert_eq!(r.header("x-ratelimit-reset"), Some("1"));
    assert_eq!(r.header("retry-after"), None);
}

#[tokio::test]
async fn sub_second_waits_round_up_to_one_second() {
    // One token, refilled every 100 ms: the second request must wait about 100 ms.
    let p = Policy::new(
        "tight",
        Algorithm::TokenBucket {
            capacity: 1,
            rate: Rate::per_second(10),
        },
    )
    .unwrap();
    let addr = serve(app(RateLimitLayer::builder(Limiter::memory())
        .policy(p)
        .build()))
    .await;
    assert_eq!(get(addr, "/ok", &[]).await.status, StatusCode::OK);
    let r = get(addr, "/ok", &[]).await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(r.header("retry-after"), Some("1"));
    assert_eq!(r.header("cache-control"), Some("no-store"));
    assert_eq!(r.header("content-type"), Some("application/problem+json"));
    assert_eq!(r.header("ratelimit-policy"), Some("\"tight\";q=1;w=1"));
    let body: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
    assert_eq!(body["status"], 429);
    assert_eq!(body["policy"], "tight");
    let ms = body["retry_after_ms"].as_u64().unwrap();
    assert!((1..=100).contains(&ms), "{body}");
}

#[tokio::test]
async fn clients_not_behind_a_trusted_proxy_cannot_choose_their_identity() {
    let layer = RateLimitLayer::builder(Limiter::memory())
        .policy(fixed("p", 2))
        .build();
    let addr = serve(app(layer)).await;
    let mut statuses = Vec::new();
    for i in 0..4 {
        let spoof = format!("203.0.113.{i}");
        let r = get(
            addr,
            "/whoami",
            &[
                ("x-forwarded-for", &spoof),
                ("x-real-ip", &spoof),
                ("forwarded", &format!("for={spoof}")),
            ],
        )
        .await;
        if r.status == StatusCode::OK {
            assert_eq!(r.text(), "ip:127.0.0.1");
        }
        statuses.push(r.status.as_u16());
    }
    assert_eq!(statuses, [200, 200, 429, 429]);
}

#[tokio::test]
async fn one_trusted_proxy() {
    let layer = RateLimitLayer::builder(Limiter::memory())
        .policy(fixed("p", 2))
        .trusted_proxies(TrustedProxies::cidrs(&["127.0.0.1/32"]).unwrap())
        .build();
    let addr = serve(app(layer)).await;
    let who =
        |xff: &'static str| async move { get(addr, "/whoami", &[("x-forwarded-for", xff)]).await };
    assert_eq!(who("203.0.113.7").await.text(), "ip:203.0.113.7");
    // What the client wrote left of our proxy's entry is ignored.
    assert_eq!(who("6.6.6.6, 203.0.113.7").await.text(), "ip:203.0.113.7");
    assert_eq!(
        who("203.0.113.7").await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
    // Another client behind the same proxy has its own limit.
    assert_eq!(who("203.0.113.8").await.text(), "ip:203.0.113.8");
}

#[tokio::test]
async fn two_trusted_proxies() {
    let layer = RateLimitLayer::builder(Limiter::memory())
        .policy(fixed("p", 100))
        .trusted_proxies(TrustedProxies::cidrs(&["127.0.0.1", "10.0.0.0/8"]).unwrap())
        .build();
    let addr = serve(app(layer)).await;
    let r = get(
        addr,
        "/whoami",
        &[("x-forwarded-for", "6.6.6.6, 203.0.113.9, 10.0.0.5")],
    )
    .await;
    assert_eq!(r.text(), "ip:203.0.113.9");
    let r = get(
        addr,
        "/whoami",
        &[(
            "forwarded",
            "for=6.6.6.6, for=203.0.113.9;proto=https, for=\"10.0.0.5:81\"",
        )],
    )
    .await;
    assert_eq!(r.text(), "ip:203.0.113.9");

    // The same chain with a hop count of 2 (our proxy and the one at 10.0.0.5).
    let layer = RateLimitLayer::builder(Limiter::memory())
        .policy(fixed("p", 100))
        .trusted_proxies(TrustedProxies::Hops(2))
        .build();
    let addr = serve(app(layer)).await;
    let r = get(
        addr,
        "/whoami",
        &[("x-forwarded-for", "6.6.6.6, 203.0.113.9, 10.0.0.5")],
    )
    .await;
    assert_eq!(r.text(), "ip:203.0.113.9");
}

#[tokio::test]
async fn ipv6_clients_are_grouped_by_prefix() {
    let layer = RateLimitLayer::builder(Limiter::memory())
        .policy(fixed("p", 2))
        .trusted_proxies(TrustedProxies::cidrs(&["127.0.0.1/32"]).unwrap())
        .build();
    let addr = serve(app(layer)).await;
    let who =
        |xff: &'static str| async move { get(addr, "/whoami", &[("x-forwarded-for", xff)]).await };
    assert_eq!(who("2001:db8:1:2::a").await.text(), "ip6:2001:db8:1:2::/64");
    assert_eq!(who("2001:db8:1:2:ffff::b").await.status, StatusCode::OK);
    // A third address of the same /64 shares its limit.
    assert_eq!(
        who("2001:db8:1:2::c").await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
    assert_eq!(who("2001:db8:1:3::a").await.text(), "ip6:2001:db8:1:3::/64");
}

#[tokio::test]
async fn lease_is_released_when_the_handler_panics() {
    let layer = RateLimitLayer::builder(Limiter::memory())
        .policy(concurrency(1))
        .build();
    let addr = serve(routes().route("/panic", route(panics)).layer(layer)).await;
    // The panic kills the connection; the client sees no response.
    assert!(support::try_get(addr, "/panic", &[]).await.is_err());
    let seen = until_ok(addr, "/ok", &[], 50).await;
    assert_eq!(
        seen.last(),
        Some(&200),
        "capacity never came back: {seen:?}"
    );
}

#[tokio::test]
async fn lease_is_held_while_streaming_and_released_when_the_client_disconnects() {
    let layer = RateLimitLayer::builder(Limiter::memory())
        .policy(concurrency(1))
        .build();
    let stream = || async {
        let first = futures::stream::once(async {
            Ok::<_, std::io::Error>(Bytes::from_static(b"first chunk"))
        });
        axum::body::Body::from_stream(futures::StreamExt::chain(first, futures::stream::pending()))
    };
    let addr = serve(routes().route("/stream", route(stream)).layer(layer)).await;

    let mut open = open(addr, "/stream", &[]).await.unwrap();
    assert_eq!(open.status, StatusCode::OK);
    let frame = tokio::time::timeout(Duration::from_secs(5), open.body.frame())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(frame.into_data().unwrap(), "first chunk");
    // While the body is streaming the lease is held.
    assert_eq!(
        get(addr, "/ok", &[]).await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
    open.disconnect();
    let seen = until_ok(addr, "/ok", &[], 50).await;
    assert_eq!(
        seen.last(),
        Some(&200),
        "capacity never came back: {seen:?}"
    );
}

#[tokio::test]
async fn lease_is_released_when_the_body_completes() {
    let layer = RateLimitLayer::builder(Limiter::memory())
        .policy(concurrency(1))
        .build();
    let addr = serve(app(layer)).await;
    for _ in 0..5 {
        let seen = until_ok(addr, "/ok", &[], 50).await;
        assert_eq!(seen.last(), Some(&200), "{seen:?}");
    }
}

#[tokio::test]
async fn lease_is_released_when_the_request_future_is_dropped() {
    let limiter = Limiter::memory();
    let layer = RateLimitLayer::builder(limiter)
        .policy(concurrency(1))
        .build();
    let svc = layer.layer(
        Router::new()
            .route("/hang", route(std::future::pending::<&'static str>))
            .route("/ok", route(|| async { "ok" })),
    );
    let req = |path: &str| Request::get(path).body(axum::body::Body::empty()).unwrap();
    // A client that gives up: its request future is dropped while the handler waits.
    let gave_up = tokio::time::timeout(
        Duration::from_millis(100),
        svc.clone().oneshot(req("/hang")),
    )
    .await;
    assert!(gave_up.is_err());
    let mut status = None;
    for _ in 0..50 {
        let res = svc.clone().oneshot(req("/ok")).await.unwrap();
        status = Some(res.status());
        if res.status() == StatusCode::OK {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(status, Some(StatusCode::OK));
}

#[tokio::test]
async fn shaping_spaces_requests_at_the_bucket_rate() {
    let p = Policy::new(
        "shape",
        Algorithm::LeakyBucket {
            capacity: 5,
            rate: Rate::per_second(10),
            mode: LeakyMode::Shaping,
        },
    )
    .unwrap();
    let addr = serve(app(RateLimitLayer::builder(Limiter::memory())
        .policy(p)
        .build()))
    .await;
    let start = Instant::now();
    let tasks: Vec<_> = (0..4)
        .map(|_| {
            tokio::spawn(async move {
                let r = get(addr, "/ok", &[]).await;
                (r.status, start.elapsed())
            })
        })
        .collect();
    let mut times = Vec::new();
    for t in tasks {
        let (status, elapsed) = t.await.unwrap();
        assert_eq!(status, StatusCode::OK);
        times.push(elapsed);
    }
    times.sort();
    // Request k leaves no earlier than k x 100 ms after the first (a few ms of slack for the
    // spread of arrival times, which the bucket counts as drained already).
    assert!(times[0] < Duration::from_millis(100), "{times:?}");
    for (k, t) in times.iter().enumerate() {
        assert!(
            *t >= Duration::from_millis(100 * k as u64).saturating_sub(Duration::from_millis(30)),
            "{times:?}"
        );
    }
    assert!(times[3] < Duration::from_secs(2), "{times:?}");
}

#[tokio::test]
async fn rules_pick_policies_by_prefix_and_exempt_paths() {
    let layer = RateLimitLayer::builder(Limiter::memory())
        .policy(fixed("all", 1))
        .rule(Rule::new("/health"))
        .build();
    let addr = serve(
        routes()
            .route("/health", route(|| async { "up" }))
            .layer(layer),
    )
    .await;
    for _ in 0..3 {
        let r = get(addr, "/health", &[]).await;
        assert_eq!(r.status, StatusCode::OK);
        assert_eq!(r.header("ratelimit"), None);
    }
    assert_eq!(get(addr, "/ok", &[]).await.status, StatusCode::OK);
    assert_eq!(
        get(addr, "/ok", &[]).await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
}

/// A Limiter on a real Redis that is then stopped.
async fn limiter_on_stopped_redis() -> (Limiter, sluice_testkit::servers::RedisServer) {
    let mut server = sluice_testkit::servers::RedisServer::redis();
    let store = sluice_redis::RedisStore::builder(server.url())
        .namespace("http-failmode")
        .connect()
        .await
        .unwrap();
    let limiter = Limiter::builder(Arc::new(store))
        .timeout(Duration::from_millis(50))
        .build();
    server.stop();
    (limiter, server)
}

#[tokio::test]
async fn fail_open_passes_without_limiter_headers_and_is_counted() {
    let (limiter, _server) = limiter_on_stopped_redis().await;
    let layer = RateLimitLayer::builder(limiter)
        .policy(fixed("p", 1))
        .headers(HeaderOptions::all())
        .build();
    let stats = layer.stats();
    let addr = serve(app(layer)).await;
    for _ in 0..3 {
        let start = Instant::now();
        let r = get(addr, "/ok", &[]).await;
        assert!(
            start.elapsed() < Duration::from_secs(1),
            "{:?}",
            start.elapsed()
        );
        assert_eq!(r.status, StatusCode::OK);
        assert_eq!(r.text(), "ok");
        for h in [
            "ratelimit",
            "ratelimit-policy",
            "x-ratelimit-limit",
            "retry-after",
        ] {
            assert_eq!(r.header(h), None, "{h}");
        }
    }
    assert_eq!(stats.snapshot().failed_open, 3);
    assert_eq!(stats.snapshot().allowed, 0);
}

#[tokio::test]
async fn fail_closed_answers_the_configured_status() {
    let (limiter, _server) = limiter_on_stopped_redis().await;
    let mut p = fixed("strict", 100);
    p.failure_mode = FailureMode::Closed;
    for (configured, expected) in [
        (None, StatusCode::SERVICE_UNAVAILABLE),
        (
            Some(StatusCode::TOO_MANY_REQUESTS),
            StatusCode::TOO_MANY_REQUESTS,
        ),
    ] {
        let mut b = RateLimitLayer::builder(limiter.clone()).policy(p.clone());
        if let Some(s) = configured {
            b = b.fail_closed_status(s);
        }
        let layer = b.build();
        let stats = layer.stats();
        let addr = serve(app(layer)).await;
        let start = Instant::now();
        let r = get(addr, "/ok", &[]).await;
        assert!(
            start.elapsed() < Duration::from_secs(1),
            "{:?}",
            start.elapsed()
        );
        assert_eq!(r.status, expected);
        assert_eq!(r.header("retry-after"), Some("1"));
        assert_eq!(r.header("cache-control"), Some("no-store"));
        assert_eq!(r.header("ratelimit"), None);
        let body: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
        assert_eq!(body["policy"], "strict");
        assert_eq!(body["status"], expected.as_u16());
        assert_eq!(stats.snapshot().failed_closed, 1);
    }
}

#[tokio::test]
async fn shadow_policies_never_deny() {
    let mut p = fixed("trial", 1);
    p.shadow = true;
    let addr = serve(app(RateLimitLayer::builder(Limiter::memory())
        .policy(p)
        .build()))
    .await;
    for _ in 0..3 {
        let r = get(addr, "/ok", &[]).await;
        assert_eq!(r.status, StatusCode::OK);
        assert_eq!(r.header("ratelimit"), None);
    }
}

#[tokio::test]
async fn works_with_a_plain_hyper_service() {
    use hyper_util::rt::{TokioExecutor, TokioIo};
    use hyper_util::service::TowerToHyperService;

    let layer = RateLimitLayer::builder(Limiter::memory())
        .policy(fixed("p", 1))
        .build();
    let hello = tower::service_fn(|req: Request<hyper::body::Incoming>| async move {
        let who = req
            .extensions()
            .get::<RateLimitIdentity>()
            .map(|i| i.0.to_string())
            .unwrap_or_default();
        Ok::<_, std::convert::Infallible>(http::Response::new(http_body_util::Full::new(
            Bytes::from(who),
        )))
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        for _ in 0..2 {
            let (stream, peer) = listener.accept().await.unwrap();
            // Plain hyper: hand the socket peer to the layer as a `SocketAddr` extension.
            let svc = tower::ServiceBuilder::new()
                .map_request(move |mut req: Request<hyper::body::Incoming>| {
                    req.extensions_mut().insert::<SocketAddr>(peer);
                    req
                })
                .layer(layer.clone())
                .service(hello);
            tokio::spawn(async move {
                let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(stream), TowerToHyperService::new(svc))
                    .await;
            });
        }
    });
    let r = get(addr, "/", &[]).await;
    assert_eq!((r.status, r.text()), (StatusCode::OK, "ip:127.0.0.1"));
    assert!(r.header("ratelimit").unwrap().starts_with("\"p\";r=0;t="));
    assert_eq!(
        get(addr, "/", &[]).await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
}
