//! The HTTP decision API, health, metrics and admin endpoints over real HTTP on loopback.

mod common;

use common::{client, start};
use serde_json::{Value, json};

const CONFIG: &str = r#"
admin_token = "s3cret"

[server]
max_body_bytes = 1024
max_policies_per_check = 4

[policies.burst]
algorithm = "token-bucket"
capacity = 3
rate = "1/min"

[policies.pair]
algorithm = "fixed-window"
limit = 2
window = "1h"

[policies.wide]
algorithm = "token-bucket"
capacity = 100
rate = "1/min"

[policies.uploads]
algorithm = "concurrency"
limit = 1
lease = "1m"

[policies.trial]
algorithm = "fixed-window"
limit = 1
window = "1h"
shadow = true
"#;

async fn check(base: &common::TestServer, body: Value) -> Value {
    let res = client()
        .post(base.url("/v1/check"))
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 200, "{body}");
    res.json().await.unwrap()
}

#[tokio::test]
async fn single_policy_counts_down_then_denies_with_headers() {
    let s = start(CONFIG).await;
    for expect in [2, 1, 0] {
        let v = check(
            &s,
            json!({"policy": "burst", "identity": "user:1", "cost": 1}),
        )
        .await;
        assert_eq!(v["allowed"], true);
        assert_eq!(v["limit"], 3);
        assert_eq!(v["remaining"], expect);
        assert_eq!(v["retry_after_ms"], 0);
        assert_eq!(v["verdict"], "decided");
        assert_eq!(v["headers"]["RateLimit-Policy"], "\"burst\";q=3;w=180");
        assert_eq!(
            v["headers"]["RateLimit"],
            format!("\"burst\";r={expect};t={}", (3 - expect) * 60)
        );
        assert!(v["headers"].get("Retry-After").is_none());
        assert_eq!(v["lease"], Value::Null);
    }
    let v = check(&s, json!({"policy": "burst", "identity": "user:1"})).await;
    assert_eq!(v["allowed"], false);
    assert_eq!(v["remaining"], 0);
    let retry = v["retry_after_ms"].as_u64().unwrap();
    assert!(retry > 50_000 && retry <= 60_000, "{retry}");
    assert_eq!(v["headers"]["Retry-After"], "60");
    assert_eq!(v["policies"][0]["reason"], "limited");
    // Another identity has its own bucket; cost 0 only looks.
    let v = check(
        &s,
        json!({"policy": "burst", "identity": "user:2", "cost": 0}),
    )
    .await;
    assert_eq!(
        (v["allowed"].as_bool(), v["remaining"].as_u64()),
        (Some(true), Some(3))
    );
    s.stop().await;
}

#[tokio::test]
async fn several_policies_are_all_or_nothing() {
    let s = start(CONFIG).await;
    for _ in 0..2 {
        let v = check(&s, json!({"policies": ["wide", "pair"], "identity": "k"})).await;
        assert_eq!(v["allowed"], true);
    }
    let v = check(&s, json!({"policies": ["wide", "pair"], "identity": "k"})).await;
    assert_eq!(v["allowed"], false);
    assert_eq!(v["limit"], 2, "the denying policy's numbers");
    assert_eq!(v["policies"][0]["reason"], "other_limit_denied");
    assert_eq!(v["policies"][1]["reason"], "limited");
    assert!(
        v["headers"]["RateLimit-Policy"]
            .as_str()
            .unwrap()
            .contains("\"wide\";q=100")
    );
    // The denied check consumed nothing from "wide": 2 of 100 used.
    let v = check(&s, json!({"policy": "wide", "identity": "k", "cost": 0})).await;
    assert_eq!(v["remaining"], 98);
    s.stop().await;
}

#[tokio::test]
async fn concurrency_leases_are_released() {
    let s = start(CONFIG).await;
    let v = check(&s, json!({"policy": "uploads", "identity": "u"})).await;
    assert_eq!(v["allowed"], true);
    let lease = v["lease"].as_str().unwrap().to_string();
    let v = check(&s, json!({"policy": "uploads", "identity": "u"})).await;
    assert_eq!(v["allowed"], false, "one lease at a time");
    let res = client()
        .post(s.url("/v1/release"))
        .json(&json!({"lease": lease}))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 200);
    assert_eq!(res.json::<Value>().await.unwrap()["released"], true);
    let v = check(&s, json!({"policy": "uploads", "identity": "u"})).await;
    assert_eq!(v["allowed"], true, "the slot is free again");
    // Releasing twice says it was no longer held; a forged token is refused.
    let res = client()
        .post(s.url("/v1/release"))
        .json(&json!({"lease": lease}))
        .send()
        .await
        .unwrap();
    assert_eq!(res.json::<Value>().await.unwrap()["released"], false);
    let forged = lease.replace("uploads", "burst");
    let res = client()
        .post(s.url("/v1/release"))
        .json(&json!({"lease": forged}))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 400);
    s.stop().await;
}

