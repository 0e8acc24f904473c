//! Metric label cardinality of `sluice serve` does not grow with identities, paths, unknown
//! policies or Envoy domains.
//!
//! Its own test binary, not a module of `tests/suite`: it counts the series of the
//! process-wide Prometheus recorder before and after hundreds of identities, and servers of
//! other tests in the same process would add their own series (a histogram per policy of
//! theirs) in between.

#[path = "suite/secured_server.rs"]
mod secured_server;

use std::collections::BTreeSet;

use serde_json::json;
use sluice_reliability::prom;
use sluice_reliability::serve::{TestServer, client, start_with};

use crate::secured_server::{config, metrics, redis_with_password, upstream};

/// Every kind of request of [`metric_label_cardinality_is_bounded`] with the identities,
/// unknown policies, paths and Envoy domains numbered `range`.
async fn varied_traffic(s: &TestServer, range: std::ops::Range<u32>) {
    let c = client();
    for i in range.clone() {
        let id = format!("ident-{i}-{:x}", rand::random::<u32>());
        let _ = c
            .post(s.url("/v1/check"))
            .json(&json!({"policy": "api", "identity": id}))
            .send()
            .await
            .unwrap();
        let _ = c
            .post(s.url("/v1/check"))
            .json(&json!({"policy": format!("nope-{i}"), "identity": id}))
            .send()
            .await
            .unwrap();
        let _ = c
            .get(s.proxy_url(&format!("/key/{id}")))
            .header("x-api-key", &id)
            .send()
            .await
            .unwrap();
        let _ = c
            .get(s.proxy_url(&format!("/unrouted/{id}")))
            .send()
            .await
            .unwrap();
        let _ = c
            .get(s.url(&format!("/nothing/{id}")))
            .send()
            .await
            .unwrap();
    }
    let mut rls = envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient::connect(s.grpc_url()).await.unwrap();
    for i in range.step_by(3) {
        let _ = rls
            .should_rate_limit(
                envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest {
                    domain: format!("domain-{i}"),
                    descriptors: vec![],
                    hits_addend: 0,
                },
            )
            .await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metric_label_cardinality_is_bounded() {
    let redis = redis_with_password();
    let up = upstream().await;
    let s = start_with(&config(redis.port(), up, ""), &[]).await;
    // A first round makes every series this server's traffic has (a fixed set: outcomes x
    // configured policies, statuses x endpoints, route prefixes, kinds), so what the second
    // round adds is what grows with identities. The recorder is the process's: servers of
    // other tests running meanwhile add their own fixed sets, a few dozen at most.
    varied_traffic(&s, 0..30).await;
    let before = metrics(&s).await;
    let label_values = |text: &str| -> BTreeSet<String> {
        prom::samples(text)
            .filter(|x| x.name.starts_with("sluice_"))
            .map(|x| format!("{}{:?}", x.name, x.labels))
            .collect()
    };
    // Hundreds of identities, keys, paths, unknown policies and Envoy domains.
    varied_traffic(&s, 30..330).await;
    let after = metrics(&s).await;
    let (b, a) = (label_values(&before), label_values(&after));
    let new: Vec<&String> = a.difference(&b).collect();
    // Nothing per identity, path or domain (that would be 100 series at least): only what
    // other servers in the process made meanwhile.
    assert!(
        new.len() < 60,
        "{} new series after 300 identities: {new:#?}",
        new.len()
    );
    for x in prom::samples(&after).filter(|x| x.name.starts_with("sluice_")) {
        for (k, v) in &x.labels {
            assert!(
                !v.contains("ident-")
                    && !v.contains("nope-")
                    && !v.contains("domain-")
                    && !v.contains("unrouted"),
                "{}: {k}={v}",
                x.name
            );
        }
    }
    s.stop().await;
}
