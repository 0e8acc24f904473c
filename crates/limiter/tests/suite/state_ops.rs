//! `Limiter::state`, `reset`, `charge` and `refund` on the embedded store with a manual clock:
//! exact arithmetic, sharded policies handled whole, the deny cache forgetting a reset key.
#![forbid(unsafe_code)]

use std::sync::Arc;

use sluice::core::ManualClock;
use sluice::{Algorithm, DenyCacheMode, Identity, Limiter, Policy, Rate, StoreError};
use sluice_memory::MemoryStore;

const T0: u64 = 1_700_000_000_000_000;

fn limiter(deny_cache: DenyCacheMode) -> Limiter {
    let store = MemoryStore::with_clock(Arc::new(ManualClock::new(T0)));
    Limiter::builder(Arc::new(store))
        .deny_cache(deny_cache)
        .build()
}

fn bucket(name: &str, capacity: u64, shards: u32) -> Arc<Policy> {
    let mut p = Policy::new(
        name,
        Algorithm::TokenBucket {
            capacity,
            rate: Rate::per_second(1),
        },
    )
    .unwrap();
    p.shards = shards;
    Arc::new(p)
}

#[tokio::test]
async fn state_reads_without_consuming_and_reset_restores() {
    let l = limiter(DenyCacheMode::Off);
    let (id, p) = (Identity::new("user:1"), bucket("api", 5, 1));
    assert!(l.check(&id, &p, 3).await.allowed);
    for _ in 0..3 {
        let s = l.state(&id, &p).await.unwrap();
        assert_eq!((s.limit, s.remaining, s.reset_after_ms), (5, 2, 3000));
    }
    assert!(l.reset(&id, &p).await.unwrap());
    assert!(!l.reset(&id, &p).await.unwrap(), "nothing left to reset");
    let s = l.state(&id, &p).await.unwrap();
    assert_eq!((s.remaining, s.reset_after_ms), (5, 0));
}

#[tokio::test]
async fn charge_and_refund_settle_an_estimate() {
    let l = limiter(DenyCacheMode::Off);
    let id = Identity::new("user:2");
    let p = Arc::new(
        Policy::new(
            "tokens",
            Algorithm::FixedWindow {
                limit: 10_000,
                window_ms: 3_600_000,
            },
        )
        .unwrap(),
    );
    assert!(l.check(&id, &p, 2000).await.allowed);
    let d = l.refund(&id, &p, 800).await.unwrap();
    assert_eq!(d.remaining, 8800);
    let d = l.charge(&id, &p, 9000).await.unwrap();
    assert_eq!((d.remaining, d.allowed), (0, false));
    assert!(!l.check(&id, &p, 1).await.allowed);
    let cc = Arc::new(
        Policy::new(
            "slots",
            Algorithm::Concurrency {
                limit: 2,
                lease_ms: 1000,
            },
        )
        .unwrap(),
    );
    assert!(matches!(
        l.refund(&id, &cc, 1).await,
        Err(StoreError::Invalid(_))
    ));
}

#[tokio::test]
async fn a_sharded_policy_is_read_charged_and_reset_whole() {
    let l = limiter(DenyCacheMode::Off);
    // 4 shards of 10 / 4 = 3 (rounded up): 12 in all, shown as the policy's 10.
    let (id, p) = (Identity::new("hot"), bucket("hot", 10, 4));
    let d = l.charge(&id, &p, 6).await.unwrap();
    // 6 spread 2, 2, 1, 1 over shards of 3: 1 + 1 + 2 + 2 left.
    assert_eq!((d.limit, d.remaining), (10, 6));
    let d = l.refund(&id, &p, 2).await.unwrap();
    // Refund 1, 1, 0, 0: 2 + 2 + 2 + 2.
    assert_eq!(d.remaining, 8);
    assert!(l.reset(&id, &p).await.unwrap());
    assert_eq!(l.state(&id, &p).await.unwrap().remaining, 10);
}

#[tokio::test]
async fn reset_and_refund_drop_the_remembered_denial() {
    let l = limiter(DenyCacheMode::All);
    let (id, p) = (Identity::new("user:3"), bucket("strict", 2, 1));
    assert!(l.check(&id, &p, 2).await.allowed);
    assert!(!l.check(&id, &p, 1).await.allowed);
    // Denied again: this time from the deny cache, without the store.
    assert!(!l.check(&id, &p, 1).await.allowed);
    assert_eq!(l.deny_cache_hits(), 1);
    l.refund(&id, &p, 1).await.unwrap();
    assert!(
        l.check(&id, &p, 1).await.allowed,
        "refund must reach the next check"
    );
    assert!(!l.check(&id, &p, 1).await.allowed);
    assert!(l.reset(&id, &p).await.unwrap());
    assert!(
        l.check(&id, &p, 2).await.allowed,
        "reset must reach the next check"
    );
}

#[tokio::test]
async fn an_override_applies_to_state_charge_and_refund() {
    let l = limiter(DenyCacheMode::Off);
    let (id, p) = (Identity::new("vip"), bucket("api", 5, 1));
    let bigger = Algorithm::TokenBucket {
        capacity: 50,
        rate: Rate::per_second(1),
    };
    l.control()
        .set_override("api", "vip", sluice::OverrideTarget::Params(bigger), None)
        .await
        .unwrap();
    assert!(
        l.check(&id, &p, 30).await.allowed,
        "the override's capacity"
    );
    let s = l.state(&id, &p).await.unwrap();
    assert_eq!((s.limit, s.remaining), (50, 20));
    assert_eq!(l.refund(&id, &p, 25).await.unwrap().remaining, 45);
    assert_eq!(l.charge(&id, &p, 40).await.unwrap().remaining, 5);
    // Another identity keeps the configured capacity.
    let other = Identity::new("plain");
    assert_eq!(l.state(&other, &p).await.unwrap().limit, 5);
}
