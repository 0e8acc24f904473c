//! The layer honours the limiter's control plane, over real HTTP on 127.0.0.1:0: an
//! override changes the limit, an allow entry bypasses it, a deny entry (a network) gets
//! 403, a ban gets 429 with the time left in `Retry-After`.

mod support;

use std::time::Duration;

use axum::Router;
use axum::routing::get as route;
use http::StatusCode;
use sluice::{Algorithm, Limiter, ListEntry, ListKind, OverrideTarget, Policy};
use sluice_http::{RateLimitLayer, Rule};
use support::{get, serve};

fn fixed(limit: u64) -> Algorithm {
    Algorithm::FixedWindow {
        limit,
        window_ms: 3_600_000,
    }
}

async fn statuses(addr: std::net::SocketAddr, n: usize) -> Vec<u16> {
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        out.push(get(addr, "/ok", &[]).await.status.as_u16());
    }
    out
}

#[tokio::test]
async fn overrides_lists_and_bans_reach_the_layer() {
    let limiter = Limiter::memory();
    let control = limiter.control().clone();
    let layer = RateLimitLayer::builder(limiter)
        .rule(Rule::new("/").policy(Policy::new("site", fixed(2)).unwrap()))
        .build();
    let addr = serve(
        Router::new()
            .route("/ok", route(|| async { "ok" }))
            .layer(layer),
    )
    .await;
    // The client is 127.0.0.1: its identity is ip:127.0.0.1.
    let me = "ip:127.0.0.1";

    // Allowed: bypasses the limit of 2.
    let allow = ListEntry::parse(me).unwrap();
    control
        .list_add(ListKind::Allow, &allow, None)
        .await
        .unwrap();
    assert_eq!(statuses(addr, 5).await, vec![200; 5]);
    control.list_remove(ListKind::Allow, &allow).await.unwrap();
    assert_eq!(statuses(addr, 3).await, vec![200, 200, 429]);

    // An override to 4 keeps the 2 used: 2 more.
    control
        .set_override("site", me, OverrideTarget::Params(fixed(4)), None)
        .await
        .unwrap();
    assert_eq!(statuses(addr, 3).await, vec![200, 200, 429]);

    // Denied by network: 403, problem+json, no Retry-After.
    let net = ListEntry::parse("127.0.0.0/8").unwrap();
    control.list_add(ListKind::Deny, &net, None).await.unwrap();
    let r = get(addr, "/ok", &[]).await;
    assert_eq!(r.status, StatusCode::FORBIDDEN);
    assert_eq!(r.header("content-type"), Some("application/problem+json"));
    assert!(r.text().contains("deny list"), "{}", r.text());
    assert_eq!(r.header("retry-after"), None);
    control.list_remove(ListKind::Deny, &net).await.unwrap();

    // Banned: 429 with the ban's time left.
    control.remove_override("site", me).await.unwrap();
    control
        .ban(me, Duration::from_secs(90), None)
        .await
        .unwrap();
    let r = get(addr, "/ok", &[]).await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(r.header("retry-after"), Some("90"));
    assert!(r.text().contains("banned"), "{}", r.text());
}
