//! `/v1/state` (read and reset), `/v1/charge` and `/v1/refund` over real HTTP on loopback,
//! on the embedded store and on two `sluice serve` instances sharing one redis-server.

use crate::support;
use crate::support::{Redis, client, start};
use serde_json::{Value, json};

const POLICIES: &str = r#"
[policies.burst]
algorithm = "token-bucket"
capacity = 5
rate = "1/h"

[policies.tokens]
algorithm = "fixed-window"
limit = 10000
window = "1h"

[policies.slots]
algorithm = "concurrency"
limit = 2
lease = "1m"
"#;

fn config(extra: &str) -> String {
    format!(
        "admin_token = \"adm1n\"\nidentity_hash_key = \"{}\"\n[server]\napi_token = \"app\"\n{extra}\n{POLICIES}",
        "ab".repeat(32)
    )
}

/// Sends `body` with `method` to `path` with bearer `token`; the status and the JSON answer.
async fn call(
    s: &support::TestServer,
    method: reqwest::Method,
    path: &str,
    token: &str,
    body: Value,
) -> (u16, Value) {
    let res = client()
        .request(method, s.url(path))
        .bearer_auth(token)
        .json(&body)
        .send()
        .await
        .unwrap();
    let status = res.status().as_u16();
    (status, res.json().await.unwrap())
}

async fn check(s: &support::TestServer, body: Value) -> Value {
    let (status, v) = call(s, reqwest::Method::POST, "/v1/check", "app", body).await;
    assert_eq!(status, 200);
    v
}

#[tokio::test]
async fn read_reset_charge_refund_on_the_embedded_store() {
    let s = start(&config("")).await;
    let who = json!({"policy": "burst", "identity": "user:1"});
    assert_eq!(
        check(
            &s,
            json!({"policy": "burst", "identity": "user:1", "cost": 3})
        )
        .await["remaining"],
        2
    );
    // Reading needs only the API token and consumes nothing.
    for _ in 0..2 {
        let (status, v) = call(&s, reqwest::Method::POST, "/v1/state", "app", who.clone()).await;
        assert_eq!(status, 200, "{v}");
        assert_eq!(
            (v["limit"].as_u64(), v["remaining"].as_u64()),
            (Some(5), Some(2))
        );
        // 3 tokens at 1 per hour, less the few ms (at most a second) since the check.
        let reset = v["reset_after_ms"].as_u64().unwrap();
        assert!(
            (3 * 3_600_000 - 1000..=3 * 3_600_000).contains(&reset),
            "{v}"
        );
    }
    // Changing state needs the admin token.
    let (status, v) = call(&s, reqwest::Method::DELETE, "/v1/state", "app", who.clone()).await;
    assert_eq!(status, 401, "{v}");
    assert!(v["detail"].as_str().unwrap().contains("admin_token"));
    let (status, v) = call(
        &s,
        reqwest::Method::DELETE,
        "/v1/state",
        "adm1n",
        who.clone(),
    )
    .await;
    assert_eq!((status, v["existed"].as_bool()), (200, Some(true)), "{v}");
    assert_eq!(
        check(
            &s,
            json!({"policy": "burst", "identity": "user:1", "cost": 5})
        )
        .await["allowed"],
        true
    );

    // The settle pattern: check an estimate of 2000, then settle the actual 1400 and 2600.
    let est = json!({"policy": "tokens", "identity": "user:1", "cost": 2000});
    assert_eq!(check(&s, est.clone()).await["remaining"], 8000);
    let refund = json!({"policy": "tokens", "identity": "user:1", "cost": 600});
    let (status, v) = call(&s, reqwest::Method::POST, "/v1/refund", "adm1n", refund).await;
    assert_eq!((status, v["remaining"].as_u64()), (200, Some(8600)), "{v}");
    assert_eq!(check(&s, est).await["remaining"], 6600);
    let charge = json!({"policy": "tokens", "identity": "user:1", "cost": 600});
    let (status, v) = call(&s, reqwest::Method::POST, "/v1/charge", "adm1n", charge).await;
    assert_eq!((status, v["remaining"].as_u64()), (200, Some(6000)), "{v}");
    let (_, v) = call(
        &s,
        reqwest::Method::POST,
        "/v1/refund",
        "app",
        json!({"policy": "tokens", "identity": "user:1", "cost": 1}),
    )
    .await;
    assert_eq!(v["status"], 401);

    // Bad input is named; a concurrency policy cannot be charged.
    for (body, needle) in [
        (
            json!({"policy": "tokens", "identity": "user:1"}),
            "missing \"cost\"",
        ),
        (
            json!({"policy": "nope", "identity": "u", "cost": 1}),
            "unknown policy",
        ),
        (
            json!({"policy": "tokens", "identity": "u", "cost": -1}),
            "negative",
        ),
        (
            json!({"policy": "tokens", "identity": "u", "cost": 1, "x": 1}),
            "unknown field",
        ),
        (
            json!({"policy": "slots", "identity": "u", "cost": 1}),
            "concurrency",
        ),
    ] {
        let (status, v) = call(
            &s,
            reqwest::Method::POST,
            "/v1/charge",
            "adm1n",
            body.clone(),
        )
        .await;
        assert_eq!(status, 400, "{body}: {v}");
        assert!(
            v["detail"].as_str().unwrap().contains(needle),
            "{body}: {v}"
        );
    }
    s.stop().await;
}

