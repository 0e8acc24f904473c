//! What the console, `GET /v1/stats` and `sluice top` show: the server's decisions of the last
//! five minutes per policy, the store's latency and errors, the heaviest identities, and the
//! last reload.
//!
//! It is fed by the limiter's [`DecisionObserver`] hook, so the decision API, the Envoy service
//! and the proxy are all counted at the one place they meet. Recording one decision costs, per
//! policy of the check, a read lock on the policy table and a few atomic additions, and per
//! identity one short lock on one of eight heavy-hitter shards. Everything is fixed in size:
//! [`MAX_POLICIES`] policies, [`ring::SecondRing`]s of 300 s and 60 s, and
//! [`heavy::PER_SHARD`] identities per shard.
//!
//! # Layout
//! - [`heavy`]: the Space-Saving heavy-hitter summary and its error bound;
//! - [`ring`]: lock-free per-second counters and latency buckets;
//! - [`prometheus`]: latency histogram buckets and the rank-labelled heavy-hitter gauges;
//! - this module: the recorder and the JSON report.

pub mod heavy;
pub mod prometheus;
pub mod ring;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::{Mutex, RwLock};
use serde_json::{Value, json};
use sluice::core::Clock;
use sluice::{DecisionEvent, DecisionObserver, Outcome, StoreError};

use heavy::HeavyHitters;
use ring::{LATENCY_BUCKETS, SecondRing, latency_bucket, quantile_ms};

/// Seconds of per-policy counters kept (and charted).
pub const HISTORY_SECS: usize = 300;

/// Seconds the latency quantiles are computed over.
pub const LATENCY_SECS: usize = 60;

/// The most policies tracked one by one; decisions of further policies are not charted (a
/// configuration or Envoy domains with more is unusual, and memory stays bounded).
pub const MAX_POLICIES: usize = 512;

/// The counters of one second of one policy, in this order.
pub const OUTCOMES: [&str; 6] = [
    "decisions",
    "allowed",
    "denied",
    "shadow_denied",
    "failed_open",
    "failed_closed",
];

fn outcome_index(o: Outcome) -> usize {
    match o {
        Outcome::Allowed => 1,
        Outcome::Denied => 2,
        Outcome::ShadowDenied => 3,
        Outcome::FailedOpen => 4,
        Outcome::FailedClosed => 5,
    }
}

struct PolicySeries {
    counts: SecondRing<6>,
    latency: SecondRing<LATENCY_BUCKETS>,
    /// The policy's Prometheus histograms, registered once: recording through a kept handle
    /// skips building the labels and looking them up on every decision.
    decision_histogram: metrics::Histogram,
    store_histogram: metrics::Histogram,
}

impl std::fmt::Debug for PolicySeries {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PolicySeries").finish_non_exhaustive()
    }
}

impl PolicySeries {
    fn new(policy: &str) -> Self {
        PolicySeries {
            counts: SecondRing::new(HISTORY_SECS),
            latency: SecondRing::new(LATENCY_SECS),
            decision_histogram: metrics::histogram!("sluice_decision_duration_seconds", "policy" => policy.to_string()),
            store_histogram: metrics::histogram!("sluice_store_call_duration_seconds", "policy" => policy.to_string()),
        }
    }
}

/// The outcome of the last reload.
#[derive(Debug, Clone)]
struct ReloadRecord {
    at_ms: u64,
    trigger: String,
    ok: bool,
    generation: Option<u64>,
    errors: Vec<String>,
}

/// The live statistics of one server (kept across reloads). See the module docs.
#[derive(Debug)]
pub struct Stats {
    started: Instant,
    policies: RwLock<HashMap<String, Arc<PolicySeries>, foldhash::fast::RandomState>>,
    /// Store calls: latency buckets per second.
    store_latency: SecondRing<LATENCY_BUCKETS>,
    /// Store calls per second: calls, errors.
    store_calls: SecondRing<2>,
    decisions: HeavyHitters,
    denials: HeavyHitters,
    last_reload: Mutex<Option<ReloadRecord>>,
}

impl Default for Stats {
    fn default() -> Self {
        Self::new()
    }
}

/// Whole seconds since `started`: the index of the per-second counters and windows.
fn seconds(started: Instant) -> u64 {
    started.elapsed().as_secs()
}

