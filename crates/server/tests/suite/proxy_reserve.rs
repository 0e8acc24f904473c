//! A route reserving each request's `max_tokens` (`[routes.reserve]`) in front of a real
//! streaming upstream: a small OpenAI-like server written here (axum) that answers JSON, or an
//! event stream whose last event carries the `usage`, holding the stream open until the test
//! lets it finish. The stream reaches the client unchanged and before the upstream finished
//! (nothing buffered); the reservation holds the maximum while the request runs and is
//! settled with the reported usage at the end; a client that leaves, or an upstream that
//! fails, leaves the whole maximum spent.

use crate::support;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::support::{client, start};
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::Response;
use serde_json::{Value, json};
use tokio::sync::Notify;

const FIRST: &str = "data: {\"choices\":[{\"delta\":{\"content\":\"Hel\"}}]}\n\n";
const SECOND: &str = "data: {\"choices\":[{\"delta\":{\"content\":\"lo\"}}]}\n\n";
const DONE: &str = "data: [DONE]\n\n";

fn last_event(used: u64) -> String {
    format!(
        "data: {{\"choices\":[],\"usage\":{{\"prompt_tokens\":3,\"completion_tokens\":{used},\"total_tokens\":{}}}}}\n\n",
        used + 3
    )
}

/// The upstream: `/v1/chat/completions` answers `usage.total_tokens = used + 3`, streamed
/// when `stream` is true (the first event at once, the rest once `release` is notified);
/// `/v1/fail` answers 500.
#[derive(Clone)]
struct Upstream {
    release: Arc<Notify>,
}

async fn completions(State(up): State<Upstream>, body: Bytes) -> Response {
    let req: Value = serde_json::from_slice(&body).unwrap();
    let used = req["used"].as_u64().unwrap();
    if req["stream"] != true {
        let answer = json!({
            "id": "cmpl-1",
            "choices": [{"message": {"content": "Hello"}}],
            "usage": {"prompt_tokens": 3, "completion_tokens": used, "total_tokens": used + 3}
        });
        return Response::builder()
            .header(header::CONTENT_TYPE, "application/json")
            .body(Body::from(answer.to_string()))
            .unwrap();
    }
    let (tx, rx) = tokio::sync::mpsc::channel::<Bytes>(8);
    tokio::spawn(async move {
        let _ = tx.send(Bytes::from(FIRST)).await;
        up.release.notified().await;
        for part in [SECOND.to_string(), last_event(used), DONE.to_string()] {
            if tx.send(Bytes::from(part)).await.is_err() {
                return;
            }
        }
    });
    let stream = futures::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|b| (Ok::<_, Infallible>(b), rx))
    });
    Response::builder()
        .header(header::CONTENT_TYPE, "text/event-stream")
        .body(Body::from_stream(stream))
        .unwrap()
}

async fn fail() -> Response {
    Response::builder()
        .status(StatusCode::INTERNAL_SERVER_ERROR)
        .body(Body::from("upstream broke"))
        .unwrap()
}

async fn upstream() -> (String, Arc<Notify>) {
    let release = Arc::new(Notify::new());
    let app = axum::Router::new()
        .route("/v1/chat/completions", axum::routing::post(completions))
        .route("/v2/chat/completions", axum::routing::post(completions))
        .route("/v1/fail", axum::routing::post(fail))
        .with_state(Upstream {
            release: Arc::clone(&release),
        });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (format!("http://{addr}"), release)
}

fn config(upstream: &str) -> String {
    format!(
        r#"
[policies.tokens]
algorithm = "fixed-window"
limit = 1000
window = "1h"
identity = "ip"

[[routes]]
prefix = "/v1"
upstream = "{upstream}"

[routes.reserve]
policy = "tokens"
json_field = "max_tokens"
usage = "total_tokens"
ttl = "1m"

[[routes]]
prefix = "/v2"
upstream = "{upstream}"

[routes.reserve]
policy = "tokens"
header = "x-max-tokens"
default = 100
"#
    )
}

/// What the budget has left for the test client (its address is its identity).
async fn remaining(s: &support::TestServer) -> u64 {
    let res = client()
        .post(s.url("/v1/state"))
        .json(&json!({"policy": "tokens", "identity": "ip:127.0.0.1"}))
        .send()
        .await
        .unwrap();
    let v: Value = res.json().await.unwrap();
    v["remaining"].as_u64().unwrap_or_else(|| panic!("{v}"))
}

