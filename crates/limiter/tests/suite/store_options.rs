//! The options of [`Limiter::connect`] reach the store they configure.

use std::sync::Arc;

use sluice::{Algorithm, Identity, Limiter, Policy, Rate, StoreOptions};

/// Evictions the store has counted, of every kind.
fn evicted(l: &Limiter) -> u64 {
    l.store().evictions().iter().map(|(_, n)| n).sum()
}

/// `n` checks, each for a fresh 200-byte identity.
async fn flood(l: &Limiter, policy: &Arc<Policy>, n: usize) {
    for i in 0..n {
        let id = Identity::new(format!("{i:0>200}"));
        assert!(l.check(&id, policy, 1).await.allowed);
    }
}

/// `max_memory` bounds the embedded store in bytes (it was once dropped on the way, so the
/// store grew to its key cap whatever the configuration said).
#[tokio::test]
async fn max_memory_bounds_the_embedded_store() {
    let policy = Arc::new(
        Policy::new(
            "p",
            Algorithm::TokenBucket {
                capacity: 10,
                rate: Rate::per_second(1),
            },
        )
        .unwrap(),
    );
    // 20,000 keys of 200-byte identities take several MiB: far over a 1 MiB bound, far
    // under the default key cap.
    let bounded = Limiter::connect(
        "memory",
        StoreOptions {
            max_memory: Some(1 << 20),
            ..Default::default()
        },
    )
    .await
    .unwrap();
    flood(&bounded, &policy, 20_000).await;
    assert!(evicted(&bounded) > 0, "the 1 MiB bound never evicted");

    let unbounded = Limiter::connect("memory", StoreOptions::default())
        .await
        .unwrap();
    flood(&unbounded, &policy, 20_000).await;
    assert_eq!(evicted(&unbounded), 0, "no bound, nothing evicted");
}
