//! `sluice-bench redis`: the anchors harness's `EXTRA_CLIENTS` contract for sluice.
//!
//! CONC concurrent loops on one tokio thread (like the Node anchors, one event loop; Redis gets
//! the other core), each picking a random identity `user:<n>` out of KEYSPACE and making one
//! decision through [`sluice::Limiter`] (the path applications take: key building, timeout,
//! breaker, the deny cache), timing it, for WARMUP + DURATION seconds. Only decisions started
//! after the warm-up are counted. All in-flight calls share one multiplexed connection, so
//! concurrent decisions are pipelined on it automatically. Prints one JSON line.

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::json;
use sluice::{DenyCacheMode, Identity, Limiter, Policy, StoreOptions, StoreUrl, Verdict};

use crate::stats::{Samples, process_cpu, round1};
use crate::{Rng, bench_algorithm, require_loopback};

/// What to run.
#[derive(Debug, Clone)]
pub struct LoadConfig {
    /// Store URL (loopback only), `memory` allowed.
    pub url: String,
    /// Measured seconds.
    pub duration: f64,
    /// Warm-up seconds (run, not counted).
    pub warmup: f64,
    /// Decisions in flight.
    pub conc: usize,
    /// Identities to pick from.
    pub keyspace: u64,
    /// Algorithm CLI name.
    pub algorithm: String,
    /// Deny cache mode.
    pub deny_cache: DenyCacheMode,
    /// Worker threads of the runtime (1: a current-thread runtime).
    pub threads: usize,
    /// Per-call timeout.
    pub timeout: Duration,
    /// Stop after this many counted decisions (a bound for very fast stores).
    pub max_decisions: u64,
}

#[derive(Debug, Default)]
struct Tally {
    lat: Samples,
    allowed: u64,
    denied: u64,
    errors: u64,
    total: u64,
    first_error: Option<String>,
}

/// Runs the load and returns the JSON summary.
pub fn run(cfg: LoadConfig) -> Result<serde_json::Value, String> {
    if cfg.url != "memory" {
        require_loopback(&cfg.url)?;
    }
    let rt = if cfg.threads <= 1 {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
    } else {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(cfg.threads)
            .enable_all()
            .build()
    }
    .map_err(|e| e.to_string())?;
    rt.block_on(run_async(cfg))
}

async fn run_async(cfg: LoadConfig) -> Result<serde_json::Value, String> {
    let (algorithm, short) = bench_algorithm(&cfg.algorithm)?;
    let policy = Arc::new(Policy::new(short, algorithm).map_err(|e| e.to_string())?);
    let url: StoreUrl = cfg
        .url
        .parse()
        .map_err(|e: sluice::StoreError| e.to_string())?;
    let options = StoreOptions {
        timeout: cfg.timeout,
        ..Default::default()
    };
    let store = url.connect(&options).await.map_err(|e| e.to_string())?;
    let limiter = Limiter::builder(store)
        .timeout(cfg.timeout)
        .deny_cache(cfg.deny_cache)
        .build();

    let cpu0 = process_cpu();
    let start = Instant::now();
    let warm_end = start + Duration::from_secs_f64(cfg.warmup);
    let deadline = warm_end + Duration::from_secs_f64(cfg.duration);
    let cap = (cfg.max_decisions / cfg.conc.max(1) as u64).max(1);
    let mut tasks = Vec::with_capacity(cfg.conc);
    for w in 0..cfg.conc {
        let (limiter, policy) = (limiter.clone(), Arc::clone(&policy));
        let keyspace = cfg.keyspace;
        tasks.push(tokio::spawn(async move {
            let mut rng = Rng::new(w as u64 + 1);
            let mut t = Tally::default();
            let mut counted = 0u64;
            loop {
                let t0 = Instant::now();
                if t0 >= deadline || counted >= cap {
                    return t;
                }
                let id = Identity::new(format!("user:{}", rng.below(keyspace)));
                let checked = limiter.check(&id, &policy, 1).await;
                for lease in &checked.leases {
                    let _ = limiter.release(lease).await;
                }
                let t1 = Instant::now();
                t.total += 1;
                let error = match &checked.verdict {
                    Verdict::Decided => None,
                    Verdict::FailedOpen(e) | Verdict::FailedClosed(e) => Some(e.to_string()),
                };
                if t0 < warm_end {
                    continue;
                }
                counted += 1;
                match error {
                    Some(e) => {
                        t.errors += 1;
                        t.first_error.get_or_insert(e);
                    }
                    None => {
                        t.lat.push(t1 - t0);
                        if checked.allowed {
                            t.allowed += 1
                        } else {
                            t.denied += 1
                        }
                    }
                }
            }
        }));
    }
    let mut all = Tally::default();
    for task in tasks {
        let t = task.await.map_err(|e| e.to_string())?;
        all.lat.extend(t.lat);
        all.allowed += t.allowed;
        all.denied += t.denied;
        all.errors += t.errors;
        all.total += t.total;
        if all.first_error.is_none() {
            all.first_error = t.first_error;
        }
    }
    let end = Instant::now();
    let cpu = process_cpu().zip(cpu0).map(|(b, a)| (b - a).as_secs_f64());
    let elapsed = (end - warm_end).as_secs_f64();
    all.lat.sort();
    let decisions = all.allowed + all.denied;
    Ok(json!({
        "name": format!("sluice {} ({})", cfg.algorithm, limiter.store().kind()),
        "decisions": decisions,
        "elapsed_s": round1(elapsed * 100.0) / 100.0,
        "decisions_per_s": round1(decisions as f64 / elapsed),
        "allowed": all.allowed,
        "denied": all.denied,
        "errors": all.errors,
        "p50_us": all.lat.pct_us(50.0),
        "p90_us": all.lat.pct_us(90.0),
        "p99_us": all.lat.pct_us(99.0),
        "p999_us": all.lat.pct_us(99.9),
        "max_us": all.lat.0.last().map(|&n| n as f64 / 1000.0),
        "decisions_incl_warmup": all.total,
        "client_cpu_s": cpu,
        "client_cpu_s_per_s": cpu.map(|c| round1(c / (end - start).as_secs_f64() * 100.0) / 100.0),
        "conc": cfg.conc,
        "keyspace": cfg.keyspace,
        "algorithm": cfg.algorithm,
        "deny_cache": format!("{:?}", cfg.deny_cache),
        "deny_cache_hits": limiter.deny_cache_hits(),
        "first_error": all.first_error,
        "lib": format!("sluice {} (redis-rs, one multiplexed connection)", env!("CARGO_PKG_VERSION")),
    }))
}