/// Waits (at most 5 s) until the budget has `want` left; settles run after the body ended.
async fn settles_to(s: &support::TestServer, want: u64) {
    let until = Instant::now() + Duration::from_secs(5);
    loop {
        let got = remaining(s).await;
        if got == want {
            return;
        }
        assert!(Instant::now() < until, "remaining {got}, expected {want}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn chat(proxy: &str, max_tokens: u64, used: u64, stream: bool) -> reqwest::RequestBuilder {
    client()
        .post(format!("{proxy}/v1/chat/completions"))
        .json(&json!({"model": "m", "max_tokens": max_tokens, "used": used, "stream": stream}))
}

#[tokio::test]
async fn a_stream_passes_through_unbuffered_and_settles_with_its_last_usage() {
    let (up, release) = upstream().await;
    let s = start(&config(&up)).await;
    let proxy = format!("http://{}", s.addrs.proxy.unwrap());

    let mut res = chat(&proxy, 500, 120, true).send().await.unwrap();
    assert_eq!(res.status(), 200);
    assert_eq!(res.headers()[header::CONTENT_TYPE], "text/event-stream");
    // The first event arrives while the upstream still holds the rest back.
    let first = tokio::time::timeout(Duration::from_secs(5), res.chunk())
        .await
        .expect("the first event was held back")
        .unwrap()
        .unwrap();
    assert_eq!(first, FIRST.as_bytes());
    // While it runs, the whole maximum is held.
    assert_eq!(remaining(&s).await, 500);
    release.notify_one();
    let mut rest = Vec::new();
    while let Some(chunk) = res.chunk().await.unwrap() {
        rest.extend_from_slice(&chunk);
    }
    let expected = format!("{SECOND}{}{DONE}", last_event(120));
    assert_eq!(String::from_utf8(rest).unwrap(), expected);
    // Settled with usage.total_tokens = 123: 377 of the 500 went back.
    settles_to(&s, 877).await;

    // A JSON answer settles the same way.
    let res = chat(&proxy, 300, 47, false).send().await.unwrap();
    assert_eq!(res.status(), 200);
    let v: Value = res.json().await.unwrap();
    assert_eq!(v["usage"]["total_tokens"], 50);
    settles_to(&s, 827).await;

    // The maximum from a header: a real cost beyond it (303 > 200) is charged as debt.
    let res = client()
        .post(format!("{proxy}/v2/chat/completions"))
        .header("x-max-tokens", "200")
        .json(&json!({"used": 300}))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 200);
    res.bytes().await.unwrap();
    settles_to(&s, 524).await;
    // No header: the route's default of 100 is reserved, 13 spent.
    let res = client()
        .post(format!("{proxy}/v2/chat/completions"))
        .json(&json!({"used": 10}))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 200);
    res.bytes().await.unwrap();
    settles_to(&s, 511).await;
    s.stop().await;
}

#[tokio::test]
async fn a_client_that_leaves_or_a_failed_upstream_spends_the_whole_maximum() {
    let (up, release) = upstream().await;
    let s = start(&config(&up)).await;
    let proxy = format!("http://{}", s.addrs.proxy.unwrap());

    let mut res = chat(&proxy, 200, 10, true).send().await.unwrap();
    let first = res.chunk().await.unwrap().unwrap();
    assert_eq!(first, FIRST.as_bytes());
    drop(res);
    release.notify_one();
    tokio::time::sleep(Duration::from_millis(300)).await;
    // Never refunded: the 200 stay spent although the upstream reported 13.
    assert_eq!(remaining(&s).await, 800);

    let res = client()
        .post(format!("{proxy}/v1/fail"))
        .json(&json!({"max_tokens": 300}))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 500);
    assert_eq!(res.text().await.unwrap(), "upstream broke");
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(remaining(&s).await, 500);

    // What is left is 500: a request that may cost 600 does not fit, and never reaches
    // the upstream.
    let res = chat(&proxy, 600, 1, false).send().await.unwrap();
    assert_eq!(res.status(), 429);
    assert!(res.headers().contains_key(header::RETRY_AFTER));
    // A request that declares no maximum is refused: this route has no default.
    let res = client()
        .post(format!("{proxy}/v1/chat/completions"))
        .json(&json!({"used": 1}))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 400);
    let p: Value = res.json().await.unwrap();
    assert!(p["detail"].as_str().unwrap().contains("max_tokens"), "{p}");
    assert_eq!(remaining(&s).await, 500);
    s.stop().await;
}

/// The errors of `[routes.reserve]`, each naming the file, line and field.
#[test]
fn a_bad_reservation_route_is_refused_with_file_line_and_field() {
    use sluice_server::config::Config;
    let errors = |reserve: &str| -> Vec<String> {
        let src = format!(
            "[policies.tokens]\nalgorithm = \"fixed-window\"\nlimit = 10\nwindow = \"1h\"\n\n\
             [policies.slots]\nalgorithm = \"concurrency\"\nlimit = 2\nlease = \"1m\"\n\n\
             [[routes]]\nprefix = \"/v1\"\nupstream = \"http://127.0.0.1:9\"\n\n\
             [routes.reserve]\n{reserve}\n"
        );
        match Config::parse(&src, "sluice.toml", None) {
            Ok(_) => panic!("expected errors in:\n{src}"),
            Err(e) => e.0.iter().map(ToString::to_string).collect(),
        }
    };
    let one = |reserve: &str, expected: &[&str]| {
        let e = errors(reserve);
        let text = e.join("\n");
        for part in expected {
            assert!(text.contains(part), "{part:?} not in:\n{text}");
        }
    };
    one(
        "policy = \"nope\"\njson_field = \"max_tokens\"",
        &[
            "sluice.toml:16",
            "routes[0].reserve.policy",
            "unknown policy \"nope\"",
        ],
    );
    one(
        "policy = \"slots\"\njson_field = \"max_tokens\"",
        &["routes[0].reserve.policy", "concurrency limit"],
    );
    one(
        "policy = \"tokens\"",
        &["routes[0].reserve", "exactly one of json_field"],
    );
    one(
        "policy = \"tokens\"\njson_field = \"a\"\nheader = \"x-max\"",
        &["exactly one of json_field"],
    );
    one(
        "policy = \"tokens\"\nheader = \"bad header\"",
        &[
            "sluice.toml:17",
            "routes[0].reserve.header",
            "invalid header name",
        ],
    );
    one(
        "policy = \"tokens\"\njson_field = \"max_tokens\"\nttl = \"2d\"",
        &["sluice.toml:18", "routes[0].reserve.ttl", "must be between"],
    );
    one(
        "policy = \"tokens\"\njson_field = \"max_tokens\"\ndefault = -1",
        &["routes[0].reserve.default", "whole number"],
    );
    one(
        "policy = \"tokens\"\njson_field = \"max_tokens\"\nmaximum = 5",
        &["maximum"],
    );
}
