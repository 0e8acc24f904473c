//! What holds for every algorithm: expiry back to a fresh key, cost 0 peeks, a cost over
//! the limit is final, retry times are exact, unknown leases release nothing.

use std::sync::Arc;

use sluice_core::{Algorithm, DenyReason, ManualClock, Store};

use super::{Harness, align, all_algorithms, fields};

/// Waiting `reset_after_ms` brings every algorithm back to the answers of a fresh key.
pub async fn expiry_returns_to_initial_state(store: Arc<dyn Store>, clock: ManualClock) {
    let h = Harness::new(store, clock);
    for (name, alg) in all_algorithms() {
        align(&h.clock, 10_000);
        let (k, fresh) = (h.key("user:42", name), h.key("user:fresh", name));
        let first = h.one(&k, &alg, 1).await;
        let mut last = first.clone();
        for _ in 0..10 {
            last = h.one(&k, &alg, 1).await;
            if !last.allowed {
                break;
            }
        }
        assert!(!last.allowed, "{name} denies after its quota");
        h.clock.advance_ms(last.reset_after_ms);
        let again = h.one(&k, &alg, 1).await;
        assert_eq!(
            fields(&again),
            fields(&first),
            "{name} after reset_after_ms"
        );
        // A key never used answers the same at the same point of a window.
        align(&h.clock, 10_000);
        assert_eq!(
            fields(&h.one(&fresh, &alg, 1).await),
            fields(&first),
            "{name} on a fresh key"
        );
    }
}

/// Cost 0 answers like a check but consumes nothing.
pub async fn cost_zero_peeks(store: Arc<dyn Store>, clock: ManualClock) {
    let h = Harness::new(store, clock);
    for (name, alg) in all_algorithms() {
        let k = h.key("user:42", name);
        let d = h.one(&k, &alg, 0).await;
        assert_eq!(
            (d.allowed, d.remaining, d.retry_after_ms, d.lease.is_some()),
            (true, 3, 0, false),
            "{name}"
        );
        assert!(h.one(&k, &alg, 1).await.allowed);
        for _ in 0..3 {
            let d = h.one(&k, &alg, 0).await;
            assert_eq!(
                (d.allowed, d.remaining, d.lease.is_some()),
                (true, 2, false),
                "{name} peek"
            );
        }
        assert_eq!(
            h.one(&k, &alg, 2).await.remaining,
            0,
            "{name}: the peeks took nothing"
        );
        let d = h.one(&k, &alg, 0).await;
        assert_eq!(
            (d.allowed, d.remaining),
            (true, 0),
            "{name} peek of an exhausted limit"
        );
    }
}

/// A cost above the quota is denied with its own reason, no retry time, and no effect.
pub async fn cost_exceeding_the_limit_is_final(store: Arc<dyn Store>, clock: ManualClock) {
    let h = Harness::new(store, clock);
    for (name, alg) in all_algorithms() {
        let (k, fresh) = (h.key("user:42", name), h.key("user:fresh", name));
        for cost in [4, 1000] {
            let d = h.one(&k, &alg, cost).await;
            assert_eq!(
                (d.allowed, d.reason, d.retry_after_ms, d.remaining, d.lease),
                (false, Some(DenyReason::CostExceedsLimit), 0, 3, None),
                "{name} cost {cost}"
            );
        }
        let exact = h.one(&k, &alg, 3).await;
        assert!(exact.allowed, "{name}: the whole quota at once fits");
        assert_eq!(exact.remaining, 0);
        let d = h.one(&fresh, &alg, 1).await;
        assert_eq!(d.remaining, 2, "{name}");
    }
}

/// A client waiting `retry_after_ms` is never early, and not later than needed: one ms before,
/// the request is still denied. A flood of denials in between changes nothing.
pub async fn retry_after_is_exact_and_denials_change_nothing(
    store: Arc<dyn Store>,
    clock: ManualClock,
) {
    let h = Harness::new(store, clock);
    for (name, alg) in all_algorithms() {
        let k = h.key("user:42", name);
        align(&h.clock, 10_000);
        h.clock.advance_ms(137); // off the window boundary
        assert!(h.one(&k, &alg, 2).await.allowed);
        h.clock.advance_ms(300);
        assert!(h.one(&k, &alg, 1).await.allowed);
        let d = h.one(&k, &alg, 2).await;
        assert!(!d.allowed && d.retry_after_ms > 1, "{name}: {d:?}");
        for _ in 0..20 {
            assert_eq!(
                fields(&h.one(&k, &alg, 2).await),
                fields(&d),
                "{name}: denials change nothing"
            );
        }
        h.clock.advance_ms(d.retry_after_ms - 1);
        let early = h.one(&k, &alg, 2).await;
        assert_eq!(
            (early.allowed, early.retry_after_ms),
            (false, 1),
            "{name} one ms early"
        );
        h.clock.advance_ms(1);
        assert!(
            h.one(&k, &alg, 2).await.allowed,
            "{name} after retry_after_ms"
        );
        h.clock.advance_ms(60_000);
    }
}

/// Releasing a lease that was never taken, or on a key without leases, answers false.
pub async fn release_of_unknown_leases(store: Arc<dyn Store>, clock: ManualClock) {
    let h = Harness::new(store, clock);
    let cc = Algorithm::Concurrency {
        limit: 1,
        lease_ms: 1000,
    };
    let k = h.key("user:42", "jobs");
    let nobody = sluice_core::LeaseId("0123456789abcdef".into());
    assert!(!h.store.release(&k, &cc, &nobody).await.unwrap());
    let held = h.one(&k, &cc, 1).await.lease.expect("a lease");
    assert!(!h.store.release(&k, &cc, &nobody).await.unwrap());
    assert_eq!(
        h.one(&k, &cc, 1).await.reason,
        Some(DenyReason::Limited),
        "a wrong id frees nothing"
    );
    assert!(h.store.release(&k, &cc, &held).await.unwrap());
    assert!(h.one(&k, &cc, 1).await.allowed);
}
