//! The reverse proxy and configuration reload over real HTTP on loopback.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use crate::support::{client, start};
use axum::body::Body;
use axum::extract::Request;
use http_body_util::BodyExt;
use serde_json::{Value, json};

/// An upstream that echoes what it received: method, path, X-Forwarded-For, body length;
/// `/stream` answers a body sent in several chunks over time.
async fn upstream() -> SocketAddr {
    async fn echo(req: Request) -> axum::response::Response {
        let (parts, body) = req.into_parts();
        if parts.uri.path() == "/api/stream" {
            let chunks = futures::stream::unfold(0u32, |i| async move {
                if i == 3 {
                    return None;
                }
                tokio::time::sleep(Duration::from_millis(30)).await;
                Some((
                    Ok::<_, std::io::Error>(bytes::Bytes::from(format!("chunk{i};"))),
                    i + 1,
                ))
            });
            return axum::response::Response::new(Body::from_stream(chunks));
        }
        let bytes = body.collect().await.unwrap().to_bytes();
        let xff = parts
            .headers
            .get("x-forwarded-for")
            .map(|v| v.to_str().unwrap().to_string());
        axum::Json(json!({
            "method": parts.method.as_str(),
            "path": parts.uri.path_and_query().map(|p| p.as_str()),
            "xff": xff,
            "len": bytes.len(),
            "connection": parts.headers.get("x-private").is_some(),
        }))
        .into_response_()
    }
    trait Into_ {
        fn into_response_(self) -> axum::response::Response;
    }
    impl<T: axum::response::IntoResponse> Into_ for T {
        fn into_response_(self) -> axum::response::Response {
            self.into_response()
        }
    }
    let app = axum::Router::new().fallback(echo);
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(l, app).await });
    addr
}

fn config(up: SocketAddr, capacity: u32) -> String {
    format!(
        r#"
[server]
reload_poll = "100ms"

[policies.per-key]
algorithm = "token-bucket"
capacity = {capacity}
rate = "1/min"
identity = "api-key:x-api-key"

[policies.uploads]
algorithm = "concurrency"
limit = 1
identity = "global"

[[routes]]
prefix = "/api"
policies = ["per-key"]
upstream = "http://{up}"

[[routes]]
prefix = "/api/upload"
methods = ["POST"]
policies = ["uploads"]
upstream = "http://{up}"

[[routes]]
prefix = "/open"
upstream = "http://{up}"
"#
    )
}

#[tokio::test]
async fn proxy_enforces_route_policies_and_forwards() {
    let up = upstream().await;
    let s = start(&config(up, 2)).await;
    let c = client();
    for left in [1, 0] {
        let res = c
            .get(s.proxy_url("/api/items?x=1"))
            .header("x-api-key", "k1")
            .header("x-forwarded-for", "198.51.100.7")
            .send()
            .await
            .unwrap();
        assert_eq!(res.status(), 200);
        assert_eq!(res.headers()["ratelimit-policy"], "\"per-key\";q=2;w=120");
        assert!(
            res.headers()["ratelimit"]
                .to_str()
                .unwrap()
                .starts_with(&format!("\"per-key\";r={left};"))
        );
        let v: Value = res.json().await.unwrap();
        assert_eq!(v["path"], "/api/items?x=1");
        assert_eq!(
            v["xff"], "198.51.100.7, 127.0.0.1",
            "the client address is appended"
        );
    }
    let res = c
        .get(s.proxy_url("/api/items"))
        .header("x-api-key", "k1")
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 429);
    assert_eq!(res.headers()["content-type"], "application/problem+json");
    assert_eq!(res.headers()["retry-after"], "60");
    // Another key is another identity; an unlimited route passes everything.
    assert_eq!(
        c.get(s.proxy_url("/api/items"))
            .header("x-api-key", "k2")
            .send()
            .await
            .unwrap()
            .status(),
        200
    );
    for _ in 0..5 {
        let res = c.get(s.proxy_url("/open/x")).send().await.unwrap();
        assert_eq!(res.status(), 200);
        assert!(res.headers().get("ratelimit").is_none());
    }
    // No route: 404 from the proxy itself.
    assert_eq!(
        c.get(s.proxy_url("/elsewhere"))
            .send()
            .await
            .unwrap()
            .status(),
        404
    );
    s.stop().await;
}

