//! `sluice verify`: does a running deployment admit what its policy says, and no more?
//!
//! `loadtest` measures; `verify` judges. It sends a planned arrival pattern to one or several
//! targets of a deployment (the decision API, a proxy route, the Envoy rate limit service),
//! runs sluice's own algorithm over the same arrival times, and fails when the deployment
//! admitted more than the arithmetic plus the bound its mode is allowed
//! ([guarantees.md](../../../docs/guarantees.md)). The usual causes of an over-admit are the
//! ones a single-instance test never sees: two instances on different stores, instances
//! that build different keys for one client (another `identity_hash_key`, another policy
//! name), or a clock problem.
//!
//! # The plan
//! An opening burst of twice the policy's quota at once, then steady arrivals at `--overload`
//! times the policy's rate (at least 4 per second) for `--duration`, the whole run capped at
//! `--max-requests`. With several targets the arrivals go round-robin, so instances that share
//! nothing each grant the full quota and the total shows it.
//!
//! # The judgement
//! `expected` is the algorithm run over the real send times (the key is fresh: `{run}` in the
//! identity, a header or a descriptor becomes a new value each run). The deployment's decision
//! happens somewhere between send and answer, so `slack` = 1 + what the policy refills during
//! the slowest answer. Exit codes: 0 pass; 1 admitted more than `expected + slack +
//! --allow-over`; 2 an error (bad arguments, or requests that got no decision, so the count
//! cannot be judged); 3 admitted fewer than `expected - slack - --allow-under`.
//!
//! The plan and the judgement are pure arithmetic in `judge.rs`; the targets and the
//! requests to them in `send.rs`; this module reads the arguments, runs the plan and reports.

use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use clap::Args;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use sluice_core::policy::parse_duration_ms;
use sluice_core::{Algorithm, Clock, SystemClock};
use tokio::time::Instant;

use crate::loadtest::LoadReport;

mod judge;
mod send;

use crate::policy_args::PolicyArgs;
use judge::rate_per_ms;
pub use judge::{Answer, Sample, TargetReport, Verdict, VerifyReport, judge, plan, simulate};
use send::{Sender, Target, http_uri, parse_header, run_id};

/// The most requests one run may send, whatever `--max-requests` says.
const MAX_REQUESTS: u64 = 20_000;
/// The longest steady phase, whatever `--duration` says.
const MAX_DURATION_MS: u64 = 60_000;

/// Arguments of `sluice verify`.
#[derive(Debug, Clone, Args)]
pub struct VerifyArgs {
    /// A decision API to check through: http://HOST:PORT (POST /v1/check). Repeatable; every
    /// target given (of any kind) gets the arrivals in turn.
    #[arg(long = "api")]
    pub api: Vec<String>,
    /// A proxy route to request: http://HOST:PORT/path (GET; 2xx admitted, 429 limited).
    /// Repeatable.
    #[arg(long = "proxy")]
    pub proxy: Vec<String>,
    /// An Envoy rate limit service (gRPC): http://HOST:PORT. Repeatable.
    #[arg(long = "rls")]
    pub rls: Vec<String>,
    /// The policy the deployment should enforce, read from this sluice.toml (with --policy).
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// The policy's name: sent to the decision API, and looked up in --config.
    #[arg(long = "policy")]
    pub policy_name: Option<String>,
    /// The policy as flags, when not read from --config.
    #[command(flatten)]
    pub policy: PolicyArgs,
    /// The identity sent to the decision API; `{run}` becomes a fresh value each run.
    #[arg(long, default_value = "verify:{run}")]
    pub identity: String,
    /// Bearer token for the decision API (server.api_token).
    #[arg(long, env = "SLUICE_API_TOKEN")]
    pub token: Option<String>,
    /// Extra proxy request header, `name: value` (repeatable); `{run}` becomes a fresh value.
    #[arg(short = 'H', long = "header")]
    pub headers: Vec<String>,
    /// The Envoy domain (with --rls).
    #[arg(long)]
    pub domain: Option<String>,
    /// One descriptor entry `key=value` (repeatable, with --rls); `{run}` becomes a fresh value.
    #[arg(long = "descriptor")]
    pub descriptor: Vec<String>,
    /// Steady arrivals at this multiple of the policy's rate.
    #[arg(long, default_value_t = 3.0)]
    pub overload: f64,
    /// How long the steady arrivals last (at most 60s).
    #[arg(long, default_value = "5s")]
    pub duration: String,
    /// Upper bound on requests sent (at most 20000).
    #[arg(long, default_value_t = 2_000)]
    pub max_requests: u64,
    /// Per-request timeout.
    #[arg(long, default_value = "2s")]
    pub timeout: String,
    /// Admits beyond the arithmetic that the deployment's mode is allowed (docs/guarantees.md:
    /// leased slices, local_share, sharding).
    #[arg(long, default_value_t = 0)]
    pub allow_over: u64,
    /// Denials beyond the arithmetic that the deployment's mode is allowed.
    #[arg(long, default_value_t = 0)]
    pub allow_under: u64,
    /// Machine-readable output.
    #[arg(long)]
    pub json: bool,
    /// Write an SVG plot of admitted and limited requests per second, with the expected line.
    #[arg(long)]
    pub svg: Option<PathBuf>,
}

