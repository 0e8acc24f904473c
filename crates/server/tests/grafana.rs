//! `examples/grafana/sluice.json` queries only metrics that `sluice serve` exports: every
//! metric name in its queries is found in `/metrics` of a real server on a real redis-server,
//! first while it is fresh (no request yet: every panel must show 0, not "No data"), then
//! after traffic, a reload and the store's loss.
//!
//! Its own test binary, not a module of `tests/suite`: what a fresh instance exports is read
//! from the process-wide Prometheus recorder, so it takes a process in which no other server
//! has decided, reloaded or lost its store yet (the zeros below), and no other server sets
//! the heavy-hitter gauges between this one's setting and rendering them.

#[path = "suite/support/mod.rs"]
mod support;

use std::collections::BTreeSet;
use std::time::Duration;

use crate::support::{Redis, client, start};
use serde_json::{Value, json};

/// Every `sluice_*` name in the dashboard's queries.
fn queried_metrics() -> BTreeSet<String> {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../examples/grafana/sluice.json"
    );
    let dash: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let mut exprs = Vec::new();
    for p in dash["panels"].as_array().unwrap() {
        for t in p["targets"].as_array().unwrap() {
            exprs.push(t["expr"].as_str().unwrap().to_string());
        }
    }
    for v in dash["templating"]["list"].as_array().unwrap() {
        exprs.push(v["definition"].as_str().unwrap().to_string());
    }
    let mut names = BTreeSet::new();
    for e in exprs {
        let mut rest = e.as_str();
        while let Some(i) = rest.find("sluice_") {
            let tail = &rest[i..];
            let end = tail
                .find(|c: char| !(c.is_ascii_lowercase() || c == '_'))
                .unwrap_or(tail.len());
            names.insert(tail[..end].to_string());
            rest = &tail[end..];
        }
    }
    names
}

fn exported(text: &str, name: &str) -> bool {
    text.lines().any(|l| {
        l.strip_prefix(name)
            .is_some_and(|r| r.starts_with('{') || r.starts_with(' '))
    })
}

#[tokio::test]
async fn every_metric_the_dashboard_queries_is_exported() {
    let names = queried_metrics();
    assert!(names.len() >= 10, "{names:?}");
    let Some(mut redis) = Redis::start() else {
        eprintln!("redis-server not found; skipping (run scripts/install-test-deps)");
        return;
    };
    let toml = format!(
        "admin_token = \"t\"\nidentity_hash_key = \"{}\"\n[store]\nurl = \"{}\"\ntimeout = \"100ms\"\n\
         [policies.api]\nalgorithm = \"fixed-window\"\nlimit = 2\nwindow = \"1h\"\nfailure_mode = \"open\"\n",
        "ef".repeat(32),
        redis.url()
    );
    let s = start(&toml).await;
    let c = client();
    let fresh = c
        .get(s.url("/metrics"))
        .bearer_auth("t")
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let missing: Vec<&String> = names.iter().filter(|n| !exported(&fresh, n)).collect();
    assert!(
        missing.is_empty(),
        "a fresh instance does not export {missing:?}\n{fresh}"
    );
    for zero in [
        "sluice_config_generation 1",
        "sluice_store_errors_total{kind=\"timeout\"} 0",
        "sluice_store_failures_total{mode=\"open\"} 0",
        "sluice_config_reloads_total{result=\"ok\"} 0",
        "sluice_decisions_total{policy=\"api\",outcome=\"denied\"} 0",
    ] {
        assert!(
            fresh.lines().any(|l| l == zero),
            "no line {zero:?} in\n{fresh}"
        );
    }
    let check = |who: &'static str| {
        let c = c.clone();
        let url = s.url("/v1/check");
        async move {
            c.post(url)
                .bearer_auth("t")
                .json(&json!({"policy": "api", "identity": who}))
                .send()
                .await
                .unwrap()
                .status()
        }
    };
    for _ in 0..4 {
        assert_eq!(check("user:1").await, 200);
    }
    let reload = c
        .post(s.url("/admin/reload"))
        .bearer_auth("t")
        .send()
        .await
        .unwrap();
    assert_eq!(reload.status(), 200);
    // The store goes away: checks fail open, and the store's errors are counted.
    redis.kill();
    for _ in 0..3 {
        assert_eq!(check("user:2").await, 200);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let text = c
        .get(s.url("/metrics"))
        .bearer_auth("t")
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let missing: Vec<&String> = names.iter().filter(|n| !exported(&text, n)).collect();
    assert!(
        missing.is_empty(),
        "queried by the dashboard but not in /metrics: {missing:?}\n{text}"
    );
    // The heavy-hitter gauges are by rank only: no identity in any label.
    assert!(!text.contains("user:1"), "an identity in a metric label");
    assert!(exported(&text, "sluice_top_identity_count"));
    assert!(
        text.contains("sluice_top_identity_count{list=\"decisions\",rank=\"1\"} 4"),
        "{text}"
    );
    s.stop().await;
}
