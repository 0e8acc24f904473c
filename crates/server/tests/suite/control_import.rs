//! Bulk import, table limits and entry validation of the control endpoints over real HTTP
//! on loopback: a 10,000-entry import is all or nothing and names its bad entries, a full
//! table answers 409 naming the table and its maximum, a prefix length beyond the family's is
//! refused; on two `sluice serve` instances sharing one redis-server, an import through one
//! is in force on the other within a second and both report their snapshot's age.

use crate::support;
use std::time::{Duration, Instant};

use crate::support::{Redis, client, start};
use reqwest::Method;
use serde_json::{Value, json};

const POLICIES: &str = r#"
[policies.api]
algorithm = "fixed-window"
limit = 1000
window = "1h"
"#;

fn config(extra: &str) -> String {
    format!("admin_token = \"adm1n\"\n{extra}\n{POLICIES}")
}

/// A call as a trusted operator makes it: the admin token, a JSON body, a loopback host.
async fn call(
    s: &support::TestServer,
    method: Method,
    path: &str,
    body: &Value,
) -> (u16, String, Value) {
    let res = client()
        .request(method, s.url(path))
        .bearer_auth("adm1n")
        .header("content-type", "application/json")
        .header("host", "127.0.0.1")
        .body(body.to_string())
        .send()
        .await
        .unwrap();
    let status = res.status().as_u16();
    let ct = res
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_string();
    (status, ct, res.json().await.unwrap_or(Value::Null))
}

async fn reason(s: &support::TestServer, who: &str) -> String {
    let body = json!({"policy": "api", "identity": who});
    let (status, _, v) = call(s, Method::POST, "/v1/check", &body).await;
    assert_eq!(status, 200, "{v}");
    v["policies"][0]["reason"]
        .as_str()
        .unwrap_or("")
        .to_string()
}

fn entries(n: usize, from: usize) -> Vec<Value> {
    (from..from + n)
        .map(|i| json!(format!("ip:10.{}.{}.{}", i >> 16, (i >> 8) & 255, i & 255)))
        .collect()
}

#[tokio::test]
async fn a_bulk_import_is_all_or_nothing_and_names_its_bad_entries() {
    let s = start(&config("")).await;
    let mut list = entries(10_000, 0);
    list[5_000] = json!("1.2.3.4/33");
    list[7_000] = json!(17);
    let body = json!({ "entries": list });
    assert!(
        body.to_string().len() > 16 * 1024,
        "larger than /v1/check's limit"
    );
    let (status, ct, v) = call(&s, Method::POST, "/v1/lists/deny", &body).await;
    assert_eq!(status, 400, "{v}");
    assert_eq!(ct, "application/problem+json");
    let detail = v["detail"].as_str().unwrap();
    assert!(
        detail.contains("2 of 10000") && detail.contains("none was added"),
        "{detail}"
    );
    assert_eq!(v["errors"][0]["index"], 5_000);
    assert_eq!(v["errors"][0]["entry"], "1.2.3.4/33");
    assert!(
        v["errors"][0]["error"]
            .as_str()
            .unwrap()
            .contains("from 0 to 32"),
        "{v}"
    );
    assert_eq!(v["errors"][1]["index"], 7_000);
    // Nothing of the call was added.
    assert_eq!(reason(&s, "ip:10.0.0.1").await, "");

    // The same call without the bad entries: all 10,000 in force at once.
    let body = json!({ "entries": entries(10_000, 0), "ttl": "1h" });
    let (status, _, v) = call(&s, Method::POST, "/v1/lists/deny", &body).await;
    assert_eq!((status, v["added"].as_u64()), (200, Some(10_000)), "{v}");
    assert_eq!(reason(&s, "ip:10.0.0.1").await, "denied");
    assert_eq!(reason(&s, "ip:10.0.39.15").await, "denied");
    assert_eq!(
        reason(&s, "ip:10.0.39.16").await,
        "",
        "entry 10,000 was not sent"
    );

    // More than 10,000 per call, an empty list, or entries with a single entry: refused.
    for (body, needle) in [
        (json!({"entries": entries(10_001, 0)}), "at most 10000"),
        (json!({"entries": []}), "must not be empty"),
        (
            json!({"entries": ["a"], "entry": "b"}),
            "either \"entries\" or one",
        ),
        (json!({"entries": "a"}), "list of strings"),
    ] {
        let (status, _, v) = call(&s, Method::POST, "/v1/lists/allow", &body).await;
        assert_eq!(status, 400, "{v}");
        assert!(v["detail"].as_str().unwrap().contains(needle), "{v}");
    }
}

