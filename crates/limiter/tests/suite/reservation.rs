//! Reservations on a real Redis (the testkit starts one): three instances reserve, settle
//! (on their own or another instance), overrun their maximum and abandon reservations at
//! random, concurrently, in exact and in leased mode. What was admitted plus what is still
//! reserved never exceeds the budget, and what was spent exceeds it by at most the debt of
//! the requests that overran their own maximum. Settling is exactly once across instances,
//! and an unsettled reservation counts in full once its ttl ends.

use std::sync::Arc;
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use sluice::{
    Algorithm, DecisionMode, Identity, Limiter, Policy, SettleError, StoreError, StoreOptions,
};
use sluice_testkit::servers::RedisServer;

const BUDGET: u64 = 1000;
const INSTANCES: usize = 3;
const TASKS_PER_INSTANCE: usize = 4;
const OPS_PER_TASK: usize = 60;

/// A window far longer than the run, so everything admitted is in one window.
fn budget(name: &str, leased: bool) -> Arc<Policy> {
    let mut p = Policy::new(
        name,
        Algorithm::FixedWindow {
            limit: BUDGET,
            window_ms: 7 * 86_400_000,
        },
    )
    .unwrap();
    if leased {
        p.mode = DecisionMode::Leased { ttl_ms: 60_000 };
    }
    p.validate().unwrap();
    Arc::new(p)
}

async fn instances(url: &str) -> Vec<Limiter> {
    let options = StoreOptions {
        timeout: Duration::from_millis(500),
        ..Default::default()
    };
    let mut out = Vec::new();
    for _ in 0..INSTANCES {
        out.push(Limiter::connect(url, options.clone()).await.unwrap());
    }
    out
}

/// What one task did, in units.
#[derive(Debug, Default, Clone, Copy)]
struct Tally {
    /// Real costs of settled reservations.
    settled: u64,
    /// Maxima of reservations abandoned (never settled): spent in full.
    abandoned: u64,
    /// Real costs beyond the declared maximum, charged as debt.
    debt: u64,
    /// Reservations admitted and denied.
    admitted: u64,
    denied: u64,
}

impl std::ops::AddAssign for Tally {
    fn add_assign(&mut self, o: Tally) {
        self.settled += o.settled;
        self.abandoned += o.abandoned;
        self.debt += o.debt;
        self.admitted += o.admitted;
        self.denied += o.denied;
    }
}

/// One task: reserve 1..=120 units; then settle on this instance or another with a real cost
/// of 0..=130 % of the maximum, or abandon it; sometimes settle twice (refused).
async fn run_task(limiters: Vec<Limiter>, me: usize, policy: Arc<Policy>, seed: u64) -> Tally {
    let mut rng = StdRng::seed_from_u64(seed);
    let id = Identity::new("gateway");
    let mut t = Tally::default();
    for _ in 0..OPS_PER_TASK {
        let max = rng.random_range(1..=120u64);
        let reserved = limiters[me]
            .reserve(&id, &policy, max, Duration::from_secs(60))
            .await
            .unwrap();
        let Some(reservation) = reserved.reservation else {
            assert!(!reserved.checked.allowed);
            t.denied += 1;
            continue;
        };
        assert!(reserved.checked.allowed);
        t.admitted += 1;
        tokio::task::yield_now().await;
        match rng.random_range(0..10) {
            0 | 1 => {
                // Abandoned: the holder went away.
                t.abandoned += max;
                drop(reservation);
            }
            choice => {
                let actual = rng.random_range(0..=max * 13 / 10);
                let rid = reservation.id().to_string();
                let settled = if choice < 6 {
                    reservation.settle(actual).await.unwrap()
                } else {
                    // Settled by another instance, which did not make it.
                    let other = (me + 1 + choice % (INSTANCES - 1)) % INSTANCES;
                    drop(reservation);
                    limiters[other].settle(&rid, actual).await.unwrap()
                };
                assert_eq!(settled.max_cost, max);
                assert_eq!(settled.debt, actual.saturating_sub(max));
                assert_eq!(settled.refunded, max.saturating_sub(actual));
                t.settled += actual;
                t.debt += settled.debt;
                if choice == 9 {
                    let again = limiters[me].settle(&rid, 0).await;
                    assert_eq!(again.unwrap_err(), SettleError::AlreadySettled);
                }
            }
        }
    }
    t
}