/// The policy to verify against: `--config` + `--policy`, or the policy flags.
fn expected_algorithm(args: &VerifyArgs) -> Result<Algorithm, String> {
    let Some(path) = &args.config else {
        return args.policy.algorithm();
    };
    let p = &args.policy;
    if p.capacity.is_some()
        || p.rate.is_some()
        || p.burst.is_some()
        || p.limit.is_some()
        || p.window.is_some()
        || p.mode.is_some()
        || p.lease.is_some()
    {
        return Err(
            "give the policy either as --config with --policy or as flags, not both".into(),
        );
    }
    let name = args
        .policy_name
        .as_deref()
        .ok_or("--config needs --policy NAME (which policy of the file to verify)")?;
    let config = sluice_server::Config::load(path).map_err(|e| e.to_string())?;
    let pc = config.policies.get(name).ok_or_else(|| {
        let names: Vec<&str> = config.policies.keys().map(String::as_str).collect();
        format!(
            "{} has no policy {name:?}; its policies: {}",
            path.display(),
            names.join(", ")
        )
    })?;
    Ok(pc.policy.algorithm.clone())
}

/// Runs `sluice verify`.
pub async fn run(args: &VerifyArgs) -> Result<VerifyReport, String> {
    let algorithm = expected_algorithm(args)?;
    let run = run_id();
    let mut targets = Vec::new();
    for url in &args.api {
        let policy = args
            .policy_name
            .clone()
            .ok_or("--api needs --policy NAME (the policy the decision API checks)")?;
        targets.push(Target::Api {
            uri: http_uri(url, Some("/v1/check"))?,
            policy,
        });
    }
    for url in &args.proxy {
        targets.push(Target::Proxy {
            uri: http_uri(url, None)?,
        });
    }
    for endpoint in &args.rls {
        http_uri(endpoint, None)?;
        targets.push(Target::Rls {
            endpoint: endpoint.clone(),
        });
    }
    if targets.is_empty() {
        return Err("nothing to verify: give --api URL, --proxy URL or --rls URL".into());
    }
    if !args.rls.is_empty() && (args.domain.is_none() || args.descriptor.is_empty()) {
        return Err("--rls needs --domain and at least one --descriptor key=value".into());
    }
    if !(args.overload > 0.0 && args.overload <= 100.0) {
        return Err(format!(
            "--overload must be above 0 and at most 100, got {}",
            args.overload
        ));
    }
    let duration_ms = parse_duration_ms(&args.duration).map_err(|e| e.to_string())?;
    if duration_ms > MAX_DURATION_MS {
        return Err(format!("--duration is at most 60s, got {}", args.duration));
    }
    if args.max_requests > MAX_REQUESTS {
        return Err(format!(
            "--max-requests is at most {MAX_REQUESTS}, got {}",
            args.max_requests
        ));
    }
    let timeout =
        Duration::from_millis(parse_duration_ms(&args.timeout).map_err(|e| e.to_string())?);
    let headers = args
        .headers
        .iter()
        .map(|h| parse_header(h, &run))
        .collect::<Result<Vec<_>, _>>()?;
    let mut entries = Vec::new();
    for d in &args.descriptor {
        let (k, v) = d
            .split_once('=')
            .ok_or_else(|| format!("descriptor {d:?} must look like key=value"))?;
        entries.push(Entry {
            key: k.trim().to_string(),
            value: v.trim().replace("{run}", &run),
        });
    }
    let identity = args.identity.replace("{run}", &run);
    let mut rls = Vec::with_capacity(targets.len());
    for t in &targets {
        rls.push(match t {
            Target::Rls { endpoint } => Some(
                RateLimitServiceClient::connect(endpoint.clone())
                    .await
                    .map_err(|e| format!("cannot reach the rate limit service {endpoint}: {e}"))?,
            ),
            _ => None,
        });
    }
    let api_policy = targets.iter().find_map(|t| match t {
        Target::Api { policy, .. } => Some(policy.clone()),
        _ => None,
    });
    let sender = Arc::new(Sender {
        http: hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
            .pool_max_idle_per_host(256)
            .build_http(),
        rls,
        api_body: Bytes::from(
            serde_json::json!({"policy": api_policy, "identity": identity, "cost": 1}).to_string(),
        ),
        token: args.token.clone(),
        headers,
        rls_request: RateLimitRequest {
            domain: args.domain.clone().unwrap_or_default(),
            descriptors: vec![RateLimitDescriptor {
                entries,
                ..Default::default()
            }],
            hits_addend: 1,
        },
        timeout,
        targets: targets.clone(),
    });

    let offsets = plan(&algorithm, args.overload, duration_ms, args.max_requests);
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<Sample>();
    let t0 = Instant::now();
    let t0_us = SystemClock.now();
    let n_targets = targets.len();
    let driver = {
        let sender = sender.clone();
        let offsets = offsets.clone();
        tokio::spawn(async move {
            for (i, planned) in offsets.into_iter().enumerate() {
                tokio::time::sleep_until(t0 + Duration::from_micros(planned)).await;
                let (sender, tx) = (sender.clone(), tx.clone());
                tokio::spawn(async move {
                    let target = i % n_targets;
                    let started = Instant::now();
                    let answer = sender.send(target).await;
                    let _ = tx.send(Sample {
                        target,
                        offset_us: started.duration_since(t0).as_micros() as u64,
                        latency_us: started.elapsed().as_micros() as u64,
                        answer,
                    });
                });
            }
        })
    };
    let deadline = t0 + Duration::from_millis(duration_ms) + timeout + Duration::from_secs(1);
    let mut samples = Vec::with_capacity(offsets.len());
    while let Ok(Some(s)) = tokio::time::timeout_at(deadline, rx.recv()).await {
        samples.push(s);
    }
    driver.abort();
    let elapsed_s = t0.elapsed().as_secs_f64();

    let names: Vec<String> = targets.iter().map(Target::describe).collect();
    let mut report = judge(
        &algorithm,
        &names,
        &samples,
        t0_us,
        args.allow_over,
        args.allow_under,
    );
    // A request that never answered is one that got no decision.
    let missing = offsets.len() as u64 - report.requests;
    report.failed += missing;
    report.requests += missing;
    if missing > 0 && report.verdict != Verdict::OverAdmits {
        report.verdict = Verdict::Inconclusive;
    }
    report.elapsed_s = elapsed_s;
    report.steady_rate_per_s =
        (rate_per_ms(&algorithm) * 1000.0 * args.overload).clamp(4.0, 1000.0);
    if let Some(path) = &args.svg {
        std::fs::write(path, crate::plot::svg(&as_load_report(&report)))
            .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    }
    Ok(report)
}

