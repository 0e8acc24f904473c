//! The HTTP decision API, health, metrics and admin endpoints over real HTTP on loopback.

use crate::support;
use crate::support::{client, start};
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

async fn check(base: &support::TestServer, body: Value) -> Value {
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
    s: &support::TestServer,
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

/// An upstream that answers every request with `200 ok`.
async fn ok_upstream() -> std::net::SocketAddr {
    let app = axum::Router::new().fallback(|| async { "ok" });
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(l, app).await });
    addr
}

/// Every key name in a Redis, read with `KEYS *` over RESP.
async fn redis_keys(port: u16) -> Vec<String> {
    use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
    let mut tcp = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .unwrap();
    tcp.write_all(b"*2\r\n$4\r\nKEYS\r\n$1\r\n*\r\n")
        .await
        .unwrap();
    let mut r = BufReader::new(tcp);
    let mut line = String::new();
    r.read_line(&mut line).await.unwrap();
    let n: usize = line.trim().strip_prefix('*').unwrap().parse().unwrap();
    let mut keys = Vec::with_capacity(n);
    for _ in 0..n {
        line.clear();
        r.read_line(&mut line).await.unwrap(); // $len
        line.clear();
        r.read_line(&mut line).await.unwrap();
        keys.push(line.trim_end().to_string());
    }
    keys.sort();
    keys
}

#[tokio::test]
async fn a_credential_is_hashed_exactly_as_the_proxy_hashes_an_api_key() {
    let redis =
        support::Redis::start().expect("redis-server is needed: run scripts/install-test-deps");
    let up = ok_upstream().await;
    let toml = format!(
        r#"
identity_hash_key = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"

[store]
url = "{}"

[policies.per-key]
algorithm = "fixed-window"
limit = 5
window = "1h"
identity = "api-key:x-api-key"

[[routes]]
prefix = "/api"
policies = ["per-key"]
upstream = "http://{up}"
"#,
        redis.url()
    );
    let s = start(&toml).await;
    let secret = "sk_live_abc123";
    let res = client()
        .get(s.proxy_url("/api/x"))
        .header("x-api-key", secret)
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 200);
    let rl = res.headers()["ratelimit"].to_str().unwrap().to_string();
    assert!(rl.starts_with("\"per-key\";r=4;"), "{rl}");
    let keys = redis_keys(redis.port).await;
    assert_eq!(keys.len(), 1, "{keys:?}");
    let proxy_key = keys[0].clone();

    // The same secret through the decision API lands in the same bucket, under the same key.
    let v = check(&s, json!({"policy": "per-key", "credential": secret})).await;
    assert_eq!(
        (v["allowed"].as_bool(), v["remaining"].as_u64()),
        (Some(true), Some(3))
    );
    assert_eq!(
        redis_keys(redis.port).await,
        std::slice::from_ref(&proxy_key)
    );
    assert!(
        !proxy_key.contains(secret) && !proxy_key.contains("sk_live"),
        "{proxy_key}"
    );
    assert!(proxy_key.starts_with("rl:{key:h"), "{proxy_key}");
    // Another secret is another bucket; a raw identity is never confused with a credential.
    let v = check(
        &s,
        json!({"policy": "per-key", "credential": "sk_live_other"}),
    )
    .await;
    assert_eq!(v["remaining"], 4);
    let v = check(&s, json!({"policy": "per-key", "identity": secret})).await;
    assert_eq!(v["remaining"], 4);

    for (body, needle) in [
        (
            json!({"policy": "per-key", "identity": "a", "credential": "b"}),
            "not both",
        ),
        (
            json!({"policy": "per-key", "credential": ""}),
            "must not be empty",
        ),
        (
            json!({"policy": "per-key", "credential": 42}),
            "\"credential\" must be a string",
        ),
        (json!({"policy": "per-key"}), "\"credential\""),
    ] {
        bad(&s, body.to_string().into(), "application/json", 400, needle).await;
    }
    s.stop().await;
}

#[tokio::test]
async fn release_checks_the_identity_when_one_is_given() {
    let s = start(CONFIG).await;
    let v = check(&s, json!({"policy": "uploads", "credential": "sk_a"})).await;
    let lease = v["lease"].as_str().unwrap().to_string();
    assert!(!lease.contains("sk_a"), "{lease}");
    let url = s.url("/v1/release");
    let release = |body: Value| client().post(&url).json(&body).send();
    let res = release(json!({"lease": lease, "credential": "sk_b"}))
        .await
        .unwrap();
    assert_eq!(res.status(), 400);
    let doc: Value = res.json().await.unwrap();
    assert!(
        doc["detail"]
            .as_str()
            .unwrap()
            .contains("not taken for this identity")
    );
    let res = release(json!({"lease": lease, "credential": "sk_a"}))
        .await
        .unwrap();
    assert_eq!(res.status(), 200);
    assert_eq!(res.json::<Value>().await.unwrap()["released"], true);
    s.stop().await;
}

