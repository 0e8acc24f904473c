//! The Lua scripts against the Rust algorithms: the same random sequences of (now, cost)
//! through each script (with an explicit `now`) and through `sluice_core::algorithm::decide`
//! give identical decisions, field by field, for every algorithm; also for mixed multi-limit
//! checks, lease releases, and in Functions mode.

use crate::support;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use sluice_core::algorithm::{self, State, Update};
use sluice_core::{Algorithm, CheckItem, Decision, DenyReason, LeaseId, ManualClock, Store};
use sluice_redis::ScriptMode;
use support::{Kind, manual_store};

const STEPS: usize = 250;
const SEEDS: u64 = 4;

/// The embedded reference: Rust state per key, updated as the memory store would (the Redis
/// keys never expire during the test: their TTLs are padded for the manual clock).
#[derive(Default)]
struct Model {
    states: Vec<Option<State>>,
}

fn apply(slot: &mut Option<State>, update: Update<State>) {
    match update {
        Update::Keep => {}
        Update::Delete => *slot = None,
        Update::Put { state, .. } => *slot = Some(state),
    }
}

fn quota(a: &Algorithm) -> u64 {
    a.quota()
}

fn window(a: &Algorithm) -> u64 {
    a.window_ms().max(1)
}

/// The next step of time, µs: mostly small steps, sometimes long gaps, sometimes backwards.
fn step(rng: &mut StdRng, w_ms: u64) -> i64 {
    match rng.random_range(0..100) {
        0..30 => 0,
        30..60 => rng.random_range(0..50_000),
        60..90 => rng.random_range(0..(w_ms as i64 * 1000)),
        90..95 => rng.random_range(0..(5 * w_ms as i64 * 1000)),
        _ => -rng.random_range(0..200_000),
    }
}

fn cost(rng: &mut StdRng, q: u64) -> u64 {
    match rng.random_range(0..100) {
        0..10 => 0,
        10..70 => 1,
        70..95 => rng.random_range(1..=q),
        _ => q + 1,
    }
}

/// What the multi-limit check must answer, from the per-item Rust outcomes.
fn multi_model(
    algs: &[&Algorithm],
    model: &mut Model,
    now: u64,
    costs: &[u64],
    leases: &[Option<LeaseId>],
) -> Vec<Decision> {
    let outcomes: Vec<_> = algs
        .iter()
        .enumerate()
        .map(|(i, a)| {
            algorithm::decide(
                a,
                model.states[i].as_ref(),
                now,
                costs[i],
                leases[i].as_ref(),
            )
        })
        .collect();
    let all = outcomes.iter().all(|o| o.decision.allowed);
    let mut out = Vec::new();
    for (i, o) in outcomes.into_iter().enumerate() {
        if all {
            apply(&mut model.states[i], o.update);
            out.push(o.decision);
        } else if o.decision.allowed {
            let mut d = algorithm::decide(algs[i], model.states[i].as_ref(), now, 0, None).decision;
            d.allowed = false;
            d.retry_after_ms = 0;
            d.delay_ms = 0;
            d.reason = Some(DenyReason::OtherLimitDenied);
            d.lease = None;
            out.push(d);
        } else {
            out.push(o.decision);
        }
    }
    out
}

/// Runs one sequence; returns (admitted, denied, releases that found their lease) to show the
/// sequence exercised every branch.
async fn run_sequence(
    kind: Kind,
    mode: ScriptMode,
    algs: &[&Algorithm],
    seed: u64,
) -> (u32, u32, u32) {
    let (mut admitted, mut denied, mut released) = (0, 0, 0);
    let mut rng = StdRng::seed_from_u64(seed);
    let mut now: u64 = 1_700_000_000_000_000 + rng.random_range(0..1_000_000_000);
    let clock = ManualClock::new(now);
    let store = manual_store(kind, &clock, mode).await;
    let keys: Vec<String> = (0..algs.len())
        .map(|i| format!("rl:{{diff:{seed}}}:p{i}"))
        .collect();
    let mut model = Model {
        states: vec![None; algs.len()],
    };
    let mut held: Vec<(usize, LeaseId)> = Vec::new();
    let w = algs.iter().map(|a| window(a)).max().unwrap_or(1000);
    for n in 0..STEPS {
        now = (now as i64 + step(&mut rng, w)) as u64;
        clock.set(now);
        // Now and then release a lease (concurrency only).
        if !held.is_empty() && rng.random_range(0..4) == 0 {
            let (i, lease) = held.swap_remove(rng.random_range(0..held.len()));
            let got = store.release(&keys[i], algs[i], &lease).await.unwrap();
            let want = match model.states[i].as_ref() {
                Some(s) => {
                    let (held, update) = algorithm::release(Some(s), now, &lease);
                    apply(&mut model.states[i], update);
                    held
                }
                None => false,
            };
            assert_eq!(got, want, "release, seed {seed} step {n} {:?}", algs[i]);
            released += u32::from(got);
            continue;
        }
        let costs: Vec<u64> = algs.iter().map(|a| cost(&mut rng, quota(a))).collect();
        let items: Vec<CheckItem<'_>> = algs
            .iter()
            .enumerate()
            .map(|(i, a)| CheckItem {
                key: &keys[i],
                algorithm: a,
                cost: costs[i],
            })
            .collect();
        let got = store.check(&items).await.unwrap();
        // The store chose the lease ids; the model takes the same ones.
        let leases: Vec<Option<LeaseId>> = got.decisions.iter().map(|d| d.lease.clone()).collect();
        let want = multi_model(algs, &mut model, now, &costs, &leases);
        assert_eq!(
            got.decisions, want,
            "{kind:?} {mode:?} seed {seed} step {n} now {now} costs {costs:?} algorithms {algs:?}"
        );
        assert_eq!(got.allowed, want.iter().all(|d| d.allowed));
        if got.allowed {
            admitted += 1
        } else {
            denied += 1
        }
        for (i, d) in got.decisions.iter().enumerate() {
            if let Some(l) = &d.lease {
                held.push((i, l.clone()));
            }
        }
    }
    (admitted, denied, released)
}

