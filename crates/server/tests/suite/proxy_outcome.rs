//! Routes that count by outcome, behind the reverse proxy, against real upstream frameworks:
//! the cost is reserved at the check, so concurrent requests cannot pass the limit together,
//! and a request whose status never comes (client gone) or that the upstream failed (502,
//! 504) stays counted. The upstreams count what reached their handlers.

use std::net::SocketAddr;
use std::time::Duration;

use crate::support::start;
use sluice_testkit::upstream::Upstream;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

fn config(upstream: &str, limit: u32, count: &str, extra: &str) -> String {
    format!(
        r#"
{extra}

[policies.outcome]
algorithm = "fixed-window"
limit = {limit}
window = "1h"
identity = "ip"

[[routes]]
prefix = "/"
policies = ["outcome"]
upstream = "{upstream}"
count = {count}
"#
    )
}

/// Sends a request on a fresh connection and reads the answer; the status code.
async fn send(addr: SocketAddr, target: &str) -> u16 {
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    let head = format!(
        "POST {target} HTTP/1.1\r\nHost: sluice.test\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
    );
    s.write_all(head.as_bytes()).await.unwrap();
    let mut out = Vec::new();
    s.read_to_end(&mut out).await.unwrap();
    String::from_utf8_lossy(&out)
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0)
}

/// Sends a request and closes the connection after `after`, before the answer.
async fn abandon(addr: SocketAddr, target: &str, after: Duration) {
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    let head = format!("POST {target} HTTP/1.1\r\nHost: sluice.test\r\nContent-Length: 0\r\n\r\n");
    s.write_all(head.as_bytes()).await.unwrap();
    tokio::time::sleep(after).await;
    drop(s);
}

#[tokio::test]
async fn clients_abandoning_a_slow_success_cannot_get_more_than_3_actions() {
    let up = Upstream::fastapi();
    let s = start(&config(&up.url(), 3, "\"successes\"", "")).await;
    let proxy = s.addrs.proxy.unwrap();
    for _ in 0..20 {
        // The upstream acts on entry and answers after 300 ms; the client leaves at 100 ms.
        abandon(proxy, "/slow?ms=300", Duration::from_millis(100)).await;
    }
    assert_eq!(up.hits("slow"), 3, "{}", up.hits_json());
    assert_eq!(send(proxy, "/slow?ms=0").await, 429);
    s.stop().await;
}

#[tokio::test]
async fn concurrent_wrong_passwords_reach_the_password_check_at_most_5_times() {
    let up = Upstream::express();
    let s = start(&config(&up.url(), 5, "[401]", "")).await;
    let proxy = s.addrs.proxy.unwrap();
    let statuses =
        futures::future::join_all((0..250).map(|_| send(proxy, "/login?password=wrong"))).await;
    let unauthorized = statuses.iter().filter(|&&s| s == 401).count();
    let limited = statuses.iter().filter(|&&s| s == 429).count();
    assert_eq!((unauthorized, limited), (5, 245), "{statuses:?}");
    assert_eq!(up.hits("login"), 5, "{}", up.hits_json());
    s.stop().await;
}

#[tokio::test]
async fn right_passwords_give_their_unit_back() {
    let up = Upstream::fastapi();
    let s = start(&config(&up.url(), 5, "[401]", "")).await;
    let proxy = s.addrs.proxy.unwrap();
    for _ in 0..20 {
        assert_eq!(send(proxy, "/login?password=right").await, 200);
    }
    for _ in 0..5 {
        assert_eq!(send(proxy, "/login?password=wrong").await, 401);
    }
    assert_eq!(send(proxy, "/login?password=right").await, 429);
    assert_eq!(up.hits("login"), 25);
    s.stop().await;
}

#[tokio::test]
async fn upstream_failures_and_timeouts_stay_counted() {
    // Nothing listens on this port: every forward is a 502.
    let closed = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let s = start(&config(
        &format!("http://127.0.0.1:{closed}"),
        2,
        "[401]",
        "",
    ))
    .await;
    let proxy = s.addrs.proxy.unwrap();
    let statuses = [
        send(proxy, "/login").await,
        send(proxy, "/login").await,
        send(proxy, "/login").await,
    ];
    assert_eq!(statuses, [502, 502, 429]);
    s.stop().await;

    // An upstream slower than proxy.upstream_timeout: 504, counted although a route counting
    // successes would not count a 504 the upstream itself answered.
    let up = Upstream::fastapi();
    let extra = "[proxy]\nupstream_timeout = \"200ms\"";
    let s = start(&config(&up.url(), 2, "\"successes\"", extra)).await;
    let proxy = s.addrs.proxy.unwrap();
    let statuses = [
        send(proxy, "/slow?ms=1000").await,
        send(proxy, "/slow?ms=1000").await,
        send(proxy, "/slow?ms=0").await,
    ];
    assert_eq!(statuses, [504, 504, 429]);
    assert_eq!(up.hits("slow"), 2);
    s.stop().await;
}
