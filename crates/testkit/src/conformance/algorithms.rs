//! One sequence per algorithm, with the numbers of `docs/algorithms.md`.

use std::sync::Arc;

use sluice_core::{Algorithm, DenyReason, LeakyMode, ManualClock, Rate, Store};

use super::Harness;

/// The guide's token bucket: capacity 5, 1/s, calls at one instant.
pub async fn token_bucket_guide_sequence(store: Arc<dyn Store>, clock: ManualClock) {
    let h = Harness::new(store, clock);
    let (k, tb) = (
        h.key("user:42", "tb"),
        Algorithm::TokenBucket {
            capacity: 5,
            rate: Rate::per_second(1),
        },
    );
    for (i, remaining) in [4, 3, 2, 1, 0].into_iter().enumerate() {
        let d = h
            .expect(&k, &tb, 1, (true, remaining, 0, 1000 * (i as u64 + 1)))
            .await;
        assert_eq!((d.limit, d.delay_ms, d.reason, d.lease), (5, 0, None, None));
    }
    let d = h.expect(&k, &tb, 1, (false, 0, 1000, 5000)).await;
    assert_eq!(d.reason, Some(DenyReason::Limited));
    h.clock.advance_ms(400);
    h.expect(&k, &tb, 1, (false, 0, 600, 4600)).await;
    h.clock.advance_ms(600);
    h.expect(&k, &tb, 1, (true, 0, 0, 5000)).await;
    h.clock.advance_ms(2500);
    h.expect(&k, &tb, 2, (true, 0, 0, 4500)).await;
}

/// GCRA 1/s with burst 2 (limit 3), as redis-cell answers in ms.
pub async fn gcra_sequence(store: Arc<dyn Store>, clock: ManualClock) {
    let h = Harness::new(store, clock);
    let (k, g) = (
        h.key("user:42", "gcra"),
        Algorithm::Gcra {
            rate: Rate::per_second(1),
            burst: 2,
        },
    );
    for (i, remaining) in [2, 1, 0].into_iter().enumerate() {
        let d = h
            .expect(&k, &g, 1, (true, remaining, 0, 1000 * (i as u64 + 1)))
            .await;
        assert_eq!(d.limit, 3);
    }
    h.expect(&k, &g, 1, (false, 0, 1000, 3000)).await;
    h.clock.advance_ms(250);
    h.expect(&k, &g, 1, (false, 0, 750, 2750)).await;
    h.clock.advance_ms(750);
    h.expect(&k, &g, 1, (true, 0, 0, 3000)).await;
    h.clock.advance_ms(2000);
    h.expect(&k, &g, 2, (true, 0, 0, 3000)).await;
    h.expect(&k, &g, 1, (false, 0, 1000, 3000)).await;
}

/// Leaky bucket policing: capacity 3 draining 1/s, admits at once.
pub async fn leaky_bucket_policing_sequence(store: Arc<dyn Store>, clock: ManualClock) {
    let h = Harness::new(store, clock);
    let rate = Rate::per_second(1);
    let (k, lb) = (
        h.key("user:42", "lbp"),
        Algorithm::LeakyBucket {
            capacity: 3,
            rate,
            mode: LeakyMode::Policing,
        },
    );
    for (i, remaining) in [2, 1, 0].into_iter().enumerate() {
        let d = h
            .expect(&k, &lb, 1, (true, remaining, 0, 1000 * (i as u64 + 1)))
            .await;
        assert_eq!((d.limit, d.delay_ms), (3, 0));
    }
    h.clock.advance_ms(250);
    h.expect(&k, &lb, 1, (false, 0, 750, 2750)).await;
    h.clock.advance_ms(750);
    h.expect(&k, &lb, 1, (true, 0, 0, 3000)).await;
}

/// Leaky bucket shaping: capacity 3 draining 2/s; delays 0, P/R, 2P/R.
pub async fn leaky_bucket_shaping_sequence(store: Arc<dyn Store>, clock: ManualClock) {
    let h = Harness::new(store, clock);
    let rate = Rate::per_second(2);
    let (k, lb) = (
        h.key("user:42", "lbs"),
        Algorithm::LeakyBucket {
            capacity: 3,
            rate,
            mode: LeakyMode::Shaping,
        },
    );
    for (i, remaining) in [2, 1, 0].into_iter().enumerate() {
        let d = h
            .expect(&k, &lb, 1, (true, remaining, 0, 500 * (i as u64 + 1)))
            .await;
        assert_eq!(d.delay_ms, 500 * i as u64);
    }
    let d = h.expect(&k, &lb, 1, (false, 0, 500, 1500)).await;
    assert_eq!(d.delay_ms, 0);
    h.clock.advance_ms(500);
    let d = h.expect(&k, &lb, 1, (true, 0, 0, 1500)).await;
    assert_eq!(d.delay_ms, 1000);
}

/// Fixed window: 3 per 10 s aligned to the epoch.
pub async fn fixed_window_sequence(store: Arc<dyn Store>, clock: ManualClock) {
    let h = Harness::new(store, clock);
    let (k, fw) = (
        h.key("user:42", "fw"),
        Algorithm::FixedWindow {
            limit: 3,
            window_ms: 10_000,
        },
    );
    h.clock.advance_ms(1000);
    for remaining in [2, 1, 0] {
        h.expect(&k, &fw, 1, (true, remaining, 0, 9000)).await;
    }
    h.clock.advance_ms(3000);
    h.expect(&k, &fw, 1, (false, 0, 6000, 6000)).await;
    h.clock.advance_ms(5999);
    h.expect(&k, &fw, 1, (false, 0, 1, 1)).await;
    h.clock.advance_ms(1);
    h.expect(&k, &fw, 2, (true, 1, 0, 10_000)).await;
    h.expect(&k, &fw, 2, (false, 1, 10_000, 10_000)).await;
}