/// The report in `loadtest`'s shape, for its plot.
fn as_load_report(r: &VerifyReport) -> LoadReport {
    LoadReport {
        url: r
            .targets
            .iter()
            .map(|t| t.target.as_str())
            .collect::<Vec<_>>()
            .join(", "),
        requests: r.requests,
        rate_per_s: r.steady_rate_per_s,
        duration_s: r.per_second.len() as f64,
        elapsed_s: r.elapsed_s,
        statuses: Default::default(),
        errors: r.failed,
        admitted: r.admitted,
        limited: r.limited,
        predicted_admitted: Some(r.expected),
        policy: Some(r.policy.clone()),
        latency_ms: r.latency_ms.clone(),
        per_second: r.per_second.clone(),
    }
}

/// The human report.
pub fn render(r: &VerifyReport, out: &mut dyn Write) {
    let _ = writeln!(out, "policy   {}", r.policy);
    let _ = writeln!(
        out,
        "sent     {} requests in {:.1} s ({} admitted, {} limited, {} without a decision)",
        r.requests, r.elapsed_s, r.admitted, r.limited, r.failed
    );
    for t in &r.targets {
        let _ = writeln!(
            out,
            "  {:<40} sent {:>5}  admitted {:>5}  limited {:>5}  failed {:>3}  (alone it would admit {})",
            t.target, t.sent, t.admitted, t.limited, t.failed, t.expected_alone
        );
    }
    let ratio = if r.expected > 0 {
        r.admitted as f64 / r.expected as f64
    } else {
        0.0
    };
    let _ = writeln!(
        out,
        "expected {} admitted by the policy's arithmetic; allowed {}..={} (slack {} for timing, \
         +{} / -{} for the mode); admitted {} = {ratio:.2}x expected",
        r.expected, r.floor, r.ceiling, r.slack, r.allow_over, r.allow_under, r.admitted
    );
    let _ = writeln!(
        out,
        "latency  p50 {:.2} ms   p99 {:.2} ms   max {:.2} ms",
        r.latency_ms.p50, r.latency_ms.p99, r.latency_ms.max
    );
    let verdict = match r.verdict {
        Verdict::Pass => "PASS: the deployment admits what the policy allows".to_string(),
        Verdict::OverAdmits => {
            let mut s = format!(
                "FAIL: over-admits: {} admitted, at most {} allowed ({} too many)",
                r.admitted,
                r.ceiling,
                r.admitted - r.ceiling
            );
            if r.targets.len() > 1 && r.admitted + r.slack >= r.expected_if_unshared {
                s.push_str(&format!(
                    "\n      the targets together admitted about what {} separate limiters would \
                     ({}): they do not share state (different stores, a different \
                     identity_hash_key, or another policy name)",
                    r.targets.len(),
                    r.expected_if_unshared
                ));
            } else {
                s.push_str(
                    "\n      causes: instances on different stores, identities or keys that \
                     differ between instances, a clock problem, a mode with a wider bound \
                     (pass --allow-over, see docs/guarantees.md)",
                );
            }
            s
        }
        Verdict::UnderAdmits => format!(
            "FAIL: under-admits: {} admitted, at least {} expected",
            r.admitted, r.floor
        ),
        Verdict::Inconclusive => format!(
            "INCONCLUSIVE: {} requests got no decision (timeouts, refused connections, \
             statuses other than 2xx/429)",
            r.failed
        ),
    };
    let _ = writeln!(out, "{verdict}");
}
