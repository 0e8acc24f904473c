//! The judgement of `sluice verify`, pure: the planned arrivals, sluice's own algorithm run
//! over the real send times, and the verdict from the counts (see the parent module's docs for
//! the rule). Apart from the sending so the arithmetic is tested without a deployment.

use serde::Serialize;
use sluice_core::Algorithm;
use sluice_core::algorithm::{Update, decide};

use crate::loadtest::Latency;

/// The largest opening burst.
const MAX_OPENING: u64 = 500;

/// What one request got.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Answer {
    Admitted,
    Limited,
    /// No decision: a timeout, a refused connection, another status.
    Failed,
}

/// One request of the run.
#[derive(Debug, Clone)]
pub struct Sample {
    /// Which target (index into the report's targets).
    pub target: usize,
    /// When it was sent, µs after the start.
    pub offset_us: u64,
    pub latency_us: u64,
    pub answer: Answer,
}

/// The counts of one target.
#[derive(Debug, Clone, Serialize)]
pub struct TargetReport {
    pub target: String,
    pub sent: u64,
    pub admitted: u64,
    pub limited: u64,
    pub failed: u64,
    /// What the policy would have admitted had this target been alone.
    pub expected_alone: u64,
}

/// The judgement.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Verdict {
    Pass,
    OverAdmits,
    UnderAdmits,
    /// Some requests got no decision and the admitted count is within the ceiling.
    Inconclusive,
}

impl Verdict {
    /// The exit code: 0 pass, 1 over-admits, 2 inconclusive (like any error), 3 under-admits.
    pub fn exit_code(self) -> u8 {
        match self {
            Verdict::Pass => 0,
            Verdict::OverAdmits => 1,
            Verdict::Inconclusive => 2,
            Verdict::UnderAdmits => 3,
        }
    }
}

/// The result of `sluice verify`.
#[derive(Debug, Clone, Serialize)]
pub struct VerifyReport {
    pub policy: String,
    pub targets: Vec<TargetReport>,
    pub requests: u64,
    pub admitted: u64,
    pub limited: u64,
    pub failed: u64,
    /// The algorithm over the real send times, one shared state.
    pub expected: u64,
    /// 1 + what the policy refills during the slowest answer.
    pub slack: u64,
    pub allow_over: u64,
    pub allow_under: u64,
    /// The most the deployment may admit: expected + slack + allow_over.
    pub ceiling: u64,
    /// The fewest: expected - slack - allow_under.
    pub floor: u64,
    /// What targets sharing nothing would admit together (the sum of `expected_alone`).
    pub expected_if_unshared: u64,
    pub verdict: Verdict,
    pub elapsed_s: f64,
    pub latency_ms: Latency,
    /// Per second: (admitted, limited, expected).
    #[serde(skip)]
    pub per_second: Vec<(u64, u64, u64)>,
    #[serde(skip)]
    pub steady_rate_per_s: f64,
}

/// The steady rate of `algorithm` in units per ms: its quota per window.
pub(super) fn rate_per_ms(algorithm: &Algorithm) -> f64 {
    let window = algorithm.window_ms().max(1) as f64;
    algorithm.quota() as f64 / window
}

/// The planned send offsets (µs): an opening burst of twice the quota at 0, then steady
/// arrivals at `overload` times the policy's rate (4/s to 1000/s) for `duration_ms`; at most
/// `max` in all.
pub fn plan(algorithm: &Algorithm, overload: f64, duration_ms: u64, max: u64) -> Vec<u64> {
    let opening = (algorithm.quota().saturating_mul(2)).clamp(2, MAX_OPENING);
    let per_s = (rate_per_ms(algorithm) * 1000.0 * overload).clamp(4.0, 1000.0);
    let interval_us = (1_000_000.0 / per_s) as u64;
    let mut offsets: Vec<u64> = vec![0; opening as usize];
    let mut t = interval_us;
    while t <= duration_ms * 1000 {
        offsets.push(t);
        t += interval_us;
    }
    offsets.truncate(max as usize);
    offsets
}

