//! Several at once: multi-limit checks (all or nothing), concurrent tasks on one key, many
//! independent keys.

use std::sync::Arc;

use sluice_core::{Algorithm, CheckItem, DenyReason, LeakyMode, ManualClock, Rate, Store};

use super::{Harness, T0};

/// 10 per second and 25 per day for one user: a check consumes from both or from neither.
pub async fn multi_limit_per_second_and_per_day(store: Arc<dyn Store>, clock: ManualClock) {
    let h = Harness::new(store, clock);
    let second = Algorithm::TokenBucket {
        capacity: 10,
        rate: Rate::per_second(10),
    };
    let day = Algorithm::FixedWindow {
        limit: 25,
        window_ms: 86_400_000,
    };
    let (ks, kd) = (h.key("user:42", "per-second"), h.key("user:42", "per-day"));
    let check = || async {
        h.multi(&[(ks.as_str(), &second, 1), (kd.as_str(), &day, 1)])
            .await
    };
    for i in 0..10u64 {
        let d = check().await;
        assert!(d.allowed);
        assert_eq!(
            (d.decisions[0].remaining, d.decisions[1].remaining),
            (9 - i, 24 - i)
        );
    }
    let d = check().await;
    assert!(!d.allowed);
    assert_eq!(d.denied_by(), Some(0));
    assert_eq!(
        (d.decisions[0].reason, d.decisions[0].retry_after_ms),
        (Some(DenyReason::Limited), 100)
    );
    let other = &d.decisions[1];
    assert_eq!(
        (
            other.allowed,
            other.reason,
            other.remaining,
            other.retry_after_ms
        ),
        (false, Some(DenyReason::OtherLimitDenied), 15, 0)
    );
    assert_eq!(d.retry_after_ms(), 100);
    assert_eq!(
        h.one(kd.as_str(), &day, 0).await.remaining,
        15,
        "the day was not charged"
    );

    h.clock.advance_ms(1000);
    for _ in 0..10 {
        assert!(check().await.allowed);
    }
    h.clock.advance_ms(1000);
    for _ in 0..5 {
        assert!(check().await.allowed);
    }
    let d = check().await;
    assert_eq!(d.denied_by(), Some(1));
    let day_end = (T0 / 1000 + 2000) / 86_400_000 * 86_400_000 + 86_400_000;
    assert_eq!(d.decisions[1].retry_after_ms, day_end - (T0 / 1000 + 2000));
    assert_eq!(
        (d.decisions[0].reason, d.decisions[0].remaining),
        (Some(DenyReason::OtherLimitDenied), 5)
    );
    assert_eq!(
        h.one(ks.as_str(), &second, 0).await.remaining,
        5,
        "the second was not charged"
    );
}

/// A user and its tenant, both keyed under the tenant's identity (one hash tag): the tenant's
/// limit stops a user who still has quota, without charging that user.
pub async fn multi_limit_user_and_tenant(store: Arc<dyn Store>, clock: ManualClock) {
    let h = Harness::new(store, clock);
    let user = Algorithm::TokenBucket {
        capacity: 2,
        rate: Rate::new(1, 3_600_000),
    };
    let tenant = Algorithm::TokenBucket {
        capacity: 3,
        rate: Rate::new(1, 3_600_000),
    };
    let (u42, u43, t7) = (
        h.key("tenant:7", "user-42"),
        h.key("tenant:7", "user-43"),
        h.key("tenant:7", "tenant"),
    );
    for _ in 0..2 {
        assert!(
            h.multi(&[(u42.as_str(), &user, 1), (t7.as_str(), &tenant, 1)])
                .await
                .allowed
        );
    }
    let d = h
        .multi(&[(u42.as_str(), &user, 1), (t7.as_str(), &tenant, 1)])
        .await;
    assert_eq!(
        (d.denied_by(), d.decisions[1].reason),
        (Some(0), Some(DenyReason::OtherLimitDenied))
    );
    assert!(
        h.multi(&[(u43.as_str(), &user, 1), (t7.as_str(), &tenant, 1)])
            .await
            .allowed
    );
    let d = h
        .multi(&[(u43.as_str(), &user, 1), (t7.as_str(), &tenant, 1)])
        .await;
    assert_eq!(d.denied_by(), Some(1));
    assert_eq!(
        (d.decisions[0].reason, d.decisions[0].remaining),
        (Some(DenyReason::OtherLimitDenied), 1)
    );
    assert_eq!(
        h.one(u43.as_str(), &user, 0).await.remaining,
        1,
        "user 43 was not charged"
    );
    assert_eq!(h.one(t7.as_str(), &tenant, 0).await.remaining, 0);
}

