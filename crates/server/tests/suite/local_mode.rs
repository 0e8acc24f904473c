//! `failure_mode = "local"` through `sluice serve`: with Redis gone, a policy is decided by
//! the instance's embedded store at its limit times `local_share`, never failed open.

use crate::support::{Redis, client, start};
use serde_json::{Value, json};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_redis_down_a_local_policy_admits_its_share_and_no_more() {
    let mut redis = Redis::start().expect("redis-server");
    let s = start(&format!(
        "[store]\nurl = \"{}\"\ntimeout = \"50ms\"\nfailure_mode = \"local\"\nlocal_share = 0.5\n\n\
         [policies.api]\nalgorithm = \"fixed-window\"\nlimit = 10\nwindow = \"1h\"\n",
        redis.url()
    ))
    .await;
    let c = client();
    // The store answers first (the server connects to it at start), then goes away.
    let first = c
        .post(s.url("/v1/check"))
        .json(&json!({"policy": "api", "identity": "user:0"}))
        .send()
        .await
        .unwrap();
    assert_eq!(first.json::<Value>().await.unwrap()["verdict"], "decided");
    redis.kill();
    let mut admitted = 0;
    let mut verdicts = Vec::new();
    for _ in 0..20 {
        let res = c
            .post(s.url("/v1/check"))
            .json(&json!({"policy": "api", "identity": "user:1"}))
            .send()
            .await
            .unwrap();
        assert_eq!(res.status(), 200);
        let d: Value = res.json().await.unwrap();
        if d["allowed"] == true {
            admitted += 1;
        }
        verdicts.push(d["verdict"].as_str().unwrap_or_default().to_owned());
    }
    assert_eq!(admitted, 5, "half of 10 with Redis down: {verdicts:?}");
    assert!(
        !verdicts.iter().any(|v| v == "failed_open"),
        "a local policy never fails open: {verdicts:?}"
    );
    s.stop().await;
}