#[tokio::test]
async fn proxy_streams_bodies_both_ways() {
    let up = upstream().await;
    let s = start(&config(up, 100)).await;
    // A 3 MB upload, streamed by the client in chunks.
    let chunks: Vec<Result<bytes::Bytes, std::io::Error>> = (0..48)
        .map(|_| Ok(bytes::Bytes::from(vec![b'x'; 65536])))
        .collect();
    let body = reqwest::Body::from(
        chunks
            .into_iter()
            .map(|c| c.unwrap())
            .flat_map(|b| b.to_vec())
            .collect::<Vec<u8>>(),
    );
    let res = client()
        .post(s.proxy_url("/open/upload"))
        .body(body)
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 200);
    assert_eq!(res.json::<Value>().await.unwrap()["len"], 48 * 65536);
    // The response arrives chunk by chunk, not buffered to the end.
    let mut res = client()
        .get(s.proxy_url("/api/stream"))
        .header("x-api-key", "s")
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 200);
    let start = Instant::now();
    let first = res.chunk().await.unwrap().unwrap();
    let first_at = start.elapsed();
    let mut all = first.to_vec();
    while let Some(c) = res.chunk().await.unwrap() {
        all.extend_from_slice(&c);
    }
    let total = start.elapsed();
    assert_eq!(String::from_utf8(all).unwrap(), "chunk0;chunk1;chunk2;");
    assert!(
        total >= first_at + Duration::from_millis(40),
        "first chunk at {first_at:?}, all at {total:?}"
    );
    s.stop().await;
}

#[tokio::test]
async fn proxy_hop_by_hop_headers_are_not_forwarded() {
    let up = upstream().await;
    let s = start(&config(up, 100)).await;
    let res = client()
        .get(s.proxy_url("/open/h"))
        .header("connection", "x-private")
        .header("x-private", "secret")
        .send()
        .await
        .unwrap();
    assert_eq!(res.json::<Value>().await.unwrap()["connection"], false);
    s.stop().await;
}

