//! `mode: leased` on Envoy limits: three `sluice serve` instances on one real Redis, each
//! holding its own slices of every descriptor's quota, are driven through `ShouldRateLimit`
//! with random arrivals (which instance, how many calls at once). Together they never admit
//! more than the quota (plus, for a bucket, what it refilled while the case ran), and fall
//! short of it by at most the slices the instances can hold (`docs/leased-mode.md`).

use std::time::{SystemTime, UNIX_EPOCH};

use crate::support::{Redis, TestServer, start_with};
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use proptest::prelude::*;
use proptest::test_runner::{Config as ProptestConfig, TestCaseError, TestRunner};
use sluice::core::algorithm::AlgorithmKind;
use sluice::leased::max_slice;
use sluice_server::envoy::quota_algorithms;
use tonic::transport::Channel;

const INSTANCES: usize = 3;

/// One descriptor key per algorithm leasing serves, each with its own quota and slice lifetime
/// (a short one makes slices expire and go back while the window still runs).
const LIMITS: [(&str, &str, u32, &str); 3] = [
    ("fixed-window", "minute", 60, "300ms"),
    ("token-bucket", "minute", 90, "60s"),
    ("gcra", "minute", 120, "1s"),
];

fn domain_yaml() -> String {
    let mut y = String::from("domain: edge\ndescriptors:\n");
    for (algorithm, unit, rpu, ttl) in LIMITS {
        y.push_str(&format!(
            "  - key: {algorithm}\n    rate_limit:\n      name: rls_leased_{algorithm}\n      unit: {unit}\n      \
             requests_per_unit: {rpu}\n      algorithm: {algorithm}\n      mode: leased\n      \
             lease_ttl: {ttl}\n"
        ));
    }
    y
}