async fn every_algorithm_alone(kind: Kind, mode: ScriptMode) {
    let algs = support::algorithms();
    let mut tasks = Vec::new();
    for (j, a) in algs.into_iter().enumerate() {
        tasks.push(tokio::spawn(async move {
            let mut totals = (0, 0, 0);
            for seed in 0..SEEDS {
                let (a_, d_, r_) = run_sequence(kind, mode, &[&a], 1000 * j as u64 + seed).await;
                totals = (totals.0 + a_, totals.1 + d_, totals.2 + r_);
            }
            assert!(totals.0 > 50 && totals.1 > 50, "{a:?} saw {totals:?}");
            if matches!(a, Algorithm::Concurrency { .. }) {
                assert!(totals.2 > 5, "{a:?} released {totals:?}");
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
}

async fn mixed_multi_checks(kind: Kind, mode: ScriptMode) {
    let algs = support::algorithms();
    let mut rng = StdRng::seed_from_u64(7);
    for seed in 0..12u64 {
        let n = rng.random_range(2..=4);
        let picked: Vec<Algorithm> = (0..n)
            .map(|_| algs[rng.random_range(0..algs.len())].clone())
            .collect();
        let refs: Vec<&Algorithm> = picked.iter().collect();
        let (a, d, _) = run_sequence(kind, mode, &refs, 50_000 + seed).await;
        assert!(a > 0 && d > 0, "{refs:?}: {a} admitted, {d} denied");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scripts_equal_rust_on_redis() {
    every_algorithm_alone(Kind::Redis, ScriptMode::Eval).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn multi_limit_script_equals_rust_on_redis() {
    mixed_multi_checks(Kind::Redis, ScriptMode::Eval).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scripts_equal_rust_on_valkey() {
    every_algorithm_alone(Kind::Valkey, ScriptMode::Eval).await;
    mixed_multi_checks(Kind::Valkey, ScriptMode::Eval).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn functions_equal_rust_on_redis_and_valkey() {
    every_algorithm_alone(Kind::Redis, ScriptMode::Functions).await;
    mixed_multi_checks(Kind::Valkey, ScriptMode::Functions).await;
}

/// A long sliding log through its two ways of counting: entries of cost 1 only (counted in
/// Redis without being read), then entries of cost > 1 (the log read whole while one is in
/// the window), then cost 1 again once they have left. Every decision equals Rust's.
async fn sliding_log_phases(kind: Kind, mode: ScriptMode, seed: u64) {
    let alg = Algorithm::SlidingWindowLog {
        limit: 40,
        window_ms: 2000,
    };
    let mut rng = StdRng::seed_from_u64(seed);
    let mut now: u64 = 1_700_000_000_000_000 + rng.random_range(0..1_000_000_000);
    let clock = ManualClock::new(now);
    let store = manual_store(kind, &clock, mode).await;
    let key = format!("rl:{{swl:{seed}}}:p");
    let mut state: Option<State> = None;
    let (mut admitted, mut denied) = (0, 0);
    for n in 0..400 {
        now = match (n, rng.random_range(0..100)) {
            // The cost > 1 entries leave the window here.
            (260, _) => now + 2_500_000,
            (_, 0..20) => now,
            (_, 20..95) => now + rng.random_range(0..60_000),
            _ => now - rng.random_range(0..100_000),
        };
        clock.set(now);
        let cost = match (n, rng.random_range(0..10)) {
            (_, 0) => 0,
            (180..260, _) => rng.random_range(1..=6),
            _ => 1,
        };
        let got = store
            .check(&[CheckItem {
                key: &key,
                algorithm: &alg,
                cost,
            }])
            .await
            .unwrap();
        let want = algorithm::decide(&alg, state.as_ref(), now, cost, None);
        assert_eq!(
            got.decisions[0], want.decision,
            "{kind:?} {mode:?} seed {seed} step {n} now {now} cost {cost}"
        );
        apply(&mut state, want.update);
        if got.allowed {
            admitted += 1;
        } else {
            denied += 1;
        }
    }
    assert!(
        admitted > 100 && denied > 100,
        "{admitted} admitted, {denied} denied"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sliding_log_counting_equals_rust() {
    for seed in 0..3 {
        sliding_log_phases(Kind::Redis, ScriptMode::Eval, seed).await;
        sliding_log_phases(Kind::Valkey, ScriptMode::Functions, seed).await;
        sliding_log_phases(Kind::Cluster, ScriptMode::Eval, seed).await;
    }
}
