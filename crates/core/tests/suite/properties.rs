//! Property tests of the algorithms over random arrival sequences and costs: each algorithm's
//! bound from `docs/algorithms.md`, GCRA against the redis-cell reference model, and the rules
//! every algorithm shares (denials and peeks never write; `retry_after_ms` is exact; after
//! `reset_after_ms` a key answers like a fresh one).
//!
//! The simulated store keeps one state and drops it at its `expires_at`, as the stores do.

use proptest::prelude::*;
use sluice_core::algorithm::gcra::{self, ReferenceKey};
use sluice_core::algorithm::{self, State, Update};
use sluice_core::decision::ceil_ms;
use sluice_core::{Algorithm, Decision, DenyReason, LeakyMode, LeaseId, Rate};

const T0: u64 = 1_700_000_000_000_000;

/// One key's state as a store holds it.
#[derive(Debug)]
struct Sim {
    algorithm: Algorithm,
    state: Option<(State, u64)>,
    leases: u64,
}

impl Sim {
    fn new(algorithm: Algorithm) -> Self {
        Self {
            algorithm,
            state: None,
            leases: 0,
        }
    }

    fn live(&self, now: u64) -> Option<&State> {
        self.state
            .as_ref()
            .filter(|(_, exp)| *exp > now)
            .map(|(s, _)| s)
    }

    /// Decides without applying.
    fn peek(&self, now: u64, cost: u64) -> algorithm::Outcome<State> {
        algorithm::decide(
            &self.algorithm,
            self.live(now),
            now,
            cost,
            Some(&LeaseId(format!("l{}", self.leases))),
        )
    }

    /// Decides and applies, checking the rules every algorithm shares.
    fn step(&mut self, now: u64, cost: u64) -> Decision {
        // An expired state is gone for good, even if the clock later steps back (as in Redis).
        if self.live(now).is_none() {
            self.state = None;
        }
        let o = self.peek(now, cost);
        let d = o.decision.clone();
        if !d.allowed || cost == 0 {
            assert_eq!(
                o.update,
                Update::Keep,
                "denials and peeks never write: {d:?}"
            );
        }
        if d.allowed {
            assert_eq!((d.retry_after_ms, d.reason), (0, None));
        } else if d.reason == Some(DenyReason::CostExceedsLimit) {
            assert_eq!(d.retry_after_ms, 0);
            assert!(cost > self.algorithm.quota());
        } else {
            assert!(d.retry_after_ms >= 1);
            self.check_retry_is_exact(now, cost, d.retry_after_ms);
        }
        self.check_reset_is_exact(now, &o);
        self.leases += 1;
        match o.update {
            Update::Put { state, expires_at } => {
                assert!(expires_at > now, "a written state is not already expired");
                self.state = Some((state, expires_at));
            }
            Update::Delete => self.state = None,
            Update::Keep => {}
        }
        d
    }

    /// Waiting `retry` ms admits the same request; one ms less does not.
    fn check_retry_is_exact(&self, now: u64, cost: u64, retry: u64) {
        let at = |ms: u64| now / 1000 * 1000 + ms * 1000 + now % 1000;
        let late = self.peek(at(retry), cost).decision;
        assert!(
            late.allowed,
            "{:?}: retry_after {retry} at {now} is not enough: {late:?}",
            self.algorithm
        );
        let early = self.peek(at(retry - 1), cost).decision;
        assert!(
            !early.allowed,
            "{:?}: retry_after {retry} is later than needed",
            self.algorithm
        );
    }

    /// After `reset_after_ms` the key answers like a fresh one.
    fn check_reset_is_exact(&self, now: u64, o: &algorithm::Outcome<State>) {
        let state = match &o.update {
            Update::Put { state, .. } => Some(state),
            Update::Delete => None,
            Update::Keep => self.live(now),
        };
        let later = now + o.decision.reset_after_ms * 1000;
        let lease = Some(LeaseId("x".into()));
        let a = algorithm::decide(&self.algorithm, state, later, 1, lease.as_ref()).decision;
        let b = algorithm::decide(&self.algorithm, None, later, 1, lease.as_ref()).decision;
        assert_eq!(
            a, b,
            "{:?}: not back to the initial state after reset_after_ms",
            self.algorithm
        );
    }
}

/// Arrivals: (gap in µs, cost), turned into absolute times from T0.
fn arrivals(max_gap_us: u64, max_cost: u64) -> impl Strategy<Value = Vec<(u64, u64)>> {
    prop::collection::vec((0..max_gap_us, 0..=max_cost), 1..120).prop_map(|v| {
        let mut now = T0;
        v.into_iter()
            .map(|(gap, cost)| {
                now += gap;
                (now, cost)
            })
            .collect()
    })
}