impl Stats {
    /// Empty statistics.
    pub fn new() -> Self {
        Stats {
            started: Instant::now(),
            policies: RwLock::new(HashMap::default()),
            store_latency: SecondRing::new(LATENCY_SECS),
            store_calls: SecondRing::new(LATENCY_SECS),
            decisions: HeavyHitters::new(),
            denials: HeavyHitters::new(),
            last_reload: Mutex::new(None),
        }
    }

    fn series(&self, policy: &str) -> Option<Arc<PolicySeries>> {
        if let Some(s) = self.policies.read().get(policy) {
            return Some(Arc::clone(s));
        }
        let mut all = self.policies.write();
        if all.len() >= MAX_POLICIES && !all.contains_key(policy) {
            return None;
        }
        Some(Arc::clone(
            all.entry(policy.to_string())
                .or_insert_with(|| Arc::new(PolicySeries::new(policy))),
        ))
    }

    /// Records a reload's outcome (`Ok(generation)` or the errors).
    pub fn reload_done(&self, trigger: &str, result: &Result<u64, Vec<String>>) {
        *self.last_reload.lock() = Some(ReloadRecord {
            at_ms: sluice::core::SystemClock.now() / 1000,
            trigger: trigger.to_string(),
            ok: result.is_ok(),
            generation: result.as_ref().ok().copied(),
            errors: result.as_ref().err().cloned().unwrap_or_default(),
        });
    }

    /// The `n` heaviest identities by decisions and by denials, with the totals they were
    /// drawn from: `(decisions, decisions_total, denials, denials_total)`.
    pub fn top(&self, n: usize) -> (Vec<heavy::Counted>, u64, Vec<heavy::Counted>, u64) {
        let now = seconds(self.started);
        let (d, dt) = self.decisions.top(n, now);
        let (x, xt) = self.denials.top(n, now);
        (d, dt, x, xt)
    }

    /// The report of `GET /v1/stats` (without the parts the running configuration adds):
    /// every policy that decided something, and those of `configured` (at zero if idle).
    pub fn report(&self, top_n: usize, configured: &[&str]) -> Value {
        let now = seconds(self.started);
        let mut names: Vec<(String, Arc<PolicySeries>)> = self
            .policies
            .read()
            .iter()
            .map(|(k, v)| (k.clone(), Arc::clone(v)))
            .collect();
        for name in configured {
            if !names.iter().any(|(n, _)| n == name)
                && let Some(s) = self.series(name)
            {
                names.push((name.to_string(), s));
            }
        }
        names.sort_by(|a, b| a.0.cmp(&b.0));
        let policies: Vec<Value> = names
            .iter()
            .map(|(name, s)| {
                let rows = s.counts.series(now);
                let totals = s.counts.sum(now);
                let mut series = serde_json::Map::new();
                let mut totals_json = serde_json::Map::new();
                for (i, o) in OUTCOMES.iter().enumerate() {
                    series.insert(
                        (*o).to_string(),
                        Value::from(rows.iter().map(|r| r[i]).collect::<Vec<u64>>()),
                    );
                    totals_json.insert((*o).to_string(), Value::from(totals[i]));
                }
                let lat = s.latency.sum(now);
                let last = now.saturating_sub(1);
                json!({
                    "policy": name,
                    "decisions_per_s": s.counts.at(last)[0],
                    "totals": totals_json,
                    "series": series,
                    "latency_ms": {
                        "p50": quantile_ms(&lat, 0.5),
                        "p99": quantile_ms(&lat, 0.99),
                    },
                })
            })
            .collect();
        let lat = self.store_latency.sum(now);
        let [calls, errors] = self.store_calls.sum(now);
        let (top_d, total_d, top_x, total_x) = self.top(top_n);
        let listed = |v: Vec<heavy::Counted>| -> Vec<Value> {
            v.into_iter()
                .map(|c| json!({"identity": c.identity, "count": c.count, "error": c.error}))
                .collect()
        };
        let reload = self.last_reload.lock().clone().map(|r| {
            json!({
                "at_ms": r.at_ms,
                "trigger": r.trigger,
                "ok": r.ok,
                "generation": r.generation,
                "errors": r.errors,
            })
        });
        json!({
            "uptime_s": now,
            "window_s": HISTORY_SECS,
            "policies": policies,
            "store": {
                "window_s": LATENCY_SECS,
                "calls": calls,
                "errors": errors,
                "latency_ms": {
                    "p50": quantile_ms(&lat, 0.5),
                    "p99": quantile_ms(&lat, 0.99),
                },
            },
            "top": {
                "window_s": [heavy::WINDOW_SECS, 2 * heavy::WINDOW_SECS],
                "error_bound": format!(
                    "each count is at most its error above the true count; an error is at most \
                     the window's decisions / {} per shard",
                    heavy::PER_SHARD
                ),
                "decisions": listed(top_d),
                "decisions_total": total_d,
                "denials": listed(top_x),
                "denials_total": total_x,
            },
            "last_reload": reload,
        })
    }
}

