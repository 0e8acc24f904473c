//! Overrides and plans, bans and allow/deny lists through `/v1/*` over real HTTP on loopback:
//! on the embedded store, and on two `sluice serve` instances sharing one redis-server (a
//! change made through one is obeyed by the other within a second).

use crate::support;
use std::time::{Duration, Instant};

use crate::support::{Redis, client, start};
use reqwest::Method;
use serde_json::{Value, json};

const POLICIES: &str = r#"
[policies.api]
algorithm = "fixed-window"
limit = 3
window = "1h"
ban = { after = 2, within = "1m", duration = "2s", multiplier = 3.0, max = "1h" }

[policies.other]
algorithm = "fixed-window"
limit = 3
window = "1h"

[plans.gold.api]
limit = 6

[lists]
deny = ["198.51.100.0/24"]
"#;

fn config(extra: &str) -> String {
    format!(
        "admin_token = \"adm1n\"\nidentity_hash_key = \"{}\"\n{extra}\n{POLICIES}",
        "ab".repeat(32)
    )
}

async fn call(s: &support::TestServer, method: Method, path: &str, body: Value) -> (u16, Value) {
    let res = client()
        .request(method, s.url(path))
        .bearer_auth("adm1n")
        .json(&body)
        .send()
        .await
        .unwrap();
    let status = res.status().as_u16();
    (status, res.json().await.unwrap())
}

async fn check(s: &support::TestServer, policy: &str, who: &str) -> Value {
    let body = json!({"policy": policy, "identity": who});
    let (status, v) = call(s, Method::POST, "/v1/check", body).await;
    assert_eq!(status, 200, "{v}");
    v
}

/// How many of `n` checks are admitted.
async fn admitted(s: &support::TestServer, policy: &str, who: &str, n: usize) -> usize {
    let mut ok = 0;
    for _ in 0..n {
        if check(s, policy, who).await["allowed"] == true {
            ok += 1;
        }
    }
    ok
}

fn reason(v: &Value) -> &str {
    v["policies"][0]["reason"].as_str().unwrap_or("")
}

