//! The layer honours the limiter's control plane, over real HTTP on 127.0.0.1:0. On the
//! embedded store: an override changes the limit, an allow entry bypasses it, a deny entry (a
//! network) gets 403, a ban gets 429 with the time left in `Retry-After`. On a Redis Cluster,
//! with the control plane driven by a second limiter on the same Cluster (another instance):
//! a plan override, allow and deny entries, a ban that escalates, a reset, a refund, a route
//! counting only 401s and a calendar-month window with its `RateLimit` reset. Each row has
//! its own route and policy, since every request comes from one client (`ip:127.0.0.1`).

use crate::support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::Router;
use axum::routing::get as route;
use http::StatusCode;
use sluice::core::algorithm::calendar::CalendarPeriod;
use sluice::{
    Algorithm, BanRule, ControlConfig, Identity, Limiter, ListEntry, ListKind, OverrideTarget,
    Policy, StoreOptions,
};
use sluice_http::{Count, RateLimitLayer, Rule};
use sluice_testkit::servers::RedisCluster;
use support::get;

const ME: &str = "ip:127.0.0.1";

fn fixed(name: &str, limit: u64) -> Policy {
    Policy::new(
        name,
        Algorithm::FixedWindow {
            limit,
            window_ms: 3_600_000,
        },
    )
    .unwrap()
}

fn monthly() -> Policy {
    Policy::new(
        "monthly",
        Algorithm::CalendarWindow {
            limit: 3,
            period: CalendarPeriod::Month,
        },
    )
    .unwrap()
}

async fn statuses(addr: std::net::SocketAddr, path: &str, n: usize) -> Vec<u16> {
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        out.push(get(addr, path, &[]).await.status.as_u16());
    }
    out
}

/// Waits at most a second for `f`.
async fn within_a_second<F, Fut>(what: &str, f: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    within(what, Duration::from_secs(1), f).await
}

