//! `lua/adjust.lua` against `sluice_core::algorithm::adjust`: random sequences of checks,
//! charges and refunds at random times (forward, long gaps, sometimes backwards) through the
//! Redis store with an explicit clock and through the Rust functions give identical answers,
//! field by field, for every algorithm that can be adjusted, calendar windows included.

use crate::support;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use sluice_core::algorithm::calendar::CalendarPeriod;
use sluice_core::algorithm::{self, Adjustment, State, Update};
use sluice_core::{Algorithm, CheckItem, ManualClock, Store};
use sluice_redis::ScriptMode;
use support::{Kind, manual_store};

const STEPS: usize = 200;

fn adjustable() -> Vec<Algorithm> {
    let mut algs: Vec<Algorithm> = support::algorithms()
        .into_iter()
        .filter(|a| !matches!(a, Algorithm::Concurrency { .. }))
        .collect();
    for period in [
        CalendarPeriod::Day,
        CalendarPeriod::Week,
        CalendarPeriod::Month,
    ] {
        algs.push(Algorithm::CalendarWindow { limit: 6, period });
    }
    algs
}

fn apply(slot: &mut Option<State>, update: Update<State>) {
    match update {
        Update::Keep => {}
        Update::Delete => *slot = None,
        Update::Put { state, .. } => *slot = Some(state),
    }
}

/// Runs one sequence on one algorithm; returns how many (charges, refunds) it made.
async fn run(kind: Kind, mode: ScriptMode, alg: &Algorithm, seed: u64) -> (u32, u32) {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut now: u64 = 1_700_000_000_000_000 + rng.random_range(0..1_000_000_000);
    let clock = ManualClock::new(now);
    let store = manual_store(kind, &clock, mode).await;
    let key = format!("rl:{{adj:{seed}:{}}}:p", rand::random::<u32>());
    let (q, w) = (alg.quota(), alg.window_ms().max(1) as i64);
    let mut state: Option<State> = None;
    let (mut charges, mut refunds) = (0, 0);
    for n in 0..STEPS {
        let step = match rng.random_range(0..100) {
            0..30 => 0,
            30..70 => rng.random_range(0..(w * 1000 / 4).max(1)),
            70..95 => rng.random_range(0..(2 * w * 1000)),
            _ => -rng.random_range(0..200_000),
        };
        now = (now as i64 + step) as u64;
        clock.set(now);
        let cost = match rng.random_range(0..10) {
            0 => 0,
            1..6 => rng.random_range(1..=q),
            _ => rng.random_range(1..=3 * q),
        };
        let (want, got) = match rng.random_range(0..3) {
            0 => {
                let cost = cost.min(q);
                let o = algorithm::decide(alg, state.as_ref(), now, cost, None);
                let item = CheckItem {
                    key: &key,
                    algorithm: alg,
                    cost,
                };
                let got = store.check(&[item]).await.unwrap().decisions.remove(0);
                if o.decision.allowed {
                    apply(&mut state, o.update);
                }
                (o.decision, got)
            }
            op => {
                let adj = if op == 1 {
                    charges += 1;
                    Adjustment::Charge(cost)
                } else {
                    refunds += 1;
                    Adjustment::Refund(cost)
                };
                let o = algorithm::adjust(alg, state.as_ref(), now, adj).unwrap();
                apply(&mut state, o.update);
                (o.decision, store.adjust(&key, alg, adj).await.unwrap())
            }
        };
        assert_eq!(
            want, got,
            "{kind:?} {mode:?} {alg:?} seed {seed} step {n} at {now}: rust vs lua"
        );
    }
    (charges, refunds)
}

async fn every_adjustable_algorithm(kind: Kind, mode: ScriptMode) {
    for (i, alg) in adjustable().iter().enumerate() {
        for seed in 0..3 {
            let (c, r) = run(kind, mode, alg, seed * 100 + i as u64).await;
            assert!(c > 20 && r > 20, "{alg:?}: {c} charges, {r} refunds");
        }
    }
}

#[tokio::test]
async fn redis_eval() {
    every_adjustable_algorithm(Kind::Redis, ScriptMode::Eval).await;
}

#[tokio::test]
async fn valkey_functions() {
    every_adjustable_algorithm(Kind::Valkey, ScriptMode::Functions).await;
}

#[tokio::test]
async fn cluster_eval() {
    every_adjustable_algorithm(Kind::Cluster, ScriptMode::Eval).await;
}
