//! The Envoy rate limit service over real gRPC on loopback, one test per semantic.

use crate::support;
use crate::support::{Redis, start_with};
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::{
    Entry, RateLimitOverride,
};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{Code, DescriptorStatus};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use envoy_types::pb::google::protobuf::UInt64Value;
use tonic::transport::Channel;

const DOMAIN: &str = r#"
domain: edge
descriptors:
  - key: remote_address
    rate_limit:
      unit: minute
      requests_per_unit: 3
  - key: path
    value: /login
    rate_limit:
      name: login
      unit: minute
      requests_per_unit: 1
  - key: path
    value: /static/*
    rate_limit:
      unit: second
      requests_per_unit: 1
  - key: path
    value: /free
    rate_limit:
      unlimited: true
  - key: plan
    value: gold
    rate_limit:
      unit: minute
      requests_per_unit: 100
      replaces:
        - name: login
  - key: trial
    shadow_mode: true
    rate_limit:
      unit: hour
      requests_per_unit: 1
  - key: tenant
    descriptors:
      - key: user
        rate_limit:
          unit: hour
          requests_per_unit: 2
          algorithm: token-bucket
"#;

fn toml() -> String {
    "[envoy]\nfiles = [\"edge.yaml\"]\n".to_string()
}

async fn server() -> (support::TestServer, RateLimitServiceClient<Channel>) {
    let s = start_with(&toml(), &[("edge.yaml", DOMAIN)]).await;
    let c = RateLimitServiceClient::connect(s.grpc_url()).await.unwrap();
    (s, c)
}

fn desc(entries: &[(&str, &str)]) -> RateLimitDescriptor {
    RateLimitDescriptor {
        entries: entries
            .iter()
            .map(|(k, v)| Entry {
                key: k.to_string(),
                value: v.to_string(),
            })
            .collect(),
        ..Default::default()
    }
}

async fn ask(
    c: &mut RateLimitServiceClient<Channel>,
    hits: u32,
    descriptors: Vec<RateLimitDescriptor>,
) -> RateLimitResponse {
    let req = RateLimitRequest {
        domain: "edge".into(),
        descriptors,
        hits_addend: hits,
    };
    c.should_rate_limit(req).await.unwrap().into_inner()
}

fn ok(r: &RateLimitResponse) -> bool {
    r.overall_code == Code::Ok as i32
}

fn status(r: &RateLimitResponse) -> &DescriptorStatus {
    &r.statuses[0]
}

fn header<'a>(r: &'a RateLimitResponse, name: &str) -> Option<&'a str> {
    r.response_headers_to_add
        .iter()
        .find(|h| h.key.eq_ignore_ascii_case(name))
        .map(|h| h.value.as_str())
}

#[tokio::test]
async fn limit_reached_and_every_status_field_filled() {
    let (s, mut c) = server().await;
    for left in [2, 1, 0] {
        let r = ask(&mut c, 0, vec![desc(&[("remote_address", "10.0.0.1")])]).await;
        assert!(ok(&r));
        let st = status(&r);
        assert_eq!(st.code, Code::Ok as i32);
        let limit = st.current_limit.as_ref().unwrap();
        assert_eq!(
            (limit.requests_per_unit, limit.unit),
            (3, 2),
            "3 per MINUTE"
        );
        assert_eq!(st.limit_remaining, left);
        let until = st.duration_until_reset.as_ref().unwrap();
        assert!(until.seconds > 0 || until.nanos > 0);
        assert!(until.seconds <= 60);
        let policy = header(&r, "RateLimit-Policy").unwrap();
        assert!(policy.ends_with(";q=3;w=60"), "{policy}");
        assert!(
            header(&r, "RateLimit")
                .unwrap()
                .contains(&format!(";r={left};"))
        );
        assert!(header(&r, "Retry-After").is_none());
    }
    let r = ask(&mut c, 0, vec![desc(&[("remote_address", "10.0.0.1")])]).await;
    assert_eq!(r.overall_code, Code::OverLimit as i32);
    assert_eq!(status(&r).code, Code::OverLimit as i32);
    assert_eq!(status(&r).limit_remaining, 0);
    let retry: u64 = header(&r, "Retry-After").unwrap().parse().unwrap();
    assert!((1..=60).contains(&retry));
    // Another value of the key has its own counter.
    assert!(ok(&ask(
        &mut c,
        0,
        vec![desc(&[("remote_address", "10.0.0.2")])]
    )
    .await));
    s.stop().await;
}

#[tokio::test]
async fn hits_addend_zero_means_one_and_descriptor_values_win() {
    let (s, mut c) = server().await;
    let ip = |v: &str| desc(&[("remote_address", v)]);
    // Request-level 0 means 1.
    let r = ask(&mut c, 0, vec![ip("a")]).await;
    assert_eq!(status(&r).limit_remaining, 2);
    // Request-level 2 consumes 2.
    let r = ask(&mut c, 2, vec![ip("b")]).await;
    assert_eq!(status(&r).limit_remaining, 1);
    // A per-descriptor value overrides the request's.
    let mut d = ip("c");
    d.hits_addend = Some(UInt64Value { value: 3 });
    let r = ask(&mut c, 1, vec![d]).await;
    assert!(ok(&r));
    assert_eq!(status(&r).limit_remaining, 0);
    // An explicit per-descriptor 0 only checks: nothing consumed, even with a request value.
    let mut d = ip("a");
    d.hits_addend = Some(UInt64Value { value: 0 });
    for _ in 0..3 {
        let r = ask(&mut c, 5, vec![d.clone()]).await;
        assert!(ok(&r));
        assert_eq!(status(&r).limit_remaining, 2);
    }
    // More than the limit at once is over limit.
    let r = ask(&mut c, 4, vec![ip("d")]).await;
    assert_eq!(status(&r).code, Code::OverLimit as i32);
    s.stop().await;
}

#[tokio::test]
async fn limit_overrides_replace_the_configured_limit() {
    let (s, mut c) = server().await;
    let mut d = desc(&[("remote_address", "override")]);
    d.limit = Some(RateLimitOverride {
        requests_per_unit: 1,
        unit: 3,
    });
    let r = ask(&mut c, 0, vec![d.clone()]).await;
    assert!(ok(&r));
    let limit = status(&r).current_limit.clone().unwrap();
    assert_eq!(
        (limit.requests_per_unit, limit.unit),
        (1, 3),
        "1 per HOUR, not 3 per minute"
    );
    let r = ask(&mut c, 0, vec![d]).await;
    assert_eq!(status(&r).code, Code::OverLimit as i32);
    // The configured limit of the same descriptor is untouched.
    let r = ask(&mut c, 0, vec![desc(&[("remote_address", "override")])]).await;
    assert_eq!(status(&r).limit_remaining, 2);
    s.stop().await;
}

#[tokio::test]
async fn wildcards_match_by_prefix_with_a_counter_per_value() {
    let (s, mut c) = server().await;
    let r = ask(&mut c, 0, vec![desc(&[("path", "/static/app.js")])]).await;
    assert!(ok(&r));
    assert_eq!(
        status(&r).current_limit.as_ref().unwrap().requests_per_unit,
        1
    );
    let r = ask(&mut c, 0, vec![desc(&[("path", "/static/app.js")])]).await;
    assert!(!ok(&r));
    let r = ask(&mut c, 0, vec![desc(&[("path", "/static/other.css")])]).await;
    assert!(ok(&r), "another value has its own counter");
    // No match at all: OK with no limit.
    let r = ask(&mut c, 0, vec![desc(&[("path", "/elsewhere")])]).await;
    assert!(ok(&r));
    assert!(status(&r).current_limit.is_none());
    s.stop().await;
}

#[tokio::test]
async fn nested_descriptors_need_the_full_depth() {
    let (s, mut c) = server().await;
    let d = desc(&[("tenant", "acme"), ("user", "7")]);
    for left in [1, 0] {
        let r = ask(&mut c, 0, vec![d.clone()]).await;
        assert!(ok(&r));
        assert_eq!(status(&r).limit_remaining, left);
    }
    assert!(!ok(&ask(&mut c, 0, vec![d]).await));
    let r = ask(&mut c, 0, vec![desc(&[("tenant", "acme")])]).await;
    assert!(ok(&r) && status(&r).current_limit.is_none());
    s.stop().await;
}

#[tokio::test]
async fn replaces_drops_the_named_limit() {
    let (s, mut c) = server().await;
    let login = desc(&[("path", "/login")]);
    let gold = desc(&[("plan", "gold")]);
    // With the gold plan in the same request, "login" (1/min) does not apply.
    for _ in 0..3 {
        let r = ask(&mut c, 0, vec![login.clone(), gold.clone()]).await;
        assert!(ok(&r));
        assert!(r.statuses[0].current_limit.is_none());
        assert_eq!(
            r.statuses[1]
                .current_limit
                .as_ref()
                .unwrap()
                .requests_per_unit,
            100
        );
    }
    // Alone, it does.
    assert!(ok(&ask(&mut c, 0, vec![login.clone()]).await));
    assert!(!ok(&ask(&mut c, 0, vec![login]).await));
    s.stop().await;
}

#[tokio::test]
async fn a_denial_retrying_cannot_cure_has_no_retry_after() {
    let (s, mut c) = server().await;
    let ip = || vec![desc(&[("remote_address", "big")])];
    // 5 hits on a limit of 3 per minute: over limit now and at every later time.
    let r = ask(&mut c, 5, ip()).await;
    assert_eq!(r.overall_code, Code::OverLimit as i32);
    assert_eq!(status(&r).code, Code::OverLimit as i32);
    assert!(header(&r, "Retry-After").is_none(), "{r:?}");
    assert!(header(&r, "RateLimit").unwrap().contains(";r=3;"), "{r:?}");
    // Nothing was consumed: three single hits still pass, the fourth waits.
    for left in [2, 1, 0] {
        assert_eq!(status(&ask(&mut c, 1, ip()).await).limit_remaining, left);
    }
    let r = ask(&mut c, 1, ip()).await;
    assert_eq!(r.overall_code, Code::OverLimit as i32);
    let retry: u64 = header(&r, "Retry-After").unwrap().parse().unwrap();
    assert!((1..=60).contains(&retry));
    s.stop().await;
}

#[tokio::test]
async fn shadow_mode_counts_but_answers_ok() {
    let (s, mut c) = server().await;
    for left in [0, 0, 0] {
        let r = ask(&mut c, 0, vec![desc(&[("trial", "t")])]).await;
        assert!(ok(&r));
        assert_eq!(status(&r).code, Code::Ok as i32);
        assert_eq!(status(&r).limit_remaining, left);
        assert!(header(&r, "Retry-After").is_none());
    }
    s.stop().await;
}

#[tokio::test]
async fn unlimited_is_ok_with_everything_remaining() {
    let (s, mut c) = server().await;
    for _ in 0..5 {
        let r = ask(&mut c, 0, vec![desc(&[("path", "/free")])]).await;
        assert!(ok(&r));
        assert_eq!(status(&r).limit_remaining, u32::MAX);
        assert!(status(&r).current_limit.is_none());
    }
    // Unknown domains limit nothing.
    let req = RateLimitRequest {
        domain: "nope".into(),
        descriptors: vec![desc(&[("remote_address", "x")])],
        hits_addend: 0,
    };
    let r = c.should_rate_limit(req).await.unwrap().into_inner();
    assert!(ok(&r));
    s.stop().await;
}

#[tokio::test]
async fn several_descriptors_each_get_a_status() {
    let (s, mut c) = server().await;
    let r = ask(
        &mut c,
        0,
        vec![
            desc(&[("remote_address", "m")]),
            desc(&[("path", "/login")]),
            desc(&[("nothing", "x")]),
        ],
    )
    .await;
    assert_eq!(r.statuses.len(), 3);
    assert!(ok(&r));
    let r = ask(
        &mut c,
        0,
        vec![
            desc(&[("remote_address", "m")]),
            desc(&[("path", "/login")]),
        ],
    )
    .await;
    assert_eq!(r.overall_code, Code::OverLimit as i32);
    assert_eq!(
        r.statuses[0].code,
        Code::Ok as i32,
        "only the exhausted limit is over"
    );
    assert_eq!(r.statuses[1].code, Code::OverLimit as i32);
    s.stop().await;
}

#[tokio::test]
async fn grpc_health_reports_serving() {
    use tonic_health::pb::HealthCheckRequest;
    use tonic_health::pb::health_client::HealthClient;
    let (s, _) = server().await;
    let channel = tonic::transport::Endpoint::from_shared(s.grpc_url())
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut h = HealthClient::new(channel);
    for service in ["", "envoy.service.ratelimit.v3.RateLimitService"] {
        let r = h
            .check(HealthCheckRequest {
                service: service.into(),
            })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(r.status, 1, "SERVING for {service:?}");
    }
    s.stop().await;
}

#[tokio::test]
async fn store_failure_is_unavailable() {
    let Some(mut redis) = Redis::start() else {
        panic!("redis-server is needed for this test: run scripts/install-test-deps");
    };
    let toml = format!(
        "[store]\nurl = \"{}\"\ntimeout = \"100ms\"\n{}",
        redis.url(),
        toml()
    );
    let s = start_with(&toml, &[("edge.yaml", DOMAIN)]).await;
    let mut c = RateLimitServiceClient::connect(s.grpc_url()).await.unwrap();
    let r = ask(&mut c, 0, vec![desc(&[("remote_address", "r")])]).await;
    assert!(ok(&r));
    assert_eq!(status(&r).limit_remaining, 2, "counted in Redis");
    redis.kill();
    let req = RateLimitRequest {
        domain: "edge".into(),
        descriptors: vec![desc(&[("remote_address", "r")])],
        hits_addend: 0,
    };
    let err = c.should_rate_limit(req).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::Unavailable, "{err:?}");
    // Descriptors without a limit need no store and still answer.
    let r = ask(&mut c, 0, vec![desc(&[("path", "/free")])]).await;
    assert!(ok(&r));
    s.stop().await;
}

/// `sluice_rls_requests_total{domain, code}` counts each answer under its configured domain
/// (requests for other domains under `unknown`). The domain is this test's own: every server
/// of the test process shares one metrics recorder.
#[tokio::test]
async fn answers_are_counted_per_domain_and_code() {
    let yaml = "domain: counted_rls\ndescriptors:\n  - key: user\n    rate_limit: { unit: hour, requests_per_unit: 2 }\n";
    let s = start_with(
        "admin_token = \"s3cret\"\n[envoy]\nfiles = [\"counted.yaml\"]\n",
        &[("counted.yaml", yaml)],
    )
    .await;
    let mut c = RateLimitServiceClient::connect(s.grpc_url()).await.unwrap();
    for _ in 0..5 {
        let req = RateLimitRequest {
            domain: "counted_rls".into(),
            descriptors: vec![desc(&[("user", "u")])],
            hits_addend: 1,
        };
        c.should_rate_limit(req).await.unwrap();
    }
    let text = support::client()
        .get(s.url("/metrics"))
        .bearer_auth("s3cret")
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let count = |code: &str| -> f64 {
        text.lines()
            .filter(|l| {
                l.starts_with("sluice_rls_requests_total")
                    && l.contains("domain=\"counted_rls\"")
                    && l.contains(&format!("code=\"{code}\""))
            })
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    };
    assert_eq!(
        (count("ok"), count("over_limit"), count("unavailable")),
        (2.0, 3.0, 0.0),
        "{text}"
    );
    s.stop().await;
}

/// The listener's threads (`server.grpc_threads`): on its own single-threaded runtimes (3 of
/// them, so connections land on different ones) and on the shared runtime (0), every call is
/// answered and counted on the same limit, and the server stops cleanly with its threads.
#[tokio::test]
async fn the_listener_answers_on_its_own_threads_and_on_the_shared_runtime() {
    for threads in [3, 0] {
        let toml = format!("[server]\ngrpc_threads = {threads}\n\n{}", toml());
        let s = start_with(&toml, &[("edge.yaml", DOMAIN)]).await;
        // Several connections, so more than one thread accepts: one `login` a minute in all.
        let mut answers = Vec::new();
        for _ in 0..4 {
            let mut c = RateLimitServiceClient::connect(s.grpc_url()).await.unwrap();
            answers.push(ok(&ask(&mut c, 0, vec![desc(&[("path", "/login")])]).await));
        }
        assert_eq!(
            answers,
            [true, false, false, false],
            "grpc_threads = {threads}"
        );
        s.stop().await;
    }
}