/// Sliding window counter: 4 per 10 s; the previous window weighs in by its overlap.
pub async fn sliding_window_counter_sequence(store: Arc<dyn Store>, clock: ManualClock) {
    let h = Harness::new(store, clock);
    let (k, swc) = (
        h.key("user:42", "swc"),
        Algorithm::SlidingWindowCounter {
            limit: 4,
            window_ms: 10_000,
        },
    );
    for remaining in [3, 2, 1, 0] {
        h.expect(&k, &swc, 1, (true, remaining, 0, 20_000)).await;
    }
    // floor(4 * (10000 - e) / 10000) + 1 <= 4 first holds at e = 1 of the next window.
    h.expect(&k, &swc, 1, (false, 0, 10_001, 20_000)).await;
    h.clock.advance_ms(10_000);
    h.expect(&k, &swc, 1, (false, 0, 1, 10_000)).await;
    h.clock.advance_ms(1);
    h.expect(&k, &swc, 1, (true, 0, 0, 19_999)).await;
    // prev 4, curr 1: fits once floor(4 * (10000 - e) / 10000) <= 2, at e = 2501.
    h.expect(&k, &swc, 1, (false, 0, 2500, 19_999)).await;
    h.clock.advance_ms(2500);
    h.expect(&k, &swc, 1, (true, 0, 0, 17_499)).await;
}

/// The guide's sliding log: 3 per 10 s at one instant, then denied for 10 s.
pub async fn sliding_window_log_guide_sequence(store: Arc<dyn Store>, clock: ManualClock) {
    let h = Harness::new(store, clock);
    let (k, swl) = (
        h.key("user:42", "sw"),
        Algorithm::SlidingWindowLog {
            limit: 3,
            window_ms: 10_000,
        },
    );
    for remaining in [2, 1, 0] {
        h.expect(&k, &swl, 1, (true, remaining, 0, 10_000)).await;
    }
    h.expect(&k, &swl, 1, (false, 0, 10_000, 10_000)).await;
    h.clock.advance_ms(5);
    h.expect(&k, &swl, 1, (false, 0, 9995, 9995)).await;
    h.clock.advance_ms(9995);
    h.expect(&k, &swl, 3, (true, 0, 0, 10_000)).await;
}

/// Sliding log with spaced requests: they leave the window one by one; a cost of 2 waits for two.
pub async fn sliding_window_log_spaced_sequence(store: Arc<dyn Store>, clock: ManualClock) {
    let h = Harness::new(store, clock);
    let (k, swl) = (
        h.key("user:42", "sw"),
        Algorithm::SlidingWindowLog {
            limit: 3,
            window_ms: 10_000,
        },
    );
    for (i, remaining) in [2, 1, 0].into_iter().enumerate() {
        if i > 0 {
            h.clock.advance_ms(1000);
        }
        h.expect(&k, &swl, 1, (true, remaining, 0, 10_000)).await;
    }
    h.clock.advance_ms(1000); // T0 + 3 s
    h.expect(&k, &swl, 1, (false, 0, 7000, 9000)).await;
    h.expect(&k, &swl, 2, (false, 0, 8000, 9000)).await;
    h.clock.advance_ms(6999);
    h.expect(&k, &swl, 1, (false, 0, 1, 2001)).await;
    h.clock.advance_ms(1); // T0 + 10 s: the first entry left
    h.expect(&k, &swl, 1, (true, 0, 0, 10_000)).await;
    h.expect(&k, &swl, 1, (false, 0, 1000, 10_000)).await;
}

/// Concurrency: leases are taken, released once, and lapse on their own.
pub async fn concurrency_acquire_release_expiry(store: Arc<dyn Store>, clock: ManualClock) {
    let h = Harness::new(store, clock);
    let (k, cc) = (
        h.key("user:42", "jobs"),
        Algorithm::Concurrency {
            limit: 2,
            lease_ms: 30_000,
        },
    );
    let a = h
        .expect(&k, &cc, 1, (true, 1, 0, 30_000))
        .await
        .lease
        .expect("a lease");
    h.clock.advance_ms(10_000);
    let b = h
        .expect(&k, &cc, 1, (true, 0, 0, 30_000))
        .await
        .lease
        .expect("a lease");
    assert_ne!(a, b);
    let d = h.expect(&k, &cc, 1, (false, 0, 20_000, 30_000)).await;
    assert_eq!(d.lease, None);
    assert!(h.store.release(&k, &cc, &a).await.unwrap());
    assert!(
        !h.store.release(&k, &cc, &a).await.unwrap(),
        "a lease is released once"
    );
    let c = h
        .expect(&k, &cc, 1, (true, 0, 0, 30_000))
        .await
        .lease
        .expect("a lease");
    // b lapses at T0 + 40 s, c at T0 + 40 s too; one ms before, both are held.
    h.clock.advance_ms(29_999);
    h.expect(&k, &cc, 1, (false, 0, 1, 1)).await;
    h.clock.advance_ms(1);
    assert!(
        !h.store.release(&k, &cc, &b).await.unwrap(),
        "a lapsed lease is not held"
    );
    assert!(!h.store.release(&k, &cc, &c).await.unwrap());
    h.expect(&k, &cc, 2, (true, 0, 0, 30_000)).await;
}
