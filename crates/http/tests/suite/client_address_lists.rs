//! The control plane's network lists meet the layer's identities by the client address an
//! identity carries, never by its text, over real HTTP on 127.0.0.1:0 behind a trusted proxy
//! (the socket peer 127.0.0.1, which names the client in `X-Forwarded-For`):
//!
//! - a deny-listed network refuses the IPv4 and the IPv6 clients inside it (403), from the
//!   configuration file and added at runtime, and no client outside it;
//! - an identity whose text merely spells a listed address (here an application's custom
//!   source that takes a header the client writes, `x-client: ip:203.0.113.7`) is not that
//!   client: a deny-listed network does not refuse it and an allow-listed one does not let it
//!   past its limit. Decided by text, both would (the client picks its own exemption).

use crate::support;

use std::time::Duration;

use axum::routing::get as route;
use axum::{Extension, Router};
use http::StatusCode;
use sluice::{Algorithm, ControlConfig, Identity, Limiter, ListEntry, ListKind, Policy};
use sluice_http::{IdentitySource, RateLimitIdentity, RateLimitLayer, TrustedProxies};
use support::{get, serve};

fn fixed(limit: u64) -> Policy {
    Policy::new(
        "p",
        Algorithm::FixedWindow {
            limit,
            window_ms: 3_600_000,
        },
    )
    .unwrap()
}

async fn whoami(Extension(RateLimitIdentity(id)): Extension<RateLimitIdentity>) -> String {
    id.to_string()
}

fn entries(texts: &[&str]) -> Vec<ListEntry> {
    texts.iter().map(|t| ListEntry::parse(t).unwrap()).collect()
}

/// A layer (limit 2 per client) over `limiter`: the identity is the `x-client` header's
/// value as is when present (an application's own source), else the client address from
/// the trusted proxy's `X-Forwarded-For`.
async fn serve_layer(limiter: Limiter) -> std::net::SocketAddr {
    let layer = RateLimitLayer::builder(limiter)
        .policy(fixed(2))
        .identity(IdentitySource::custom(|parts| {
            let v = parts.headers.get("x-client")?.to_str().ok()?;
            Some(Identity::new(v))
        }))
        .trusted_proxies(TrustedProxies::cidrs(&["127.0.0.1/32"]).unwrap())
        .build();
    serve(Router::new().route("/whoami", route(whoami)).layer(layer)).await
}

/// The statuses of `n` requests from the client at `client`, with extra `headers`.
async fn statuses(
    addr: std::net::SocketAddr,
    client: &str,
    headers: &[(&str, &str)],
    n: usize,
) -> Vec<u16> {
    let mut h = vec![("x-forwarded-for", client)];
    h.extend_from_slice(headers);
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        out.push(get(addr, "/whoami", &h).await.status.as_u16());
    }
    out
}

#[tokio::test]
async fn a_deny_listed_network_refuses_ipv4_and_ipv6_clients_inside_it() {
    let limiter = Limiter::memory();
    limiter.control().configure(ControlConfig {
        deny: entries(&["203.0.113.0/24", "2001:db8::/32"]),
        ..Default::default()
    });
    let control = limiter.control().clone();
    let addr = serve_layer(limiter).await;

    let r = get(addr, "/whoami", &[("x-forwarded-for", "203.0.113.7")]).await;
    assert_eq!(r.status, StatusCode::FORBIDDEN, "{}", r.text());
    let r = get(addr, "/whoami", &[("x-forwarded-for", "2001:db8:1:2::a")]).await;
    assert_eq!(r.status, StatusCode::FORBIDDEN, "{}", r.text());
    // An IPv4-mapped IPv6 hop is the IPv4 client.
    assert_eq!(
        statuses(addr, "::ffff:203.0.113.9", &[], 1).await,
        [403],
        "mapped"
    );
    // Clients outside the networks are limited as usual.
    assert_eq!(
        statuses(addr, "198.51.100.1", &[], 3).await,
        [200, 200, 429]
    );
    assert_eq!(statuses(addr, "2001:db9::1", &[], 3).await, [200, 200, 429]);
    let r = get(addr, "/whoami", &[("x-forwarded-for", "2001:db9:0:1::5")]).await;
    assert_eq!(
        r.text(),
        "ip6:2001:db9:0:1::/64",
        "the key name is unchanged"
    );

    // A network added at runtime, for the IPv6 /64 group and an IPv4 host.
    control
        .list_add(
            ListKind::Deny,
            &ListEntry::parse("2001:db9:0:1::/64").unwrap(),
            Some(Duration::from_secs(60)),
        )
        .await
        .unwrap();
    control
        .list_add(
            ListKind::Deny,
            &ListEntry::parse("ip:198.51.100.2").unwrap(),
            None,
        )
        .await
        .unwrap();
    assert_eq!(statuses(addr, "2001:db9:0:1::77", &[], 1).await, [403]);
    assert_eq!(statuses(addr, "198.51.100.2", &[], 1).await, [403]);
    assert_eq!(statuses(addr, "198.51.100.3", &[], 1).await, [200]);
}

#[tokio::test]
async fn an_identity_that_spells_a_listed_address_is_not_that_client() {
    let limiter = Limiter::memory();
    limiter.control().configure(ControlConfig {
        deny: entries(&["203.0.113.0/24", "2001:db8::/32"]),
        allow: entries(&["10.0.0.0/8"]),
        ..Default::default()
    });
    let addr = serve_layer(limiter).await;

    // The text the layer writes for the deny-listed client 203.0.113.7, chosen by a client
    // at 198.51.100.1: limited as an identity of its own, not refused as that client.
    let spelled = [("x-client", "ip:203.0.113.7")];
    let r = get(
        addr,
        "/whoami",
        &[("x-forwarded-for", "198.51.100.1"), spelled[0]],
    )
    .await;
    assert_eq!(
        (r.status, r.text()),
        (StatusCode::OK, "ip:203.0.113.7"),
        "same text, not the same client"
    );
    assert_eq!(
        statuses(addr, "198.51.100.1", &spelled, 2).await,
        [200, 429]
    );
    let v6 = [("x-client", "ip6:2001:db8::1")];
    assert_eq!(
        statuses(addr, "198.51.100.1", &v6, 3).await,
        [200, 200, 429]
    );

    // The text of an allow-listed client buys no exemption: limited after 2.
    let allowed = [("x-client", "ip:10.0.0.1")];
    assert_eq!(
        statuses(addr, "198.51.100.1", &allowed, 4).await,
        [200, 200, 429, 429]
    );
    // The client really at 10.0.0.1 is allowed past the limit.
    assert_eq!(
        statuses(addr, "10.0.0.1", &[], 4).await,
        [200, 200, 200, 200]
    );
    // And the client really at 203.0.113.7 is refused.
    assert_eq!(statuses(addr, "203.0.113.7", &[], 1).await, [403]);
}
