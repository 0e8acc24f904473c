//! Exposure: the operator endpoints can move to their own listener, and the start-up warns
//! when a shared store hashes credentials with the public built-in key.

use crate::support::{client, start};
use serde_json::json;
use sluice_server::Config;

const POLICY: &str = "[policies.api]\nalgorithm = \"fixed-window\"\nlimit = 5\nwindow = \"1h\"\n";

#[tokio::test]
async fn a_separate_admin_listener_takes_metrics_and_admin_off_the_api_listener() {
    let s = start(&format!(
        "[server]\nadmin = \"127.0.0.1:9\"\nreload_poll = \"0s\"\n\n{POLICY}"
    ))
    .await;
    let c = client();
    // The decision API still decides on the HTTP listener...
    let res = c
        .post(s.url("/v1/check"))
        .json(&json!({"policy": "api", "identity": "user:1"}))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 200);
    // ...but no longer serves the operator endpoints there.
    assert_eq!(c.get(s.url("/metrics")).send().await.unwrap().status(), 404);
    let reload = c.post(s.url("/admin/reload")).send().await.unwrap();
    assert_eq!(reload.status(), 404);
    assert_eq!(c.get(s.url("/healthz")).send().await.unwrap().status(), 200);

    // The admin listener serves them, and not the decision API.
    let metrics = c.get(s.admin_url("/metrics")).send().await.unwrap();
    assert_eq!(metrics.status(), 200);
    assert!(metrics.text().await.unwrap().contains("sluice_"));
    let reload = c.post(s.admin_url("/admin/reload")).send().await.unwrap();
    assert!(reload.status().is_success(), "{}", reload.status());
    assert_eq!(
        c.get(s.admin_url("/readyz")).send().await.unwrap().status(),
        200
    );
    let check = c
        .post(s.admin_url("/v1/check"))
        .json(&json!({"policy": "api", "identity": "user:1"}))
        .send()
        .await
        .unwrap();
    assert_eq!(check.status(), 404);
    s.stop().await;
}

#[test]
fn the_built_in_hash_key_with_a_shared_store_is_warned_about() {
    let parse = |src: &str| Config::parse(src, "sluice.toml", None).unwrap();
    let redis = parse(&format!(
        "[store]\nurl = \"redis://127.0.0.1:6379\"\n\n{POLICY}"
    ));
    let warnings = sluice_server::startup_warnings(&redis);
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    assert!(warnings[0].contains("identity_hash_key"), "{warnings:?}");

    let keyed = parse(&format!(
        "identity_hash_key = \"000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f\"\n\n[store]\nurl = \"redis://127.0.0.1:6379\"\n\n{POLICY}"
    ));
    assert!(sluice_server::startup_warnings(&keyed).is_empty());

    let memory = parse(POLICY);
    assert!(sluice_server::startup_warnings(&memory).is_empty());
}
