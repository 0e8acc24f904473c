//! A flood of fresh identities on the embedded store: the exhausted victim stays denied
//! through `sluice serve`, and the evictions it caused are counted in `/metrics`.

mod common;

use common::{client, start};
use serde_json::{Value, json};

#[tokio::test]
async fn a_flood_cannot_reset_a_victim_and_its_evictions_are_counted() {
    let s = start(
        "[store]\nurl = \"memory\"\nmax_keys = 200\n\n\
         [policies.api]\nalgorithm = \"fixed-window\"\nlimit = 3\nwindow = \"1h\"\n\n\
         [policies.log]\nalgorithm = \"sliding-log\"\nlimit = 3\nwindow = \"2h\"\n",
    )
    .await;
    let c = client();
    let check = |policy: &'static str, identity: String| {
        let c = c.clone();
        let url = s.url("/v1/check");
        async move {
            let res = c
                .post(url)
                .json(&json!({"policy": policy, "identity": identity}))
                .send()
                .await
                .unwrap();
            assert_eq!(res.status(), 200);
            res.json::<Value>().await.unwrap()
        }
    };
    for _ in 0..3 {
        assert_eq!(check("api", "victim".into()).await["allowed"], true);
    }
    assert_eq!(check("api", "victim".into()).await["allowed"], false);
    // 600 fresh identities on a longer policy: three times the key cap.
    for i in 0..600 {
        check("log", format!("flood:{i}")).await;
    }
    let after = check("api", "victim".into()).await;
    assert_eq!(
        after["allowed"], false,
        "the flood reset the victim: {after}"
    );

    let metrics = c
        .get(s.url("/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let evicted: u64 = metrics
        .lines()
        .filter(|l| l.starts_with("sluice_store_evictions_total{"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        .sum();
    assert!(evicted >= 400, "evictions not counted:\n{metrics}");
    s.stop().await;
}
