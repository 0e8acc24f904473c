//! The control plane kept in Redis and in a Redis Cluster: two limiters on one store (two
//! instances), a change made through one applied by the other within a second; automatic
//! bans escalate across them.

use std::sync::Arc;
use std::time::{Duration, Instant};

use sluice::{
    Algorithm, BanRule, ControlConfig, DenyReason, Identity, Limiter, ListEntry, ListKind,
    OverrideTarget, Policy, StoreOptions,
};
use sluice_testkit::servers::{RedisCluster, RedisServer};

fn policy(name: &str, limit: u64) -> Arc<Policy> {
    Arc::new(
        Policy::new(
            name,
            Algorithm::FixedWindow {
                limit,
                window_ms: 3_600_000,
            },
        )
        .unwrap(),
    )
}

async fn pair(url: &str) -> (Limiter, Limiter) {
    let options = StoreOptions {
        timeout: Duration::from_millis(500),
        ..Default::default()
    };
    let a = Limiter::connect(url, options.clone()).await.unwrap();
    let b = Limiter::connect(url, options).await.unwrap();
    let rule = ControlConfig {
        bans: [(
            "api".to_string(),
            BanRule {
                after: 2,
                within_ms: 60_000,
                duration_ms: 2_000,
                multiplier: 3.0,
                max_ms: 3_600_000,
            },
        )]
        .into(),
        ..Default::default()
    };
    a.control().configure(rule.clone());
    b.control().configure(rule);
    (a, b)
}

async fn reason(l: &Limiter, who: &str, p: &Arc<Policy>) -> Option<DenyReason> {
    let c = l.check(&Identity::new(who), p, 1).await;
    c.limits[0].decision.as_ref().and_then(|d| d.reason)
}

/// Waits at most a second for `f`; the time it took.
async fn within_a_second<F, Fut>(what: &str, mut f: F) -> Duration
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(1) {
        if f().await {
            return start.elapsed();
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("{what}: not within a second");
}

async fn shared_changes(url: &str) {
    let (a, b) = pair(url).await;
    assert_eq!(a.control().backend(), "redis");
    // A policy without a ban rule, so the denials while waiting do not ban.
    let plain = policy("plain", 2);
    for _ in 0..2 {
        assert!(b.check(&Identity::new("o"), &plain, 1).await.allowed);
    }
    let bigger = Algorithm::FixedWindow {
        limit: 4,
        window_ms: 3_600_000,
    };
    a.control()
        .set_override("plain", "o", OverrideTarget::Params(bigger), None)
        .await
        .unwrap();
    let took = within_a_second("step 1", || async {
        b.check(&Identity::new("o"), &plain, 1).await.allowed
    })
    .await;
    println!("override applied by the other instance after {took:?}");
    assert!(
        b.check(&Identity::new("o"), &plain, 1).await.allowed,
        "4th of 4"
    );
    assert!(
        !b.check(&Identity::new("o"), &plain, 1).await.allowed,
        "5th of 4"
    );

    let p = policy("api", 2);
    // Two denials ban for 2 s; after it, two more ban for 6 s.
    for _ in 0..2 {
        assert!(a.check(&Identity::new("f"), &p, 1).await.allowed);
    }
    assert_eq!(reason(&a, "f", &p).await, Some(DenyReason::Limited));
    assert_eq!(reason(&b, "f", &p).await, Some(DenyReason::Limited));
    within_a_second("step 2", || async {
        a.control().ban_left_ms("f", "api") > 0
    })
    .await;
    within_a_second("step 3", || async {
        reason(&b, "f", &p).await == Some(DenyReason::Banned)
    })
    .await;
    let first = a.control().ban_left_ms("f", "api");
    assert!((1_000..=2_000).contains(&first), "first ban {first} ms");
    tokio::time::sleep(Duration::from_millis(first + 20)).await;
    assert_eq!(reason(&b, "f", &p).await, Some(DenyReason::Limited));
    assert_eq!(reason(&a, "f", &p).await, Some(DenyReason::Limited));
    within_a_second("step 4", || async {
        b.control().ban_left_ms("f", "api") > 0
    })
    .await;
    let second = b.control().ban_left_ms("f", "api");
    assert!((5_000..=6_000).contains(&second), "second ban {second} ms");

    // Lists (on the policy without a ban rule: the checks while waiting would ban).
    let net = ListEntry::parse("10.9.0.0/16").unwrap();
    b.control()
        .list_add(ListKind::Deny, &net, Some(Duration::from_secs(60)))
        .await
        .unwrap();
    within_a_second("step 5", || async {
        reason(&a, "ip:10.9.8.7", &plain).await == Some(DenyReason::Denied)
    })
    .await;
    assert!(b.control().list_remove(ListKind::Deny, &net).await.unwrap());

    within_a_second("step 6", || async {
        reason(&a, "ip:10.9.8.7", &plain).await != Some(DenyReason::Denied)
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn changes_reach_the_other_instance_on_redis() {
    let server = RedisServer::redis();
    shared_changes(&server.url()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn changes_reach_the_other_instance_on_a_cluster() {
    let cluster = RedisCluster::start();
    shared_changes(&cluster.url()).await;
}
