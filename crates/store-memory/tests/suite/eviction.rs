//! Eviction under `max_keys` and `max_memory` never resets a limit: a flood of fresh identities
//! cannot give an exhausted identity its quota back, whichever policy or cost the flood uses.
//! Also: the byte bound holds, entries back at rest go before live ones, and the counters say
//! what happened.

use std::sync::Arc;

use sluice_core::{Algorithm, CheckItem, Decision, DenyReason, ManualClock, Rate};
use sluice_memory::{EvictionCounts, MemoryStore};

const T0: u64 = 1_700_000_000_000_000;

fn one(store: &MemoryStore, key: &str, algorithm: &Algorithm, cost: u64) -> Decision {
    store.check_one(&CheckItem {
        key,
        algorithm,
        cost,
    })
}

/// The victim's policy: 10 per minute.
fn per_minute() -> Algorithm {
    Algorithm::TokenBucket {
        capacity: 10,
        rate: Rate::new(10, 60_000),
    }
}

/// Exhausts the victim, then floods `identities` fresh keys with `flood` at cost `cost`, one
/// second later. Returns the victim's answer right after the flood.
fn flood_after_exhausting(
    store: &MemoryStore,
    clock: &ManualClock,
    flood: &Algorithm,
    cost: u64,
    identities: usize,
) -> Decision {
    let victim = per_minute();
    for _ in 0..10 {
        assert!(one(store, "rl:{victim}:minute", &victim, 1).allowed);
    }
    assert!(!one(store, "rl:{victim}:minute", &victim, 1).allowed);
    clock.advance_ms(1000);
    for i in 0..identities {
        one(store, &format!("rl:{{flood:{i}}}:long"), flood, cost);
    }
    one(store, "rl:{victim}:minute", &victim, 1)
}

fn bounded_by_keys(clock: &ManualClock) -> MemoryStore {
    MemoryStore::builder()
        .clock(Arc::new(clock.clone()))
        .max_keys(10_000)
        .build()
}

/// 1 MiB, with summaries of 256 KiB per policy so the map keeps most of it.
fn bounded_by_bytes(clock: &ManualClock) -> MemoryStore {
    MemoryStore::builder()
        .clock(Arc::new(clock.clone()))
        .max_memory(1 << 20)
        .summary_width(4096)
        .build()
}

fn sliding_log_hour() -> Algorithm {
    Algorithm::SlidingWindowLog {
        limit: 10,
        window_ms: 3_600_000,
    }
}

/// The victim is still denied after the flood, and gets back exactly what refilled: with the
/// flood's keys in other policies' summaries, its own summary is exact.
fn assert_still_limited(d: Decision, store: &MemoryStore, clock: &ManualClock) {
    assert!(!d.allowed, "the flood reset the victim: {d:?}");
    assert_eq!(d.reason, Some(DenyReason::Limited));
    let counts = store.eviction_counts();
    assert!(counts.informative > 0, "{counts:?}");
    assert!(counts.summarized_checks > 0, "{counts:?}");
    // 10 per minute: one token per 6 s; 1 s has passed, 5 s more give one token.
    clock.advance_ms(5000);
    assert!(one(store, "rl:{victim}:minute", &per_minute(), 1).allowed);
    assert!(!one(store, "rl:{victim}:minute", &per_minute(), 1).allowed);
}

#[test]
fn a_flood_on_a_longer_sliding_log_does_not_reset_the_victim() {
    let clock = ManualClock::new(T0);
    let store = bounded_by_keys(&clock);
    let d = flood_after_exhausting(&store, &clock, &sliding_log_hour(), 1, 20_000);
    assert!(store.len() <= 10_000);
    assert_still_limited(d, &store, &clock);
}

