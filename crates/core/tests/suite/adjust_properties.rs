//! Property tests of `algorithm::adjust` over random sequences of checks, charges and refunds:
//! a charge never raises what is left and a refund never lowers it, neither moves it by more
//! than the cost, and a refund never fills beyond the limit; a charge and a refund of the same
//! cost at one instant leave the state answering exactly as before (when the charge did not
//! hit the token bucket's floor); a written state is at rest at its `expires_at`.

use proptest::prelude::*;
use sluice_core::algorithm::calendar::CalendarPeriod;
use sluice_core::algorithm::{self, Adjustment, State, Update};
use sluice_core::{Algorithm, Decision, LeakyMode, Rate};

const T0: u64 = 1_700_000_000_000_000;

fn algorithms() -> Vec<Algorithm> {
    vec![
        Algorithm::TokenBucket {
            capacity: 7,
            rate: Rate::new(3, 1000),
        },
        Algorithm::Gcra {
            rate: Rate::per_second(4),
            burst: 3,
        },
        Algorithm::LeakyBucket {
            capacity: 5,
            rate: Rate::new(2, 700),
            mode: LeakyMode::Shaping,
        },
        Algorithm::FixedWindow {
            limit: 6,
            window_ms: 1500,
        },
        Algorithm::SlidingWindowCounter {
            limit: 6,
            window_ms: 900,
        },
        Algorithm::SlidingWindowLog {
            limit: 6,
            window_ms: 1200,
        },
        Algorithm::CalendarWindow {
            limit: 6,
            period: CalendarPeriod::Day,
        },
    ]
}

fn peek(a: &Algorithm, s: Option<&State>, now: u64) -> Decision {
    algorithm::decide(a, s, now, 0, None).decision
}

/// Applies `update`; checks that a written state is back at rest at its `expires_at`.
fn apply(a: &Algorithm, slot: &mut Option<(State, u64)>, update: Update<State>) {
    match update {
        Update::Keep => {}
        Update::Delete => *slot = None,
        Update::Put { state, expires_at } => {
            let d = peek(a, Some(&state), expires_at);
            assert_eq!(
                (d.remaining, d.reset_after_ms),
                (a.quota(), 0),
                "{a:?} at rest at expiry"
            );
            *slot = Some((state, expires_at));
        }
    }
}

fn live(slot: &Option<(State, u64)>, now: u64) -> Option<&State> {
    slot.as_ref().filter(|(_, e)| *e > now).map(|(s, _)| s)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]
    #[test]
    fn charges_and_refunds_move_remaining_by_at_most_the_cost(
        which in 0usize..7,
        ops in prop::collection::vec((0u64..800_000, 0u8..3, 0u64..15), 1..60),
    ) {
        let a = &algorithms()[which];
        let limit = a.quota();
        let mut slot: Option<(State, u64)> = None;
        let mut now = T0;
        for (dt, op, cost) in ops {
            now += dt;
            let before = peek(a, live(&slot, now), now);
            match op {
                0 => {
                    let o = algorithm::decide(a, live(&slot, now), now, cost.min(limit), None);
                    if o.decision.allowed {
                        apply(a, &mut slot, o.update);
                    }
                }
                1 => {
                    let o = algorithm::adjust(a, live(&slot, now), now, Adjustment::Charge(cost)).unwrap();
                    let after = o.decision.remaining;
                    prop_assert!(after <= before.remaining && after >= before.remaining.saturating_sub(cost),
                        "{a:?} charge {cost}: {} -> {after}", before.remaining);
                    apply(a, &mut slot, o.update);
                }
                _ => {
                    let o = algorithm::adjust(a, live(&slot, now), now, Adjustment::Refund(cost)).unwrap();
                    let after = o.decision.remaining;
                    prop_assert!(after >= before.remaining && after <= limit.min(before.remaining + cost),
                        "{a:?} refund {cost}: {} -> {after}", before.remaining);
                    apply(a, &mut slot, o.update);
                }
            }
        }
    }

    #[test]
    fn a_charge_and_a_refund_of_the_same_cost_cancel(
        which in 0usize..7,
        ops in prop::collection::vec((0u64..800_000, 0u64..6), 1..30),
        cost in 1u64..10,
    ) {
        let a = &algorithms()[which];
        let mut slot: Option<(State, u64)> = None;
        let mut now = T0;
        for (dt, c) in ops {
            now += dt;
            let o = algorithm::decide(a, live(&slot, now), now, c.min(a.quota()), None);
            if o.decision.allowed {
                apply(a, &mut slot, o.update);
            }
        }
        now += 1;
        let before = peek(a, live(&slot, now), now);
        // The token bucket drops debt beyond empty: only a charge it can hold cancels.
        if matches!(a, Algorithm::TokenBucket { .. }) && before.remaining < cost {
            return Ok(());
        }
        let o = algorithm::adjust(a, live(&slot, now), now, Adjustment::Charge(cost)).unwrap();
        apply(a, &mut slot, o.update);
        let o = algorithm::adjust(a, live(&slot, now), now, Adjustment::Refund(cost)).unwrap();
        apply(a, &mut slot, o.update);
        let after = peek(a, live(&slot, now), now);
        prop_assert_eq!(before, after, "{:?}", a);
    }
}