/// Waits at most a second for `/banned` to answer that the identity is banned, and returns
/// that answer's `Retry-After` (seconds).
async fn ban_retry_after(addr: std::net::SocketAddr, what: &str) -> u64 {
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(1) {
        let r = get(addr, "/banned", &[]).await;
        if r.text().contains("banned from rate limit") {
            assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS);
            return r.header("retry-after").unwrap().parse().unwrap();
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("{what}: not banned within a second");
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

/// 200 for the right password, 401 for any other.
async fn login(uri: http::Uri) -> StatusCode {
    if uri.query() == Some("password=right") {
        StatusCode::OK
    } else {
        StatusCode::UNAUTHORIZED
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_rule_through_the_layer_on_a_cluster() {
    let cluster = RedisCluster::start();
    let options = StoreOptions {
        timeout: Duration::from_millis(500),
        ..Default::default()
    };
    let served = Limiter::connect(&cluster.url(), options.clone())
        .await
        .unwrap();
    let admin = Limiter::connect(&cluster.url(), options).await.unwrap();
    let control = ControlConfig {
        plans: [(
            "gold".to_string(),
            [("plan".to_string(), fixed("plan", 5).algorithm)].into(),
        )]
        .into(),
        bans: [(
            "banned".to_string(),
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
    served.control().configure(control.clone());
    admin.control().configure(control);

    let layer = RateLimitLayer::builder(served)
        .rule(Rule::new("/plan").policy(fixed("plan", 2)))
        .rule(Rule::new("/listed").policy(fixed("listed", 2)))
        .rule(Rule::new("/banned").policy(fixed("banned", 2)))
        .rule(Rule::new("/reset").policy(fixed("reset", 2)))
        .rule(Rule::new("/refund").policy(fixed("refund", 10)))
        .rule(
            Rule::new("/login")
                .policy(fixed("login", 3))
                .count(Count::statuses([401]).unwrap()),
        )
        .rule(Rule::new("/monthly").policy(monthly()))
        .build();
    let ok = || route(|| async { "ok" });
    let addr = support::serve(
        Router::new()
            .route("/plan", ok())
            .route("/listed", ok())
            .route("/banned", ok())
            .route("/reset", ok())
            .route("/refund", ok())
            .route("/monthly", ok())
            .route("/login", route(login))
            .layer(layer),
    )
    .await;
    let c = admin.control();

    // A plan override set through the other instance: gold's 5 instead of 2.
    assert_eq!(statuses(addr, "/plan", 3).await, [200, 200, 429]);
    c.set_override("plan", ME, OverrideTarget::Plan("gold".into()), None)
        .await
        .unwrap();
    within_a_second("plan override", || async {
        get(addr, "/plan", &[]).await.status == StatusCode::OK
    })
    .await;
    assert_eq!(
        statuses(addr, "/plan", 3).await,
        [200, 200, 429],
        "5 in all"
    );

    // An allow entry bypasses the limit; a deny network answers 403.
    let me = ListEntry::parse(ME).unwrap();
    c.list_add(ListKind::Allow, &me, None).await.unwrap();
    within_a_second("allow", || async {
        statuses(addr, "/listed", 3).await == [200, 200, 200]
    })
    .await;
    assert_eq!(statuses(addr, "/listed", 5).await, [200; 5]);
    c.list_remove(ListKind::Allow, &me).await.unwrap();
    let net = ListEntry::parse("127.0.0.0/8").unwrap();
    c.list_add(ListKind::Deny, &net, None).await.unwrap();
    within_a_second("deny", || async {
        get(addr, "/listed", &[]).await.status == StatusCode::FORBIDDEN
    })
    .await;
    c.list_remove(ListKind::Deny, &net).await.unwrap();
    within_a_second("deny removed", || async {
        get(addr, "/listed", &[]).await.status != StatusCode::FORBIDDEN
    })
    .await;

    // Two denials ban for 2 s; after it, two more ban for 6 s (the other instance sees both).
    assert_eq!(statuses(addr, "/banned", 4).await, [200, 200, 429, 429]);
    let first = ban_retry_after(addr, "ban").await;
    assert!((1..=2).contains(&first), "first ban {first} s");
    within_a_second("ban seen by the other instance", || async {
        admin.control().ban_left_ms(ME, "banned") > 0
    })
    .await;
    let left = admin.control().ban_left_ms(ME, "banned");
    tokio::time::sleep(Duration::from_millis(left + 50)).await;
    assert_eq!(
        statuses(addr, "/banned", 2).await,
        [429, 429],
        "limited again"
    );
    let second = ban_retry_after(addr, "second ban").await;
    assert!((5..=6).contains(&second), "second ban {second} s");

    // A reset through the other instance restores the limit.
    let me_id = Identity::new(ME);
    assert_eq!(statuses(addr, "/reset", 3).await, [200, 200, 429]);
    let reset = Arc::new(fixed("reset", 2));
    assert!(admin.reset(&me_id, &reset).await.unwrap());
    // The served instance trusts the denial it remembers for at most a second after the
    // store gave it (sluice::deny_cache::MAX_TRUST_MS).
    let trust = Duration::from_millis(sluice::deny_cache::MAX_TRUST_MS + 200);
    within("reset", trust, || async {
        get(addr, "/reset", &[]).await.status == StatusCode::OK
    })
    .await;
    assert_eq!(statuses(addr, "/reset", 2).await, [200, 429], "2 again");

    // A charge and a refund through the other instance move what the layer admits.
    let refund = Arc::new(fixed("refund", 10));
    assert_eq!(admin.charge(&me_id, &refund, 9).await.unwrap().remaining, 1);
    assert_eq!(statuses(addr, "/refund", 2).await, [200, 429]);
    assert_eq!(admin.refund(&me_id, &refund, 3).await.unwrap().remaining, 3);
    within("refund", trust, || async {
        get(addr, "/refund", &[]).await.status == StatusCode::OK
    })
    .await;
    assert_eq!(
        statuses(addr, "/refund", 3).await,
        [200, 200, 429],
        "3 given back"
    );

    // Counting only 401s: successes are free, the 4th failure is refused before the handler.
    for _ in 0..10 {
        let r = get(addr, "/login?password=right", &[]).await;
        assert_eq!(r.status, StatusCode::OK);
    }
    for _ in 0..3 {
        let r = get(addr, "/login?password=wrong", &[]).await;
        assert_eq!(r.status, StatusCode::UNAUTHORIZED);
    }
    let r = get(addr, "/login?password=right", &[]).await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS);
    let login = Arc::new(fixed("login", 3));
    assert_eq!(admin.state(&me_id, &login).await.unwrap().remaining, 0);

    // A calendar month: 3 a month, and `RateLimit` counts to the 1st.
    let now_s = sluice::core::Clock::now(&sluice::core::SystemClock) / 1_000_000;
    let (_, end_ms) = CalendarPeriod::Month.bounds(now_s * 1000);
    let to_first = end_ms / 1000 - now_s;
    let r = get(addr, "/monthly", &[]).await;
    assert_eq!(r.status, StatusCode::OK);
    let header = r.header("ratelimit").unwrap();
    let t: u64 = header
        .strip_prefix("\"monthly\";r=2;t=")
        .unwrap_or_else(|| panic!("{header}"))
        .parse()
        .unwrap();
    assert!(
        t.abs_diff(to_first) <= 5,
        "t={t}, the 1st is {to_first} s away"
    );
    assert_eq!(statuses(addr, "/monthly", 3).await, [200, 200, 429]);
}

#[tokio::test]
async fn overrides_lists_and_bans_reach_the_layer() {
    let limiter = Limiter::memory();
    let control = limiter.control().clone();
    let layer = RateLimitLayer::builder(limiter)
        .rule(Rule::new("/").policy(fixed("site", 2)))
        .build();
    let addr = support::serve(
        Router::new()
            .route("/ok", route(|| async { "ok" }))
            .layer(layer),
    )
    .await;
    // The client is 127.0.0.1: its identity is ME.
    let me = ME;

    // Allowed: bypasses the limit of 2.
    let allow = ListEntry::parse(me).unwrap();
    control
        .list_add(ListKind::Allow, &allow, None)
        .await
        .unwrap();
    assert_eq!(statuses(addr, "/ok", 5).await, vec![200; 5]);
    control.list_remove(ListKind::Allow, &allow).await.unwrap();
    assert_eq!(statuses(addr, "/ok", 3).await, vec![200, 200, 429]);

    // An override to 4 keeps the 2 used: 2 more.
    control
        .set_override(
            "site",
            me,
            OverrideTarget::Params(fixed("site", 4).algorithm),
            None,
        )
        .await
        .unwrap();
    assert_eq!(statuses(addr, "/ok", 3).await, vec![200, 200, 429]);

    // Denied by network: 403, problem+json, no Retry-After.
    let net = ListEntry::parse("127.0.0.0/8").unwrap();
    control.list_add(ListKind::Deny, &net, None).await.unwrap();
    let r = get(addr, "/ok", &[]).await;
    assert_eq!(r.status, StatusCode::FORBIDDEN);
    assert_eq!(r.header("content-type"), Some("application/problem+json"));
    assert!(r.text().contains("deny list"), "{}", r.text());
    assert_eq!(r.header("retry-after"), None);
    control.list_remove(ListKind::Deny, &net).await.unwrap();

    // Banned: 429 with the ban's time left.
    control.remove_override("site", me).await.unwrap();
    control
        .ban(me, Duration::from_secs(90), None)
        .await
        .unwrap();
    let r = get(addr, "/ok", &[]).await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(r.header("retry-after"), Some("90"));
    assert!(r.text().contains("banned"), "{}", r.text());
}
