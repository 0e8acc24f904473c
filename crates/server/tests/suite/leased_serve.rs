//! `mode = "leased"` through `sluice serve`'s decision API: a configured leased policy is
//! decided from slices and, on one instance, admits exactly its limit.

use crate::support::{client, start};
use serde_json::{Value, json};

const CONFIG: &str = r#"
admin_token = "s3cret"

[policies.daily]
algorithm = "fixed-window"
limit = 200
window = "1h"
mode = "leased"
lease_ttl = "10s"
"#;

#[tokio::test]
async fn a_leased_policy_admits_exactly_its_limit_on_one_instance() {
    let s = start(CONFIG).await;
    let c = client();
    let mut admitted = 0;
    for i in 0..300 {
        let res = c
            .post(s.url("/v1/check"))
            .json(&json!({"policy": "daily", "identity": "user:1"}))
            .send()
            .await
            .unwrap();
        assert_eq!(res.status(), 200);
        let v: Value = res.json().await.unwrap();
        let remaining = v["remaining"].as_u64().unwrap();
        assert!(remaining <= 200, "check {i}: remaining {remaining}");
        if v["allowed"] == true {
            admitted += 1;
        } else {
            assert!(i >= 200, "check {i} denied after {admitted} admitted: {v}");
            assert!(v["retry_after_ms"].as_u64().unwrap() > 0, "{v}");
        }
    }
    // One instance spends its own slices: nothing is held elsewhere, so nothing is short.
    assert_eq!(admitted, 200);
    // And it did spend slices: far fewer reservations than admissions.
    let metrics = c
        .get(s.url("/metrics"))
        .bearer_auth("s3cret")
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let reservations: f64 = metrics
        .lines()
        .find(|l| l.starts_with("sluice_lease_reservations_total") && l.contains("daily"))
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
        .unwrap_or_else(|| panic!("no reservations metric in\n{metrics}"));
    assert!(
        (1.0..50.0).contains(&reservations),
        "{reservations} reservations"
    );
}
