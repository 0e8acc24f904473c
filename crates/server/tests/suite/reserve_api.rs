//! `/v1/reserve` and `/v1/settle` over real HTTP on loopback: on the embedded store, and on
//! two `sluice serve` instances sharing one redis-server (a reservation made on one is
//! settled on the other, once).

use crate::support;
use std::time::Duration;

use crate::support::{Redis, client, start};
use serde_json::{Value, json};

const POLICIES: &str = r#"
[policies.tokens]
algorithm = "fixed-window"
limit = 1000
window = "1h"

[policies.slots]
algorithm = "concurrency"
limit = 2
lease = "1m"
"#;

fn config(extra: &str) -> String {
    format!("[server]\napi_token = \"app\"\n{extra}\n{POLICIES}")
}

async fn post(s: &support::TestServer, path: &str, body: Value) -> (u16, Value) {
    let res = client()
        .post(s.url(path))
        .bearer_auth("app")
        .json(&body)
        .send()
        .await
        .unwrap();
    let status = res.status().as_u16();
    (status, res.json().await.unwrap())
}

async fn reserve(s: &support::TestServer, cost: u64, ttl: Option<u64>) -> Value {
    let mut body = json!({"policy": "tokens", "identity": "team:a", "cost": cost});
    if let Some(ttl) = ttl {
        body["ttl"] = json!(ttl);
    }
    let (status, v) = post(s, "/v1/reserve", body).await;
    assert_eq!(status, 200, "{v}");
    v
}

async fn remaining(s: &support::TestServer) -> u64 {
    let (status, v) = post(
        s,
        "/v1/state",
        json!({"policy": "tokens", "identity": "team:a"}),
    )
    .await;
    assert_eq!(status, 200, "{v}");
    v["remaining"].as_u64().unwrap()
}

/// Reserve, settle below and above the maximum, settle twice, forge, let one run out.
async fn the_reservation_story(a: &support::TestServer, b: &support::TestServer) {
    let v = reserve(a, 600, None).await;
    assert_eq!(v["allowed"], true, "{v}");
    assert_eq!(v["remaining"], 400, "{v}");
    assert_eq!(v["ttl_ms"], 60_000, "{v}");
    let id = v["reservation"].as_str().unwrap().to_string();
    assert_eq!(id.len(), 32);
    // 600 are held: 500 more do not fit, and a denial carries no reservation.
    let denied = reserve(b, 500, None).await;
    assert_eq!(denied["allowed"], false, "{denied}");
    assert_eq!(denied["reservation"], Value::Null);
    assert!(denied["headers"]["Retry-After"].is_string(), "{denied}");
    // Settled on the other instance with the real cost: 450 go back.
    let (status, s) = post(b, "/v1/settle", json!({"reservation": id, "cost": 150})).await;
    assert_eq!(status, 200, "{s}");
    assert_eq!(
        (
            s["max_cost"].as_u64(),
            s["refunded"].as_u64(),
            s["debt"].as_u64()
        ),
        (Some(600), Some(450), Some(0)),
        "{s}"
    );
    assert_eq!(s["remaining"], 850, "{s}");
    assert_eq!(remaining(a).await, 850);
    // Once only.
    for server in [a, b] {
        let (status, p) = post(server, "/v1/settle", json!({"reservation": id, "cost": 0})).await;
        assert_eq!(status, 409, "{p}");
        assert!(p["detail"].as_str().unwrap().contains("settled already"));
    }
    // A guessed id refunds nothing.
    let (status, p) = post(
        a,
        "/v1/settle",
        json!({"reservation": "0123456789abcdef0123456789abcdef", "cost": 0}),
    )
    .await;
    assert_eq!(status, 404, "{p}");
    assert_eq!(remaining(b).await, 850);
    // Overrunning the maximum is charged as debt and reported.
    let id = reserve(b, 100, None).await["reservation"]
        .as_str()
        .unwrap()
        .to_string();
    let (status, s) = post(a, "/v1/settle", json!({"reservation": id, "cost": 250})).await;
    assert_eq!(status, 200, "{s}");
    assert_eq!(
        (s["refunded"].as_u64(), s["debt"].as_u64()),
        (Some(0), Some(150))
    );
    assert_eq!(remaining(a).await, 600);
    // Unsettled at the end of its ttl: counted in full, and no longer refundable.
    let id = reserve(a, 200, Some(100)).await["reservation"]
        .as_str()
        .unwrap()
        .to_string();
    tokio::time::sleep(Duration::from_millis(250)).await;
    let (status, p) = post(b, "/v1/settle", json!({"reservation": id, "cost": 0})).await;
    assert_eq!(status, 404, "{p}");
    assert_eq!(remaining(b).await, 400);
}

#[tokio::test]
async fn reserve_and_settle_on_the_embedded_store() {
    let s = start(&config("")).await;
    the_reservation_story(&s, &s).await;
    s.stop().await;
}

#[tokio::test]
async fn a_reservation_made_on_one_instance_is_settled_on_another_once() {
    let Some(redis) = Redis::start() else {
        panic!("redis-server is needed (scripts/install-test-deps)");
    };
    let store = format!("[store]\nurl = \"{}\"\n", redis.url());
    let a = start(&config(&store)).await;
    let b = start(&config(&store)).await;
    the_reservation_story(&a, &b).await;
    a.stop().await;
    b.stop().await;
}

#[tokio::test]
async fn bad_reservations_are_answered_400_with_what_is_wrong() {
    let s = start(&config("")).await;
    let cases = [
        (
            json!({"policy": "tokens", "identity": "a"}),
            "missing \"cost\"",
        ),
        (
            json!({"policy": "nope", "identity": "a", "cost": 1}),
            "unknown policy",
        ),
        (
            json!({"policy": "tokens", "identity": "a", "cost": -1}),
            "must not be negative",
        ),
        (
            json!({"policy": "tokens", "identity": "a", "cost": 1, "ttl": 1}),
            "\"ttl\" must be between",
        ),
        (
            json!({"policy": "tokens", "identity": "a", "cost": 1, "extra": 1}),
            "unknown field \"extra\"",
        ),
        (
            json!({"policy": "slots", "identity": "a", "cost": 1}),
            "concurrency",
        ),
    ];
    for (body, expected) in cases {
        let (status, p) = post(&s, "/v1/reserve", body.clone()).await;
        assert_eq!(status, 400, "{body}: {p}");
        let detail = p["detail"].as_str().unwrap();
        assert!(detail.contains(expected), "{body}: {detail}");
    }
    for (body, expected) in [
        (json!({"cost": 1}), "missing \"reservation\""),
        (json!({"reservation": "x"}), "missing \"cost\""),
        (json!({"reservation": 5, "cost": 1}), "must be a string"),
    ] {
        let (status, p) = post(&s, "/v1/settle", body.clone()).await;
        assert_eq!(status, 400, "{body}: {p}");
        assert!(p["detail"].as_str().unwrap().contains(expected), "{p}");
    }
    // Both are decision calls: the API token is needed.
    let res = client()
        .post(s.url("/v1/reserve"))
        .json(&json!({"policy": "tokens", "identity": "a", "cost": 1}))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status().as_u16(), 401);
    // The OpenAPI document describes both.
    let doc: Value = client()
        .get(s.url("/openapi.json"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert!(doc["paths"]["/v1/reserve"]["post"].is_object());
    assert!(doc["paths"]["/v1/settle"]["post"]["responses"]["409"].is_object());
    assert!(
        doc["components"]["schemas"]["ReserveResponse"]["properties"]["reservation"].is_object()
    );
    s.stop().await;
}
