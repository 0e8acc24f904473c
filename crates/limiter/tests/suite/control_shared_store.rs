//! The control plane kept in Redis and in a Redis Cluster, each with two limiters on one store
//! (two instances): every change is made through one instance and applied by the other within
//! a second. The rows: an override of a policy's parameters, automatic bans escalating across
//! the instances, a plan override, a manual ban scoped to one policy and lifted, allow and deny
//! entries naming networks and identities, `state`, `charge`, `refund` and `reset` (also under
//! an override), and a calendar-month window.

use std::sync::Arc;
use std::time::{Duration, Instant};

use sluice::core::algorithm::calendar::CalendarPeriod;
use sluice::{
    Algorithm, BanRule, ControlConfig, DenyReason, Identity, Limiter, ListEntry, ListKind,
    OverrideTarget, Policy, StoreOptions,
};
use sluice_testkit::servers::{RedisCluster, RedisServer};

fn fixed(limit: u64) -> Algorithm {
    Algorithm::FixedWindow {
        limit,
        window_ms: 3_600_000,
    }
}

fn policy(name: &str, algorithm: Algorithm) -> Arc<Policy> {
    Arc::new(Policy::new(name, algorithm).unwrap())
}

/// The plan `gold` (the policy `planned` at 5), for the rows of `every_row_*`.
fn plans() -> ControlConfig {
    ControlConfig {
        plans: [(
            "gold".to_string(),
            [("planned".to_string(), fixed(5))].into(),
        )]
        .into(),
        ..Default::default()
    }
}

/// Bans on the policy `api` after 2 denials, for 2 s, then 3 times as long each time.
fn escalating_bans() -> ControlConfig {
    ControlConfig {
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
    }
}

/// Two limiters on the store at `url` (two instances), both configured with `control`.
async fn pair(url: &str, control: ControlConfig) -> (Limiter, Limiter) {
    let options = StoreOptions {
        timeout: Duration::from_millis(500),
        ..Default::default()
    };
    let a = Limiter::connect(url, options.clone()).await.unwrap();
    let b = Limiter::connect(url, options).await.unwrap();
    a.control().configure(control.clone());
    b.control().configure(control);
    (a, b)
}

async fn reason(l: &Limiter, who: &str, p: &Arc<Policy>) -> Option<DenyReason> {
    let c = l.check(&client(who), p, 1).await;
    c.limits[0].decision.as_ref().and_then(|d| d.reason)
}

