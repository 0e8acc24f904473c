//! The store conformance suite: every behaviour a [`Store`] must have, written once against
//! `Arc<dyn Store>` and a [`ManualClock`], so the embedded store, Redis, Valkey and Redis
//! Cluster all run the very same tests (limitador's habit of one suite stamped out per backend).
//!
//! A backend instantiates it with [`crate::store_conformance_tests!`], naming an
//! `async fn(ManualClock) -> Arc<dyn Store>` that builds a store reading its time from that
//! clock. Each case is a public `async fn(Arc<dyn Store>, ManualClock)` here.
//!
//! Every case builds its keys with a random prefix, so cases can share one server and run
//! concurrently; the keys of one multi-limit check share one identity, hence one hash tag (one
//! Cluster slot). The clock starts at [`T0`], a multiple of 10 s, and only moves forward.
//! Expected values are the arithmetic of `docs/algorithms.md`, never values read back from a
//! store.

use std::sync::Arc;

use sluice_core::{
    Algorithm, CheckItem, Decision, DenyReason, Identity, KeyScheme, LeakyMode, ManualClock,
    MultiDecision, Rate, Store,
};

/// Where every case's clock starts: 2023-11-14T22:13:20Z in µs, a multiple of 10 s.
pub const T0: u64 = 1_700_000_000_000_000;

/// Lists the cases once; [`crate::store_conformance_tests!`] expands over this list.
#[doc(hidden)]
#[macro_export]
macro_rules! __conformance_cases {
    ($callback:ident ! ($($args:tt)*)) => {
        $crate::$callback! { $($args)*;
            token_bucket_guide_sequence,
            gcra_sequence,
            leaky_bucket_policing_sequence,
            leaky_bucket_shaping_sequence,
            fixed_window_sequence,
            sliding_window_counter_sequence,
            sliding_window_log_guide_sequence,
            sliding_window_log_spaced_sequence,
            concurrency_acquire_release_expiry,
            expiry_returns_to_initial_state,
            cost_zero_peeks,
            cost_exceeding_the_limit_is_final,
            retry_after_is_exact_and_denials_change_nothing,
            multi_limit_per_second_and_per_day,
            multi_limit_user_and_tenant,
            concurrent_tasks_admit_exactly_the_limit,
            many_distinct_keys,
            release_of_unknown_leases,
        }
    };
}

/// Expands to one `#[tokio::test]` per conformance case, each building its store with
/// `factory`, an `async fn(sluice_core::ManualClock) -> std::sync::Arc<dyn sluice_core::Store>`.
/// The calling crate needs `tokio` (with `macros` and `rt-multi-thread`) as a dev-dependency.
///
/// ```ignore
/// async fn memory(clock: ManualClock) -> Arc<dyn Store> {
///     Arc::new(MemoryStore::with_clock(Arc::new(clock)))
/// }
/// sluice_testkit::store_conformance_tests!(memory);
/// ```
#[macro_export]
macro_rules! store_conformance_tests {
    ($factory:path) => {
        $crate::__conformance_cases!(__conformance_test_fns!($factory));
    };
}

#[doc(hidden)]
#[macro_export]
macro_rules! __conformance_test_fns {
    ($factory:path; $($case:ident),* $(,)?) => {
        $(
            #[::tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $case() {
                let clock = $crate::conformance::start_clock();
                let store = $factory(clock.clone()).await;
                $crate::conformance::$case(store, clock).await;
            }
        )*
    };
}

/// A clock standing at [`T0`].
pub fn start_clock() -> ManualClock {
    ManualClock::new(T0)
}

/// A key scheme with a random prefix, so concurrent cases on one server never share a key.
pub fn unique_scheme() -> KeyScheme {
    KeyScheme::with_prefix(format!("ct{:016x}", rand::random::<u64>()))
}

/// The fields a conformance test compares (everything but the random lease id).
pub type Fields = (bool, u64, u64, u64, u64, u64, Option<DenyReason>);