async fn concurrent_reservations_never_over_spend(leased: bool) {
    let server = RedisServer::redis();
    let limiters = instances(&server.url()).await;
    let policy = budget(if leased { "leased" } else { "exact" }, leased);
    let mut tasks = Vec::new();
    for me in 0..INSTANCES {
        for k in 0..TASKS_PER_INSTANCE {
            let seed = (me * 100 + k) as u64 + u64::from(leased) * 7919;
            tasks.push(tokio::spawn(run_task(
                limiters.clone(),
                me,
                Arc::clone(&policy),
                seed,
            )));
        }
    }
    let mut total = Tally::default();
    for task in tasks {
        total += task.await.unwrap();
    }
    let spent = total.settled + total.abandoned;
    eprintln!("leased={leased}: {total:?}, spent {spent}");
    // The budget ran out: the run tested the bound.
    assert!(total.denied > 0, "{total:?}");
    assert!(
        spent <= BUDGET + total.debt,
        "spent {spent} of a budget of {BUDGET} with a debt of {}: {total:?}",
        total.debt
    );
    // Everything reserved is settled or abandoned now: the store counts exactly what was
    // spent (exact mode), or that plus the slices the instances still hold (leased mode).
    let exact = budget(policy.name.as_str(), false);
    let state = limiters[0]
        .state(&Identity::new("gateway"), &exact)
        .await
        .unwrap();
    let counted = BUDGET - state.remaining;
    if leased {
        assert!(
            counted >= spent.min(BUDGET),
            "{counted} < {spent}: {total:?}"
        );
    } else {
        assert_eq!(counted, spent.min(BUDGET), "{total:?}");
    }
    // The refunds made room again: far more was admitted than one budget's worth of maxima.
    assert!(total.admitted > 20, "{total:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_reservations_on_three_instances_never_over_spend_exact() {
    concurrent_reservations_never_over_spend(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_reservations_on_three_instances_never_over_spend_leased() {
    concurrent_reservations_never_over_spend(true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reservation_is_settled_once_from_any_instance_and_counts_in_full_after_its_ttl() {
    let server = RedisServer::redis();
    let limiters = instances(&server.url()).await;
    let policy = budget("once", false);
    let id = Identity::new("team");
    let r = limiters[0]
        .reserve(&id, &policy, 400, Duration::from_secs(60))
        .await
        .unwrap()
        .reservation
        .unwrap();
    let rid = r.id().to_string();
    drop(r);
    assert_eq!(
        limiters[0].state(&id, &policy).await.unwrap().remaining,
        600
    );
    let settled = limiters[1].settle(&rid, 150).await.unwrap();
    assert_eq!((settled.refunded, settled.debt), (250, 0));
    assert_eq!(settled.decision.unwrap().remaining, 850);
    for l in &limiters {
        assert_eq!(
            l.settle(&rid, 0).await.unwrap_err(),
            SettleError::AlreadySettled
        );
    }
    // A forged id settles nothing.
    assert_eq!(
        limiters[2].settle(&"0".repeat(32), 0).await.unwrap_err(),
        SettleError::Unknown
    );
    assert_eq!(
        limiters[2].settle("not-an-id", 0).await.unwrap_err(),
        SettleError::Unknown
    );
    // Unsettled when its ttl ends: it counted in full, and can no longer be refunded.
    let short = limiters[0]
        .reserve(&id, &policy, 300, Duration::from_millis(200))
        .await
        .unwrap()
        .reservation
        .unwrap();
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert_eq!(short.settle(0).await.unwrap_err(), SettleError::Unknown);
    assert_eq!(
        limiters[1].state(&id, &policy).await.unwrap().remaining,
        550
    );
    // Overrunning the maximum is charged as debt and reported.
    let over = limiters[2]
        .reserve(&id, &policy, 50, Duration::from_secs(60))
        .await
        .unwrap()
        .reservation
        .unwrap();
    let settled = over.settle(700).await.unwrap();
    assert_eq!((settled.refunded, settled.debt), (0, 650));
    let d = limiters[0].state(&id, &policy).await.unwrap();
    assert_eq!(d.remaining, 0);
    // In debt: nothing more is admitted, and nothing is reserved.
    let denied = limiters[1]
        .reserve(&id, &policy, 1, Duration::from_secs(60))
        .await
        .unwrap();
    assert!(!denied.checked.allowed && denied.reservation.is_none());
}

#[tokio::test]
async fn the_embedded_store_keeps_reservations_in_process() {
    let l = Limiter::memory();
    let policy = budget("memory", false);
    let id = Identity::new("team");
    let r = l
        .reserve(&id, &policy, 900, Duration::from_secs(60))
        .await
        .unwrap()
        .reservation
        .unwrap();
    // 900 reserved: a reservation of 200 more does not fit.
    let denied = l
        .reserve(&id, &policy, 200, Duration::from_secs(60))
        .await
        .unwrap();
    assert!(!denied.checked.allowed && denied.reservation.is_none());
    let rid = r.id().to_string();
    let settled = r.settle(100).await.unwrap();
    assert_eq!(settled.refunded, 800);
    assert_eq!(l.state(&id, &policy).await.unwrap().remaining, 900);
    assert_eq!(
        l.settle(&rid, 0).await.unwrap_err(),
        SettleError::AlreadySettled
    );
    // A concurrency policy holds leases, not costs.
    let leases = Arc::new(
        Policy::new(
            "leases",
            Algorithm::Concurrency {
                limit: 3,
                lease_ms: 1000,
            },
        )
        .unwrap(),
    );
    assert!(matches!(
        l.reserve(&id, &leases, 1, Duration::from_secs(1)).await,
        Err(StoreError::Invalid(_))
    ));
}