#[tokio::test]
async fn a_prefix_length_beyond_the_family_is_refused() {
    let s = start(&config("")).await;
    for (entry, needle) in [
        ("1.2.3.4/33", "from 0 to 32 for an IPv4"),
        ("ip:10.0.0.0/40", "from 0 to 32 for an IPv4"),
        ("2001:db8::/129", "from 0 to 128 for an IPv6"),
        ("10.0.0.0/x", "from 0 to 32"),
    ] {
        let (status, ct, v) = call(
            &s,
            Method::POST,
            "/v1/lists/deny",
            &json!({ "entry": entry }),
        )
        .await;
        assert_eq!(status, 400, "{entry}: {v}");
        assert_eq!(ct, "application/problem+json");
        assert!(
            v["detail"].as_str().unwrap().contains(needle),
            "{entry}: {v}"
        );
    }
    // The widest valid ones are fine.
    for entry in ["1.2.3.4/32", "2001:db8::1/128"] {
        let (status, _, v) = call(
            &s,
            Method::POST,
            "/v1/lists/deny",
            &json!({ "entry": entry }),
        )
        .await;
        assert_eq!(status, 200, "{entry}: {v}");
    }
}

#[tokio::test]
async fn a_full_table_answers_409_naming_the_table_and_its_maximum() {
    let s = start(&config("[control]\nmax_deny = 5\nmax_bans = 1\n")).await;
    let body = json!({ "entries": entries(5, 0) });
    let (status, _, v) = call(&s, Method::POST, "/v1/lists/deny", &body).await;
    assert_eq!(status, 200, "{v}");
    for body in [
        json!({ "entry": "user:six" }),
        json!({ "entries": entries(2, 4) }),
    ] {
        let (status, ct, v) = call(&s, Method::POST, "/v1/lists/deny", &body).await;
        assert_eq!(status, 409, "{v}");
        assert_eq!(ct, "application/problem+json");
        assert_eq!(
            (v["table"].as_str(), v["max"].as_u64()),
            (Some("deny"), Some(5))
        );
        let detail = v["detail"].as_str().unwrap();
        assert!(
            detail.contains("deny table is full") && detail.contains("control.max_deny"),
            "{detail}"
        );
    }
    assert_eq!(
        reason(&s, "ip:10.0.0.5").await,
        "",
        "nothing of the refused call"
    );
    // An entry already there takes no room; the other tables have their own.
    let (status, _, _) = call(
        &s,
        Method::POST,
        "/v1/lists/deny",
        &json!({"entry": "ip:10.0.0.0"}),
    )
    .await;
    assert_eq!(status, 200);
    let (status, _, _) = call(
        &s,
        Method::POST,
        "/v1/lists/allow",
        &json!({"entry": "user:six"}),
    )
    .await;
    assert_eq!(status, 200);
    let ban = |who: &str| json!({"identity": who, "duration": "1m"});
    assert_eq!(call(&s, Method::POST, "/v1/bans", &ban("a")).await.0, 200);
    let (status, _, v) = call(&s, Method::POST, "/v1/bans", &ban("b")).await;
    assert_eq!((status, v["table"].as_str()), (409, Some("bans")), "{v}");
}

#[tokio::test]
async fn the_control_body_limit_is_its_own() {
    let s = start(&config("[control]\nmax_body_bytes = \"64KiB\"\n")).await;
    // 5,000 entries: over 64 KiB.
    let body = json!({ "entries": entries(5_000, 0) });
    assert!(body.to_string().len() > 64 * 1024);
    let (status, ct, v) = call(&s, Method::POST, "/v1/lists/deny", &body).await;
    assert_eq!(status, 413, "{v}");
    assert_eq!(ct, "application/problem+json");
    let body = json!({ "entries": entries(1_000, 0) });
    let (status, _, v) = call(&s, Method::POST, "/v1/lists/deny", &body).await;
    assert_eq!(status, 200, "{v}");
}

#[tokio::test]
async fn an_import_through_one_instance_is_in_force_on_the_other_within_a_second() {
    let Some(redis) = Redis::start() else {
        panic!("redis-server not found on PATH");
    };
    let cfg = config(&format!("[store]\nurl = \"{}\"\n", redis.url()));
    let a = start(&cfg).await;
    let b = start(&cfg).await;
    let body = json!({ "entries": entries(10_000, 0) });
    let (status, _, v) = call(&a, Method::POST, "/v1/lists/deny", &body).await;
    assert_eq!(status, 200, "{v}");
    let t = Instant::now();
    while reason(&b, "ip:10.0.39.15").await != "denied" {
        assert!(t.elapsed() < Duration::from_secs(1), "not within a second");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    println!("10,000 entries in force on b after {:?}", t.elapsed());
    // Both say how old the snapshot they decide from is.
    let ready: Value = client()
        .get(b.url("/readyz"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let age = ready["control_snapshot_age_seconds"].as_f64().unwrap();
    assert!(age < 1.0, "{ready}");
    let (status, _, stats) = call(&b, Method::GET, "/v1/stats", &json!({})).await;
    assert_eq!(status, 200, "{stats}");
    assert!(
        stats["control"]["snapshot_age_seconds"].as_f64().unwrap() < 1.0,
        "{stats}"
    );
    assert_eq!(stats["control"]["sizes"]["deny"], 10_000, "{stats}");
    assert_eq!(stats["control"]["sizes"]["max_deny"], 2_000_000);
}
