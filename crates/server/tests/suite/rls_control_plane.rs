//! The control plane in the answers of the Envoy rate limit service, over real gRPC on
//! loopback: a deny-listed client address and a banned descriptor are `OVER_LIMIT` with
//! `X-Sluice-Reason`, an allow-listed one is never limited; an override of an Envoy limit's
//! policy, a ban scoped to it, and `/v1/state` (read, reset), `/v1/charge` and `/v1/refund` on
//! it, first on the embedded store, then on two `sluice serve` instances sharing a Redis
//! Cluster (an override, a reset, a deny entry, a charge, a refund and a ban made through one
//! are obeyed by the other's RLS answers). The lists' networks match the address a
//! `remote_address` entry carries (IPv4 and IPv6, also next to a value so long that the
//! identity is a hash), never a value the client writes that spells a listed address.

use crate::support;
use std::time::{Duration, Instant};

use crate::support::{client, start_with};
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use reqwest::Method;
use serde_json::{Value, json};
use sluice_testkit::servers::RedisCluster;
use tonic::transport::Channel;

const DOMAIN: &str = r#"
domain: edge
descriptors:
  - key: remote_address
    rate_limit:
      unit: hour
      requests_per_unit: 2
"#;

/// The policy of the limit above (`envoy.<algorithm>.<requests_per_unit>.<unit>`).
const POLICY: &str = "envoy.fixed-window.2.hour";

fn who(ip: &str) -> String {
    format!("envoy:edge:remote_address={ip}")
}

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

async fn ok(c: &mut RateLimitServiceClient<Channel>, ip: &str) -> bool {
    ask(c, ip).await.overall_code == Code::Ok as i32
}

/// How many of `n` descriptors are answered OK.
async fn oks(c: &mut RateLimitServiceClient<Channel>, ip: &str, n: usize) -> usize {
    let mut count = 0;
    for _ in 0..n {
        if ok(c, ip).await {
            count += 1;
        }
    }
    count
}

fn header<'a>(r: &'a RateLimitResponse, name: &str) -> Option<&'a str> {
    r.response_headers_to_add
        .iter()
        .find(|h| h.key.eq_ignore_ascii_case(name))
        .map(|h| h.value.as_str())
}

async fn call(s: &support::TestServer, method: Method, path: &str, body: Value) -> Value {
    let res = client()
        .request(method, s.url(path))
        .bearer_auth("adm1n")
        .json(&body)
        .send()
        .await
        .unwrap();
    let status = res.status().as_u16();
    let v: Value = res.json().await.unwrap();
    assert_eq!(status, 200, "{path}: {v}");
    v
}

fn config(store: &str) -> String {
    format!("admin_token = \"adm1n\"\n{store}[envoy]\nfiles = [\"edge.yaml\"]\n")
}

