//! Property: a store that evicts admits nothing an exact store would deny. Random sequences of
//! checks (random keys of two policies, costs and clock steps) go to a store squeezed to 4 keys
//! with tiny summaries (so evictions and summary collisions happen all the time; a fingerprint
//! table of one bucket up to a table that holds every key, so traces also overflow from the table
//! into the sketch, and keys carry traces in both) and, when it
//! admits, to an unbounded store that saw exactly the same admitted checks. The unbounded one
//! must admit too, with at least as much remaining.

use std::sync::Arc;

use proptest::prelude::*;
use sluice_core::{Algorithm, CheckItem, LeakyMode, ManualClock, Rate};
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
    #![proptest_config(ProptestConfig { cases: 300, ..ProptestConfig::default() })]

    #[test]
    fn summarized_decisions_never_admit_more_than_exact(
        a in algorithm(),
        b in algorithm(),
        slots in prop::sample::select(vec![8usize, 16, 40, 128]),
        steps in prop::collection::vec((0usize..12, 0u64..=3, 0u64..700), 1..200),
    ) {
        let clock = ManualClock::new(1_700_000_000_000_000);
        let bounded = MemoryStore::builder()
            .clock(Arc::new(clock.clone()))
            .shards(1)
            .max_keys(4)
            .summary_width(16)
            .fingerprint_memory(slots * sluice_memory::fingerprints::SLOT_BYTES)
            .build();
        let exact = MemoryStore::with_clock(Arc::new(clock.clone()));
        let keys: Vec<String> = (0..12).map(|i| format!("rl:{{user:{i}}}:p")).collect();
        for (k, cost, gap_ms) in steps {
            clock.advance_ms(gap_ms);
            let algorithm = if k < 6 { &a } else { &b };
            let item = CheckItem { key: &keys[k], algorithm, cost };
            let d = bounded.check_one(&item);
            prop_assert!(bounded.len() <= 4);
            if !d.allowed {
                continue;
            }
            let e = exact.check_one(&item);
            prop_assert!(e.allowed, "key {k} cost {cost}: admitted after eviction, exact denies: {d:?} vs {e:?}");
            prop_assert!(d.remaining <= e.remaining, "key {k}: {d:?} vs {e:?}");
        }
    }
}
