//! `failure_mode = "local"`: while Redis is down, a local-mode policy is decided by the
//! embedded store at its limit (times the local share) instead of failing open or closed;
//! once Redis is back, decisions come from Redis again.

use std::sync::Arc;
use std::time::{Duration, Instant};

use sluice::{
    Algorithm, FailureMode, Identity, Limiter, LocalShare, Policy, StoreOptions, StoreUrl, Verdict,
};
use sluice_testkit::servers::RedisServer;

const LIMIT: u64 = 10;
const ATTEMPTS: u64 = 50;

fn local_policy() -> Arc<Policy> {
    let mut p = Policy::new(
        "local-fw",
        Algorithm::FixedWindow {
            limit: LIMIT,
            window_ms: 600_000,
        },
    )
    .unwrap();
    p.failure_mode = FailureMode::Local;
    Arc::new(p)
}

async fn limiter(url: &str, share: f64) -> Limiter {
    let options = StoreOptions {
        timeout: Duration::from_millis(50),
        ..Default::default()
    };
    let store = url
        .parse::<StoreUrl>()
        .unwrap()
        .connect(&options)
        .await
        .unwrap();
    Limiter::builder(store)
        .timeout(options.timeout)
        .local_share(LocalShare::new(share).unwrap())
        .build()
}

/// `n` checks one after the other: how many were admitted; every one must be decided (never
/// failed open or closed).
async fn admitted_of(l: &Limiter, policy: &Arc<Policy>, id: &Identity, n: u64) -> u64 {
    let mut admitted = 0;
    for _ in 0..n {
        let c = l.check(id, policy, 1).await;
        assert_eq!(c.verdict, Verdict::Decided, "{c:?}");
        admitted += u64::from(c.allowed);
    }
    admitted
}

async fn down_then_back(share: f64, expected_local: u64) {
    let mut server = RedisServer::redis();
    let l = limiter(&server.url(), share).await;
    let policy = local_policy();
    let id = Identity::new(format!("client-{share}"));

    server.stop();
    let local = admitted_of(&l, &policy, &id, ATTEMPTS).await;
    assert_eq!(
        local, expected_local,
        "with Redis down, share {share}: {local} of {ATTEMPTS} admitted"
    );

    // Back, empty: the first admission after the local limit is spent comes from Redis.
    server.restart();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let c = l.check(&id, &policy, 1).await;
        assert_eq!(c.verdict, Verdict::Decided, "{c:?}");
        if c.allowed {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "decisions did not return to Redis"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let keys = server.cli(&["KEYS", "*local-fw*"]);
    assert!(keys.contains("local-fw"), "Redis holds the state: {keys:?}");
    // Redis's own limit, counted from the admission above.
    let remote = admitted_of(&l, &policy, &id, ATTEMPTS).await;
    assert_eq!(remote, LIMIT - 1, "after recovery Redis decides");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_down_decides_locally_at_the_whole_limit_then_returns_to_redis() {
    down_then_back(1.0, LIMIT).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_down_decides_locally_at_the_configured_share() {
    down_then_back(0.3, 3).await;
}