/// 200 concurrent tasks on one key at a limit of 10 admit exactly 10, for every algorithm that
/// has a hard limit at a frozen instant.
pub async fn concurrent_tasks_admit_exactly_the_limit(store: Arc<dyn Store>, clock: ManualClock) {
    let h = Harness::new(store, clock);
    let rate = Rate::per_second(1);
    let algorithms = [
        ("tb", Algorithm::TokenBucket { capacity: 10, rate }),
        ("gcra", Algorithm::Gcra { rate, burst: 9 }),
        (
            "lb",
            Algorithm::LeakyBucket {
                capacity: 10,
                rate,
                mode: LeakyMode::Policing,
            },
        ),
        (
            "fw",
            Algorithm::FixedWindow {
                limit: 10,
                window_ms: 60_000,
            },
        ),
        (
            "swc",
            Algorithm::SlidingWindowCounter {
                limit: 10,
                window_ms: 60_000,
            },
        ),
        (
            "swl",
            Algorithm::SlidingWindowLog {
                limit: 10,
                window_ms: 60_000,
            },
        ),
        (
            "cc",
            Algorithm::Concurrency {
                limit: 10,
                lease_ms: 60_000,
            },
        ),
    ];
    for (name, alg) in algorithms {
        let key = Arc::new(h.key("user:race", name));
        let alg = Arc::new(alg);
        let tasks: Vec<_> = (0..200)
            .map(|_| {
                let (store, key, alg) = (h.store.clone(), key.clone(), alg.clone());
                tokio::spawn(async move {
                    let d = store
                        .check(&[CheckItem {
                            key: &key,
                            algorithm: &alg,
                            cost: 1,
                        }])
                        .await
                        .unwrap();
                    d.allowed
                })
            })
            .collect();
        let mut admitted = 0;
        for t in tasks {
            admitted += u64::from(t.await.unwrap());
        }
        assert_eq!(admitted, 10, "{name}");
    }
}

/// Many keys are independent: 500 identities each get their own limit of 1.
pub async fn many_distinct_keys(store: Arc<dyn Store>, clock: ManualClock) {
    let h = Harness::new(store, clock);
    let fw = Arc::new(Algorithm::FixedWindow {
        limit: 1,
        window_ms: 60_000,
    });
    let tasks: Vec<_> = (0..500)
        .map(|i| {
            let (store, fw, key) = (
                h.store.clone(),
                fw.clone(),
                h.key(&format!("user:{i}"), "fw"),
            );
            tokio::spawn(async move {
                let check = |cost| {
                    let (store, fw, key) = (store.clone(), fw.clone(), key.clone());
                    async move {
                        store
                            .check(&[CheckItem {
                                key: &key,
                                algorithm: &fw,
                                cost,
                            }])
                            .await
                            .unwrap()
                            .decisions
                            .remove(0)
                    }
                };
                let first = check(1).await;
                let second = check(1).await;
                (
                    first.allowed,
                    first.remaining,
                    second.allowed,
                    second.reason,
                )
            })
        })
        .collect();
    for t in tasks {
        assert_eq!(
            t.await.unwrap(),
            (true, 0, false, Some(DenyReason::Limited))
        );
    }
}