impl DecisionObserver for Stats {
    fn decision(&self, event: &DecisionEvent<'_>) {
        let now = seconds(self.started);
        let us = event.elapsed.as_micros() as u64;
        let bucket = latency_bucket(us);
        let mut last_policy: Option<&str> = None;
        for (limit, &(identity, policy, _)) in event.checked.limits.iter().zip(event.items) {
            let outcome = event.outcome(limit);
            // The configured name: an override's policy keeps it too.
            let name = policy.name.as_str();
            let first = last_policy != Some(name);
            match self.series(name) {
                Some(s) => {
                    s.counts.add(now, 0, 1);
                    s.counts.add(now, outcome_index(outcome), 1);
                    if first {
                        s.latency.add(now, bucket, 1);
                        s.decision_histogram.record(event.elapsed.as_secs_f64());
                    }
                }
                None if first => {
                    metrics::histogram!("sluice_decision_duration_seconds", "policy" => name.to_string())
                        .record(event.elapsed.as_secs_f64());
                }
                None => {}
            }
            last_policy = Some(name);
            self.decisions.add(identity.as_str(), now);
            if outcome == Outcome::Denied {
                self.denials.add(identity.as_str(), now);
            }
        }
    }

    fn store_call(&self, policies: &[&str], elapsed: Duration, error: Option<&StoreError>) {
        let now = seconds(self.started);
        self.store_latency
            .add(now, latency_bucket(elapsed.as_micros() as u64), 1);
        self.store_calls.add(now, 0, 1);
        if error.is_some() {
            self.store_calls.add(now, 1, 1);
        }
        for p in policies {
            match self.series(p) {
                Some(s) => s.store_histogram.record(elapsed.as_secs_f64()),
                None => {
                    metrics::histogram!("sluice_store_call_duration_seconds", "policy" => p.to_string())
                        .record(elapsed.as_secs_f64());
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice::{Identity, Limiter, Policy};

    fn policy(name: &str, limit: u64) -> Arc<Policy> {
        Arc::new(
            Policy::new(
                name,
                sluice::Algorithm::FixedWindow {
                    limit,
                    window_ms: 60_000,
                },
            )
            .expect("valid policy"),
        )
    }

    #[tokio::test]
    async fn decisions_are_counted_per_policy_and_identity() {
        let limiter = Limiter::memory();
        let stats = Arc::new(Stats::new());
        assert!(limiter.set_observer(stats.clone()));
        let p = policy("api", 3);
        let heavy = Identity::new("user:heavy");
        let light = Identity::new("user:light");
        for _ in 0..5 {
            limiter.check(&heavy, &p, 1).await;
        }
        limiter.check(&light, &p, 1).await;
        let r = stats.report(5, &["api", "idle"]);
        let api = &r["policies"][0];
        assert_eq!(api["policy"], "api");
        assert_eq!(api["totals"]["decisions"], 6);
        assert_eq!(api["totals"]["allowed"], 4);
        assert_eq!(api["totals"]["denied"], 2);
        assert_eq!(
            api["series"]["decisions"].as_array().unwrap().len(),
            HISTORY_SECS
        );
        assert_eq!(r["policies"][1]["policy"], "idle");
        assert_eq!(r["policies"][1]["totals"]["decisions"], 0);
        assert_eq!(r["top"]["decisions"][0]["identity"], "user:heavy");
        assert_eq!(r["top"]["decisions"][0]["count"], 5);
        assert_eq!(r["top"]["denials"][0]["identity"], "user:heavy");
        assert_eq!(r["top"]["denials"][0]["count"], 2);
        assert_eq!(r["top"]["decisions_total"], 6);
        assert_eq!(r["store"]["calls"], 6);
        assert_eq!(r["store"]["errors"], 0);
        assert!(r["store"]["latency_ms"]["p99"].as_f64().is_some());
    }
}
