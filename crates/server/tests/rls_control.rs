//! The Envoy rate limit service and the control plane over real gRPC on loopback: a deny-listed
//! client address and a banned descriptor are `OVER_LIMIT` with `X-Sluice-Reason`; an
//! allow-listed one is never limited.
#![cfg(feature = "testing")]

mod common;

use common::{client, start_with};
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use serde_json::{Value, json};
use tonic::transport::Channel;

const DOMAIN: &str = r#"
domain: edge
descriptors:
  - key: remote_address
    rate_limit:
      unit: minute
      requests_per_unit: 2
"#;

async fn ask(c: &mut RateLimitServiceClient<Channel>, ip: &str) -> RateLimitResponse {
    let req = RateLimitRequest {
        domain: "edge".into(),
        descriptors: vec![RateLimitDescriptor {
            entries: vec![Entry {
                key: "remote_address".into(),
                value: ip.into(),
            }],
            ..Default::default()
        }],
        hits_addend: 0,
    };
    c.should_rate_limit(req).await.unwrap().into_inner()
}

fn header<'a>(r: &'a RateLimitResponse, name: &str) -> Option<&'a str> {
    r.response_headers_to_add
        .iter()
        .find(|h| h.key.eq_ignore_ascii_case(name))
        .map(|h| h.value.as_str())
}

async fn post(s: &common::TestServer, path: &str, body: Value) {
    let res = client()
        .post(s.url(path))
        .bearer_auth("adm1n")
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 200, "{}", res.text().await.unwrap());
}

#[tokio::test]
async fn banned_and_denied_descriptors_are_over_limit_with_the_reason() {
    let toml = "admin_token = \"adm1n\"\n[envoy]\nfiles = [\"edge.yaml\"]\n[lists]\ndeny = [\"192.0.2.0/24\"]\n";
    let s = start_with(toml, &[("edge.yaml", DOMAIN)]).await;
    let mut c = RateLimitServiceClient::connect(s.grpc_url()).await.unwrap();

    // The file's deny network matches the remote_address descriptor.
    let r = ask(&mut c, "192.0.2.44").await;
    assert_eq!(r.overall_code, Code::OverLimit as i32);
    assert_eq!(r.statuses[0].code, Code::OverLimit as i32);
    assert_eq!(header(&r, "X-Sluice-Reason"), Some("denied"));
    assert_eq!(
        header(&r, "Retry-After"),
        None,
        "waiting does not cure a deny"
    );

    // A ban of the descriptor's identity, with the time left.
    let ok = ask(&mut c, "10.0.0.7").await;
    assert_eq!(ok.overall_code, Code::Ok as i32);
    assert_eq!(header(&ok, "X-Sluice-Reason"), None);
    post(
        &s,
        "/v1/bans",
        json!({"identity": "envoy:edge:remote_address=10.0.0.7", "duration": "90s"}),
    )
    .await;
    let r = ask(&mut c, "10.0.0.7").await;
    assert_eq!(r.overall_code, Code::OverLimit as i32);
    assert_eq!(header(&r, "X-Sluice-Reason"), Some("banned"));
    assert_eq!(header(&r, "Retry-After"), Some("90"));

    // An allowed network is never over its limit of 2.
    post(&s, "/v1/lists/allow", json!({"entry": "10.1.0.0/16"})).await;
    for _ in 0..5 {
        assert_eq!(ask(&mut c, "10.1.2.3").await.overall_code, Code::Ok as i32);
    }
    s.stop().await;
}
