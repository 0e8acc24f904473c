//! `sluice-bench rls`: a bounded gRPC load driver for Envoy's `ShouldRateLimit` against
//! `sluice serve`'s gRPC listener: CONC loops on one HTTP/2 channel, each sending one request
//! with one descriptor `KEY=<random value out of KEYSPACE>` for WARMUP + DURATION seconds.

use std::time::{Duration, Instant};

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use serde_json::json;

use crate::Rng;
use crate::stats::{Samples, process_cpu, round1};

/// Where the calls go: the gRPC listener, the Envoy domain and the descriptor key (`rls` and
/// `rls-burst` take the same flags).
#[derive(Debug, Clone, clap::Args)]
pub struct Target {
    /// `http://127.0.0.1:PORT` of the gRPC listener.
    #[arg(long, default_value = "http://127.0.0.1:8081")]
    pub target: String,
    /// The Envoy domain.
    #[arg(long, default_value = "bench")]
    pub domain: String,
    /// The descriptor key.
    #[arg(long, default_value = "user")]
    pub key: String,
}

/// A current-thread runtime and a client connected to `to.target` (loopback only), for one run.
fn connect_on_loopback(
    to: &Target,
) -> Result<
    (
        tokio::runtime::Runtime,
        RateLimitServiceClient<tonic::transport::Channel>,
    ),
    String,
> {
    crate::require_loopback(&to.target)?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    let client = rt
        .block_on(RateLimitServiceClient::connect(to.target.clone()))
        .map_err(|e| e.to_string())?;
    Ok((rt, client))
}

/// What to run.
#[derive(Debug, Clone)]
pub struct RlsConfig {
    /// Where the calls go.
    pub to: Target,
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
    let (rt, client) = connect_on_loopback(&cfg.to)?;
    rt.block_on(async move {
        let cpu0 = process_cpu();
        let start = Instant::now();
        let warm_end = start + Duration::from_secs_f64(cfg.warmup);
        let deadline = warm_end + Duration::from_secs_f64(cfg.duration);
        let mut tasks = Vec::new();
        for w in 0..cfg.conc {
            let mut client = client.clone();
            let (domain, key, keyspace) = (cfg.to.domain.clone(), cfg.to.key.clone(), cfg.keyspace);
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

/// What `sluice-bench rls-burst` checks.
#[derive(Debug, Clone)]
pub struct BurstConfig {
    /// Where the calls go.
    pub to: Target,
    /// The descriptor value every burst uses (the sustained part uses `<value>-sustained`).
    pub value: String,
    /// Bursts, two wall-clock seconds apart.
    pub bursts: usize,
    /// Calls sent at once in each burst, and in flight during the sustained part.
    pub calls: usize,
    /// Seconds of the sustained part.
    pub sustained: f64,
}

fn one(domain: &str, key: &str, value: &str) -> RateLimitRequest {
    RateLimitRequest {
        domain: domain.to_string(),
        descriptors: vec![RateLimitDescriptor {
            entries: vec![Entry {
                key: key.to_string(),
                value: value.to_string(),
            }],
            ..Default::default()
        }],
        hits_addend: 1,
    }
}

fn unix_s() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// The correctness check of an Envoy rate limit service on one descriptor value with a fixed
/// window of a second: `bursts` times, `calls` calls sent at once at x.300 s, two wall-clock
/// seconds apart (so a window holds exactly one burst, and OK per burst must equal the limit); then `calls` loops on another value for `sustained` seconds, OK counted per
/// wall-clock second. Returns one JSON line.
pub fn burst(cfg: BurstConfig) -> Result<serde_json::Value, String> {
    let (rt, mut client) = connect_on_loopback(&cfg.to)?;
    rt.block_on(async move {
        // A call on another value first, so the bursts do not wait on connection setup.
        client
            .should_rate_limit(one(&cfg.to.domain, &cfg.to.key, &format!("{}-warm", cfg.value)))
            .await
            .map_err(|e| e.to_string())?;
        let is_ok = |r: &Result<tonic::Response<RateLimitResponse>, tonic::Status>| {
            matches!(r, Ok(resp) if resp.get_ref().overall_code == Code::Ok as i32)
        };
        let (mut bursts_ok, mut burst_errors, mut spread_ms) = (Vec::new(), 0usize, Vec::new());
        let mut last_second = unix_s().floor();
        for _ in 0..cfg.bursts {
            // x.300 of the second after next of the last burst's: a window that starts at its
            // first call (limitador's) then holds one burst too, not only an epoch-aligned one.
            let now = unix_s();
            let target = (now.floor() + 1.0).max(last_second + 2.0) + 0.3;
            tokio::time::sleep(Duration::from_secs_f64((target - now).max(0.0))).await;
            last_second = unix_s().floor();
            let t0 = Instant::now();
            let calls: Vec<_> = (0..cfg.calls)
                .map(|_| {
                    let mut c = client.clone();
                    let req = one(&cfg.to.domain, &cfg.to.key, &cfg.value);
                    tokio::spawn(async move { c.should_rate_limit(req).await })
                })
                .collect();
            let mut ok = 0u64;
            for c in calls {
                let r = c.await.map_err(|e| e.to_string())?;
                if r.is_err() {
                    burst_errors += 1;
                }
                ok += u64::from(is_ok(&r));
            }
            spread_ms.push(round1(t0.elapsed().as_secs_f64() * 1000.0));
            bursts_ok.push(ok);
        }
        let sustained_value = format!("{}-sustained", cfg.value);
        let end = Instant::now() + Duration::from_secs_f64(cfg.sustained);
        let loops: Vec<_> = (0..cfg.calls)
            .map(|_| {
                let mut c = client.clone();
                let req = one(&cfg.to.domain, &cfg.to.key, &sustained_value);
                tokio::spawn(async move {
                    let mut ok_at = Vec::new();
                    let mut calls = 0u64;
                    while Instant::now() < end {
                        let r = c.should_rate_limit(req.clone()).await;
                        calls += 1;
                        if is_ok(&r) {
                            ok_at.push(unix_s().floor() as u64);
                        }
                    }
                    (calls, ok_at)
                })
            })
            .collect();
        let mut per_second = std::collections::BTreeMap::<u64, u64>::new();
        let mut sustained_calls = 0;
        for l in loops {
            let (calls, ok_at) = l.await.map_err(|e| e.to_string())?;
            sustained_calls += calls;
            for s in ok_at {
                *per_second.entry(s).or_default() += 1;
            }
        }
        Ok(json!({
            "bursts_ok": bursts_ok,
            "burst_errors": burst_errors,
            "burst_spread_ms": spread_ms,
            "sustained_calls": sustained_calls,
            "sustained_ok_per_wall_second": per_second.values().collect::<Vec<_>>(),
            "sustained_ok_total": per_second.values().sum::<u64>(),
        }))
    })
}
