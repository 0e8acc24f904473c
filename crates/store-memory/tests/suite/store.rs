//! Behaviour specific to the embedded store: exact admission under many OS threads, dropping
//! expired state, the key cap, and the atomicity of multi-limit checks.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use sluice_core::{Algorithm, CheckItem, DenyReason, LeakyMode, ManualClock, Rate};
use sluice_memory::MemoryStore;

const T0: u64 = 1_700_000_000_000_000;

fn store(clock: &ManualClock) -> MemoryStore {
    MemoryStore::with_clock(Arc::new(clock.clone()))
}

fn one(store: &MemoryStore, key: &str, algorithm: &Algorithm, cost: u64) -> sluice_core::Decision {
    let d = store.check_now(&[CheckItem {
        key,
        algorithm,
        cost,
    }]);
    d.decisions.into_iter().next().unwrap()
}

/// 10,000 attempts from 8 threads on one key at a limit of 10 admit exactly 10.
fn hammer(algorithm: Algorithm) {
    let clock = ManualClock::new(T0);
    let store = Arc::new(store(&clock));
    let admitted = Arc::new(AtomicU64::new(0));
    let threads: Vec<_> = (0..8)
        .map(|_| {
            let (store, admitted, algorithm) = (store.clone(), admitted.clone(), algorithm.clone());
            std::thread::spawn(move || {
                for _ in 0..1250 {
                    let d = one(&store, "rl:{user:42}:hot", &algorithm, 1);
                    if d.allowed {
                        admitted.fetch_add(1, Ordering::Relaxed);
                    } else {
                        assert_eq!(d.reason, Some(DenyReason::Limited));
                    }
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    assert_eq!(admitted.load(Ordering::Relaxed), 10, "{algorithm:?}");
}

#[test]
fn eight_threads_admit_exactly_the_limit() {
    hammer(Algorithm::TokenBucket {
        capacity: 10,
        rate: Rate::per_second(1),
    });
    hammer(Algorithm::SlidingWindowLog {
        limit: 10,
        window_ms: 60_000,
    });
    hammer(Algorithm::FixedWindow {
        limit: 10,
        window_ms: 60_000,
    });
    hammer(Algorithm::Gcra {
        rate: Rate::per_second(1),
        burst: 9,
    });
    hammer(Algorithm::SlidingWindowCounter {
        limit: 10,
        window_ms: 60_000,
    });
    hammer(Algorithm::LeakyBucket {
        capacity: 10,
        rate: Rate::per_second(1),
        mode: LeakyMode::Policing,
    });
    hammer(Algorithm::Concurrency {
        limit: 10,
        lease_ms: 60_000,
    });
}

#[test]
fn states_back_at_their_initial_value_are_dropped() {
    let clock = ManualClock::new(T0);
    let store = store(&clock);
    let tb = Algorithm::TokenBucket {
        capacity: 5,
        rate: Rate::per_second(1),
    };
    for i in 0..100 {
        assert!(one(&store, &format!("rl:{{user:{i}}}:tb"), &tb, 1).allowed);
    }
    assert_eq!(store.len(), 100);
    // Peeks and denials do not create keys.
    one(&store, "rl:{peek}:tb", &tb, 0);
    one(&store, "rl:{big}:tb", &tb, 6);
    assert_eq!(store.len(), 100);
    // One second later every bucket is full again; touching a key drops it.
    clock.advance_ms(1000);
    let d = one(&store, "rl:{user:0}:tb", &tb, 0);
    assert_eq!((d.allowed, d.remaining, d.reset_after_ms), (true, 5, 0));
    assert_eq!(store.len(), 99);
    // Checks sweep the rest incrementally: a shard sweeps after as many checks as it holds
    // entries (at least 64), so 64 x 64 x 3 peeks spread over the shards reach every one.
    for i in 0..12_288 {
        one(&store, &format!("rl:{{peek:{i}}}:tb"), &tb, 0);
    }
    assert_eq!(store.len(), 0);
}

#[test]
fn deleting_release_drops_the_key() {
    let clock = ManualClock::new(T0);
    let store = store(&clock);
    let c = Algorithm::Concurrency {
        limit: 2,
        lease_ms: 10_000,
    };
    let d = one(&store, "rl:{job}:c", &c, 1);
    let lease = d.lease.unwrap();
    assert_eq!(lease.0.len(), 16);
    assert_eq!(store.len(), 1);
    assert!(store.release_now("rl:{job}:c", &lease));
    assert_eq!(store.len(), 0);
    assert!(!store.release_now("rl:{job}:c", &lease));
}

#[test]
fn key_cap_evicts_expired_then_soonest_expiring_into_the_summary() {
    let clock = ManualClock::new(T0);
    let store = MemoryStore::builder()
        .clock(Arc::new(clock.clone()))
        .max_keys(100)
        .build();
    // Key i expires after i + 1 seconds (fixed window of 1 h, cost i + 1 of a 1000/s bucket).
    let short = Algorithm::TokenBucket {
        capacity: 1000,
        rate: Rate::per_second(1),
    };
    for i in 0..100u64 {
        assert!(one(&store, &format!("rl:{{k:{i}}}:p"), &short, i + 1).allowed);
    }
    assert_eq!(store.len(), 100);
    // The 101st key pushes the store over the cap: it evicts down to 95, the soonest expiring.
    assert!(one(&store, "rl:{k:new}:p", &short, 500).allowed);
    assert_eq!(store.len(), 95);
    // Keys 0..=5 (expiring soonest) were evicted, into their policy's summary: they come back
    // exactly as spent (a token bucket's summary is exact for a key that shares no cell).
    assert_eq!(one(&store, "rl:{k:0}:p", &short, 0).remaining, 1000 - 1);
    assert_eq!(one(&store, "rl:{k:5}:p", &short, 0).remaining, 1000 - 6);
    assert_eq!(store.eviction_counts().informative, 6);
    assert_eq!(one(&store, "rl:{k:6}:p", &short, 0).remaining, 1000 - 7);
    assert_eq!(one(&store, "rl:{k:new}:p", &short, 0).remaining, 500);

    // Over a long run the cap holds.
    for i in 0..5000u64 {
        one(&store, &format!("rl:{{flood:{i}}}:p"), &short, 1);
        assert!(store.len() <= 100);
    }
    // The flood keys, expiring soonest, were the ones evicted; the long-lived keys survive.
    assert_eq!(one(&store, "rl:{k:new}:p", &short, 0).remaining, 500);
    assert_eq!(one(&store, "rl:{k:50}:p", &short, 0).remaining, 1000 - 51);
    // Expired keys go before live ones: 2 s later the flood keys have expired.
    clock.advance_ms(2000);
    for i in 0..20u64 {
        one(&store, &format!("rl:{{late:{i}}}:p"), &short, 1);
    }
    assert_eq!(one(&store, "rl:{k:new}:p", &short, 0).remaining, 502);
    assert_eq!(one(&store, "rl:{k:6}:p", &short, 0).remaining, 1000 - 7 + 2);
}

#[test]
fn multi_limit_denial_consumes_nothing() {
    let clock = ManualClock::new(T0);
    let store = store(&clock);
    let second = Algorithm::TokenBucket {
        capacity: 10,
        rate: Rate::per_second(10),
    };
    let day = Algorithm::FixedWindow {
        limit: 12,
        window_ms: 86_400_000,
    };
    let check = |cost| {
        store.check_now(&[
            CheckItem {
                key: "rl:{user:42}:second",
                algorithm: &second,
                cost,
            },
            CheckItem {
                key: "rl:{user:42}:day",
                algorithm: &day,
                cost,
            },
        ])
    };
    for _ in 0..10 {
        assert!(check(1).allowed);
    }
    let d = check(1);
    assert!(!d.allowed);
    assert_eq!(d.denied_by(), Some(0));
    assert_eq!(d.decisions[1].reason, Some(DenyReason::OtherLimitDenied));
    assert_eq!(
        (d.decisions[1].remaining, d.decisions[1].retry_after_ms),
        (2, 0)
    );
    clock.advance_ms(1000);
    assert!(check(2).allowed);
    let d = check(1);
    assert_eq!(d.denied_by(), Some(1));
    // The per-second bucket was not charged for the denied check.
    assert_eq!(one(&store, "rl:{user:42}:second", &second, 0).remaining, 8);
}

#[test]
fn the_same_key_twice_in_one_check_counts_twice() {
    let clock = ManualClock::new(T0);
    let store = store(&clock);
    let w = Algorithm::FixedWindow {
        limit: 3,
        window_ms: 1000,
    };
    let item = CheckItem {
        key: "rl:{dup}:w",
        algorithm: &w,
        cost: 2,
    };
    let d = store.check_now(&[item, item]);
    assert!(!d.allowed);
    assert_eq!(d.denied_by(), Some(1));
    assert_eq!(one(&store, "rl:{dup}:w", &w, 0).remaining, 3);
}

/// The read path's compare-and-swap under contention: the key is held (in its cell) before
/// 8 threads race 16,000 attempts of cost 1 or 2 at a limit of 5,000 units (every algorithm
/// kept in a cell); exactly as many
/// units are admitted as the limit holds, never one more, and no attempt is lost to a race.
#[test]
fn racing_swaps_on_a_held_key_admit_exactly_the_limit() {
    for algorithm in [
        Algorithm::TokenBucket {
            capacity: 5_000,
            rate: Rate::per_second(1),
        },
        Algorithm::Gcra {
            rate: Rate::per_second(1),
            burst: 4_999,
        },
        Algorithm::FixedWindow {
            limit: 5_000,
            window_ms: 60_000,
        },
        Algorithm::LeakyBucket {
            capacity: 5_000,
            rate: Rate::per_second(1),
            mode: LeakyMode::Policing,
        },
        Algorithm::SlidingWindowCounter {
            limit: 5_000,
            window_ms: 60_000,
        },
    ] {
        let clock = ManualClock::new(T0);
        let store = Arc::new(store(&clock));
        let key = "rl:{user:7}:race";
        // Held from here on: every attempt below decides in the key's cell.
        assert!(one(&store, key, &algorithm, 0).allowed);
        let units = Arc::new(AtomicU64::new(0));
        let threads: Vec<_> = (0..8u64)
            .map(|t| {
                let (store, units, algorithm) = (store.clone(), units.clone(), algorithm.clone());
                std::thread::spawn(move || {
                    for i in 0..2_000u64 {
                        let cost = 1 + (i + t) % 2;
                        if one(&store, key, &algorithm, cost).allowed {
                            units.fetch_add(cost, Ordering::Relaxed);
                        }
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        let admitted = units.load(Ordering::Relaxed);
        // Costs of 2 may leave one unit unspent at the end, never more.
        assert!(
            (4_999..=5_000).contains(&admitted),
            "{algorithm:?}: {admitted}"
        );
        let left = one(&store, key, &algorithm, 0).remaining;
        assert_eq!(admitted + left, 5_000, "{algorithm:?}");
    }
}