/// Runs a sequence and returns the admitted `(now, cost, decision)` with cost > 0.
fn admitted(sim: &mut Sim, seq: &[(u64, u64)]) -> Vec<(u64, u64, Decision)> {
    let mut out = Vec::new();
    for &(now, cost) in seq {
        let d = sim.step(now, cost);
        if d.allowed && cost > 0 {
            out.push((now, cost, d));
        }
    }
    out
}

fn rate() -> impl Strategy<Value = Rate> {
    (
        1u64..=6,
        prop::sample::select(vec![100u64, 1000, 3000, 60_000]),
    )
        .prop_map(|(a, p)| Rate::new(a, p))
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]

    /// Token bucket: in any interval of T ms, admitted cost <= C + R*T/P.
    #[test]
    fn token_bucket_bound(capacity in 1u64..=8, rate in rate(), seq in arrivals(1_500_000, 4)) {
        let mut sim = Sim::new(Algorithm::TokenBucket { capacity, rate });
        let adm = admitted(&mut sim, &seq);
        let Rate { amount: r, per_ms: p } = rate.reduced();
        for i in 0..adm.len() {
            let mut sum = 0;
            for j in i..adm.len() {
                sum += adm[j].1;
                let t = adm[j].0 / 1000 - adm[i].0 / 1000;
                prop_assert!(sum * p <= capacity * p + r * t, "{sum} admitted in {t} ms");
            }
        }
    }

    /// Leaky bucket: the same bound; shaping delays stay below (C - cost) * P / R and requests
    /// leave at the bucket's rate.
    #[test]
    fn leaky_bucket_bound(capacity in 1u64..=8, rate in rate(), shaping: bool, seq in arrivals(1_500_000, 4)) {
        let mode = if shaping { LeakyMode::Shaping } else { LeakyMode::Policing };
        let mut sim = Sim::new(Algorithm::LeakyBucket { capacity, rate, mode });
        let adm = admitted(&mut sim, &seq);
        let Rate { amount: r, per_ms: p } = rate.reduced();
        for i in 0..adm.len() {
            let (ti, ci, di) = (&adm[i].0, adm[i].1, &adm[i].2);
            prop_assert!(di.delay_ms <= ((capacity - ci) * p).div_ceil(r));
            if !shaping {
                prop_assert_eq!(di.delay_ms, 0);
            }
            let (mut sum, mut before_j) = (0, 0);
            for (j, (tj, cj, dj)) in adm.iter().enumerate().skip(i) {
                sum += cj;
                let t = tj / 1000 - ti / 1000;
                prop_assert!(sum * p <= capacity * p + r * t, "{sum} admitted in {t} ms");
                if shaping && j > i {
                    // Request j leaves after everything admitted from i on has drained.
                    let (ri, rj) = (ti / 1000 + di.delay_ms, tj / 1000 + dj.delay_ms);
                    prop_assert!((rj + 1).saturating_sub(ri) * r > before_j * p, "released too early");
                }
                before_j = sum;
            }
        }
    }

    /// Fixed window: admitted cost per aligned window <= L.
    #[test]
    fn fixed_window_bound(limit in 1u64..=6, window in 1u64..=3000, seq in arrivals(700_000, 3)) {
        let mut sim = Sim::new(Algorithm::FixedWindow { limit, window_ms: window });
        let adm = admitted(&mut sim, &seq);
        let mut per_window = std::collections::BTreeMap::new();
        for (now, cost, _) in &adm {
            *per_window.entry(now / 1000 / window).or_insert(0) += cost;
        }
        prop_assert!(per_window.values().all(|&c| c <= limit));
    }

    /// Sliding window log: admitted cost in any window of W ms <= L, exactly; and every request
    /// that fits is admitted.
    #[test]
    fn sliding_log_bound(limit in 1u64..=6, window in 1u64..=3000, seq in arrivals(700_000, 3)) {
        let mut sim = Sim::new(Algorithm::SlidingWindowLog { limit, window_ms: window });
        let mut history: Vec<(u64, u64)> = Vec::new();
        for &(now, cost) in &seq {
            let now_ms = now / 1000;
            let in_window: u64 = history.iter().filter(|(t, _)| t + window > now_ms).map(|(_, c)| c).sum();
            let d = sim.step(now, cost);
            prop_assert_eq!(d.allowed, cost <= limit && in_window + cost <= limit);
            if d.allowed && cost > 0 {
                history.push((now_ms, cost));
            }
        }
        for &(t, _) in &history {
            let sum: u64 = history.iter().filter(|(u, _)| *u >= t && *u < t + window).map(|(_, c)| c).sum();
            prop_assert!(sum <= limit);
        }
    }

    /// Sliding window counter: admits exactly when the weighted estimate, computed here from the
    /// admitted history, leaves room.
    #[test]
    fn sliding_counter_matches_its_estimate(limit in 1u64..=6, window in 1u64..=3000, seq in arrivals(700_000, 3)) {
        let mut sim = Sim::new(Algorithm::SlidingWindowCounter { limit, window_ms: window });
        let mut history: Vec<(u64, u64)> = Vec::new();
        for &(now, cost) in &seq {
            let now_ms = now / 1000;
            let start = now_ms / window * window;
            let sum = |from: u64, to: u64| -> u64 {
                history.iter().filter(|(t, _)| *t >= from && *t < to).map(|(_, c)| c).sum()
            };
            let curr = sum(start, start + window);
            let prev = sum(start.saturating_sub(window), start);
            let estimate = prev * (window - (now_ms - start)) / window + curr;
            let d = sim.step(now, cost);
            prop_assert_eq!(d.allowed, cost <= limit && estimate + cost <= limit);
            if d.allowed {
                prop_assert_eq!(d.remaining, limit - (estimate + cost));
                if cost > 0 {
                    history.push((now_ms, cost));
                }
            }
        }
    }

    /// GCRA equals the model of redis-cell's CL.THROTTLE on every step, including steps where
    /// the clock goes back a little.
    #[test]
    fn gcra_equals_reference(
        amount in 1u64..=20,
        per_ms in prop::sample::select(vec![1000u64, 3000, 60_000]),
        burst in 0u64..=5,
        steps in prop::collection::vec((-300_000i64..2_000_000, 0u64..=8), 1..150),
    ) {
        let rate = Rate::new(amount, per_ms);
        let mut sim = Sim::new(Algorithm::Gcra { rate, burst });
        let mut key: Option<ReferenceKey> = None;
        let mut now = T0 as i64;
        for (gap, cost) in steps {
            now += gap;
            let (reply, stored) = gcra::reference(key, rate, burst as i64, now, cost as i64);
            key = stored;
            let d = sim.step(now as u64, cost);
            prop_assert_eq!(d.allowed, !reply.limited);
            prop_assert_eq!(d.limit as i64, reply.limit);
            prop_assert_eq!(d.remaining as i64, reply.remaining);
            prop_assert_eq!(d.reset_after_ms, ceil_ms(reply.reset_after.max(0) as u64));
            match (reply.limited, reply.retry_after) {
                (false, r) => prop_assert_eq!((r, d.retry_after_ms), (-1, 0)),
                (true, -1) => prop_assert_eq!((d.reason, d.retry_after_ms), (Some(DenyReason::CostExceedsLimit), 0)),
                (true, r) => prop_assert_eq!((d.reason, d.retry_after_ms), (Some(DenyReason::Limited), ceil_ms(r as u64))),
            }
        }
    }

    /// Concurrency: in-flight units (leases neither released nor lapsed, counted here) never
    /// exceed N, and a request is admitted exactly when it fits.
    #[test]
    fn concurrency_never_exceeds_the_limit(
        limit in 1u64..=5,
        lease_ms in 1u64..=3000,
        ops in prop::collection::vec((0u64..1_000_000, 0u64..=3, any::<bool>(), any::<prop::sample::Index>()), 1..150),
    ) {
        let mut sim = Sim::new(Algorithm::Concurrency { limit, lease_ms });
        let mut held: Vec<(LeaseId, u64, u64)> = Vec::new(); // id, cost, expires_ms
        let mut now = T0;
        for (gap, cost, release, which) in ops {
            now += gap;
            let now_ms = now / 1000;
            held.retain(|(_, _, exp)| *exp > now_ms);
            if release && !held.is_empty() {
                let (id, _, _) = held.remove(which.index(held.len()));
                let state = sim.live(now).expect("a lease is held").clone();
                let (was_held, update) = algorithm::release(Some(&state), now, &id);
                prop_assert!(was_held);
                match update {
                    Update::Put { state, expires_at } => sim.state = Some((state, expires_at)),
                    Update::Delete => sim.state = None,
                    Update::Keep => prop_assert!(false, "a release writes"),
                }
                continue;
            }
            let in_flight: u64 = held.iter().map(|(_, c, _)| c).sum();
            let d = sim.step(now, cost);
            prop_assert_eq!(d.allowed, cost <= limit && in_flight + cost <= limit);
            if d.allowed && cost > 0 {
                held.push((d.lease.clone().expect("a lease"), cost, now_ms + lease_ms));
            }
            prop_assert!(held.iter().map(|(_, c, _)| c).sum::<u64>() <= limit);
            prop_assert_eq!(d.remaining, limit - held.iter().map(|(_, c, _)| c).sum::<u64>().min(limit));
        }
    }
}

