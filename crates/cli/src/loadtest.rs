//! `sluice loadtest`: a constant-arrival-rate HTTP driver (the guide's k6 scenario without k6).
//!
//! Request *i* starts at `t0 + i/rate` whether or not earlier ones have answered (an open
//! model, so a slow server cannot slow the arrivals down). The run is bounded in count
//! (`--max-requests`) and in time (the duration plus one request timeout). When the policy is
//! known — `--expect token-bucket:capacity=10,rate=5/s`, or read from the server's
//! `RateLimit-Policy` — the admitted count the arithmetic predicts is printed next to the
//! measured one. The prediction runs sluice's own algorithm over the ideal arrival times.

use std::collections::BTreeMap;
use std::io::{IsTerminal, Write};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use clap::Args;
use http_body_util::{BodyExt, Empty};
use serde::Serialize;
use sluice_core::algorithm::{Update, decide};
use sluice_core::policy::parse_duration_ms;
use sluice_core::{Algorithm, Clock, Rate, SystemClock};
use tokio::time::Instant;

use crate::policy_args::parse_spec;

/// Arguments of `sluice loadtest`.
#[derive(Debug, Clone, Args)]
pub struct LoadtestArgs {
    /// The URL to request (http://, loopback or your own servers).
    pub url: String,
    /// Arrival rate, e.g. 20/s.
    #[arg(long, default_value = "20/s")]
    pub rate: String,
    /// How long to send, e.g. 30s.
    #[arg(long, default_value = "30s")]
    pub duration: String,
    /// Extra request header, `name: value` (repeatable).
    #[arg(short = 'H', long = "header")]
    pub headers: Vec<String>,
    /// The policy to predict with, e.g. token-bucket:capacity=10,rate=5/s. Default: read the
    /// first RateLimit-Policy the server sends (taken as a token bucket of q per w seconds).
    #[arg(long)]
    pub expect: Option<String>,
    /// Upper bound on requests sent.
    #[arg(long, default_value_t = 100_000)]
    pub max_requests: u64,
    /// Per-request timeout.
    #[arg(long, default_value = "10s")]
    pub timeout: String,
    /// Machine-readable output.
    #[arg(long)]
    pub json: bool,
    /// Write an SVG plot of admitted and limited requests per second, with the expected line.
    #[arg(long)]
    pub plot: Option<std::path::PathBuf>,
}

/// Latency percentiles in ms.
#[derive(Debug, Clone, Serialize)]
pub struct Latency {
    pub p50: f64,
    pub p90: f64,
    pub p99: f64,
    pub max: f64,
}

/// The result of a load test.
#[derive(Debug, Clone, Serialize)]
pub struct LoadReport {
    pub url: String,
    pub requests: u64,
    pub rate_per_s: f64,
    pub duration_s: f64,
    pub elapsed_s: f64,
    pub statuses: BTreeMap<String, u64>,
    pub errors: u64,
    /// 2xx responses.
    pub admitted: u64,
    /// 429 responses.
    pub limited: u64,
    /// What the policy's arithmetic predicts for these arrival times, when the policy is known.
    pub predicted_admitted: Option<u64>,
    /// The policy used for the prediction.
    pub policy: Option<String>,
    pub latency_ms: Latency,
    /// Per second of the run: (admitted, limited, predicted admitted).
    #[serde(skip)]
    pub per_second: Vec<(u64, u64, u64)>,
}

struct Sample {
    offset_us: u64,
    status: Option<u16>,
    latency_us: u64,
}

/// Parses `--header 'name: value'`.
fn parse_header(h: &str) -> Result<(http::HeaderName, http::HeaderValue), String> {
    let (n, v) = h
        .split_once(':')
        .ok_or_else(|| format!("header {h:?} must look like 'name: value'"))?;
    let name = http::HeaderName::from_bytes(n.trim().as_bytes())
        .map_err(|e| format!("header name {n:?}: {e}"))?;
    let value =
        http::HeaderValue::from_str(v.trim()).map_err(|e| format!("header value {v:?}: {e}"))?;
    Ok((name, value))
}

/// Reads a `RateLimit-Policy` item (`"burst";q=10;w=2`) as a token bucket of q per w seconds.
pub fn policy_from_header(value: &str) -> Option<Algorithm> {
    let first = value.split(',').next()?;
    let (mut q, mut w) = (None, None);
    for param in first.split(';').skip(1) {
        let (k, v) = param.trim().split_once('=')?;
        match k {
            "q" => q = v.parse::<u64>().ok(),
            "w" => w = v.parse::<u64>().ok(),
            _ => {}
        }
    }
    let (q, w) = (q?, w?);
    (q > 0 && w > 0).then(|| Algorithm::TokenBucket {
        capacity: q,
        rate: Rate::new(q, w * 1000),
    })
}

