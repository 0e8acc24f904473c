//! The deny cache through the `Limiter`: repeated denials skip the store, and the answers match.
#![forbid(unsafe_code)]

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use sluice::core::store::CheckItem;
use sluice::core::{LeaseId, ManualClock, MultiDecision};
use sluice::{
    Algorithm, DenyCacheMode, DenyReason, Identity, Limiter, Policy, Rate, Store, StoreError,
};
use sluice_memory::MemoryStore;

/// The embedded store posing as a remote one, counting calls.
#[derive(Debug)]
struct Counting {
    inner: MemoryStore,
    calls: AtomicU64,
}

#[async_trait::async_trait]
impl Store for Counting {
    async fn check(&self, items: &[CheckItem<'_>]) -> Result<MultiDecision, StoreError> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        self.inner.check(items).await
    }
    async fn release(
        &self,
        key: &str,
        algorithm: &Algorithm,
        lease: &LeaseId,
    ) -> Result<bool, StoreError> {
        self.inner.release(key, algorithm, lease).await
    }
    fn kind(&self) -> &'static str {
        "counting"
    }
}

fn setup(mode: DenyCacheMode) -> (Arc<Counting>, Limiter) {
    let clock = ManualClock::new(1_700_000_000_000_000);
    let store = Arc::new(Counting {
        inner: MemoryStore::with_clock(Arc::new(clock)),
        calls: AtomicU64::new(0),
    });
    let limiter = Limiter::builder(store.clone()).deny_cache(mode).build();
    (store, limiter)
}

fn policy(algorithm: Algorithm) -> Arc<Policy> {
    Arc::new(Policy::new("p", algorithm).unwrap())
}

#[tokio::test]
async fn a_denied_flood_costs_the_store_nothing() {
    let (store, limiter) = setup(DenyCacheMode::Auto);
    // 2 per hour: two admitted, then denied for ~30 minutes.
    let p = policy(Algorithm::TokenBucket {
        capacity: 2,
        rate: Rate::new(2, 3_600_000),
    });
    let id = Identity::new("user:1");
    assert!(limiter.check(&id, &p, 1).await.allowed);
    assert!(limiter.check(&id, &p, 1).await.allowed);
    let first = limiter.check(&id, &p, 1).await;
    assert!(!first.allowed);
    let calls = store.calls.load(Ordering::SeqCst);
    assert_eq!(calls, 3);
    for _ in 0..1000 {
        let c = limiter.check(&id, &p, 1).await;
        assert!(!c.allowed);
        let d = c.limits[0].decision.as_ref().unwrap();
        assert_eq!(
            (d.reason, d.limit, d.remaining),
            (Some(DenyReason::Limited), 2, 0)
        );
        let stored = first.limits[0].decision.as_ref().unwrap();
        assert!(
            d.retry_after_ms <= stored.retry_after_ms
                && d.retry_after_ms + 1000 >= stored.retry_after_ms
        );
        assert_eq!(c.retry_after_ms(), d.retry_after_ms);
    }
    assert_eq!(
        store.calls.load(Ordering::SeqCst),
        calls,
        "no store call while denied"
    );
    assert_eq!(limiter.deny_cache_hits(), 1000);
    // Another identity, a larger cost (covered) and a smaller one (not covered) behave.
    assert!(limiter.check(&Identity::new("user:2"), &p, 1).await.allowed);
    assert!(!limiter.check(&id, &p, 2).await.allowed);
    assert_eq!(store.calls.load(Ordering::SeqCst), calls + 1);
    let _ = limiter.check(&id, &p, 0).await;
    assert_eq!(
        store.calls.load(Ordering::SeqCst),
        calls + 2,
        "a peek always reaches the store"
    );
}

#[tokio::test]
async fn off_and_approximate_algorithms_reach_the_store() {
    for (mode, algorithm, cached) in [
        (
            DenyCacheMode::Off,
            Algorithm::Gcra {
                rate: Rate::new(1, 3_600_000),
                burst: 0,
            },
            false,
        ),
        (
            DenyCacheMode::Auto,
            Algorithm::Gcra {
                rate: Rate::new(1, 3_600_000),
                burst: 0,
            },
            true,
        ),
        (
            DenyCacheMode::Auto,
            Algorithm::FixedWindow {
                limit: 1,
                window_ms: 3_600_000,
            },
            true,
        ),
        (
            DenyCacheMode::Auto,
            Algorithm::SlidingWindowLog {
                limit: 1,
                window_ms: 3_600_000,
            },
            false,
        ),
        (
            DenyCacheMode::All,
            Algorithm::SlidingWindowLog {
                limit: 1,
                window_ms: 3_600_000,
            },
            true,
        ),
    ] {
        let (store, limiter) = setup(mode);
        let p = policy(algorithm.clone());
        let id = Identity::new("u");
        assert!(limiter.check(&id, &p, 1).await.allowed);
        for _ in 0..10 {
            assert!(!limiter.check(&id, &p, 1).await.allowed);
        }
        let want = if cached { 2 } else { 11 };
        assert_eq!(
            store.calls.load(Ordering::SeqCst),
            want,
            "{mode:?} {algorithm:?}"
        );
    }
}

#[tokio::test]
async fn the_embedded_store_does_not_cache_by_default() {
    let limiter = Limiter::memory();
    let p = policy(Algorithm::Gcra {
        rate: Rate::new(1, 3_600_000),
        burst: 0,
    });
    let id = Identity::new("u");
    assert!(limiter.check(&id, &p, 1).await.allowed);
    assert!(!limiter.check(&id, &p, 1).await.allowed);
    assert!(!limiter.check(&id, &p, 1).await.allowed);
    assert_eq!(limiter.deny_cache_hits(), 0);
}

#[tokio::test]
async fn shadow_policies_are_never_answered_locally() {
    let (store, limiter) = setup(DenyCacheMode::Exact);
    let mut p = Policy::new(
        "p",
        Algorithm::Gcra {
            rate: Rate::new(1, 3_600_000),
            burst: 0,
        },
    )
    .unwrap();
    p.shadow = true;
    let p = Arc::new(p);
    let id = Identity::new("u");
    for _ in 0..5 {
        assert!(limiter.check(&id, &p, 1).await.allowed);
    }
    assert_eq!(store.calls.load(Ordering::SeqCst), 5);
}
