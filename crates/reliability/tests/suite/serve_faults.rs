//! Faults through `sluice serve` (the real `sluice_server::run` on 127.0.0.1:0) on a real
//! Redis: killed mid-load and restarted, paused, out of memory. Over HTTP each answer comes
//! within the store timeout plus a margin, carries the policy's failure mode (`verdict`
//! `failed_open` / `failed_closed`), and is counted in `/metrics`
//! (`sluice_store_failures_total{mode}`, `sluice_decisions_total{policy,outcome}`); Envoy's
//! `ShouldRateLimit` answers `UNAVAILABLE` so Envoy's own `failure_mode_deny` decides;
//! `/readyz` says 503 while the store is down; enforcement resumes within 1 s of recovery and
//! the server keeps running.

use std::time::{Duration, Instant};

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use serde_json::{Value, json};
use sluice_reliability::serve::{TestServer, client, start_with};
use sluice_reliability::{Outcome, Tally, prom, record};
use sluice_testkit::servers::RedisServer;

/// Store timeout in the configuration.
const TIMEOUT: Duration = Duration::from_millis(50);
/// HTTP on loopback plus scheduling slack on a busy 2-core machine.
const MARGIN: Duration = Duration::from_millis(200);
const RECOVERY: Duration = Duration::from_secs(1);

const DOMAIN: &str = "domain: edge\ndescriptors:\n  - key: user\n    rate_limit:\n      unit: hour\n      requests_per_unit: 1000000\n";

fn config(redis_url: &str, tag: &str) -> String {
    format!(
        r#"
[store]
url = "{redis_url}"
timeout = "50ms"

[policies.{tag}-open]
algorithm = "token-bucket"
capacity = 1000000
rate = "1000/s"
failure_mode = "open"

[policies.{tag}-closed]
algorithm = "token-bucket"
capacity = 1000000
rate = "1000/s"
failure_mode = "closed"

[policies.{tag}-small]
algorithm = "fixed-window"
limit = 3
window = "1h"
failure_mode = "closed"

[envoy]
files = ["edge.yaml"]
"#
    )
}

async fn start(redis: &RedisServer, tag: &str) -> TestServer {
    start_with(&config(&redis.url(), tag), &[("edge.yaml", DOMAIN)]).await
}

async fn check(s: &TestServer, policy: &str, identity: &str) -> (Duration, Value) {
    let start = Instant::now();
    let res = client()
        .post(s.url("/v1/check"))
        .json(&json!({"policy": policy, "identity": identity}))
        .timeout(Duration::from_secs(5))
        .send()
        .await
        .expect("the server answers");
    assert_eq!(res.status(), 200);
    let v: Value = res.json().await.unwrap();
    (start.elapsed(), v)
}

fn outcome(v: &Value) -> Outcome {
    match (v["verdict"].as_str(), v["allowed"].as_bool()) {
        (Some("failed_open"), _) => Outcome::FailedOpen,
        (Some("failed_closed"), _) => Outcome::FailedClosed,
        (Some("decided"), Some(true)) => Outcome::Allowed,
        (Some("decided"), Some(false)) => Outcome::Denied,
        other => panic!("unexpected answer {other:?}: {v}"),
    }
}

/// `tasks` clients calling `/v1/check` for `dur` (at most 2,000 calls each).
async fn load(s: &TestServer, policy: &str, tasks: usize, dur: Duration) -> Tally {
    let url = s.url("/v1/check");
    let mut handles = Vec::new();
    for t in 0..tasks {
        let (url, policy) = (url.clone(), policy.to_string());
        handles.push(tokio::spawn(async move {
            let c = client();
            let mut tally = Tally::default();
            let end = Instant::now() + dur;
            for _ in 0..2_000 {
                if Instant::now() >= end {
                    break;
                }
                let start = Instant::now();
                let res = c
                    .post(&url)
                    .json(&json!({"policy": policy, "identity": format!("u{t}")}))
                    .timeout(Duration::from_secs(5))
                    .send()
                    .await
                    .expect("the server answers");
                assert_eq!(res.status(), 200);
                let v: Value = res.json().await.unwrap();
                tally.add(start.elapsed(), outcome(&v));
                tokio::time::sleep(Duration::from_millis(3)).await;
            }
            tally
        }));
    }
    let mut total = Tally::default();
    for h in handles {
        total.merge(&h.await.expect("no client task panics"));
    }
    total
}

