//! Property: an all-or-nothing check never consumes from one limit when another denies. Random
//! sequences of two-limit checks (random costs and clock steps) on the embedded store; after
//! every denied check, a cost-0 peek of each limit answers exactly as it did before the check.

use std::sync::Arc;

use proptest::prelude::*;
use sluice_core::{Algorithm, CheckItem, DenyReason, LeakyMode, ManualClock, Rate};
use sluice_memory::MemoryStore;

fn algorithm() -> impl Strategy<Value = Algorithm> {
    let rate = Rate::per_second(2);
    prop::sample::select(vec![
        Algorithm::TokenBucket { capacity: 4, rate },
        Algorithm::Gcra { rate, burst: 3 },
        Algorithm::LeakyBucket {
            capacity: 4,
            rate,
            mode: LeakyMode::Shaping,
        },
        Algorithm::FixedWindow {
            limit: 5,
            window_ms: 3000,
        },
        Algorithm::SlidingWindowCounter {
            limit: 5,
            window_ms: 3000,
        },
        Algorithm::SlidingWindowLog {
            limit: 5,
            window_ms: 3000,
        },
        Algorithm::Concurrency {
            limit: 3,
            lease_ms: 2000,
        },
    ])
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]

    #[test]
    fn denied_checks_consume_nothing(
        a in algorithm(),
        b in algorithm(),
        steps in prop::collection::vec((0u64..800, 0u64..=3, 0u64..=3), 1..80),
    ) {
        let clock = ManualClock::new(1_700_000_000_000_000);
        let store = MemoryStore::with_clock(Arc::new(clock.clone()));
        let (ka, kb) = ("rl:{user:1}:a", "rl:{user:1}:b");
        let peek = || {
            store
                .check_now(&[CheckItem { key: ka, algorithm: &a, cost: 0 }, CheckItem { key: kb, algorithm: &b, cost: 0 }])
                .decisions
        };
        for (gap_ms, ca, cb) in steps {
            clock.advance_ms(gap_ms);
            let before = peek();
            let d = store.check_now(&[CheckItem { key: ka, algorithm: &a, cost: ca }, CheckItem { key: kb, algorithm: &b, cost: cb }]);
            if d.allowed {
                continue;
            }
            prop_assert!(d.denied_by().is_some());
            prop_assert_eq!(peek(), before.clone(), "a denied check changed a state");
            for (i, x) in d.decisions.iter().enumerate() {
                prop_assert!(!x.allowed && x.lease.is_none());
                if x.reason == Some(DenyReason::OtherLimitDenied) {
                    // Shown with its unconsumed state: the peek's remaining and reset.
                    prop_assert_eq!((x.remaining, x.reset_after_ms, x.retry_after_ms), (before[i].remaining, before[i].reset_after_ms, 0));
                }
            }
        }
    }
}