#[tokio::test]
async fn reload_applies_valid_changes_and_keeps_state() {
    let up = upstream().await;
    let s = start(&config(up, 2)).await;
    let c = client();
    let get = |key: &'static str| c.get(s.proxy_url("/api/x")).header("x-api-key", key).send();
    assert_eq!(get("a").await.unwrap().status(), 200);
    assert_eq!(get("a").await.unwrap().status(), 200);
    assert_eq!(get("a").await.unwrap().status(), 429);

    // An invalid file is rejected with its line; the running config stays.
    let broken = config(up, 2).replace("rate = \"1/min\"", "rate = \"5/x\"");
    std::fs::write(&s.file, &broken).unwrap();
    let res = c.post(s.url("/admin/reload")).send().await.unwrap();
    assert_eq!(res.status(), 422);
    let v: Value = res.json().await.unwrap();
    let err = v["errors"][0].as_str().unwrap();
    assert!(
        err.contains("sluice.toml:8: policies.per-key.rate: invalid rate"),
        "{err}"
    );
    assert_eq!(
        get("b").await.unwrap().status(),
        200,
        "still serving the old config"
    );

    // A valid change is picked up by the file watcher (no explicit reload), and the embedded
    // store's state carries over: key "a" still has an empty bucket, a new key gets 3.
    let generation = |v: &Value| v["generation"].as_u64().unwrap();
    let before: Value = c
        .get(s.url("/readyz"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    std::fs::write(&s.file, config(up, 3)).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let now: Value = c
            .get(s.url("/readyz"))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        if generation(&now) > generation(&before) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the file change was not picked up"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(get("a").await.unwrap().status(), 429, "state was kept");
    let res = get("c").await.unwrap();
    assert_eq!(res.status(), 200);
    assert!(
        res.headers()["ratelimit-policy"]
            .to_str()
            .unwrap()
            .contains("q=3")
    );
    assert!(
        res.headers()["ratelimit"]
            .to_str()
            .unwrap()
            .contains(";r=2;")
    );
    s.stop().await;
}

#[cfg(unix)]
#[tokio::test]
async fn sighup_reloads() {
    let up = upstream().await;
    let s = start(&config(up, 2).replace("reload_poll = \"100ms\"", "reload_poll = \"0s\"")).await;
    let c = client();
    let before: Value = c
        .get(s.url("/readyz"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    std::fs::write(
        &s.file,
        config(up, 5).replace("reload_poll = \"100ms\"", "reload_poll = \"0s\""),
    )
    .unwrap();
    // This test process is the server: signal ourselves.
    let pid = std::process::id().to_string();
    assert!(
        std::process::Command::new("kill")
            .args(["-HUP", &pid])
            .status()
            .unwrap()
            .success()
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let now: Value = c
            .get(s.url("/readyz"))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        if now["generation"].as_u64() > before["generation"].as_u64() {
            break;
        }
        assert!(Instant::now() < deadline, "SIGHUP did not reload");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let res = c
        .get(s.proxy_url("/api/x"))
        .header("x-api-key", "z")
        .send()
        .await
        .unwrap();
    assert!(
        res.headers()["ratelimit-policy"]
            .to_str()
            .unwrap()
            .contains("q=5")
    );
    s.stop().await;
}

#[tokio::test]
async fn concurrency_lease_is_released_after_the_response() {
    let up = upstream().await;
    let s = start(&config(up, 100)).await;
    let c = client();
    let res = c
        .post(s.proxy_url("/api/upload"))
        .body("data")
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 200);
    res.bytes().await.unwrap();
    // The lease is released once the body ended (on a spawned task): wait for it, bounded.
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let res = c
            .post(s.proxy_url("/api/upload"))
            .body("data")
            .send()
            .await
            .unwrap();
        if res.status() == 200 {
            break;
        }
        assert!(Instant::now() < deadline, "lease never released");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    s.stop().await;
}

#[tokio::test]
async fn a_route_mixing_identities_describes_every_policy() {
    let up = upstream().await;
    let toml = format!(
        r#"
[policies.per-key]
algorithm = "token-bucket"
capacity = 5
rate = "1/h"
identity = "api-key:x-api-key"

[policies.per-ip]
algorithm = "token-bucket"
capacity = 2
rate = "1/min"
identity = "ip"

[[routes]]
prefix = "/api"
policies = ["per-key", "per-ip"]
upstream = "http://{up}"
"#
    );
    let s = start(&toml).await;
    let c = client();
    let get = || c.get(s.proxy_url("/api/x")).header("x-api-key", "k").send();
    for used in [1, 2] {
        let res = get().await.unwrap();
        assert_eq!(res.status(), 200);
        // One list, the route's policies in the order listed, from both nested layers.
        assert_eq!(
            res.headers()["ratelimit-policy"],
            "\"per-key\";q=5;w=18000, \"per-ip\";q=2;w=120"
        );
        let rl = res.headers()["ratelimit"].to_str().unwrap().to_string();
        let items: Vec<&str> = rl.split(", ").collect();
        assert_eq!(items.len(), 2, "{rl}");
        assert!(
            items[0].starts_with(&format!("\"per-key\";r={};", 5 - used)),
            "{rl}"
        );
        assert!(
            items[1].starts_with(&format!("\"per-ip\";r={};", 2 - used)),
            "{rl}"
        );
        assert_eq!(res.headers().get_all("ratelimit").iter().count(), 1);
    }
    // The inner (per-ip) layer denies; the 429 still lists the outer policy, which admitted.
    let res = get().await.unwrap();
    assert_eq!(res.status(), 429);
    let rl = res.headers()["ratelimit"].to_str().unwrap().to_string();
    assert!(rl.starts_with("\"per-key\";r=2;"), "{rl}");
    assert!(rl.contains("\"per-ip\";r=0;"), "{rl}");
    assert_eq!(
        res.headers()["ratelimit-policy"],
        "\"per-key\";q=5;w=18000, \"per-ip\";q=2;w=120"
    );
    assert_eq!(res.headers()["cache-control"], "no-store");
    s.stop().await;
}

#[tokio::test]
async fn header_identities_that_are_not_plain_text_are_limited_on_their_own() {
    let up = upstream().await;
    let toml = format!(
        r#"
[policies.per-user]
algorithm = "token-bucket"
capacity = 1
rate = "1/h"
identity = "header:x-user"

[[routes]]
prefix = "/api"
policies = ["per-user"]
upstream = "http://{up}"
"#
    );
    let s = start(&toml).await;
    let c = client();
    let status = |user: Option<Vec<u8>>| {
        let mut req = c.get(s.proxy_url("/api/x"));
        if let Some(u) = user {
            req = req.header(
                "x-user",
                reqwest::header::HeaderValue::from_bytes(&u).unwrap(),
            );
        }
        async move { req.send().await.unwrap().status().as_u16() }
    };
    // Capacity 1 each: the first request of every distinct user passes, the second is denied.
    let users: [Vec<u8>; 4] = [
        b"\xffalice".to_vec(),
        b"\xffbob".to_vec(),
        vec![b'u'; 600],
        vec![b'v'; 600],
    ];
    for user in &users {
        assert_eq!(status(Some(user.clone())).await, 200, "{user:?}");
        assert_eq!(status(Some(user.clone())).await, 429, "{user:?}");
    }
    // None of them spent the client IP's bucket.
    assert_eq!(status(None).await, 200);
    assert_eq!(status(None).await, 429);
    s.stop().await;
}

#[tokio::test]
async fn an_upstream_that_never_answers_is_a_504_after_upstream_timeout() {
    // Accepts connections and reads nothing, answers nothing; holds them until the test ends.
    let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let up = silent.local_addr().unwrap();
    let held = tokio::spawn(async move {
        let mut conns = Vec::new();
        while let Ok((c, _)) = silent.accept().await {
            conns.push(c);
        }
    });
    let toml = format!(
        r#"
[proxy]
upstream_timeout = "300ms"
connect_timeout = "1s"

[[routes]]
prefix = "/"
upstream = "http://{up}"
"#
    );
    let s = start(&toml).await;
    let started = Instant::now();
    let res = client().get(s.proxy_url("/slow")).send().await.unwrap();
    let took = started.elapsed();
    assert_eq!(res.status(), 504);
    assert_eq!(res.headers()["content-type"], "application/problem+json");
    assert!(
        took >= Duration::from_millis(300) && took < Duration::from_secs(3),
        "answered after {took:?}"
    );
    let v: Value = res.json().await.unwrap();
    assert_eq!(v["status"], 504);
    s.stop().await;
    held.abort();
}

#[tokio::test]
async fn an_upstream_that_never_accepts_is_a_502_after_connect_timeout() {
    // A listener that never accepts, with its accept queue filled: the kernel drops further
    // connection attempts, so a connect hangs until the proxy gives up.
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let full = socket.listen(0).unwrap();
    let up = full.local_addr().unwrap();
    let mut queued = Vec::new();
    for _ in 0..8 {
        match tokio::time::timeout(
            Duration::from_millis(200),
            tokio::net::TcpStream::connect(up),
        )
        .await
        {
            Ok(Ok(c)) => queued.push(c),
            _ => break,
        }
    }
    let toml = format!(
        r#"
[proxy]
upstream_timeout = "20s"
connect_timeout = "300ms"

[[routes]]
prefix = "/"
upstream = "http://{up}"
"#
    );
    let s = start(&toml).await;
    let started = Instant::now();
    let res = client().get(s.proxy_url("/x")).send().await.unwrap();
    let took = started.elapsed();
    assert_eq!(res.status(), 502);
    assert_eq!(res.headers()["content-type"], "application/problem+json");
    assert!(
        took >= Duration::from_millis(300) && took < Duration::from_secs(3),
        "answered after {took:?}"
    );
    s.stop().await;
    drop((queued, full));
}

/// An upstream login form: `?password=right` is 200, anything else 401.
async fn login_upstream() -> SocketAddr {
    let app = axum::Router::new().fallback(|uri: http::Uri| async move {
        if uri.query() == Some("password=right") {
            http::StatusCode::OK
        } else {
            http::StatusCode::UNAUTHORIZED
        }
    });
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(l, app).await });
    addr
}

#[tokio::test]
async fn routes_count_only_the_statuses_they_name() {
    let up = login_upstream().await;
    let s = start(&format!(
        r#"
[policies.logins]
algorithm = "fixed-window"
limit = 3
window = "1m"

[policies.exports]
algorithm = "fixed-window"
limit = 3
window = "1m"

[[routes]]
prefix = "/login"
policies = ["logins"]
count = [401]
upstream = "http://{up}"

[[routes]]
prefix = "/export"
policies = ["exports"]
count = "successes"
upstream = "http://{up}"
"#
    ))
    .await;
    let c = client();
    let status = |path: &'static str| {
        let c = c.clone();
        let url = s.proxy_url(path);
        async move { c.get(url).send().await.unwrap().status().as_u16() }
    };
    for _ in 0..50 {
        assert_eq!(status("/login?password=right").await, 200);
    }
    for _ in 0..3 {
        assert_eq!(status("/login?password=wrong").await, 401);
    }
    let denied = c
        .get(s.proxy_url("/login?password=right"))
        .send()
        .await
        .unwrap();
    assert_eq!(denied.status(), 429);
    assert!(denied.headers().contains_key("retry-after"));
    assert_eq!(status("/login?password=wrong").await, 429);

    // Failures pass a route counting successes; three successes use it up.
    for _ in 0..10 {
        assert_eq!(status("/export?password=wrong").await, 401);
    }
    for _ in 0..3 {
        assert_eq!(status("/export?password=right").await, 200);
    }
    assert_eq!(status("/export?password=wrong").await, 429);
    s.stop().await;
}

#[test]
fn an_unknown_count_is_refused_with_its_field() {
    let src = |count: &str| {
        format!(
            "[policies.p]\nalgorithm = \"fixed-window\"\nlimit = 3\nwindow = \"1m\"\n\n\
             [[routes]]\nprefix = \"/\"\npolicies = [\"p\"]\ncount = {count}\n\
             upstream = \"http://127.0.0.1:9\"\n"
        )
    };
    for bad in ["\"errors\"", "[99]", "[]", "[70000]"] {
        let err = sluice_server::config::Config::parse(&src(bad), "t.toml", None)
            .unwrap_err()
            .to_string();
        assert!(err.contains("routes[0].count"), "{bad}: {err}");
    }
    assert!(sluice_server::config::Config::parse(&src("\"failures\""), "t.toml", None).is_ok());
}