#[test]
fn a_flood_at_full_cost_on_a_token_bucket_does_not_reset_the_victim() {
    let clock = ManualClock::new(T0);
    let store = bounded_by_keys(&clock);
    // Each flood key empties a bucket of the victim's own policy, so it is back at rest later
    // than the victim.
    let d = flood_after_exhausting(&store, &clock, &per_minute(), 10, 20_000);
    assert!(store.len() <= 10_000);
    assert!(!d.allowed, "the flood reset the victim: {d:?}");
    // Sharing the victim's summary, the flood can only make it stricter: at most until the
    // last flood key is back at rest (61 s after the start), never beyond.
    clock.advance_ms(60_000);
    let d = one(&store, "rl:{victim}:minute", &per_minute(), 10);
    assert!(d.allowed, "{d:?}");
}

#[test]
fn a_flood_under_a_byte_limit_does_not_reset_the_victim() {
    let clock = ManualClock::new(T0);
    let store = bounded_by_bytes(&clock);
    let d = flood_after_exhausting(&store, &clock, &sliding_log_hour(), 1, 20_000);
    assert!(store.memory_bytes() <= 1 << 20, "{}", store.memory_bytes());
    assert_still_limited(d, &store, &clock);

    let clock = ManualClock::new(T0);
    let store = bounded_by_bytes(&clock);
    let d = flood_after_exhausting(&store, &clock, &per_minute(), 10, 20_000);
    assert!(store.memory_bytes() <= 1 << 20, "{}", store.memory_bytes());
    assert!(!d.allowed, "the flood reset the victim: {d:?}");
}

#[test]
fn every_policy_keeps_its_evicted_keys_exhausted() {
    let rate = Rate::new(6, 60_000);
    let policies = [
        Algorithm::TokenBucket { capacity: 3, rate },
        Algorithm::Gcra { rate, burst: 2 },
        Algorithm::LeakyBucket {
            capacity: 3,
            rate,
            mode: sluice_core::LeakyMode::Policing,
        },
        Algorithm::FixedWindow {
            limit: 3,
            window_ms: 60_000,
        },
        Algorithm::SlidingWindowCounter {
            limit: 3,
            window_ms: 60_000,
        },
        Algorithm::SlidingWindowLog {
            limit: 3,
            window_ms: 60_000,
        },
        Algorithm::Concurrency {
            limit: 3,
            lease_ms: 60_000,
        },
    ];
    for policy in policies {
        let clock = ManualClock::new(T0);
        let store = MemoryStore::builder()
            .clock(Arc::new(clock.clone()))
            .max_keys(1000)
            .build();
        for _ in 0..3 {
            assert!(
                one(&store, "rl:{victim}:p", &policy, 1).allowed,
                "{policy:?}"
            );
        }
        assert!(!one(&store, "rl:{victim}:p", &policy, 1).allowed);
        clock.advance_ms(100);
        for i in 0..3000 {
            one(
                &store,
                &format!("rl:{{flood:{i}}}:h"),
                &sliding_log_hour(),
                1,
            );
        }
        assert!(store.eviction_counts().informative >= 2000);
        let d = one(&store, "rl:{victim}:p", &policy, 1);
        assert!(!d.allowed, "{policy:?} reset by the flood: {d:?}");
        assert!(store.eviction_counts().summarized_checks > 0);
    }
}