/// Waits at most `limit` for `f`.
async fn within<F, Fut>(what: &str, limit: Duration, mut f: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let start = Instant::now();
    while start.elapsed() < limit {
        if f().await {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("{what}: not within {limit:?}");
}

#[tokio::test]
async fn banned_and_denied_descriptors_are_over_limit_with_the_reason() {
    let toml = format!("{}[lists]\ndeny = [\"192.0.2.0/24\"]\n", config(""));
    let s = start_with(&toml, &[("edge.yaml", DOMAIN)]).await;
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
    let admitted = ask(&mut c, "10.0.0.7").await;
    assert_eq!(admitted.overall_code, Code::Ok as i32);
    assert_eq!(header(&admitted, "X-Sluice-Reason"), None);
    call(
        &s,
        Method::POST,
        "/v1/bans",
        json!({"identity": who("10.0.0.7"), "duration": "90s"}),
    )
    .await;
    let r = ask(&mut c, "10.0.0.7").await;
    assert_eq!(r.overall_code, Code::OverLimit as i32);
    assert_eq!(header(&r, "X-Sluice-Reason"), Some("banned"));
    assert_eq!(header(&r, "Retry-After"), Some("90"));

    // An allowed network is never over its limit of 2.
    call(
        &s,
        Method::POST,
        "/v1/lists/allow",
        json!({"entry": "10.1.0.0/16"}),
    )
    .await;
    assert_eq!(oks(&mut c, "10.1.2.3", 5).await, 5);
    s.stop().await;
}

#[tokio::test]
async fn overrides_state_charge_refund_and_scoped_bans_reach_the_rls() {
    let s = start_with(&config(""), &[("edge.yaml", DOMAIN)]).await;
    let mut c = RateLimitServiceClient::connect(s.grpc_url()).await.unwrap();

    // An override of the Envoy limit's policy for one descriptor: 4 instead of 2.
    let v = call(
        &s,
        Method::POST,
        "/v1/overrides",
        json!({"policy": POLICY, "identity": who("10.0.0.5"), "params": {"limit": 4}}),
    )
    .await;
    assert_eq!(v["params"]["limit"], 4, "{v}");
    assert_eq!(oks(&mut c, "10.0.0.5", 6).await, 4);
    assert_eq!(
        oks(&mut c, "10.0.0.6", 3).await,
        2,
        "other descriptors keep 2"
    );

    // Read without consuming, then reset: 4 again.
    let target = json!({"policy": POLICY, "identity": who("10.0.0.5")});
    let v = call(&s, Method::POST, "/v1/state", target.clone()).await;
    assert_eq!(
        (v["limit"].as_u64(), v["remaining"].as_u64()),
        (Some(4), Some(0)),
        "{v}"
    );
    call(&s, Method::DELETE, "/v1/state", target).await;
    assert_eq!(
        oks(&mut c, "10.0.0.5", 5).await,
        4,
        "reset restores the limit"
    );

    // Charge 2 of 2, refund 1: one more OK.
    let cost = |n: u64| json!({"policy": POLICY, "identity": who("10.0.0.7"), "cost": n});
    assert_eq!(
        call(&s, Method::POST, "/v1/charge", cost(2)).await["remaining"],
        0
    );
    assert!(!ok(&mut c, "10.0.0.7").await);
    assert_eq!(
        call(&s, Method::POST, "/v1/refund", cost(1)).await["remaining"],
        1
    );
    assert_eq!(
        oks(&mut c, "10.0.0.7", 2).await,
        1,
        "the refund restores the cost"
    );

    // A ban scoped to the Envoy policy, with the time left.
    call(
        &s,
        Method::POST,
        "/v1/bans",
        json!({"identity": who("10.0.0.8"), "duration": "2m", "policies": [POLICY]}),
    )
    .await;
    let r = ask(&mut c, "10.0.0.8").await;
    assert_eq!(r.overall_code, Code::OverLimit as i32);
    assert_eq!(header(&r, "X-Sluice-Reason"), Some("banned"));
    assert_eq!(header(&r, "Retry-After"), Some("120"));
    call(
        &s,
        Method::DELETE,
        "/v1/bans",
        json!({"identity": who("10.0.0.8")}),
    )
    .await;
    assert!(ok(&mut c, "10.0.0.8").await, "lifted");
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_change_through_one_instance_reaches_the_others_rls_on_a_cluster() {
    let cluster = RedisCluster::start();
    let store = format!("[store]\nurl = \"{}\"\n", cluster.url());
    let files = [("edge.yaml", DOMAIN)];
    let (a, b) = (
        start_with(&config(&store), &files).await,
        start_with(&config(&store), &files).await,
    );
    let mut rls = RateLimitServiceClient::connect(b.grpc_url()).await.unwrap();
    let second = Duration::from_secs(1);

    // An override through a, obeyed by b's RLS.
    assert_eq!(oks(&mut rls, "10.1.0.1", 3).await, 2);
    call(
        &a,
        Method::POST,
        "/v1/overrides",
        json!({"policy": POLICY, "identity": who("10.1.0.1"), "params": {"limit": 3}}),
    )
    .await;
    within("override", second, || async {
        let mut c = rls.clone();
        ok(&mut c, "10.1.0.1").await
    })
    .await;
    assert!(!ok(&mut rls, "10.1.0.1").await, "3 in all");

    // A reset through a: b's RLS admits again once its remembered denial lapses (1 s).
    call(
        &a,
        Method::DELETE,
        "/v1/state",
        json!({"policy": POLICY, "identity": who("10.1.0.1")}),
    )
    .await;
    within("reset", second + Duration::from_millis(200), || async {
        let mut c = rls.clone();
        ok(&mut c, "10.1.0.1").await
    })
    .await;
    assert_eq!(oks(&mut rls, "10.1.0.1", 3).await, 2, "3 again");

    // A deny entry through a.
    call(
        &a,
        Method::POST,
        "/v1/lists/deny",
        json!({"entry": "10.2.0.0/16"}),
    )
    .await;
    within("deny", second, || async {
        let mut c = rls.clone();
        header(&ask(&mut c, "10.2.3.4").await, "X-Sluice-Reason") == Some("denied")
    })
    .await;

    // A charge through b is seen by a's RLS.
    let mut rls_a = RateLimitServiceClient::connect(a.grpc_url()).await.unwrap();
    let v = call(
        &b,
        Method::POST,
        "/v1/charge",
        json!({"policy": POLICY, "identity": who("10.1.0.9"), "cost": 1}),
    )
    .await;
    assert_eq!(v["remaining"], 1);
    assert_eq!(oks(&mut rls_a, "10.1.0.9", 2).await, 1);
    // ... and a refund through b gives a's RLS the cost back (after a's remembered denial).
    let v = call(
        &b,
        Method::POST,
        "/v1/refund",
        json!({"policy": POLICY, "identity": who("10.1.0.9"), "cost": 2}),
    )
    .await;
    assert_eq!(v["remaining"], 2);
    within("refund", second + Duration::from_millis(200), || async {
        let mut c = rls_a.clone();
        ok(&mut c, "10.1.0.9").await
    })
    .await;

    // A manual ban through b, with the time left in a's answer; lifted through a.
    call(
        &b,
        Method::POST,
        "/v1/bans",
        json!({"identity": who("10.1.0.10"), "duration": "1m"}),
    )
    .await;
    within("ban", second, || async {
        let mut c = rls_a.clone();
        header(&ask(&mut c, "10.1.0.10").await, "X-Sluice-Reason") == Some("banned")
    })
    .await;
    let retry: u64 = header(&ask(&mut rls_a, "10.1.0.10").await, "Retry-After")
        .unwrap()
        .parse()
        .unwrap();
    assert!((58..=60).contains(&retry), "{retry}");
    call(
        &a,
        Method::DELETE,
        "/v1/bans",
        json!({"identity": who("10.1.0.10")}),
    )
    .await;
    // (The checks while waiting for the ban may have used the limit up: wait for the reason.)
    within("ban lifted", second, || async {
        let mut c = rls.clone();
        header(&ask(&mut c, "10.1.0.10").await, "X-Sluice-Reason") != Some("banned")
    })
    .await;
    a.stop().await;
    b.stop().await;
}

/// Descriptors that carry the client address next to values the client writes.
const WITH_CLIENT_VALUES: &str = r#"
domain: edge
descriptors:
  - key: remote_address
    rate_limit:
      unit: hour
      requests_per_unit: 2
  - key: user
    rate_limit:
      unit: hour
      requests_per_unit: 2
  - key: path
    descriptors:
      - key: remote_address
        rate_limit:
          unit: hour
          requests_per_unit: 2
"#;

async fn ask_entries(
    c: &mut RateLimitServiceClient<Channel>,
    entries: &[(&str, &str)],
) -> RateLimitResponse {
    let req = RateLimitRequest {
        domain: "edge".into(),
        descriptors: vec![RateLimitDescriptor {
            entries: entries
                .iter()
                .map(|(k, v)| Entry {
                    key: (*k).into(),
                    value: (*v).into(),
                })
                .collect(),
            ..Default::default()
        }],
        hits_addend: 0,
    };
    c.should_rate_limit(req).await.unwrap().into_inner()
}

/// The reason of one answer: `OK`, or `X-Sluice-Reason` of an over-limit one.
async fn answer(c: &mut RateLimitServiceClient<Channel>, entries: &[(&str, &str)]) -> String {
    let r = ask_entries(c, entries).await;
    if r.overall_code == Code::Ok as i32 {
        "OK".into()
    } else {
        header(&r, "X-Sluice-Reason").unwrap_or("over").into()
    }
}

#[tokio::test]
async fn network_lists_match_the_remote_address_a_descriptor_carries_not_its_text() {
    let toml = format!(
        "{}[lists]\ndeny = [\"192.0.2.0/24\", \"2001:db8::/32\"]\nallow = [\"10.0.0.0/8\"]\n",
        config("")
    );
    let s = start_with(&toml, &[("edge.yaml", WITH_CLIENT_VALUES)]).await;
    let mut c = RateLimitServiceClient::connect(s.grpc_url()).await.unwrap();

    // The remote_address of an IPv4 and an IPv6 client inside the networks.
    assert_eq!(
        answer(&mut c, &[("remote_address", "192.0.2.44")]).await,
        "denied"
    );
    assert_eq!(
        answer(&mut c, &[("remote_address", "2001:db8::7")]).await,
        "denied"
    );
    assert_eq!(
        answer(&mut c, &[("remote_address", "198.51.100.1")]).await,
        "OK"
    );
    assert_eq!(
        answer(&mut c, &[("remote_address", "2001:db9::1")]).await,
        "OK"
    );
    // Next to another entry, and next to one so long that the identity is a hash: the
    // address still decides (the descriptor's text no longer shows it).
    let long = format!("/{}", "a".repeat(600));
    for path in ["/short", long.as_str()] {
        for ip in ["192.0.2.45", "2001:db8::9"] {
            let got = answer(&mut c, &[("path", path), ("remote_address", ip)]).await;
            assert_eq!(got, "denied", "{ip} after a path of {} bytes", path.len());
        }
    }

    // A value the client writes that spells a listed address is not that client: neither
    // refused by the deny network nor let past its limit by the allow network.
    for spelled in ["192.0.2.44", "ip:192.0.2.44", "remote_address=192.0.2.44"] {
        assert_eq!(
            answer(&mut c, &[("user", spelled)]).await,
            "OK",
            "{spelled}"
        );
    }
    let mut oks = 0;
    for _ in 0..4 {
        oks += usize::from(answer(&mut c, &[("user", "10.0.0.1")]).await == "OK");
    }
    assert_eq!(oks, 2, "the text of an allowed address buys no exemption");
    // The client really at 10.0.0.1 is never over its limit of 2.
    for _ in 0..4 {
        assert_eq!(
            answer(&mut c, &[("remote_address", "10.0.0.1")]).await,
            "OK"
        );
    }
    s.stop().await;
}