#[tokio::test]
async fn overrides_plans_bans_and_lists_on_the_embedded_store() {
    let s = start(&config("")).await;

    // Without the admin token nothing changes.
    let res = client()
        .post(s.url("/v1/overrides"))
        .json(&json!({"policy": "api", "identity": "u1", "plan": "gold"}))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 401);

    // An override keeps the state: 2 used of 3, then limit 10 leaves 8.
    assert_eq!(admitted(&s, "api", "u1", 2).await, 2);
    let (status, v) = call(
        &s,
        Method::POST,
        "/v1/overrides",
        json!({"policy": "api", "identity": "u1", "params": {"limit": 10}, "ttl": "1h"}),
    )
    .await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["params"]["limit"], 10);
    assert_eq!(admitted(&s, "api", "u1", 12).await, 8);
    let (status, v) = call(
        &s,
        Method::GET,
        "/v1/overrides?policy=api&identity=u1",
        json!({}),
    )
    .await;
    assert_eq!(
        (status, v["params"]["limit"].as_u64()),
        (200, Some(10)),
        "{v}"
    );
    let (status, _) = call(
        &s,
        Method::DELETE,
        "/v1/overrides",
        json!({"policy": "api", "identity": "u1"}),
    )
    .await;
    assert_eq!(status, 200);
    let (status, v) = call(
        &s,
        Method::GET,
        "/v1/overrides?policy=api&identity=u1",
        json!({}),
    )
    .await;
    assert_eq!(status, 404, "{v}");

    // A plan, and a credential hashed as /v1/check hashes it.
    let (status, v) = call(
        &s,
        Method::POST,
        "/v1/overrides",
        json!({"policy": "api", "credential": "sk_1", "plan": "gold"}),
    )
    .await;
    assert_eq!(status, 200, "{v}");
    assert_ne!(v["identity"], "sk_1");
    let mut ok = 0;
    for _ in 0..8 {
        let (_, v) = call(
            &s,
            Method::POST,
            "/v1/check",
            json!({"policy": "api", "credential": "sk_1"}),
        )
        .await;
        ok += usize::from(v["allowed"] == true);
    }
    assert_eq!(ok, 6, "the gold plan's limit");

    // Bad input is named.
    for (body, needle) in [
        (
            json!({"policy": "api", "identity": "u", "params": {"capacity": 3}}),
            "capacity",
        ),
        (
            json!({"policy": "api", "identity": "u", "plan": "silver"}),
            "silver",
        ),
        (
            json!({"policy": "nope", "identity": "u", "plan": "gold"}),
            "unknown policy",
        ),
        (json!({"policy": "api", "identity": "u"}), "params"),
    ] {
        let (status, v) = call(&s, Method::POST, "/v1/overrides", body).await;
        assert_eq!(status, 400, "{v}");
        assert!(v["detail"].as_str().unwrap().contains(needle), "{v}");
    }

    // A manual ban for one policy, with the time left.
    let (status, v) = call(
        &s,
        Method::POST,
        "/v1/bans",
        json!({"identity": "u2", "duration": "30s", "policies": ["other"]}),
    )
    .await;
    assert_eq!(status, 200, "{v}");
    let v = check(&s, "other", "u2").await;
    assert_eq!(
        (v["allowed"].as_bool(), reason(&v)),
        (Some(false), "banned"),
        "{v}"
    );
    let wait = v["retry_after_ms"].as_u64().unwrap();
    assert!((29_000..=30_000).contains(&wait), "{v}");
    assert_eq!(
        check(&s, "api", "u2").await["allowed"],
        true,
        "out of the ban's scope"
    );
    let (status, _) = call(&s, Method::DELETE, "/v1/bans", json!({"identity": "u2"})).await;
    assert_eq!(status, 200);
    assert_eq!(check(&s, "other", "u2").await["allowed"], true);
    let (status, _) = call(&s, Method::DELETE, "/v1/bans", json!({"identity": "u2"})).await;
    assert_eq!(status, 404);

    // Lists: the file's deny network, a runtime allow entry.
    let v = check(&s, "api", "ip:198.51.100.20").await;
    assert_eq!(
        (v["allowed"].as_bool(), reason(&v)),
        (Some(false), "denied"),
        "{v}"
    );
    let (status, _) = call(
        &s,
        Method::POST,
        "/v1/lists/allow",
        json!({"entry": "vip", "ttl": 60}),
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(admitted(&s, "other", "vip", 10).await, 10);
    let (status, _) = call(
        &s,
        Method::POST,
        "/v1/lists/deny",
        json!({"entry": "ip:203.0.113.5"}),
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(reason(&check(&s, "other", "203.0.113.5").await), "denied");
    let (status, _) = call(
        &s,
        Method::DELETE,
        "/v1/lists/deny",
        json!({"entry": "203.0.113.5"}),
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(check(&s, "other", "203.0.113.5").await["allowed"], true);
    s.stop().await;
}

/// Waits (at most `limit`) until `f` holds; the time it took.
async fn within<F, Fut>(what: &str, limit: Duration, mut f: F) -> Duration
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let start = Instant::now();
    while start.elapsed() < limit {
        if f().await {
            return start.elapsed();
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("{what}: not within {limit:?}");
}

#[tokio::test]
async fn a_change_through_one_instance_is_obeyed_by_the_other_within_a_second() {
    let Some(redis) = Redis::start() else {
        panic!("redis-server is needed for this test");
    };
    let store = format!("[store]\nurl = \"{}\"\n", redis.url());
    let (a, b) = (start(&config(&store)).await, start(&config(&store)).await);

    // Override through a, obeyed by b.
    assert_eq!(admitted(&b, "other", "o1", 4).await, 3);
    let (status, v) = call(
        &a,
        Method::POST,
        "/v1/overrides",
        json!({"policy": "other", "identity": "o1", "params": {"limit": 5}}),
    )
    .await;
    assert_eq!(status, 200, "{v}");
    let took = within("step 1", Duration::from_secs(1), || async {
        check(&b, "other", "o1").await["allowed"] == true
    })
    .await;
    println!("override reached the other instance in {took:?}");
    assert_eq!(admitted(&b, "other", "o1", 3).await, 1, "5 in all, 4 used");
    let (status, v) = call(
        &b,
        Method::GET,
        "/v1/overrides?policy=other&identity=o1",
        json!({}),
    )
    .await;
    assert_eq!(
        (status, v["params"]["limit"].as_u64()),
        (200, Some(5)),
        "{v}"
    );

    // A ban escalates: 2 denials ban for 2 s, the next 2 denials for 6 s; seen by both.
    assert_eq!(admitted(&a, "api", "f1", 3).await, 3);
    assert_eq!(reason(&check(&a, "api", "f1").await), "limited");
    assert_eq!(reason(&check(&b, "api", "f1").await), "limited");
    within("step 2", Duration::from_secs(1), || async {
        reason(&check(&a, "api", "f1").await) == "banned"
    })
    .await;
    let first = check(&a, "api", "f1").await["retry_after_ms"]
        .as_u64()
        .unwrap();
    assert!((1_000..=2_000).contains(&first), "first ban {first}");
    within("step 3", Duration::from_secs(1), || async {
        reason(&check(&b, "api", "f1").await) == "banned"
    })
    .await;
    tokio::time::sleep(Duration::from_millis(first + 50)).await;
    assert_eq!(reason(&check(&b, "api", "f1").await), "limited");
    assert_eq!(reason(&check(&b, "api", "f1").await), "limited");
    within("step 4", Duration::from_secs(1), || async {
        reason(&check(&a, "api", "f1").await) == "banned"
    })
    .await;
    let second = check(&a, "api", "f1").await["retry_after_ms"]
        .as_u64()
        .unwrap();
    assert!(
        (5_000..=6_000).contains(&second),
        "second ban {second} is 3x the first"
    );

    // A manual ban and the lists, set on one, applied by the other.
    call(
        &a,
        Method::POST,
        "/v1/bans",
        json!({"identity": "m1", "duration": "1m"}),
    )
    .await;
    within("step 5", Duration::from_secs(1), || async {
        reason(&check(&b, "other", "m1").await) == "banned"
    })
    .await;
    call(&b, Method::DELETE, "/v1/bans", json!({"identity": "m1"})).await;
    // m1 may have used its 3 while the ban was on its way: lifted means no longer banned.
    within("step 6", Duration::from_secs(1), || async {
        reason(&check(&a, "other", "m1").await) != "banned"
    })
    .await;
    assert_eq!(admitted(&a, "other", "l1", 5).await, 3);
    call(
        &a,
        Method::POST,
        "/v1/lists/allow",
        json!({"entry": "l1", "ttl": "1m"}),
    )
    .await;
    within("step 7", Duration::from_secs(1), || async {
        check(&b, "other", "l1").await["allowed"] == true
    })
    .await;
    call(
        &b,
        Method::POST,
        "/v1/lists/deny",
        json!({"entry": "10.1.0.0/16"}),
    )
    .await;
    within("step 8", Duration::from_secs(1), || async {
        reason(&check(&a, "other", "ip:10.1.2.3").await) == "denied"
    })
    .await;
    a.stop().await;
    b.stop().await;
}

#[tokio::test]
async fn the_proxy_answers_403_to_a_denied_client_and_429_to_a_banned_key() {
    proxy_obeys_lists_and_bans(None).await;
}

/// The same through the proxy of one `sluice serve` while the changes go through another
/// instance on the same redis-server.
#[tokio::test]
async fn the_proxy_obeys_lists_and_bans_set_through_another_instance_on_redis() {
    let Some(redis) = Redis::start() else {
        panic!("redis-server is needed for this test");
    };
    proxy_obeys_lists_and_bans(Some(&redis.url())).await;
}

/// A deny entry and a ban by credential, each set through the decision API, reach the
/// proxy's routes. With `redis`, they are set through a second instance on that store.
async fn proxy_obeys_lists_and_bans(redis: Option<&str>) {
    let up = {
        let app = axum::Router::new().fallback(|| async { "upstream" });
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(l, app).await });
        addr
    };
    let store = redis.map_or_else(String::new, |u| format!("[store]\nurl = \"{u}\"\n"));
    let routes = format!(
        r#"
{store}
[policies.per-ip]
algorithm = "fixed-window"
limit = 100
window = "1h"

[policies.per-key]
algorithm = "fixed-window"
limit = 100
window = "1h"
identity = "api-key:x-api-key"

[[routes]]
prefix = "/ip"
policies = ["per-ip"]
upstream = "http://{up}"

[[routes]]
prefix = "/key"
policies = ["per-key"]
upstream = "http://{up}"
"#
    );
    let s = start(&config(&routes)).await;
    let other = match redis {
        Some(_) => Some(start(&config(&routes)).await),
        None => None,
    };
    // Where changes are made: the other instance when there is one.
    let admin = other.as_ref().unwrap_or(&s);
    let c = client();
    let get = |path: &'static str| {
        let c = c.clone();
        let url = s.proxy_url(path);
        async move {
            let res = c.get(url).header("x-api-key", "k1").send().await.unwrap();
            let status = res.status().as_u16();
            let retry = res
                .headers()
                .get("retry-after")
                .map(|v| v.to_str().unwrap().to_string());
            (status, retry, res.text().await.unwrap())
        }
    };
    let second = Duration::from_millis(1500);
    assert_eq!(get("/ip/a").await.0, 200);
    let (status, _) = call(
        admin,
        Method::POST,
        "/v1/lists/deny",
        json!({"entry": "127.0.0.1"}),
    )
    .await;
    assert_eq!(status, 200);
    within("deny entry", second, || async {
        get("/ip/a").await.0 == 403
    })
    .await;
    let (status, retry, body) = get("/ip/a").await;
    assert_eq!((status, retry), (403, None), "{body}");
    assert!(body.contains("deny list"), "{body}");
    call(
        admin,
        Method::DELETE,
        "/v1/lists/deny",
        json!({"entry": "127.0.0.1"}),
    )
    .await;
    within("deny entry removed", second, || async {
        get("/ip/a").await.0 == 200
    })
    .await;

    // A ban by credential reaches the bucket the proxy keys by that API key.
    let (status, v) = call(
        admin,
        Method::POST,
        "/v1/bans",
        json!({"credential": "k1", "duration": "2m", "policies": ["per-key"]}),
    )
    .await;
    assert_eq!(status, 200, "{v}");
    within("ban", second, || async { get("/key/a").await.0 == 429 }).await;
    let (status, retry, body) = get("/key/a").await;
    let retry: u64 = retry.expect("Retry-After").parse().unwrap();
    assert_eq!(status, 429, "{body}");
    assert!((119..=120).contains(&retry), "the ban's time left: {retry}");
    assert!(body.contains("banned"), "{body}");
    assert_eq!(get("/ip/a").await.0, 200, "the ban is scoped to per-key");
    s.stop().await;
    if let Some(o) = other {
        o.stop().await;
    }
}