#[test]
fn entries_at_rest_are_evicted_before_live_ones() {
    let clock = ManualClock::new(T0);
    let store = MemoryStore::builder()
        .clock(Arc::new(clock.clone()))
        .max_keys(100)
        .build();
    let second = Algorithm::TokenBucket {
        capacity: 5,
        rate: Rate::per_second(1),
    };
    let hour = Algorithm::FixedWindow {
        limit: 5,
        window_ms: 3_600_000,
    };
    // 50 keys back at rest after 1 s, 50 that hold for the hour (T0 is 10 s into its hour at
    // most; the window lasts past the 2 s below).
    for i in 0..50 {
        assert!(one(&store, &format!("rl:{{s:{i}}}:sec"), &second, 1).allowed);
        assert!(one(&store, &format!("rl:{{h:{i}}}:hour"), &hour, 3).allowed);
    }
    assert_eq!(store.len(), 100);
    clock.advance_ms(2000);
    // One more key: the 50 keys at rest make room, nothing live goes.
    assert!(one(&store, "rl:{new}:hour", &hour, 1).allowed);
    assert_eq!(store.len(), 51);
    assert_eq!(
        store.eviction_counts(),
        EvictionCounts {
            at_rest: 50,
            informative: 0,
            summarized_checks: 0,
            to_sketch: 0
        }
    );
    for i in 0..50 {
        assert_eq!(
            one(&store, &format!("rl:{{h:{i}}}:hour"), &hour, 0).remaining,
            2
        );
    }
    // 60 more live keys: now live ones must go (down to 95 keys), and they leave summaries.
    for i in 0..60 {
        assert!(one(&store, &format!("rl:{{more:{i}}}:hour"), &hour, 2).allowed);
    }
    let counts = store.eviction_counts();
    assert_eq!(counts.at_rest, 50);
    assert_eq!(store.len() as u64 + counts.informative, 51 + 60);
    // Every key, evicted or not, still shows at most what it has left (3 of 5 spent by the
    // first 50, 2 by the rest); an evicted key may show less, never more.
    for i in 0..50 {
        assert!(one(&store, &format!("rl:{{h:{i}}}:hour"), &hour, 0).remaining <= 2);
    }
    for i in 0..60 {
        assert!(one(&store, &format!("rl:{{more:{i}}}:hour"), &hour, 0).remaining <= 3);
    }
}

#[test]
fn the_byte_limit_holds_for_long_keys() {
    let clock = ManualClock::new(T0);
    let max = 8 << 20;
    let store = MemoryStore::builder()
        .clock(Arc::new(clock.clone()))
        .max_memory(max)
        .build();
    let policy = Algorithm::SlidingWindowLog {
        limit: 10,
        window_ms: 60_000,
    };
    let pad = "x".repeat(500);
    let mut most = 0;
    for i in 0..60_000 {
        one(&store, &format!("rl:{{{pad}{i}}}:p"), &policy, 1);
        most = most.max(store.memory_bytes());
    }
    // The documented slack: one insert's worth beyond the limit between evictions.
    assert!(most <= max + 4096, "{most} > {max}");
    // A key of 512 bytes costs about 600 bytes of heap and its slot. The summaries of the
    // evicted keys (their fingerprints, at most half of the limit) take the rest: the store
    // holds more than half of what fits beside them, and fewer keys than the flood.
    let summaries = store.summary_bytes();
    assert!(summaries <= max / 2, "{summaries} bytes of summaries");
    let per_key = (store.memory_bytes() - summaries) / store.len();
    assert!((600..1000).contains(&per_key), "{per_key} bytes per key");
    assert!(
        store.len() > (max - summaries) / 2 / per_key,
        "{} keys",
        store.len()
    );
    assert!(store.len() < 60_000);
}

#[test]
fn memory_bytes_follow_inserts_and_removals() {
    let clock = ManualClock::new(T0);
    let store = MemoryStore::with_clock(Arc::new(clock.clone()));
    assert_eq!(store.memory_bytes(), 0);
    let tb = Algorithm::TokenBucket {
        capacity: 5,
        rate: Rate::per_second(1),
    };
    // Keys of up to 29 bytes sit in their slot; a 40-byte key takes a 48-byte heap block.
    let short = |i: usize| format!("rl:{{user:{i}}}:tb");
    let long = |i: usize| format!("rl:{{user:{i:04}:{}}}:tb", "x".repeat(22));
    assert!(short(999).len() <= 29);
    assert_eq!(long(999).len(), 40);
    for i in 0..1000 {
        one(&store, &short(i), &tb, 1);
        one(&store, &long(i), &tb, 1);
    }
    let full = store.memory_bytes();
    // At least a 64-byte slot per key and a 48-byte block per long key.
    assert!(full >= 2000 * 64 + 1000 * 48, "{full}");
    clock.advance_ms(1000);
    for i in 0..1000 {
        one(&store, &short(i), &tb, 0);
        one(&store, &long(i), &tb, 0);
    }
    assert_eq!(store.len(), 0);
    // The long keys' blocks are freed (a token bucket's state has no heap part); the tables
    // keep their buckets.
    assert_eq!(store.memory_bytes(), full - 1000 * 48);
}
