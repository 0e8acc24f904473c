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

use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use clap::Args;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use http_body_util::{BodyExt, Full};
use serde::Serialize;
use sluice_core::algorithm::{Update, decide};
use sluice_core::policy::parse_duration_ms;
use sluice_core::{Algorithm, Clock, SystemClock};
use tokio::time::Instant;

use crate::loadtest::{Latency, LoadReport};
use crate::policy_args::PolicyArgs;

/// The most requests one run may send, whatever `--max-requests` says.
const MAX_REQUESTS: u64 = 20_000;
/// The longest steady phase, whatever `--duration` says.
const MAX_DURATION_MS: u64 = 60_000;
/// The largest opening burst.
const MAX_OPENING: u64 = 500;

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

/// Where a request goes.
#[derive(Debug, Clone)]
enum Target {
    Api { uri: http::Uri, policy: String },
    Proxy { uri: http::Uri },
    Rls { endpoint: String },
}

impl Target {
    fn describe(&self) -> String {
        match self {
            Target::Api { uri, .. } => format!("api {uri}"),
            Target::Proxy { uri } => format!("proxy {uri}"),
            Target::Rls { endpoint } => format!("rls {endpoint}"),
        }
    }
}

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
fn rate_per_ms(algorithm: &Algorithm) -> f64 {
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
        policy: crate::loadtest::describe(algorithm),
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

fn http_uri(url: &str, default_path: Option<&str>) -> Result<http::Uri, String> {
    let uri: http::Uri = url.parse().map_err(|e| format!("bad URL {url:?}: {e}"))?;
    if uri.scheme_str() != Some("http") {
        return Err(format!("{url:?}: only http:// URLs are supported"));
    }
    match default_path {
        Some(path) if uri.path() == "/" => format!("{}{path}", url.trim_end_matches('/'))
            .parse::<http::Uri>()
            .map_err(|e| format!("bad URL {url:?}: {e}")),
        _ => Ok(uri),
    }
}

/// A value for `{run}`: different for every run, so each run starts on a fresh key.
fn run_id() -> String {
    format!("{:x}{:x}", SystemClock.now(), std::process::id())
}

fn parse_header(h: &str, run: &str) -> Result<(http::HeaderName, http::HeaderValue), String> {
    let (n, v) = h
        .split_once(':')
        .ok_or_else(|| format!("header {h:?} must look like 'name: value'"))?;
    let name = http::HeaderName::from_bytes(n.trim().as_bytes())
        .map_err(|e| format!("header name {n:?}: {e}"))?;
    let value = http::HeaderValue::from_str(&v.trim().replace("{run}", run))
        .map_err(|e| format!("header value {v:?}: {e}"))?;
    Ok((name, value))
}

type HttpClient = hyper_util::client::legacy::Client<
    hyper_util::client::legacy::connect::HttpConnector,
    Full<Bytes>,
>;

/// What every request of the run shares.
struct Sender {
    http: HttpClient,
    rls: Vec<Option<RateLimitServiceClient<tonic::transport::Channel>>>,
    targets: Vec<Target>,
    api_body: Bytes,
    token: Option<String>,
    headers: Vec<(http::HeaderName, http::HeaderValue)>,
    rls_request: RateLimitRequest,
    timeout: Duration,
}

impl Sender {
    async fn send(&self, target: usize) -> Answer {
        let answer = tokio::time::timeout(self.timeout, self.send_untimed(target)).await;
        answer.unwrap_or(Answer::Failed)
    }

    async fn send_untimed(&self, target: usize) -> Answer {
        match &self.targets[target] {
            Target::Api { uri, .. } => {
                let mut req = http::Request::post(uri.clone())
                    .header(http::header::CONTENT_TYPE, "application/json");
                if let Some(t) = &self.token {
                    req = req.header(http::header::AUTHORIZATION, format!("Bearer {t}"));
                }
                let Ok(req) = req.body(Full::new(self.api_body.clone())) else {
                    return Answer::Failed;
                };
                let Ok(resp) = self.http.request(req).await else {
                    return Answer::Failed;
                };
                if resp.status() != http::StatusCode::OK {
                    return Answer::Failed;
                }
                let Ok(body) = resp.into_body().collect().await else {
                    return Answer::Failed;
                };
                let v: serde_json::Value =
                    serde_json::from_slice(&body.to_bytes()).unwrap_or_default();
                match v.get("allowed").and_then(serde_json::Value::as_bool) {
                    Some(true) => Answer::Admitted,
                    Some(false) => Answer::Limited,
                    None => Answer::Failed,
                }
            }
            Target::Proxy { uri } => {
                let mut req = http::Request::get(uri.clone());
                for (k, v) in &self.headers {
                    req = req.header(k, v);
                }
                let Ok(req) = req.body(Full::new(Bytes::new())) else {
                    return Answer::Failed;
                };
                let Ok(resp) = self.http.request(req).await else {
                    return Answer::Failed;
                };
                let status = resp.status();
                let _ = resp.into_body().collect().await;
                if status.is_success() {
                    Answer::Admitted
                } else if status == http::StatusCode::TOO_MANY_REQUESTS {
                    Answer::Limited
                } else {
                    Answer::Failed
                }
            }
            Target::Rls { .. } => {
                let Some(Some(client)) = self.rls.get(target) else {
                    return Answer::Failed;
                };
                match client
                    .clone()
                    .should_rate_limit(self.rls_request.clone())
                    .await
                {
                    Ok(r) if r.get_ref().overall_code == Code::Ok as i32 => Answer::Admitted,
                    Ok(r) if r.get_ref().overall_code == Code::OverLimit as i32 => Answer::Limited,
                    _ => Answer::Failed,
                }
            }
        }
    }
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
