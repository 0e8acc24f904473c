//! Leased mode against exact mode, on random arrivals: several limiter instances share one
//! embedded store on a hand-driven clock, and together they never admit more than one exact
//! limiter admits for the same arrivals; what they admit less is bounded by the slices they
//! can hold (`docs/leased-mode.md`).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use proptest::prelude::*;
use sluice::core::ManualClock;
use sluice::core::algorithm::Adjustment;
use sluice::core::store::CheckItem;
use sluice::core::{LeaseId, MultiDecision};
use sluice::leased::max_slice;
use sluice::{
    Algorithm, Decision, DecisionMode, DenyCacheMode, Identity, Limiter, Policy, Rate, Store,
    StoreError,
};
use sluice_memory::MemoryStore;

/// 2023-11-14, in µs: fixed windows are aligned to the epoch, so any start will do.
const START_US: u64 = 1_700_000_000_000_000;

fn algorithm() -> impl Strategy<Value = Algorithm> {
    prop_oneof![
        (10u64..200, 1u64..400).prop_map(|(capacity, per_s)| Algorithm::TokenBucket {
            capacity,
            rate: Rate::per_second(per_s),
        }),
        (9u64..200, 1u64..400).prop_map(|(burst, per_s)| Algorithm::Gcra {
            rate: Rate::per_second(per_s),
            burst,
        }),
        (10u64..200, 100u64..3000)
            .prop_map(|(limit, window_ms)| Algorithm::FixedWindow { limit, window_ms }),
    ]
}

/// µs between two arrivals: mostly bursts and steady traffic, sometimes a pause long enough
/// for a bucket to refill while slices are held.
fn gap() -> impl Strategy<Value = u64> {
    prop_oneof![
        4 => 0u64..200,
        4 => 0u64..20_000,
        1 => 20_000u64..800_000,
    ]
}

/// One instance per entry of `limiters`, all on one store whose clock is `clock`.
fn limiters(n: usize, clock: &ManualClock) -> Vec<Limiter> {
    let store = Arc::new(
        MemoryStore::builder()
            .clock(Arc::new(clock.clone()))
            .build(),
    );
    (0..n)
        .map(|_| {
            Limiter::builder(store.clone())
                .clock(Arc::new(clock.clone()))
                .deny_cache(DenyCacheMode::Off)
                .build()
        })
        .collect()
}

/// Admissions per arrival: `arrivals` are (instance, µs since the previous arrival).
fn run(policy: &Arc<Policy>, instances: usize, arrivals: &[(usize, u64)]) -> Vec<bool> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let clock = ManualClock::new(START_US);
        let limiters = limiters(instances, &clock);
        let id = Identity::new("client");
        let mut admitted = Vec::with_capacity(arrivals.len());
        for &(instance, gap_us) in arrivals {
            clock.advance_us(gap_us);
            let l = &limiters[instance % instances];
            admitted.push(l.check(&id, policy, 1).await.allowed);
        }
        admitted
    })
}

fn policy(algorithm: &Algorithm, mode: DecisionMode) -> Arc<Policy> {
    let mut p = Policy::new("p", algorithm.clone()).unwrap();
    p.mode = mode;
    p.validate().unwrap();
    Arc::new(p)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn leased_instances_never_admit_more_than_exact_and_fall_short_by_at_most_their_slices(
        algorithm in algorithm(),
        instances in 1usize..5,
        ttl_ms in 20u64..1000,
        arrivals in prop::collection::vec((0usize..4, gap()), 1..600),
    ) {
        let exact = run(&policy(&algorithm, DecisionMode::Exact), 1, &arrivals);
        let leased = run(&policy(&algorithm, DecisionMode::Leased { ttl_ms }), instances, &arrivals);
        let slice = max_slice(&algorithm);
        // Compared over every prefix: at no time have the instances admitted more, and at no
        // time are they behind by more than the slices that can be held over the lifetimes
        // elapsed so far.
        let (mut e, mut l, mut elapsed_us) = (0u64, 0u64, 0u64);
        for (i, (&x, &y)) in exact.iter().zip(&leased).enumerate() {
            elapsed_us += arrivals[i].1;
            e += u64::from(x);
            l += u64::from(y);
            prop_assert!(l <= e, "arrival {i}: leased admitted {l}, exact {e}");
            let lifetimes = 1 + elapsed_us / (ttl_ms * 1000);
            let bound = slice * instances as u64 * lifetimes;
            prop_assert!(e - l <= bound, "arrival {i}: leased {l} behind exact {e} by more than {bound}");
        }
    }
}