fn request(key: &str, value: &str) -> RateLimitRequest {
    RateLimitRequest {
        domain: "edge".into(),
        descriptors: vec![RateLimitDescriptor {
            entries: vec![Entry {
                key: key.into(),
                value: value.into(),
            }],
            ..Default::default()
        }],
        hits_addend: 1,
    }
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

/// Sends `bursts` (instance, calls at once) in order for one fresh descriptor value; returns
/// how many were admitted, and the wall times (ms) before the first and after the last call.
async fn drive(
    clients: &[RateLimitServiceClient<Channel>],
    key: &str,
    value: &str,
    bursts: &[(usize, usize)],
) -> (u64, u64, u64) {
    let start = now_ms();
    let mut admitted = 0;
    for &(instance, at_once) in bursts {
        let calls = (0..at_once).map(|_| {
            let mut c = clients[instance % clients.len()].clone();
            let req = request(key, value);
            async move { c.should_rate_limit(req).await }
        });
        for r in futures_join_all(calls).await {
            let r = r.expect("ShouldRateLimit answers").into_inner();
            if r.overall_code == Code::Ok as i32 {
                admitted += 1;
            }
        }
    }
    (admitted, start, now_ms())
}

/// `futures::future::join_all` without the crate: every call spawned, awaited in order.
async fn futures_join_all<F, T>(calls: impl Iterator<Item = F>) -> Vec<T>
where
    F: std::future::Future<Output = T> + Send + 'static,
    T: Send + 'static,
{
    let handles: Vec<_> = calls.map(tokio::spawn).collect();
    let mut out = Vec::with_capacity(handles.len());
    for h in handles {
        out.push(h.await.expect("call task"));
    }
    out
}

/// A case: which limit, and the arrivals (instance, calls at once), several times its quota.
fn case() -> impl Strategy<Value = (usize, Vec<(usize, usize)>)> {
    (0..LIMITS.len()).prop_flat_map(|limit| {
        let rpu = LIMITS[limit].2 as usize;
        let burst = (0..INSTANCES, prop_oneof![3 => 1usize..3, 1 => 3usize..24]);
        (Just(limit), prop::collection::vec(burst, rpu * 2..rpu * 3))
    })
}

#[test]
fn leased_envoy_limits_on_three_instances_never_admit_more_than_the_quota() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let Some(redis) = Redis::start() else {
        panic!("redis-server is needed for this test: run scripts/install-test-deps");
    };
    let toml = format!(
        "admin_token = \"s3cret\"\n[store]\nurl = \"{}\"\n[envoy]\nfiles = [\"edge.yaml\"]\n",
        redis.url()
    );
    let yaml = domain_yaml();
    let (servers, clients): (Vec<TestServer>, Vec<RateLimitServiceClient<Channel>>) =
        rt.block_on(async {
            let mut servers = Vec::new();
            let mut clients = Vec::new();
            for _ in 0..INSTANCES {
                let s = start_with(&toml, &[("edge.yaml", yaml.as_str())]).await;
                clients.push(RateLimitServiceClient::connect(s.grpc_url()).await.unwrap());
                servers.push(s);
            }
            (servers, clients)
        });

    let mut runner = TestRunner::new(ProptestConfig {
        cases: 12,
        failure_persistence: None,
        ..ProptestConfig::default()
    });
    let next_value = std::sync::atomic::AtomicU64::new(0);
    let admitted_in_all = std::sync::atomic::AtomicU64::new(0);
    let result = runner.run(&case(), |(limit, bursts)| {
        let (algorithm, _, rpu, _) = LIMITS[limit];
        let value = format!(
            "v{}",
            next_value.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        );
        let (admitted, start, end) = rt.block_on(drive(&clients, algorithm, &value, &bursts));
        let quota = u64::from(rpu);
        let window_ms = 60_000;
        let most = if algorithm == "fixed-window" {
            // One window's quota: a case that straddles two windows says nothing exact.
            prop_assume!(start / window_ms == end / window_ms);
            quota
        } else {
            // The full bucket, and what it refilled while the case ran (whole units).
            quota + (end - start) * quota / window_ms
        };
        let offered: usize = bursts.iter().map(|b| b.1).sum();
        admitted_in_all.fetch_add(admitted, std::sync::atomic::Ordering::Relaxed);
        prop_assert!(
            admitted <= most,
            "{algorithm} {rpu}/min on {INSTANCES} instances admitted {admitted} of {offered}, \
             more than {most}"
        );
        // Short only by what the instances hold: each at most one slice.
        let kind = AlgorithmKind::parse_among(algorithm, &quota_algorithms()).unwrap();
        let slice = max_slice(&kind.for_quota(quota, window_ms).unwrap());
        let fewest = quota.saturating_sub(slice * INSTANCES as u64);
        prop_assert!(
            offered as u64 <= fewest || admitted >= fewest,
            "{algorithm} {rpu}/min admitted {admitted} of {offered}, fewer than {fewest}"
        );
        Ok::<(), TestCaseError>(())
    });
    // And the admissions came from slices: far fewer store reservations than admissions.
    let reservations = rt.block_on(lease_reservations(&servers[0]));
    let admitted = admitted_in_all.into_inner();
    rt.block_on(async {
        for s in servers {
            s.stop().await;
        }
    });
    drop(redis);
    if let Err(e) = result {
        panic!("{e}");
    }
    assert!(
        (1.0..admitted as f64 / 2.0).contains(&reservations),
        "{reservations} slice reservations for {admitted} admissions"
    );
}

/// `sluice_lease_reservations_total` of this test's policies (every server of the process
/// shares one metrics recorder, so one server shows all three instances').
async fn lease_reservations(s: &TestServer) -> f64 {
    let text = crate::support::client()
        .get(s.url("/metrics"))
        .bearer_auth("s3cret")
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    text.lines()
        .filter(|l| l.starts_with("sluice_lease_reservations_total") && l.contains("rls_leased_"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

#[test]
fn leased_mode_on_a_sliding_window_is_refused_at_its_line() {
    let dir = sluice_server::testing::temp_dir("rls-leased");
    std::fs::write(
        dir.join("edge.yaml"),
        "domain: edge\ndescriptors:\n  - key: user\n    rate_limit:\n      unit: second\n      \
         requests_per_unit: 5\n      algorithm: sliding-counter\n      mode: leased\n",
    )
    .unwrap();
    let file = dir.join("sluice.toml");
    std::fs::write(&file, "[envoy]\nfiles = [\"edge.yaml\"]\n").unwrap();
    let e = sluice_server::config::Config::load(&file)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("edge.yaml:3: descriptors[0].rate_limit.mode: leased supports token-bucket, gcra and fixed-window, not sliding-counter"),
        "{e}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
