//! `sluice-bench rls`: a bounded gRPC load driver for Envoy's `ShouldRateLimit` against
//! `sluice serve`'s gRPC listener: CONC loops on one HTTP/2 channel, each sending one request
//! with one descriptor `KEY=<random value out of KEYSPACE>` for WARMUP + DURATION seconds.

use std::time::{Duration, Instant};

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use serde_json::json;

use crate::Rng;
use crate::stats::{Samples, process_cpu, round1};

/// What to run.
#[derive(Debug, Clone)]
pub struct RlsConfig {
    /// `http://127.0.0.1:PORT` of the gRPC listener.
    pub target: String,
    /// The Envoy domain.
    pub domain: String,
    /// The descriptor key.
    pub key: String,
    /// Measured seconds.
    pub duration: f64,
    /// Warm-up seconds.
    pub warmup: f64,
    /// Calls in flight.
    pub conc: usize,
    /// Distinct descriptor values.
    pub keyspace: u64,
}

/// Runs the load; returns the JSON summary.
pub fn run(cfg: RlsConfig) -> Result<serde_json::Value, String> {
    crate::require_loopback(&cfg.target)?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    rt.block_on(async move {
        let client = RateLimitServiceClient::connect(cfg.target.clone()).await.map_err(|e| e.to_string())?;
        let cpu0 = process_cpu();
        let start = Instant::now();
        let warm_end = start + Duration::from_secs_f64(cfg.warmup);
        let deadline = warm_end + Duration::from_secs_f64(cfg.duration);
        let mut tasks = Vec::new();
        for w in 0..cfg.conc {
            let mut client = client.clone();
            let (domain, key, keyspace) = (cfg.domain.clone(), cfg.key.clone(), cfg.keyspace);
            tasks.push(tokio::spawn(async move {
                let mut rng = Rng::new(w as u64 + 99);
                let (mut lat, mut ok, mut over, mut errors, mut total) = (Samples::default(), 0u64, 0u64, 0u64, 0u64);
                let mut first_error = None;
                loop {
                    let t0 = Instant::now();
                    if t0 >= deadline || errors > 10_000 {
                        return (lat, ok, over, errors, total, first_error);
                    }
                    let req = RateLimitRequest {
                        domain: domain.clone(),
                        descriptors: vec![RateLimitDescriptor {
                            entries: vec![Entry { key: key.clone(), value: format!("v{}", rng.below(keyspace)) }],
                            ..Default::default()
                        }],
                        hits_addend: 1,
                    };
                    let r = client.should_rate_limit(req).await;
                    let t1 = Instant::now();
                    total += 1;
                    if t0 < warm_end {
                        continue;
                    }
                    match r {
                        Ok(resp) => {
                            lat.push(t1 - t0);
                            if resp.get_ref().overall_code == Code::Ok as i32 { ok += 1 } else { over += 1 }
                        }
                        Err(e) => {
                            errors += 1;
                            first_error.get_or_insert_with(|| e.to_string());
                        }
                    }
                }
            }));
        }
        let (mut lat, mut ok, mut over, mut errors, mut total, mut first_error) =
            (Samples::default(), 0, 0, 0, 0, None);
        for t in tasks {
            let (l, o, v, e, n, f) = t.await.map_err(|e| e.to_string())?;
            lat.extend(l);
            (ok, over, errors, total) = (ok + o, over + v, errors + e, total + n);
            first_error = first_error.or(f);
        }
        let end = Instant::now();
        lat.sort();
        let elapsed = (end - warm_end).as_secs_f64();
        let cpu = process_cpu().zip(cpu0).map(|(b, a)| (b - a).as_secs_f64());
        Ok(json!({
            "name": "sluice-bench rls (tonic, one HTTP/2 channel)",
            "calls_per_s": round1((ok + over) as f64 / elapsed),
            "decisions_per_s": round1((ok + over) as f64 / elapsed),
            "decisions": ok + over,
            "allowed": ok,
            "over_limit": over,
            "errors": errors,
            "p50_us": lat.pct_us(50.0),
            "p99_us": lat.pct_us(99.0),
            "decisions_incl_warmup": total,
            "client_cpu_s_per_s": cpu.map(|c| round1(c / (end - start).as_secs_f64() * 100.0) / 100.0),
            "conc": cfg.conc,
            "keyspace": cfg.keyspace,
            "first_error": first_error,
        }))
    })
}