#[tokio::test]
async fn shadow_policies_count_but_never_deny() {
    let s = start(CONFIG).await;
    for i in 0..3 {
        let v = check(&s, json!({"policy": "trial", "identity": "shadowed"})).await;
        assert_eq!(v["allowed"], true);
        assert_eq!(v["policies"][0]["shadow"], true);
        assert_eq!(v["policies"][0]["allowed"], i == 0);
        assert!(
            v["headers"].as_object().unwrap().is_empty(),
            "shadow policies are invisible to clients"
        );
    }
    let metrics = client()
        .get(s.url("/metrics"))
        .bearer_auth("s3cret")
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let line = metrics
        .lines()
        .find(|l| {
            l.starts_with("sluice_decisions_total")
                && l.contains("policy=\"trial\"")
                && l.contains("shadow_denied")
        })
        .unwrap_or_else(|| panic!("no shadow_denied line in\n{metrics}"));
    let n: f64 = line.rsplit(' ').next().unwrap().parse().unwrap();
    assert!(n >= 2.0, "{line}");
    s.stop().await;
}

#[tokio::test]
async fn global_shadow_never_denies() {
    let s = start(
        "shadow = true\n[policies.one]\nalgorithm = \"fixed-window\"\nlimit = 1\nwindow = \"1h\"\n",
    )
    .await;
    for i in 0..3 {
        let v = check(&s, json!({"policy": "one", "identity": "x"})).await;
        assert_eq!(v["allowed"], true);
        assert_eq!(
            v["policies"][0]["allowed"],
            i == 0,
            "the decision is still computed"
        );
        assert_eq!(v["policies"][0]["shadow"], true);
    }
    s.stop().await;
}

async fn bad(
    s: &common::TestServer,
    body: reqwest::Body,
    content_type: &str,
    status: u16,
    needle: &str,
) {
    let res = client()
        .post(s.url("/v1/check"))
        .header("content-type", content_type)
        .body(body)
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), status, "{needle}");
    assert_eq!(res.headers()["content-type"], "application/problem+json");
    let v: Value = res.json().await.unwrap();
    assert_eq!(v["status"], status);
    let detail = v["detail"].as_str().unwrap();
    assert!(
        detail.contains(needle),
        "{detail:?} should mention {needle:?}"
    );
}

