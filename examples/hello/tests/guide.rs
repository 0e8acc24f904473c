//! The guide's sequence against the example, over real HTTP on 127.0.0.1:0.

use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Empty};
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;
use sluice::Limiter;
use sluice_example_hello::{Limits, app, parse_rate, serve};

async fn start(limiter: Option<Limiter>, limits: Limits) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let app = app(limiter, &limits).unwrap();
    tokio::spawn(serve(listener, app, std::future::pending()));
    addr
}

/// One keep-alive connection, so a burst of requests really is quick.
async fn connect(addr: SocketAddr) -> SendRequest<Empty<Bytes>> {
    let stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let (send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .unwrap();
    tokio::spawn(conn);
    send
}

async fn hello(send: &mut SendRequest<Empty<Bytes>>, api_key: Option<&str>) -> Response<Bytes> {
    let mut req = Request::get("/hello").header("host", "localhost");
    if let Some(k) = api_key {
        req = req.header("x-api-key", k);
    }
    let fut = async {
        send.ready().await.unwrap();
        let res = send
            .send_request(req.body(Empty::new()).unwrap())
            .await
            .unwrap();
        let (parts, body) = res.into_parts();
        Response::from_parts(parts, body.collect().await.unwrap().to_bytes())
    };
    tokio::time::timeout(Duration::from_secs(5), fut)
        .await
        .unwrap()
}

#[tokio::test]
async fn twelve_quick_requests_give_ten_200_then_429_with_the_guide_headers() {
    let addr = start(Some(Limiter::memory()), Limits::default()).await;
    let mut c = connect(addr).await;
    let mut statuses = Vec::new();
    let mut denials = Vec::new();
    for _ in 0..12 {
        let res = hello(&mut c, Some("demo")).await;
        statuses.push(res.status().as_u16());
        if res.status() == StatusCode::OK {
            assert_eq!(res.body().as_ref(), br#"{"ok":true}"#);
            assert_eq!(res.headers()["ratelimit-policy"], "\"burst\";q=10;w=2");
        } else {
            denials.push(res);
        }
    }
    assert_eq!(
        &statuses[..11],
        [200, 200, 200, 200, 200, 200, 200, 200, 200, 200, 429]
    );
    let res = &denials[0];
    assert_eq!(res.headers()["ratelimit-policy"], "\"burst\";q=10;w=2");
    assert_eq!(res.headers()["ratelimit"], "\"burst\";r=0;t=2");
    assert_eq!(res.headers()["retry-after"], "1");
    assert_eq!(res.headers()["cache-control"], "no-store");
    assert_eq!(res.headers()["content-type"], "application/problem+json");
    let body: serde_json::Value = serde_json::from_slice(res.body()).unwrap();
    assert_eq!(body["policy"], "burst");
    assert_eq!(body["status"], 429);

    // Another key, and an anonymous client (limited by IP), have buckets of their own.
    assert_eq!(hello(&mut c, Some("other")).await.status(), StatusCode::OK);
    assert_eq!(hello(&mut c, None).await.status(), StatusCode::OK);

    // The bucket refills at 5/s: 200 ms later one more request is admitted.
    tokio::time::sleep(Duration::from_millis(250)).await;
    assert_eq!(hello(&mut c, Some("demo")).await.status(), StatusCode::OK);
}

#[tokio::test]
async fn no_limiter_and_huge_limits_for_benchmarks() {
    let addr = start(None, Limits::default()).await;
    let mut c = connect(addr).await;
    for _ in 0..30 {
        let res = hello(&mut c, Some("demo")).await;
        assert_eq!(res.status(), StatusCode::OK);
        assert!(res.headers().get("ratelimit").is_none());
    }
    let limits = Limits {
        capacity: 1_000_000,
        rate: parse_rate("1000000/s").unwrap(),
        ..Limits::default()
    };
    let addr = start(Some(Limiter::memory()), limits).await;
    let mut c = connect(addr).await;
    for _ in 0..30 {
        assert_eq!(hello(&mut c, Some("demo")).await.status(), StatusCode::OK);
    }
    assert_eq!(
        hello(&mut c, None).await.headers()["ratelimit-policy"],
        "\"burst\";q=1000000;w=1"
    );
}

#[test]
fn rates_parse() {
    assert_eq!(parse_rate("5/s").unwrap(), sluice::Rate::per_second(5));
    assert_eq!(
        parse_rate("300/min").unwrap(),
        sluice::Rate::new(300, 60_000)
    );
    assert_eq!(parse_rate("7").unwrap(), sluice::Rate::per_second(7));
    assert!(parse_rate("0").is_err());
}

/// The binary runs with one command and serves the guide's answer.
#[tokio::test]
async fn the_binary_serves_hello() {
    use tokio::io::AsyncBufReadExt;
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_sluice-example-hello"))
        .args([
            "--listen",
            "127.0.0.1:0",
            "--capacity",
            "2",
            "--rate",
            "1/min",
        ])
        .env_remove("SLUICE_STORE")
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = tokio::io::BufReader::new(child.stdout.take().unwrap()).lines();
    let line = tokio::time::timeout(Duration::from_secs(20), lines.next_line())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    let addr: SocketAddr = line
        .strip_prefix("listening on http://")
        .and_then(|r| r.split_whitespace().next())
        .unwrap_or_else(|| panic!("unexpected first line {line:?}"))
        .parse()
        .unwrap();
    let mut c = connect(addr).await;
    let statuses = [
        hello(&mut c, None).await.status(),
        hello(&mut c, None).await.status(),
        hello(&mut c, None).await.status(),
    ];
    assert_eq!(
        statuses,
        [
            StatusCode::OK,
            StatusCode::OK,
            StatusCode::TOO_MANY_REQUESTS
        ]
    );
    child.kill().await.unwrap();
}

/// The same sequence with the state in a real Redis, chosen by URL as `--store` does.
#[tokio::test]
async fn the_guide_sequence_on_redis() {
    let server = sluice_testkit::servers::RedisServer::redis();
    let limiter = Limiter::connect(&server.url(), sluice::StoreOptions::default())
        .await
        .unwrap();
    assert_eq!(limiter.store().kind(), "redis");
    let addr = start(Some(limiter), Limits::default()).await;
    let mut c = connect(addr).await;
    let mut statuses = Vec::new();
    let mut last = None;
    for _ in 0..11 {
        let res = hello(&mut c, Some("demo")).await;
        statuses.push(res.status().as_u16());
        last = Some(res);
    }
    assert_eq!(
        statuses,
        [200, 200, 200, 200, 200, 200, 200, 200, 200, 200, 429]
    );
    let res = last.unwrap();
    assert_eq!(res.headers()["ratelimit-policy"], "\"burst\";q=10;w=2");
    assert_eq!(res.headers()["ratelimit"], "\"burst\";r=0;t=2");
    assert_eq!(res.headers()["retry-after"], "1");
    // The API key reached Redis only hashed.
    let keys = server.cli(&["KEYS", "*"]);
    assert!(keys.contains("rl:{key:h"), "{keys}");
    assert!(!keys.contains("demo"), "{keys}");
}