/// The embedded store, counting the calls it answers.
#[derive(Debug)]
struct Counted {
    inner: MemoryStore,
    calls: AtomicU64,
}

#[async_trait::async_trait]
impl Store for Counted {
    async fn check(&self, items: &[CheckItem<'_>]) -> Result<MultiDecision, StoreError> {
        self.calls.fetch_add(1, Ordering::Relaxed);
        self.inner.check(items).await
    }
    async fn release(&self, key: &str, a: &Algorithm, lease: &LeaseId) -> Result<bool, StoreError> {
        self.calls.fetch_add(1, Ordering::Relaxed);
        self.inner.release(key, a, lease).await
    }
    fn kind(&self) -> &'static str {
        self.inner.kind()
    }
    async fn adjust(
        &self,
        key: &str,
        a: &Algorithm,
        adjustment: Adjustment,
    ) -> Result<Decision, StoreError> {
        self.calls.fetch_add(1, Ordering::Relaxed);
        self.inner.adjust(key, a, adjustment).await
    }
}

/// Admitted and store calls of `requests` checks `gap_us` apart, alternating over two
/// instances.
fn busy(algorithm: &Algorithm, requests: usize, gap_us: u64) -> (u64, u64) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let clock = ManualClock::new(START_US);
        let store = Arc::new(Counted {
            inner: MemoryStore::builder()
                .clock(Arc::new(clock.clone()))
                .build(),
            calls: AtomicU64::new(0),
        });
        let limiters: Vec<Limiter> = (0..2)
            .map(|_| {
                Limiter::builder(store.clone())
                    .clock(Arc::new(clock.clone()))
                    .deny_cache(DenyCacheMode::Off)
                    .build()
            })
            .collect();
        let policy = policy(algorithm, DecisionMode::leased());
        let id = Identity::new("client");
        let mut admitted = 0;
        for i in 0..requests {
            clock.advance_us(gap_us);
            admitted += u64::from(limiters[i % 2].check(&id, &policy, 1).await.allowed);
        }
        (admitted, store.calls.load(Ordering::Relaxed))
    })
}

/// The property above is only worth something if slices are spent: a busy key under its
/// limit is answered almost entirely without the store.
#[test]
fn a_busy_key_under_its_limit_costs_the_store_under_one_call_in_twenty() {
    let algorithm = Algorithm::TokenBucket {
        capacity: 1000,
        rate: Rate::per_second(500),
    };
    // 4000 requests at 400/s: under the refill, so exact admits every one.
    let (admitted, calls) = busy(&algorithm, 4000, 2500);
    assert_eq!(admitted, 4000);
    assert!(calls * 20 < 4000, "{calls} store calls");
}

/// A flood on an exhausted key is denied from the remembered denial, not by the store.
#[test]
fn a_flood_past_the_limit_costs_the_store_under_one_call_in_twenty() {
    let algorithm = Algorithm::FixedWindow {
        limit: 100,
        window_ms: 1000,
    };
    // 5999 requests 0.5 ms apart, the last 0.5 ms before the fourth window: three windows
    // of 100.
    let (admitted, calls) = busy(&algorithm, 5999, 500);
    assert!(admitted <= 300, "{admitted}");
    assert!(
        admitted >= 300 - 3 * 2 * max_slice(&algorithm),
        "{admitted}"
    );
    assert!(calls * 20 < 6000, "{calls} store calls");
}