/// `(allowed, limit, remaining, retry_after_ms, reset_after_ms, delay_ms, reason)`.
pub fn fields(d: &Decision) -> Fields {
    (
        d.allowed,
        d.limit,
        d.remaining,
        d.retry_after_ms,
        d.reset_after_ms,
        d.delay_ms,
        d.reason,
    )
}

/// One store and clock with a private key space.
#[derive(Debug, Clone)]
struct Harness {
    store: Arc<dyn Store>,
    clock: ManualClock,
    scheme: KeyScheme,
}

impl Harness {
    fn new(store: Arc<dyn Store>, clock: ManualClock) -> Self {
        Self {
            store,
            clock,
            scheme: unique_scheme(),
        }
    }

    fn key(&self, identity: &str, policy: &str) -> String {
        self.scheme.key(&Identity::new(identity), policy)
    }

    async fn multi(&self, items: &[(&str, &Algorithm, u64)]) -> MultiDecision {
        let items: Vec<CheckItem<'_>> = items
            .iter()
            .map(|&(key, algorithm, cost)| CheckItem {
                key,
                algorithm,
                cost,
            })
            .collect();
        let d = self.store.check(&items).await.expect("store answers");
        assert_eq!(d.decisions.len(), items.len());
        assert_eq!(d.allowed, d.decisions.iter().all(|d| d.allowed));
        d
    }

    async fn one(&self, key: &str, algorithm: &Algorithm, cost: u64) -> Decision {
        self.multi(&[(key, algorithm, cost)])
            .await
            .decisions
            .remove(0)
    }

    /// Checks `(allowed, remaining, retry_after_ms, reset_after_ms)`.
    async fn expect(
        &self,
        key: &str,
        algorithm: &Algorithm,
        cost: u64,
        want: (bool, u64, u64, u64),
    ) -> Decision {
        let d = self.one(key, algorithm, cost).await;
        assert_eq!(
            (d.allowed, d.remaining, d.retry_after_ms, d.reset_after_ms),
            want,
            "{} cost {cost} at T0 + {} ms: {d:?}",
            algorithm.kind(),
            (self.clock_now() - T0) / 1000
        );
        d
    }

    fn clock_now(&self) -> u64 {
        sluice_core::Clock::now(&self.clock)
    }
}

/// Moves the clock forward to the next multiple of `ms` (or leaves it if already there), so a
/// case's windows start where its arithmetic expects.
fn align(clock: &ManualClock, ms: u64) {
    let now_ms = sluice_core::Clock::now(clock) / 1000;
    clock.advance_ms(now_ms.next_multiple_of(ms) - now_ms);
}

/// One of each algorithm, all with a quota of 3, with the name used in its key.
fn all_algorithms() -> Vec<(&'static str, Algorithm)> {
    let rate = Rate::per_second(1);
    vec![
        ("tb", Algorithm::TokenBucket { capacity: 3, rate }),
        ("gcra", Algorithm::Gcra { rate, burst: 2 }),
        (
            "lbp",
            Algorithm::LeakyBucket {
                capacity: 3,
                rate,
                mode: LeakyMode::Policing,
            },
        ),
        (
            "lbs",
            Algorithm::LeakyBucket {
                capacity: 3,
                rate,
                mode: LeakyMode::Shaping,
            },
        ),
        (
            "fw",
            Algorithm::FixedWindow {
                limit: 3,
                window_ms: 10_000,
            },
        ),
        (
            "swc",
            Algorithm::SlidingWindowCounter {
                limit: 3,
                window_ms: 10_000,
            },
        ),
        (
            "swl",
            Algorithm::SlidingWindowLog {
                limit: 3,
                window_ms: 10_000,
            },
        ),
        (
            "cc",
            Algorithm::Concurrency {
                limit: 3,
                lease_ms: 10_000,
            },
        ),
    ]
}

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
