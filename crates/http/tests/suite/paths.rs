//! Path normalization in the layer, over real HTTP on 127.0.0.1:0: every spelling of `/login`
//! counts against the `/login` rule, the handler sees the path that was limited, and a path
//! with no safe normal form is refused with 400 before any handler runs.

use crate::support;

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use axum::Router;
use http::StatusCode;
use sluice::{Algorithm, Limiter, Policy};
use sluice_http::{RateLimitLayer, Rule};
use support::get;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

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

/// A layer with `/login` limited to 3 and everything else to 1000, in front of a handler that
/// notes every path it receives.
async fn app(login: Rule) -> (SocketAddr, Arc<Mutex<Vec<String>>>) {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let layer = RateLimitLayer::builder(Limiter::memory())
        .rule(login.policy(fixed("login", 3)))
        .rule(Rule::new("/").policy(fixed("everything", 1000)))
        .build();
    let noted = Arc::clone(&seen);
    let router = Router::new()
        .fallback(move |uri: http::Uri| {
            let noted = Arc::clone(&noted);
            async move {
                noted.lock().unwrap().push(uri.to_string());
                "ok"
            }
        })
        .layer(layer);
    (support::serve(router).await, seen)
}

#[tokio::test]
async fn every_spelling_of_login_counts_against_the_login_limit() {
    let (addr, seen) = app(Rule::new("/login")).await;
    let spellings = [
        "/%6cogin",
        "//login",
        "/./login",
        "/x/../login?a=1",
        "/%6C%6f%67%69%6E",
    ];
    let statuses: Vec<StatusCode> = futures::future::join_all(
        spellings
            .iter()
            .map(|p| async move { get(addr, p, &[]).await.status }),
    )
    .await;
    let admitted = statuses.iter().filter(|s| **s == StatusCode::OK).count();
    assert_eq!(admitted, 3, "{statuses:?}");
    let seen = seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 3);
    for path in &seen {
        assert!(path == "/login" || path == "/login?a=1", "{seen:?}");
    }
    assert_eq!(
        get(addr, "/login", &[]).await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
    // Other paths are untouched by the login limit.
    assert_eq!(get(addr, "/logins", &[]).await.status, StatusCode::OK);
}

#[tokio::test]
async fn case_insensitive_rules_count_every_case() {
    let (addr, _) = app(Rule::new("/login")).await;
    // Exact by default: /LOGIN is another path.
    for _ in 0..5 {
        assert_eq!(get(addr, "/LOGIN", &[]).await.status, StatusCode::OK);
    }
    let (addr, seen) = app(Rule::new("/login").case_insensitive(true)).await;
    let mut statuses = Vec::new();
    for p in ["/LOGIN", "/Login", "/login", "/lOGIN", "/LoGiN/x"] {
        statuses.push(get(addr, p, &[]).await.status);
    }
    assert_eq!(
        statuses,
        [200, 200, 200, 429, 429].map(|s| StatusCode::from_u16(s).unwrap())
    );
    // The case is the client's: only the rule compares without it.
    assert_eq!(*seen.lock().unwrap(), ["/LOGIN", "/Login", "/login"]);
}

/// Sends `target` as is on a raw connection; the status line's code.
async fn raw_status(addr: SocketAddr, target: &str) -> u16 {
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    s.write_all(
        format!("GET {target} HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n").as_bytes(),
    )
    .await
    .unwrap();
    let mut out = Vec::new();
    s.read_to_end(&mut out).await.unwrap();
    let text = String::from_utf8_lossy(&out);
    text.split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0)
}

#[tokio::test]
async fn ambiguous_paths_are_refused_before_any_handler() {
    let (addr, seen) = app(Rule::new("/login")).await;
    for target in [
        "/login%2Fx",
        "/x%2f..%2flogin",
        "/login%5C",
        "/x%00",
        "/%6",
        "/%zzlogin",
        "/%2e%2e/login",
        "/x/%2E/login",
    ] {
        let r = get(addr, target, &[]).await;
        assert_eq!(r.status, StatusCode::BAD_REQUEST, "{target}");
        assert_eq!(
            r.header("content-type"),
            Some("application/problem+json"),
            "{target}"
        );
        assert!(r.text().contains("\"detail\""), "{}", r.text());
    }
    // A raw backslash, which some servers read as a slash.
    assert_eq!(raw_status(addr, "/x\\..\\login").await, 400);
    assert!(seen.lock().unwrap().is_empty());
}
