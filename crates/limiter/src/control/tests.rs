use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use sluice_core::{Algorithm, DenyReason, Identity, ManualClock, Policy};

use super::*;
use crate::Limiter;

fn limiter(control: ControlPlane) -> Limiter {
    let store = Arc::new(sluice_memory::MemoryStore::builder().build());
    Limiter::builder(store).control(control).build()
}

fn window(limit: u64) -> Arc<Policy> {
    Arc::new(
        Policy::new(
            "api",
            Algorithm::FixedWindow {
                limit,
                window_ms: 3_600_000,
            },
        )
        .unwrap(),
    )
}

async fn admitted(l: &Limiter, who: &str, p: &Arc<Policy>, n: usize) -> usize {
    let id = Identity::new(who);
    let mut ok = 0;
    for _ in 0..n {
        if l.check(&id, p, 1).await.allowed {
            ok += 1;
        }
    }
    ok
}

#[tokio::test]
async fn an_override_changes_the_numbers_and_keeps_the_state() {
    let l = limiter(ControlPlane::local());
    let p = window(3);
    assert_eq!(admitted(&l, "u", &p, 2).await, 2);
    let bigger = Algorithm::FixedWindow {
        limit: 10,
        window_ms: 3_600_000,
    };
    l.control()
        .set_override("api", "u", OverrideTarget::Params(bigger), None)
        .await
        .unwrap();
    // 2 already used of the new 10: 8 more.
    assert_eq!(admitted(&l, "u", &p, 12).await, 8);
    assert_eq!(
        admitted(&l, "other", &p, 5).await,
        3,
        "others keep the policy"
    );
    assert!(l.control().remove_override("api", "u").await.unwrap());
    assert_eq!(admitted(&l, "u", &p, 1).await, 0);
}

#[tokio::test]
async fn a_plan_override_follows_the_configured_plan() {
    let l = limiter(ControlPlane::local());
    let p = window(1);
    let mut plans = HashMap::new();
    plans.insert(
        "gold".to_string(),
        HashMap::from([(
            "api".to_string(),
            Algorithm::FixedWindow {
                limit: 4,
                window_ms: 3_600_000,
            },
        )]),
    );
    l.control().configure(ControlConfig {
        plans,
        ..Default::default()
    });
    l.control()
        .set_override("api", "g", OverrideTarget::Plan("gold".into()), None)
        .await
        .unwrap();
    assert_eq!(admitted(&l, "g", &p, 6).await, 4);
}

#[tokio::test]
async fn repeated_denials_ban_and_the_second_ban_is_longer() {
    let clock = Arc::new(ManualClock::new(1_000_000_000_000));
    let l = limiter(ControlPlane::local_with_clock(clock.clone()));
    let p = window(1);
    l.control().configure(ControlConfig {
        bans: HashMap::from([(
            "api".to_string(),
            BanRule {
                after: 3,
                within_ms: 60_000,
                duration_ms: 10_000,
                multiplier: 2.0,
                max_ms: 100_000,
            },
        )]),
        ..Default::default()
    });
    let id = Identity::new("flood");
    assert!(l.check(&id, &p, 1).await.allowed);
    for _ in 0..3 {
        let c = l.check(&id, &p, 1).await;
        assert_eq!(
            c.limits[0].decision.as_ref().unwrap().reason,
            Some(DenyReason::Limited)
        );
    }
    let c = l.check(&id, &p, 1).await;
    let d = c.limits[0].decision.clone().unwrap();
    assert_eq!(d.reason, Some(DenyReason::Banned));
    assert_eq!(d.retry_after_ms, 10_000);
    clock.advance_ms(10_001);
    for _ in 0..3 {
        l.check(&id, &p, 1).await;
    }
    assert_eq!(l.control().ban_left_ms("flood", "api"), 20_000);
    assert_eq!(
        l.control().ban_left_ms("flood", "other"),
        0,
        "scoped to api"
    );
}

#[tokio::test]
async fn lists_bypass_and_refuse() {
    let l = limiter(ControlPlane::local());
    let p = window(1);
    l.control().configure(ControlConfig {
        deny: vec![ListEntry::parse("198.51.100.0/24").unwrap()],
        ..Default::default()
    });
    let allow = ListEntry::parse("vip").unwrap();
    l.control()
        .list_add(ListKind::Allow, &allow, Some(Duration::from_secs(60)))
        .await
        .unwrap();
    assert_eq!(admitted(&l, "vip", &p, 20).await, 20);
    let client = sluice_core::ClientNet::host("198.51.100.9".parse().unwrap());
    let c = l.check(&Identity::client_ip(client), &p, 1).await;
    assert!(!c.allowed);
    assert_eq!(
        c.limits[0].decision.as_ref().unwrap().reason,
        Some(DenyReason::Denied)
    );
    // The same text without the address is an identity like any other: not the client.
    let spelled = l.check(&Identity::new("ip:198.51.100.9"), &p, 1).await;
    assert!(spelled.allowed, "{:?}", spelled.limits[0].decision);
    assert!(
        l.control()
            .list_remove(ListKind::Allow, &allow)
            .await
            .unwrap()
    );
    assert_eq!(admitted(&l, "vip", &p, 3).await, 1);
}

#[tokio::test]
async fn a_manual_ban_refuses_every_policy_in_scope_with_the_time_left() {
    let l = limiter(ControlPlane::local());
    let (a, b) = (window(5), {
        let mut p = (*window(5)).clone();
        p.name = "other".into();
        Arc::new(p)
    });
    l.control()
        .ban("x", Duration::from_secs(30), Some(vec!["api".into()]))
        .await
        .unwrap();
    let id = Identity::new("x");
    let c = l.check_many(&[(&id, &a, 1), (&id, &b, 1)]).await;
    assert!(!c.allowed);
    let d = c.limits[0].decision.clone().unwrap();
    assert_eq!(d.reason, Some(DenyReason::Banned));
    assert!(d.retry_after_ms > 29_000 && d.retry_after_ms <= 30_000);
    assert_eq!(
        admitted(&l, "x", &b, 5).await,
        5,
        "other policy out of scope"
    );
    assert!(l.control().unban("x").await.unwrap());
    assert_eq!(admitted(&l, "x", &a, 6).await, 5);
}