/// Runs `algorithm` over one key for arrivals at `times` (µs since the epoch, ascending):
/// which are admitted.
pub fn simulate(algorithm: &Algorithm, times: &[u64]) -> Vec<bool> {
    let mut state = None;
    let mut out = Vec::with_capacity(times.len());
    for &now in times {
        let o = decide(algorithm, state.as_ref(), now, 1, None);
        out.push(o.decision.allowed);
        match o.update {
            Update::Put { state: s, .. } => state = Some(s),
            Update::Delete => state = None,
            Update::Keep => {}
        }
    }
    out
}

/// Compares `samples` (one run started at `t0_us`, µs since the epoch) with `algorithm`.
pub fn judge(
    algorithm: &Algorithm,
    targets: &[String],
    samples: &[Sample],
    t0_us: u64,
    allow_over: u64,
    allow_under: u64,
) -> VerifyReport {
    let mut sorted: Vec<&Sample> = samples.iter().collect();
    sorted.sort_by_key(|s| s.offset_us);
    let times: Vec<u64> = sorted.iter().map(|s| t0_us + s.offset_us).collect();
    let allowed = simulate(algorithm, &times);
    let expected = allowed.iter().filter(|a| **a).count() as u64;

    let secs = sorted
        .last()
        .map_or(1, |s| (s.offset_us / 1_000_000) as usize + 1);
    let mut per_second = vec![(0u64, 0u64, 0u64); secs];
    for (s, a) in sorted.iter().zip(&allowed) {
        let sec = (s.offset_us / 1_000_000) as usize;
        match s.answer {
            Answer::Admitted => per_second[sec].0 += 1,
            Answer::Limited => per_second[sec].1 += 1,
            Answer::Failed => {}
        }
        if *a {
            per_second[sec].2 += 1;
        }
    }

    let mut target_reports = Vec::with_capacity(targets.len());
    for (i, name) in targets.iter().enumerate() {
        let mine: Vec<&&Sample> = sorted.iter().filter(|s| s.target == i).collect();
        let times: Vec<u64> = mine.iter().map(|s| t0_us + s.offset_us).collect();
        let count = |a: Answer| mine.iter().filter(|s| s.answer == a).count() as u64;
        target_reports.push(TargetReport {
            target: name.clone(),
            sent: mine.len() as u64,
            admitted: count(Answer::Admitted),
            limited: count(Answer::Limited),
            failed: count(Answer::Failed),
            expected_alone: simulate(algorithm, &times).iter().filter(|a| **a).count() as u64,
        });
    }
    let count = |a: Answer| samples.iter().filter(|s| s.answer == a).count() as u64;
    let (admitted, limited, failed) = (
        count(Answer::Admitted),
        count(Answer::Limited),
        count(Answer::Failed),
    );
    let mut lat: Vec<u64> = samples
        .iter()
        .filter(|s| s.answer != Answer::Failed)
        .map(|s| s.latency_us)
        .collect();
    lat.sort_unstable();
    let slowest_ms = lat.last().copied().unwrap_or(0) as f64 / 1000.0;
    let slack = 1 + (rate_per_ms(algorithm) * slowest_ms).ceil() as u64;
    let ceiling = expected + slack + allow_over;
    let floor = expected.saturating_sub(slack + allow_under);
    let verdict = if admitted > ceiling {
        Verdict::OverAdmits
    } else if failed > 0 {
        Verdict::Inconclusive
    } else if admitted < floor {
        Verdict::UnderAdmits
    } else {
        Verdict::Pass
    };
    let pct = |p: f64| {
        if lat.is_empty() {
            0.0
        } else {
            lat[(((lat.len() - 1) as f64) * p).round() as usize] as f64 / 1000.0
        }
    };
    VerifyReport {
        policy: algorithm.to_string(),
        expected_if_unshared: target_reports.iter().map(|t| t.expected_alone).sum(),
        targets: target_reports,
        requests: samples.len() as u64,
        admitted,
        limited,
        failed,
        expected,
        slack,
        allow_over,
        allow_under,
        ceiling,
        floor,
        verdict,
        elapsed_s: 0.0,
        latency_ms: Latency {
            p50: pct(0.5),
            p90: pct(0.9),
            p99: pct(0.99),
            max: pct(1.0),
        },
        per_second,
        steady_rate_per_s: 0.0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_core::Rate;

    fn bucket() -> Algorithm {
        Algorithm::TokenBucket {
            capacity: 10,
            rate: Rate::per_second(5),
        }
    }

    #[test]
    fn plan_is_a_burst_then_steady_arrivals_within_the_caps() {
        let p = plan(&bucket(), 3.0, 2_000, 1_000);
        // 20 at once, then 15/s for 2 s.
        assert_eq!(p.iter().filter(|&&o| o == 0).count(), 20);
        assert_eq!(p.len(), 20 + 30);
        assert!(p.windows(2).all(|w| w[0] <= w[1]));
        assert_eq!(plan(&bucket(), 3.0, 60_000, 100).len(), 100);
    }

    fn samples(offsets: &[u64], targets: usize, answer: impl Fn(usize) -> Answer) -> Vec<Sample> {
        offsets
            .iter()
            .enumerate()
            .map(|(i, &o)| Sample {
                target: i % targets,
                offset_us: o,
                latency_us: 1_000,
                answer: answer(i),
            })
            .collect()
    }

    #[test]
    fn judges_a_shared_limiter_as_pass_and_two_separate_ones_as_over() {
        let alg = bucket();
        let offsets = plan(&alg, 3.0, 4_000, 1_000);
        let t0 = 1_700_000_000_000_000;
        let times: Vec<u64> = offsets.iter().map(|o| t0 + o).collect();
        let shared = simulate(&alg, &times);
        let names = vec!["a".to_string(), "b".to_string()];
        let ok = samples(&offsets, 2, |i| {
            if shared[i] {
                Answer::Admitted
            } else {
                Answer::Limited
            }
        });
        let r = judge(&alg, &names, &ok, t0, 0, 0);
        assert_eq!(r.verdict, Verdict::Pass);
        assert_eq!(r.admitted, r.expected);
        // Each target alone: its own bucket.
        let mine = |k: usize| -> Vec<bool> {
            let t: Vec<u64> = times.iter().skip(k).step_by(2).copied().collect();
            simulate(&alg, &t)
        };
        let (a, b) = (mine(0), mine(1));
        let split = samples(&offsets, 2, |i| {
            let got = if i % 2 == 0 { a[i / 2] } else { b[i / 2] };
            if got {
                Answer::Admitted
            } else {
                Answer::Limited
            }
        });
        let r = judge(&alg, &names, &split, t0, 0, 0);
        assert_eq!(r.verdict, Verdict::OverAdmits);
        assert_eq!(r.admitted, r.expected_if_unshared);
        assert!(r.admitted as f64 > 1.7 * r.expected as f64, "{r:?}");
        // The mode's allowance widens the ceiling.
        let r = judge(&alg, &names, &split, t0, r.admitted, 0);
        assert_eq!(r.verdict, Verdict::Pass);
        // Everything denied is an under-admit; a missing decision is inconclusive.
        let none = samples(&offsets, 1, |_| Answer::Limited);
        assert_eq!(
            judge(&alg, &names[..1], &none, t0, 0, 0).verdict,
            Verdict::UnderAdmits
        );
        let failed = samples(&offsets, 1, |_| Answer::Failed);
        assert_eq!(
            judge(&alg, &names[..1], &failed, t0, 0, 0).verdict,
            Verdict::Inconclusive
        );
    }
}
