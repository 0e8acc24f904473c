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
//!
//! The cases live in three modules, re-exported here (the macro calls
//! `sluice_testkit::conformance::<case>`): [`algorithms`] (one known sequence per algorithm),
//! [`properties`] (what holds for every algorithm: expiry, cost 0, a cost over the limit,
//! exact retry times, unknown leases), [`many`] (several limits, tasks or keys at once) and
//! [`adjust`] (reset, charge and refund).
//! This module holds the case list, the macros and the harness they share.

pub mod adjust;
pub mod algorithms;
pub mod many;
pub mod properties;

pub use adjust::*;
pub use algorithms::*;
pub use many::*;
pub use properties::*;

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
            reset_restores_the_limit,
            charge_goes_into_debt_and_refund_stops_at_capacity,
            settle_an_estimate_exactly,
            concurrency_is_not_adjustable,
            calendar_month_resets_on_the_first,
            calendar_week_and_day_boundaries,
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
pub(crate) struct Harness {
    pub(crate) store: Arc<dyn Store>,
    pub(crate) clock: ManualClock,
    pub(crate) scheme: KeyScheme,
}

impl Harness {
    pub(crate) fn new(store: Arc<dyn Store>, clock: ManualClock) -> Self {
        Self {
            store,
            clock,
            scheme: unique_scheme(),
        }
    }

    pub(crate) fn key(&self, identity: &str, policy: &str) -> String {
        self.scheme.key(&Identity::new(identity), policy)
    }

    pub(crate) async fn multi(&self, items: &[(&str, &Algorithm, u64)]) -> MultiDecision {
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

    pub(crate) async fn one(&self, key: &str, algorithm: &Algorithm, cost: u64) -> Decision {
        self.multi(&[(key, algorithm, cost)])
            .await
            .decisions
            .remove(0)
    }

    /// Checks `(allowed, remaining, retry_after_ms, reset_after_ms)`.
    pub(crate) async fn expect(
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

    pub(crate) fn clock_now(&self) -> u64 {
        sluice_core::Clock::now(&self.clock)
    }
}

/// Moves the clock forward to the next multiple of `ms` (or leaves it if already there), so a
/// case's windows start where its arithmetic expects.
pub(crate) fn align(clock: &ManualClock, ms: u64) {
    let now_ms = sluice_core::Clock::now(clock) / 1000;
    clock.advance_ms(now_ms.next_multiple_of(ms) - now_ms);
}

/// One of each algorithm, all with a quota of 3, with the name used in its key.
pub(crate) fn all_algorithms() -> Vec<(&'static str, Algorithm)> {
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