#[tokio::test]
async fn every_client_error_is_problem_json() {
    let s = start(CONFIG).await;
    let c = client();
    let res = c.get(s.url("/v1/check")).send().await.unwrap();
    assert_eq!(res.status(), 405);
    assert_eq!(res.headers()["content-type"], "application/problem+json");
    assert!(res.headers()["allow"].to_str().unwrap().contains("POST"));
    let doc: Value = res.json().await.unwrap();
    assert_eq!(doc["status"], 405);
    assert_eq!(doc["title"], "Method Not Allowed");
    assert!(doc["detail"].as_str().unwrap().contains("GET"), "{doc}");
    for (req, status) in [
        (c.delete(s.url("/v1/release")), 405),
        (c.post(s.url("/healthz")), 405),
        (c.get(s.url("/nope")), 404),
        (c.get(s.url("/metrics")), 401),
        (c.post(s.url("/admin/reload")), 401),
        (
            c.post(s.url("/v1/check"))
                .header("content-type", "text/plain")
                .body("x"),
            415,
        ),
        (
            c.post(s.url("/v1/check"))
                .header("content-type", "application/json")
                .body("x".repeat(2000)),
            413,
        ),
        (c.post(s.url("/v1/check")).json(&json!({})), 400),
    ] {
        let res = req.send().await.unwrap();
        assert_eq!(res.status(), status);
        assert_eq!(
            res.headers()["content-type"],
            "application/problem+json",
            "{status}"
        );
        let doc: Value = res.json().await.unwrap();
        assert_eq!(doc["status"], status);
    }
    s.stop().await;
}

#[tokio::test]
async fn denials_tell_the_caller_not_to_cache() {
    let s = start(CONFIG).await;
    let v = check(&s, json!({"policy": "pair", "identity": "nc", "cost": 2})).await;
    assert_eq!(v["allowed"], true);
    assert!(v["headers"].get("Cache-Control").is_none(), "{v}");
    let v = check(&s, json!({"policy": "pair", "identity": "nc"})).await;
    assert_eq!(v["allowed"], false);
    assert_eq!(v["headers"]["Cache-Control"], "no-store");
    assert_eq!(
        v["headers"]["Retry-After"]
            .as_str()
            .map(|r| r.parse::<u64>().is_ok()),
        Some(true)
    );
    s.stop().await;
}

#[tokio::test]
async fn a_sharded_policy_reports_one_coherent_view() {
    // 8 per hour split over 4 shards of 2: the whole policy is shown everywhere.
    let s = start(
        r#"
[policies.hot]
algorithm = "fixed-window"
limit = 8
window = "1h"
shards = 4
"#,
    )
    .await;
    let v = check(&s, json!({"policy": "hot", "identity": "celebrity"})).await;
    assert_eq!(v["allowed"], true);
    // The shard that answered had 2 and has 1 left: 1 of 2 is 4 of 8.
    assert_eq!(
        (v["limit"].as_u64(), v["remaining"].as_u64()),
        (Some(8), Some(4))
    );
    assert_eq!(v["policies"][0]["limit"], 8);
    assert_eq!(v["policies"][0]["remaining"], 4);
    assert_eq!(v["headers"]["RateLimit-Policy"], "\"hot\";q=8;w=3600");
    assert!(
        v["headers"]["RateLimit"]
            .as_str()
            .unwrap()
            .starts_with("\"hot\";r=4;"),
        "{v}"
    );
    // Whatever shard answers, remaining is a whole-policy number: a multiple of 4, at most 8.
    for _ in 0..6 {
        let v = check(&s, json!({"policy": "hot", "identity": "celebrity"})).await;
        let r = v["remaining"].as_u64().unwrap();
        assert!(r <= 8 && r % 4 == 0, "{v}");
        assert_eq!(v["limit"], 8);
        let header = v["headers"]["RateLimit"].as_str().unwrap().to_string();
        assert!(header.starts_with(&format!("\"hot\";r={r};")), "{header}");
    }
    s.stop().await;
}

#[tokio::test]
async fn an_api_token_guards_the_decision_api() {
    let s = start(
        r#"
[server]
api_token = "t0ken-for-apps"

[policies.burst]
algorithm = "token-bucket"
capacity = 3
rate = "1/min"
"#,
    )
    .await;
    let c = client();
    let body = json!({"policy": "burst", "identity": "u"});
    for auth in [
        None,
        Some("wrong"),
        Some("t0ken-for-app"),
        Some("t0ken-for-apps2"),
    ] {
        let mut req = c.post(s.url("/v1/check")).json(&body);
        if let Some(a) = auth {
            req = req.bearer_auth(a);
        }
        let res = req.send().await.unwrap();
        assert_eq!(res.status(), 401, "{auth:?}");
        assert_eq!(res.headers()["content-type"], "application/problem+json");
        assert_eq!(res.headers()["www-authenticate"], "Bearer");
        let doc: Value = res.json().await.unwrap();
        assert!(
            doc["detail"].as_str().unwrap().contains("api_token"),
            "{doc}"
        );
    }
    let res = c
        .post(s.url("/v1/release"))
        .json(&json!({"lease": "x"}))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 401);
    // Nothing was spent by the refused calls: the right token sees a full bucket.
    let res = c
        .post(s.url("/v1/check"))
        .bearer_auth("t0ken-for-apps")
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 200);
    assert_eq!(res.json::<Value>().await.unwrap()["remaining"], 2);
    // The operator endpoints do not take the API token's place (nor need it).
    assert_eq!(c.get(s.url("/healthz")).send().await.unwrap().status(), 200);
    s.stop().await;
}