async fn admitted(l: &Limiter, who: &str, p: &Arc<Policy>, n: usize) -> usize {
    let mut ok = 0;
    for _ in 0..n {
        if l.check(&client(who), p, 1).await.allowed {
            ok += 1;
        }
    }
    ok
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

/// An override of parameters, bans escalating across the instances, a network deny entry.
async fn shared_changes(url: &str) {
    let (a, b) = pair(url, escalating_bans()).await;
    assert_eq!(a.control().backend(), "redis");
    // A policy without a ban rule, so the denials while waiting do not ban.
    let plain = policy("plain", fixed(2));
    for _ in 0..2 {
        assert!(b.check(&Identity::new("o"), &plain, 1).await.allowed);
    }
    a.control()
        .set_override("plain", "o", OverrideTarget::Params(fixed(4)), None)
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

    let p = policy("api", fixed(2));
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

async fn plan_override(a: &Limiter, b: &Limiter) {
    let p = policy("planned", fixed(2));
    assert_eq!(admitted(b, "p1", &p, 3).await, 2);
    a.control()
        .set_override("planned", "p1", OverrideTarget::Plan("gold".into()), None)
        .await
        .unwrap();
    // Denials while waiting write nothing: the first admitted check is the 3rd of gold's 5.
    within_a_second("plan override", || async {
        b.check(&Identity::new("p1"), &p, 1).await.allowed
    })
    .await;
    assert_eq!(admitted(b, "p1", &p, 3).await, 2, "5 in all");
    let read = b.control().get_override("planned", "p1").await.unwrap();
    assert_eq!(
        read.map(|o| o.target),
        Some(OverrideTarget::Plan("gold".into()))
    );
    assert!(a.control().remove_override("planned", "p1").await.unwrap());
    within_a_second("override removed", || async {
        b.control()
            .get_override("planned", "p1")
            .await
            .unwrap()
            .is_none()
    })
    .await;
}

async fn scoped_ban(a: &Limiter, b: &Limiter) {
    let (scoped, free) = (policy("scoped", fixed(100)), policy("free", fixed(100)));
    a.control()
        .ban("m1", Duration::from_secs(30), Some(vec!["scoped".into()]))
        .await
        .unwrap();
    within_a_second("ban", || async {
        reason(b, "m1", &scoped).await == Some(DenyReason::Banned)
    })
    .await;
    let c = b.check(&Identity::new("m1"), &scoped, 1).await;
    let left = c.limits[0].decision.as_ref().unwrap().retry_after_ms;
    assert!((28_000..=30_000).contains(&left), "retry after {left} ms");
    assert!(
        b.check(&Identity::new("m1"), &free, 1).await.allowed,
        "out of scope"
    );
    assert!(b.control().unban("m1").await.unwrap());
    within_a_second("ban lifted", || async {
        a.check(&Identity::new("m1"), &scoped, 1).await.allowed
    })
    .await;
}

/// The remaining of one check of `who` under `p`.
async fn remaining(l: &Limiter, who: &str, p: &Arc<Policy>) -> u64 {
    let c = l.check(&client(who), p, 1).await;
    c.limits[0].decision.as_ref().map_or(0, |d| d.remaining)
}

async fn identity_lists(a: &Limiter, b: &Limiter) {
    let p = policy("listed", fixed(2));
    // The waits use a policy of their own: an allow-listed check answers the whole limit as
    // remaining (1 here), one the store answers leaves 0.
    let probe = policy("probe", fixed(1));
    let vip = ListEntry::parse("vip:1").unwrap();
    a.control()
        .list_add(ListKind::Allow, &vip, Some(Duration::from_secs(60)))
        .await
        .unwrap();
    within_a_second("allow", || async {
        remaining(b, "vip:1", &probe).await == 1
    })
    .await;
    assert_eq!(
        admitted(b, "vip:1", &p, 5).await,
        5,
        "bypasses the limit of 2"
    );
    assert!(
        a.control()
            .list_remove(ListKind::Allow, &vip)
            .await
            .unwrap()
    );
    within_a_second("allow removed", || async {
        remaining(b, "vip:1", &probe).await == 0
    })
    .await;
    assert_eq!(
        admitted(b, "vip:1", &p, 3).await,
        2,
        "allowed checks consumed nothing"
    );

    // A deny entry naming an identity (the checks while waiting consume from a large limit).
    let p = policy("denied", fixed(1_000));
    let bad = ListEntry::parse("user:bad").unwrap();
    b.control()
        .list_add(ListKind::Deny, &bad, None)
        .await
        .unwrap();
    within_a_second("deny", || async {
        reason(a, "user:bad", &p).await == Some(DenyReason::Denied)
    })
    .await;
    assert!(b.control().list_remove(ListKind::Deny, &bad).await.unwrap());
    within_a_second("deny removed", || async {
        a.check(&Identity::new("user:bad"), &p, 1).await.allowed
    })
    .await;
}

async fn state_charge_refund_reset(a: &Limiter, b: &Limiter) {
    let p = policy("budget", fixed(10));
    let id = Identity::new("s1");
    assert!(a.check(&id, &p, 4).await.allowed);
    let s = b.state(&id, &p).await.unwrap();
    assert_eq!((s.limit, s.remaining), (10, 6));
    assert!(s.reset_after_ms > 0 && s.reset_after_ms <= 3_600_000);
    assert_eq!(
        b.state(&id, &p).await.unwrap().remaining,
        6,
        "state consumes nothing"
    );
    assert_eq!(b.charge(&id, &p, 3).await.unwrap().remaining, 3);
    assert_eq!(a.refund(&id, &p, 5).await.unwrap().remaining, 8);
    assert_eq!(
        a.refund(&id, &p, 50).await.unwrap().remaining,
        10,
        "bounded by capacity"
    );
    let d = b.charge(&id, &p, 25).await.unwrap();
    assert_eq!((d.allowed, d.remaining), (false, 0), "in debt");
    assert!(!a.check(&id, &p, 1).await.allowed);
    assert!(a.reset(&id, &p).await.unwrap());
    assert_eq!(
        b.state(&id, &p).await.unwrap().remaining,
        10,
        "reset restores"
    );
    assert!(b.check(&id, &p, 10).await.allowed);

    // Under an override, the same operations use the overridden numbers.
    a.control()
        .set_override("budget", "s2", OverrideTarget::Params(fixed(40)), None)
        .await
        .unwrap();
    let id = Identity::new("s2");
    within_a_second("override of state", || async {
        b.state(&id, &p).await.unwrap().limit == 40
    })
    .await;
    assert_eq!(b.charge(&id, &p, 30).await.unwrap().remaining, 10);
    assert_eq!(a.refund(&id, &p, 100).await.unwrap().remaining, 40);
}

async fn calendar_month(a: &Limiter, b: &Limiter) {
    let p = policy(
        "monthly",
        Algorithm::CalendarWindow {
            limit: 3,
            period: CalendarPeriod::Month,
        },
    );
    let id = Identity::new("c1");
    let now_ms = sluice::core::Clock::now(&sluice::core::SystemClock) / 1000;
    let (_, end) = CalendarPeriod::Month.bounds(now_ms);
    let c = a.check(&id, &p, 1).await;
    assert!(c.allowed);
    let d = c.limits[0].decision.as_ref().unwrap();
    let expected = end - now_ms;
    assert!(
        d.reset_after_ms.abs_diff(expected) < 5_000,
        "reset after {} ms, the 1st is {expected} ms away",
        d.reset_after_ms
    );
    assert_eq!(
        admitted(b, "c1", &p, 3).await,
        2,
        "3 a month, on both instances"
    );
    let c = a.check(&id, &p, 1).await;
    let d = c.limits[0].decision.as_ref().unwrap();
    assert_eq!(d.reason, Some(DenyReason::Limited));
    assert!(
        d.retry_after_ms.abs_diff(expected) < 5_000,
        "{}",
        d.retry_after_ms
    );
}

async fn all_rows(url: &str) {
    let (a, b) = pair(url, plans()).await;
    plan_override(&a, &b).await;
    scoped_ban(&a, &b).await;
    identity_lists(&a, &b).await;
    state_charge_refund_reset(&a, &b).await;
    calendar_month(&a, &b).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_row_on_redis() {
    let server = RedisServer::redis();
    all_rows(&server.url()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_row_on_a_cluster() {
    let cluster = RedisCluster::start();
    all_rows(&cluster.url()).await;
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

/// The identity the tower layer gives a client of this address (`ip:ADDRESS`), carrying the
/// address, so the deny list's networks apply; any other text is a plain identity.
fn client(who: &str) -> Identity {
    Identity::parse_client_ip(who).unwrap_or_else(|| Identity::new(who))
}