/// Runs `algorithm` over ideal arrivals at `rate` for `n` requests starting at `t0_us`:
/// the admitted count per second of the run.
pub fn predict(algorithm: &Algorithm, rate: Rate, n: u64, t0_us: u64) -> Vec<u64> {
    let mut state = None;
    let mut per_second = Vec::new();
    for i in 0..n {
        let offset_us = (i as u128 * rate.per_ms as u128 * 1000 / rate.amount as u128) as u64;
        let o = decide(algorithm, state.as_ref(), t0_us + offset_us, 1, None);
        let sec = (offset_us / 1_000_000) as usize;
        if per_second.len() <= sec {
            per_second.resize(sec + 1, 0);
        }
        if o.decision.allowed {
            per_second[sec] += 1;
        }
        match o.update {
            Update::Put { state: s, .. } => state = Some(s),
            Update::Delete => state = None,
            Update::Keep => {}
        }
    }
    per_second
}

fn percentile(sorted: &[u64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let idx = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[idx.min(sorted.len() - 1)] as f64 / 1000.0
}

/// Runs the load test.
pub async fn run(args: &LoadtestArgs) -> Result<LoadReport, String> {
    let rate: Rate = args
        .rate
        .parse()
        .map_err(|e: sluice_core::PolicyError| e.to_string())?;
    let duration_ms = parse_duration_ms(&args.duration).map_err(|e| e.to_string())?;
    let timeout =
        Duration::from_millis(parse_duration_ms(&args.timeout).map_err(|e| e.to_string())?);
    let uri: http::Uri = args
        .url
        .parse()
        .map_err(|e| format!("bad URL {:?}: {e}", args.url))?;
    if uri.scheme_str() != Some("http") {
        return Err("only http:// URLs are supported".into());
    }
    let headers = args
        .headers
        .iter()
        .map(|h| parse_header(h))
        .collect::<Result<Vec<_>, _>>()?;
    let expected = args.expect.as_deref().map(parse_spec).transpose()?;
    let n = ((duration_ms as u128 * rate.amount as u128) / rate.per_ms as u128) as u64;
    let n = n.min(args.max_requests);

    let client: hyper_util::client::legacy::Client<_, Empty<Bytes>> =
        hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
            .pool_max_idle_per_host(256)
            .build_http();
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<(Sample, Option<String>)>();
    let t0 = Instant::now();
    let t0_us = SystemClock.now();
    let interval_ns = rate.per_ms as u128 * 1_000_000 / rate.amount as u128;
    let headers = Arc::new(headers);
    let progress = std::io::stderr().is_terminal() && !args.json;

    let sender = {
        let (client, uri, headers, tx) = (client.clone(), uri.clone(), headers.clone(), tx.clone());
        tokio::spawn(async move {
            for i in 0..n {
                let at = t0 + Duration::from_nanos((i as u128 * interval_ns) as u64);
                tokio::time::sleep_until(at).await;
                let (client, uri, headers, tx) =
                    (client.clone(), uri.clone(), headers.clone(), tx.clone());
                tokio::spawn(async move {
                    let mut req = http::Request::get(uri);
                    for (k, v) in headers.iter() {
                        req = req.header(k, v);
                    }
                    let Ok(req) = req.body(Empty::<Bytes>::new()) else {
                        return;
                    };
                    let started = Instant::now();
                    let offset_us = started.duration_since(t0).as_micros() as u64;
                    let res = tokio::time::timeout(timeout, async {
                        let resp = client.request(req).await.ok()?;
                        let policy = resp
                            .headers()
                            .get("ratelimit-policy")
                            .and_then(|v| v.to_str().ok())
                            .map(str::to_string);
                        let status = resp.status().as_u16();
                        let _ = resp.into_body().collect().await;
                        Some((status, policy))
                    })
                    .await
                    .ok()
                    .flatten();
                    let latency_us = started.elapsed().as_micros() as u64;
                    let (status, policy) = match res {
                        Some((s, p)) => (Some(s), p),
                        None => (None, None),
                    };
                    let _ = tx.send((
                        Sample {
                            offset_us,
                            status,
                            latency_us,
                        },
                        policy,
                    ));
                });
            }
        })
    };
    drop(tx);

    let deadline = t0 + Duration::from_millis(duration_ms) + timeout + Duration::from_secs(1);
    let mut samples = Vec::with_capacity(n as usize);
    let mut seen_policy = None;
    let mut last_draw = Instant::now();
    loop {
        let next = tokio::time::timeout_at(deadline, rx.recv()).await;
        match next {
            Ok(Some((s, p))) => {
                if seen_policy.is_none() {
                    seen_policy = p;
                }
                samples.push(s);
                if progress && last_draw.elapsed() >= Duration::from_millis(200) {
                    last_draw = Instant::now();
                    draw_progress(samples.len() as u64, n);
                }
            }
            Ok(None) => break,
            Err(_) => break, // deadline: whatever has not answered counts as an error
        }
    }
    sender.abort();
    if progress {
        draw_progress(samples.len() as u64, n);
        eprintln!();
    }
    let elapsed_s = t0.elapsed().as_secs_f64();

    let mut statuses = BTreeMap::new();
    let (mut admitted, mut limited) = (0, 0);
    let secs = (duration_ms as usize).div_ceil(1000).max(1);
    let mut per_second = vec![(0u64, 0u64, 0u64); secs];
    let mut lat: Vec<u64> = Vec::with_capacity(samples.len());
    for s in &samples {
        let sec = ((s.offset_us / 1_000_000) as usize).min(secs - 1);
        if let Some(code) = s.status {
            *statuses.entry(code.to_string()).or_insert(0) += 1;
            if (200..300).contains(&code) {
                admitted += 1;
                per_second[sec].0 += 1;
            } else if code == 429 {
                limited += 1;
                per_second[sec].1 += 1;
            }
            lat.push(s.latency_us);
        }
    }
    let errors = n - (samples.iter().filter(|s| s.status.is_some()).count() as u64);
    lat.sort_unstable();

    let algorithm = expected.or_else(|| seen_policy.as_deref().and_then(policy_from_header));
    let predicted_admitted = algorithm.as_ref().map(|a| {
        let per = predict(a, rate, n, t0_us);
        for (i, c) in per.iter().enumerate() {
            if i < per_second.len() {
                per_second[i].2 = *c;
            }
        }
        per.iter().sum()
    });
    let report = LoadReport {
        url: args.url.clone(),
        requests: n,
        rate_per_s: rate.amount as f64 * 1000.0 / rate.per_ms as f64,
        duration_s: duration_ms as f64 / 1000.0,
        elapsed_s,
        statuses,
        errors,
        admitted,
        limited,
        predicted_admitted,
        policy: algorithm.as_ref().map(Algorithm::to_string),
        latency_ms: Latency {
            p50: percentile(&lat, 0.50),
            p90: percentile(&lat, 0.90),
            p99: percentile(&lat, 0.99),
            max: percentile(&lat, 1.0),
        },
        per_second,
    };
    if let Some(path) = &args.plot {
        std::fs::write(path, crate::plot::svg(&report))
            .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    }
    Ok(report)
}

fn draw_progress(done: u64, total: u64) {
    let width: usize = 40;
    let filled = if total == 0 {
        width
    } else {
        (done as usize * width / total as usize).min(width)
    };
    let mut err = std::io::stderr();
    let _ = write!(
        err,
        "\r[{}{}] {done}/{total}",
        "#".repeat(filled),
        ".".repeat(width - filled)
    );
    let _ = err.flush();
}

/// The human summary.
pub fn render(r: &LoadReport, out: &mut dyn Write) {
    let _ = writeln!(
        out,
        "sent {} requests to {} at {:.1}/s for {:.1} s (took {:.1} s)",
        r.requests, r.url, r.rate_per_s, r.duration_s, r.elapsed_s
    );
    let st: Vec<String> = r
        .statuses
        .iter()
        .map(|(k, v)| format!("{k}: {v}"))
        .collect();
    let _ = writeln!(
        out,
        "status   {}{}",
        st.join("   "),
        if r.errors > 0 {
            format!("   errors: {}", r.errors)
        } else {
            String::new()
        }
    );
    let l = &r.latency_ms;
    let _ = writeln!(
        out,
        "latency  p50 {:.2} ms   p90 {:.2} ms   p99 {:.2} ms   max {:.2} ms",
        l.p50, l.p90, l.p99, l.max
    );
    match (r.predicted_admitted, &r.policy) {
        (Some(p), Some(desc)) => {
            let _ = writeln!(out, "admitted {}   predicted {}   ({desc})", r.admitted, p);
        }
        _ => {
            let _ = writeln!(
                out,
                "admitted {}   (no policy known: pass --expect to predict)",
                r.admitted
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn guide_prediction_is_159() {
        // 20 req/s for 30 s against a bucket of 10 refilling 5/s: 10 + 5 x 29.95 s = 159.
        let a = Algorithm::TokenBucket {
            capacity: 10,
            rate: Rate::per_second(5),
        };
        let per = predict(&a, Rate::per_second(20), 600, 1_700_000_000_000_000);
        assert_eq!(per.iter().sum::<u64>(), 159);
        assert_eq!(per[0], 14); // the burst of 10 plus 5 refilled in the first second (t = 0.2 .. 0.8 s)
    }

    #[test]
    fn reads_ratelimit_policy() {
        assert_eq!(
            policy_from_header("\"burst\";q=10;w=2"),
            Some(Algorithm::TokenBucket {
                capacity: 10,
                rate: Rate::new(10, 2000)
            })
        );
        assert_eq!(policy_from_header("garbage"), None);
    }
}