async fn metrics(s: &TestServer) -> String {
    let res = client().get(s.url("/metrics")).send().await.unwrap();
    assert_eq!(res.status(), 200);
    res.text().await.unwrap()
}

async fn rls_code(s: &TestServer) -> (Duration, Result<i32, tonic::Code>) {
    let mut c = RateLimitServiceClient::connect(s.grpc_url()).await.unwrap();
    let req = RateLimitRequest {
        domain: "edge".into(),
        descriptors: vec![RateLimitDescriptor {
            entries: vec![Entry {
                key: "user".into(),
                value: "alice".into(),
            }],
            ..Default::default()
        }],
        hits_addend: 1,
    };
    let start = Instant::now();
    let r = c.should_rate_limit(req).await;
    (
        start.elapsed(),
        r.map(|r| r.into_inner().overall_code).map_err(|e| e.code()),
    )
}

async fn ready(s: &TestServer) -> u16 {
    client()
        .get(s.url("/readyz"))
        .send()
        .await
        .unwrap()
        .status()
        .as_u16()
}

async fn time_to_recover(s: &TestServer, policy: &str) -> Duration {
    let start = Instant::now();
    loop {
        let (_, v) = check(s, policy, "recovery-probe").await;
        if v["verdict"] == "decided" {
            return start.elapsed();
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "no recovery within 10 s"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

async fn assert_enforced(s: &TestServer, tag: &str) {
    let id = format!("enforced-{}", rand::random::<u64>());
    let mut admitted = 0;
    for _ in 0..5 {
        let (_, v) = check(s, &format!("{tag}-small"), &id).await;
        assert_eq!(v["verdict"], "decided");
        admitted += u64::from(v["allowed"] == true);
    }
    assert_eq!(admitted, 3, "the limit holds after recovery");
}

/// Runs open and closed load during a fault, checks latency, verdicts and metrics. With
/// `silent`, the server went quiet without closing its connections (a pause) right after
/// answering: for the first `store.unresponsive_after` (500 ms) that looks like a busy
/// server, so fail-open policies are denied as overloaded before they fail open.
async fn during_fault(
    s: &TestServer,
    tag: &str,
    what: &str,
    dur: Duration,
    unready: bool,
    silent: bool,
) {
    let before = metrics(s).await;
    let (open_policy, closed_policy) = (format!("{tag}-open"), format!("{tag}-closed"));
    let (a, b) = tokio::join!(
        load(s, &open_policy, 2, dur),
        load(s, &closed_policy, 2, dur)
    );
    record(&a.line(&format!("serve, {what} (fail open)")));
    record(&b.line(&format!("serve, {what} (fail closed)")));
    for t in [&a, &b] {
        assert!(
            t.worst <= TIMEOUT + MARGIN,
            "{what}: an HTTP answer took {:?}",
            t.worst
        );
    }
    assert!(
        a.failed_open > 0 && (silent || a.failed_closed == 0) && a.denied == 0,
        "{a:?}"
    );
    assert!(b.failed_closed > 0 && b.failed_open == 0, "{b:?}");

    let after = metrics(s).await;
    let delta = |name: &str, labels: &[(&str, &str)]| {
        prom::sum(&after, name, labels) - prom::sum(&before, name, labels)
    };
    assert_eq!(
        delta(
            "sluice_decisions_total",
            &[("policy", &open_policy), ("outcome", "failed_open")]
        ),
        a.failed_open as f64,
        "every fail-open answer is counted under its policy"
    );
    let outcome = |policy: &str, outcome: &str| {
        delta(
            "sluice_decisions_total",
            &[("policy", policy), ("outcome", outcome)],
        )
    };
    assert_eq!(
        outcome(&closed_policy, "failed_closed") + outcome(&closed_policy, "overloaded"),
        b.failed_closed as f64
    );
    // Overload answers (a silent server taken for a busy one) are counted as such.
    assert_eq!(
        outcome(&open_policy, "overloaded"),
        a.failed_closed as f64,
        "every overload answer is counted under its policy"
    );
    // Other tests of this binary may fail at the same time, so at least ours.
    assert!(delta("sluice_store_failures_total", &[("mode", "open")]) >= a.failed_open as f64);
    // An overload answer (counted just above) is no store failure.
    assert!(
        delta("sluice_store_failures_total", &[("mode", "closed")])
            >= b.failed_closed as f64 - outcome(&closed_policy, "overloaded")
    );
    assert!(
        delta("sluice_store_errors_total", &[]) > 0.0,
        "store errors are counted by kind"
    );

    // Envoy: UNAVAILABLE, quickly, so Envoy applies failure_mode_deny.
    let (took, code) = rls_code(s).await;
    assert_eq!(
        code,
        Err(tonic::Code::Unavailable),
        "{what}: RLS during the fault"
    );
    assert!(took <= TIMEOUT + MARGIN, "RLS answer took {took:?}");
    // /readyz probes with a read-only call: it sees a dead or paused server, not one that
    // only refuses writes (maxmemory), which still answers reads.
    let expected = if unready { 503 } else { 200 };
    assert_eq!(ready(s).await, expected, "{what}: /readyz");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_redis_killed_then_restarted() {
    let mut redis = RedisServer::redis();
    let s = start(&redis, "kill").await;
    let healthy = load(&s, "kill-open", 2, Duration::from_millis(200)).await;
    assert_eq!(healthy.allowed, healthy.requests);
    assert_eq!(rls_code(&s).await.1, Ok(1), "RLS OK while healthy");

    redis.stop();
    during_fault(
        &s,
        "kill",
        "Redis killed",
        Duration::from_millis(1200),
        true,
        false,
    )
    .await;

    redis.restart();
    let took = time_to_recover(&s, "kill-open").await;
    record(&format!(
        "serve, Redis killed: enforcement resumed {:.0} ms after the restart",
        took.as_secs_f64() * 1000.0
    ));
    assert!(took < RECOVERY, "recovery took {took:?}");
    assert_enforced(&s, "kill").await;
    assert_eq!(ready(&s).await, 200);
    assert_eq!(rls_code(&s).await.1, Ok(1), "RLS OK again");
    assert!(s.is_running(), "no panic, the server runs on");
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_redis_paused() {
    let redis = RedisServer::redis();
    let s = start(&redis, "pause").await;
    let _ = check(&s, "pause-open", "warm").await;
    let pause = Duration::from_millis(1500);
    let paused_at = Instant::now();
    assert!(
        redis
            .cli(&["CLIENT", "PAUSE", &pause.as_millis().to_string(), "ALL"])
            .contains("OK")
    );
    during_fault(
        &s,
        "pause",
        "CLIENT PAUSE",
        Duration::from_millis(800),
        true,
        true,
    )
    .await;
    tokio::time::sleep((paused_at + pause).saturating_duration_since(Instant::now())).await;
    let took = time_to_recover(&s, "pause-open").await;
    record(&format!(
        "serve, CLIENT PAUSE: enforcement resumed {:.0} ms after the pause ended",
        took.as_secs_f64() * 1000.0
    ));
    assert!(took < RECOVERY, "recovery took {took:?}");
    assert_enforced(&s, "pause").await;
    assert!(s.is_running());
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_redis_out_of_memory() {
    let redis = RedisServer::redis();
    let s = start(&redis, "oom").await;
    let _ = check(&s, "oom-open", "warm").await;
    assert!(
        redis
            .cli(&["CONFIG", "SET", "maxmemory-policy", "noeviction"])
            .contains("OK")
    );
    assert!(
        redis
            .cli(&["CONFIG", "SET", "maxmemory", "1mb"])
            .contains("OK")
    );
    during_fault(
        &s,
        "oom",
        "maxmemory reached",
        Duration::from_millis(600),
        false,
        false,
    )
    .await;
    assert!(
        redis
            .cli(&["CONFIG", "SET", "maxmemory", "0"])
            .contains("OK")
    );
    let took = time_to_recover(&s, "oom-open").await;
    record(&format!(
        "serve, maxmemory: enforcement resumed {:.0} ms after the limit was lifted",
        took.as_secs_f64() * 1000.0
    ));
    assert!(took < RECOVERY, "recovery took {took:?}");
    assert_enforced(&s, "oom").await;
    assert!(s.is_running());
    s.stop().await;
}