#[tokio::test]
async fn malformed_requests_get_problem_json() {
    let s = start(CONFIG).await;
    let j = "application/json";
    let cases: Vec<(String, u16, &str)> = vec![
        ("{\"policy\": \"burst\", ".into(), 400, "invalid JSON"),
        ("[1, 2]".into(), 400, "JSON object"),
        (
            json!({"policy": "nope", "identity": "a"}).to_string(),
            400,
            "unknown policy \"nope\"",
        ),
        (
            json!({"policy": 5, "identity": "a"}).to_string(),
            400,
            "\"policy\" must be a string",
        ),
        (
            json!({"policy": "burst", "identity": 7}).to_string(),
            400,
            "\"identity\" must be a string",
        ),
        (
            json!({"policy": "burst"}).to_string(),
            400,
            "missing \"identity\"",
        ),
        (
            json!({"identity": "a"}).to_string(),
            400,
            "missing \"policy\"",
        ),
        (
            json!({"policy": "burst", "identity": "a", "cost": -1}).to_string(),
            400,
            "must not be negative",
        ),
        (
            json!({"policy": "burst", "identity": "a", "cost": 1.5}).to_string(),
            400,
            "whole number",
        ),
        (
            json!({"policy": "burst", "identity": "a", "cost": "1"}).to_string(),
            400,
            "non-negative integer",
        ),
        (
            json!({"policy": "burst", "identity": ""}).to_string(),
            400,
            "must not be empty",
        ),
        (
            json!({"policy": "burst", "identity": "x".repeat(513)}).to_string(),
            400,
            "the most is 512",
        ),
        (
            json!({"policy": "burst", "identity": "a", "extra": 1}).to_string(),
            400,
            "unknown field \"extra\"",
        ),
        (
            json!({"policy": "burst", "policies": ["burst"], "identity": "a"}).to_string(),
            400,
            "not both",
        ),
        (
            json!({"policies": [], "identity": "a"}).to_string(),
            400,
            "must not be empty",
        ),
        (
            json!({"policies": ["burst", "burst"], "identity": "a"}).to_string(),
            400,
            "listed twice",
        ),
        (
            json!({"policies": ["a", "b", "c", "d", "e"], "identity": "a"}).to_string(),
            400,
            "at most 4 policies",
        ),
    ];
    for (body, status, needle) in cases {
        bad(&s, body.into(), j, status, needle).await;
    }
    // Larger than server.max_body_bytes: announced, and streamed without a length.
    let big = json!({"policy": "burst", "identity": "a", "pad": "x".repeat(2000)}).to_string();
    bad(&s, big.clone().into(), j, 413, "larger than 1024 bytes").await;
    {
        // Chunked, so the server only learns the size by reading.
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut tcp = tokio::net::TcpStream::connect(s.addrs.http).await.unwrap();
        let mut req = String::from(
            "POST /v1/check HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n",
        );
        for c in big.as_bytes().chunks(100) {
            req.push_str(&format!(
                "{:x}\r\n{}\r\n",
                c.len(),
                std::str::from_utf8(c).unwrap()
            ));
        }
        req.push_str("0\r\n\r\n");
        tcp.write_all(req.as_bytes()).await.unwrap();
        let mut out = Vec::new();
        let _ = tokio::time::timeout(std::time::Duration::from_secs(5), tcp.read_to_end(&mut out))
            .await;
        let out = String::from_utf8_lossy(&out);
        assert!(out.starts_with("HTTP/1.1 413"), "{out}");
        assert!(out.contains("application/problem+json"), "{out}");
    }
    bad(
        &s,
        "policy=burst".into(),
        "application/x-www-form-urlencoded",
        415,
        "application/json",
    )
    .await;
    // Release validates too.
    let res = client()
        .post(s.url("/v1/release"))
        .json(&json!({"lease": "garbage"}))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 400);
    let res = client()
        .post(s.url("/v1/release"))
        .json(&json!({}))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 400);
    s.stop().await;
}

#[tokio::test]
async fn health_metrics_openapi_and_admin_token() {
    let s = start(CONFIG).await;
    let c = client();
    assert_eq!(c.get(s.url("/healthz")).send().await.unwrap().status(), 200);
    let ready = c.get(s.url("/readyz")).send().await.unwrap();
    assert_eq!(ready.status(), 200);
    let ready: Value = ready.json().await.unwrap();
    assert_eq!(
        (ready["ready"].as_bool(), ready["store"].as_str()),
        (Some(true), Some("memory"))
    );
    let doc: Value = c
        .get(s.url("/openapi.json"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(doc["openapi"], "3.1.0");
    assert!(doc["paths"]["/v1/check"]["post"].is_object());

    // Admin endpoints need the token.
    let res = c.get(s.url("/metrics")).send().await.unwrap();
    assert_eq!(res.status(), 401);
    let res = c
        .get(s.url("/metrics"))
        .bearer_auth("wrong")
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 401);
    check(&s, json!({"policy": "burst", "identity": "metrics"})).await;
    let res = c
        .get(s.url("/metrics"))
        .bearer_auth("s3cret")
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 200);
    let text = res.text().await.unwrap();
    assert!(
        text.contains("sluice_decisions_total{policy=\"burst\",outcome=\"allowed\"}"),
        "{text}"
    );
    assert!(
        text.contains("sluice_store_duration_seconds_bucket"),
        "latency is a histogram:\n{text}"
    );
    assert!(text.contains("sluice_api_requests_total"), "{text}");
    assert_eq!(
        c.post(s.url("/admin/reload"))
            .send()
            .await
            .unwrap()
            .status(),
        401
    );
    assert_eq!(c.get(s.url("/nope")).send().await.unwrap().status(), 404);
    s.stop().await;
}