/// The token bucket written literally from `docs/algorithms.md`: the rate reduced by its GCD
/// on every call, the refill test as `elapsed >= ceil(missing / R)`, every quotient divided
/// out. [`sluice_core::algorithm::token_bucket::decide`] skips the GCD for rates in lowest
/// terms by form, multiplies instead of dividing in the refill test and skips the division
/// of less than one token; it must answer exactly this.
fn token_bucket_literal(
    state: Option<&sluice_core::algorithm::token_bucket::State>,
    capacity: u64,
    rate: Rate,
    now: u64,
    cost: u64,
) -> algorithm::Outcome<sluice_core::algorithm::token_bucket::State> {
    let Rate {
        amount: r,
        per_ms: p,
    } = rate.reduced();
    let full = capacity * p;
    let now_ms = now / 1000;
    let tokens = match state {
        None => full,
        Some(s) => {
            let elapsed = now_ms.saturating_sub(s.last_ms);
            if elapsed >= full.saturating_sub(s.tokens).div_ceil(r) {
                full
            } else {
                s.tokens + elapsed * r
            }
        }
    };
    let keep = |decision| algorithm::Outcome {
        decision,
        update: Update::Keep,
    };
    if cost > capacity {
        return keep(Decision::cost_exceeds_limit(
            capacity,
            tokens / p,
            (full - tokens).div_ceil(r),
        ));
    }
    let need = cost * p;
    if tokens < need {
        return keep(Decision::limited(
            capacity,
            tokens / p,
            (need - tokens).div_ceil(r),
            (full - tokens).div_ceil(r),
        ));
    }
    let left = tokens - need;
    let reset = (full - left).div_ceil(r);
    let decision = Decision::allow(capacity, left / p, reset);
    if cost == 0 {
        return keep(decision);
    }
    algorithm::Outcome {
        decision,
        update: Update::Put {
            state: sluice_core::algorithm::token_bucket::State {
                tokens: left,
                last_ms: now_ms,
            },
            expires_at: (now_ms + reset) * 1000,
        },
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

    /// GCRA's 64-bit form (the embedded store's hot path) answers exactly what its 128-bit
    /// form does, on values that fit 64 bits and on values that overflow them (where
    /// `decide` falls back to the 128-bit form): huge bursts and costs, TATs far ahead of or
    /// behind the clock, clocks near the end of `u64`.
    #[test]
    fn gcra_64_bit_form_equals_the_128_bit_form(
        amount in prop_oneof![Just(1u64), 1u64..=1000, 1u64..=(1 << 40)],
        per_ms in prop_oneof![Just(1000u64), Just(3_600_000), 1u64..=(1 << 40)],
        burst in prop_oneof![0u64..=10, 0u64..=(1 << 60)],
        cost in prop_oneof![0u64..=3, 0u64..=(1 << 60)],
        now in prop_oneof![Just(T0), 0u64..=u64::MAX / 2, (u64::MAX - (1 << 50))..=u64::MAX],
        tat in prop_oneof![Just(None), any::<u64>().prop_map(Some), (0u64..=(1 << 45)).prop_map(Some)],
        tat_from_now: bool,
    ) {
        let rate = Rate::new(amount, per_ms);
        // A TAT given as an offset from `now` (the common case: a little ahead) or absolute.
        let state = tat.map(|t| gcra::State {
            tat: if tat_from_now { now.saturating_add(t) } else { t },
        });
        let fast = gcra::decide(state.as_ref(), rate, burst, now, cost);
        let wide = gcra::decide_wide(state.as_ref(), rate, burst, now, cost);
        prop_assert_eq!(fast, wide);
    }

    /// The token bucket equals its literal form on every step of random sequences, with
    /// rates in and out of lowest terms and of one unit per period.
    #[test]
    fn token_bucket_equals_its_literal_form(
        capacity in prop_oneof![1u64..=8, 1u64..=1_000_000_000],
        amount in prop_oneof![Just(1u64), 1u64..=7, 1u64..=100_000],
        per_ms in prop::sample::select(vec![1u64, 100, 1000, 3000, 60_000, 3_600_000]),
        steps in prop::collection::vec((0u64..3_000_000, 0u64..=10), 1..60),
    ) {
        let rate = Rate::new(amount, per_ms);
        let algorithm = Algorithm::TokenBucket { capacity, rate };
        prop_assume!(algorithm.validate().is_ok());
        let mut state = None;
        let mut now = T0;
        for (gap, cost) in steps {
            now += gap;
            let got = algorithm::token_bucket::decide(state.as_ref(), capacity, rate, now, cost);
            let want = token_bucket_literal(state.as_ref(), capacity, rate, now, cost);
            prop_assert_eq!(&got, &want);
            if let Update::Put { state: s, expires_at } = got.update {
                prop_assert_eq!(
                    algorithm::rest_time(&algorithm, &State::TokenBucket(s)),
                    Some(expires_at)
                );
                state = Some(s);
            }
        }
    }
}