#[tokio::test]
async fn a_credential_names_the_same_bucket_as_in_check() {
    let s = start(&config("")).await;
    check(
        &s,
        json!({"policy": "burst", "credential": "sk_live_1", "cost": 4}),
    )
    .await;
    let (status, v) = call(
        &s,
        reqwest::Method::POST,
        "/v1/state",
        "app",
        json!({"policy": "burst", "credential": "sk_live_1"}),
    )
    .await;
    assert_eq!((status, v["remaining"].as_u64()), (200, Some(1)), "{v}");
    assert_ne!(v["identity"], "sk_live_1", "the raw secret is never echoed");
    let (_, v) = call(
        &s,
        reqwest::Method::POST,
        "/v1/refund",
        "adm1n",
        json!({"policy": "burst", "credential": "sk_live_1", "cost": 2}),
    )
    .await;
    assert_eq!(v["remaining"], 3);
    s.stop().await;
}

#[tokio::test]
async fn a_reset_and_a_refund_through_one_instance_reach_the_other() {
    let Some(redis) = Redis::start() else {
        panic!("redis-server is needed for this test");
    };
    let store = format!("[store]\nurl = \"{}\"\n", redis.url());
    let (a, b) = (start(&config(&store)).await, start(&config(&store)).await);
    let body = json!({"policy": "burst", "identity": "user:9", "cost": 5});
    assert_eq!(check(&a, body.clone()).await["allowed"], true);
    assert_eq!(check(&b, body.clone()).await["allowed"], false);
    let who = json!({"policy": "burst", "identity": "user:9"});
    let (status, v) = call(
        &a,
        reqwest::Method::DELETE,
        "/v1/state",
        "adm1n",
        who.clone(),
    )
    .await;
    assert_eq!((status, v["existed"].as_bool()), (200, Some(true)), "{v}");
    let (_, v) = call(&b, reqwest::Method::POST, "/v1/state", "app", who.clone()).await;
    assert_eq!(v["remaining"], 5);
    // Spend 4 on b, refund 3 on a: b sees 4 left.
    check(
        &b,
        json!({"policy": "burst", "identity": "user:9", "cost": 4}),
    )
    .await;
    let (_, v) = call(
        &a,
        reqwest::Method::POST,
        "/v1/refund",
        "adm1n",
        json!({"policy": "burst", "identity": "user:9", "cost": 3}),
    )
    .await;
    assert_eq!(v["remaining"], 4);
    assert_eq!(
        check(
            &b,
            json!({"policy": "burst", "identity": "user:9", "cost": 4})
        )
        .await["allowed"],
        true
    );
    a.stop().await;
    b.stop().await;
}
