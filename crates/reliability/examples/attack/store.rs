//! Findings 3 and 5, against a real Redis: a healthy but busy store must not produce
//! fail-open admissions, and a pause must not leave concurrency slots held by nobody.

use std::sync::Arc;
use std::time::{Duration, Instant};

use sluice_testkit::servers::RedisServer;

use crate::harness::{self, Conn, Launch, Sluice};
use crate::{Args, Outcome};

async fn start(a: &Args, redis: &RedisServer, policies: &str) -> Result<Sluice, String> {
    let (server, http, grpc) = harness::server_section();
    let toml = format!("{server}\n[store]\nurl = \"{}\"\n{policies}", redis.url());
    Sluice::start(&a.bin, &toml, http, grpc, &Launch::default()).await
}

fn redis() -> RedisServer {
    RedisServer::redis()
}

/// Loopback source addresses the overload clients are spread over (127.0.0.2..127.0.0.41), so
/// the per-client-IP connection cap (256 per process by default) admits every one of them and
/// the flood reaches the store path it is about.
const OVERLOAD_SOURCES: usize = 40;

/// 3 `sluice serve` on one Redis with default store settings; 3,000 concurrent checks on one
/// identity with a limit of 100, from 40 loopback addresses: how many are admitted, how many
/// as `failed_open`, how many denied because sluice's own queue was saturated.
pub(crate) async fn overload(a: &Args) -> Outcome {
    let (total, limit) = if a.quick {
        (600usize, 100u64)
    } else {
        (3_000, 100)
    };
    let mut out = Outcome::new(
        "overload",
        format!(
            "{total} concurrent checks from {OVERLOAD_SOURCES} addresses, 3 servers, limit {limit}"
        ),
    );
    let redis = tokio::task::spawn_blocking(redis)
        .await
        .expect("start redis");
    let policies = format!(
        "\n[policies.hot]\nalgorithm = \"sliding-log\"\nlimit = {limit}\nwindow = \"1h\"\n"
    );
    let mut servers = Vec::new();
    for _ in 0..3 {
        match start(a, &redis, &policies).await {
            Ok(s) => servers.push(s),
            Err(e) => {
                out.set("error", e);
                return out;
            }
        }
    }
    // Every connection is open before any request is sent, so the checks really are
    // concurrent; a barrier releases them together.
    let barrier = Arc::new(tokio::sync::Barrier::new(total));
    let gate = Arc::new(tokio::sync::Semaphore::new(200));
    let body = r#"{"policy":"hot","identity":"user:hot"}"#;
    let mut tasks = Vec::with_capacity(total);
    for i in 0..total {
        let addr = servers[i % 3].http;
        let from = Some(harness::attacker_ip((i / 3) % OVERLOAD_SOURCES));
        let (barrier, gate) = (Arc::clone(&barrier), Arc::clone(&gate));
        tasks.push(tokio::spawn(async move {
            let permit = gate.acquire_owned().await;
            let conn = Conn::open_from(from, addr, Duration::from_secs(10)).await;
            drop(permit);
            barrier.wait().await;
            let req = harness::request("POST", "/v1/check", Some(body), &[]);
            let answer = conn
                .ok()?
                .exchange(&[req], Duration::from_secs(30))
                .await
                .ok()?;
            Some((answer[0].status, answer[0].json()))
        }));
    }
    let mut allowed = 0u64;
    let mut verdicts = std::collections::BTreeMap::<String, u64>::new();
    let mut unanswered = 0u64;
    for t in tasks {
        match t.await.ok().flatten() {
            Some((status, v)) => {
                allowed += (v["allowed"].as_bool() == Some(true)) as u64;
                let verdict = match v["verdict"].as_str() {
                    Some(verdict) => format!("{verdict}/{}", v["allowed"]),
                    None => format!("status {status}"),
                };
                *verdicts.entry(verdict).or_default() += 1;
            }
            None => unanswered += 1,
        }
    }
    let (mut overloaded, mut refused_per_ip) = (0u64, 0u64);
    for s in &servers {
        overloaded += harness::counter_sum(s, "sluice_store_queue_overloaded_total", &[]).await;
        refused_per_ip += harness::counter_sum(
            s,
            "sluice_connections_rejected_total",
            &["reason=\"per_ip\""],
        )
        .await;
    }
    // What Redis itself spent: the script calls' count and mean time (INFO commandstats).
    let stats = redis.cli(&["INFO", "commandstats"]);
    let scripts: Vec<String> = stats
        .lines()
        .filter(|l| l.starts_with("cmdstat_eval") || l.starts_with("cmdstat_fcall"))
        .filter_map(|l| {
            let (name, rest) = l.split_once(':')?;
            let field = |k: &str| {
                rest.split(',')
                    .find_map(|f| f.strip_prefix(k))
                    .unwrap_or("?")
                    .to_string()
            };
            Some(format!(
                "{} calls={} usec_per_call={}",
                name.trim_start_matches("cmdstat_"),
                field("calls="),
                field("usec_per_call=")
            ))
        })
        .collect();
    out.set("redis_scripts", scripts.join(", "));
    let count = |k: &str| verdicts.get(k).copied().unwrap_or(0);
    out.set("admitted", allowed);
    out.set("admitted_by_decision", count("decided/true"));
    out.set("failed_open", count("failed_open/true"));
    out.set("denied_by_decision", count("decided/false"));
    out.set("denied_failed_closed", count("failed_closed/false"));
    out.set("store_queue_overloaded_total", overloaded);
    out.set("connections_refused_per_ip", refused_per_ip);
    out.set("unanswered", unanswered);
    out.set("answers", format!("{verdicts:?}"));
    out
}

/// The concurrency policy's in-flight count as seen by a cost-0 check, when the store decided.
async fn in_flight(s: &Sluice, limit: u64) -> Option<u64> {
    let body = r#"{"policy":"slots","identity":"user:slots","cost":0}"#;
    let v = harness::check(s.http, body, Duration::from_secs(2))
        .await
        .ok()?
        .json();
    if v["verdict"].as_str() != Some("decided") {
        return None;
    }
    v["remaining"].as_u64().map(|r| limit.saturating_sub(r))
}

/// A concurrency policy with a 60 s lease; Redis paused 5 s while acquires time out: seconds
/// from the end of the pause until every slot is free again.
pub(crate) async fn leases(a: &Args) -> Outcome {
    let (lease, pause, limit) = if a.quick {
        (10u64, 2u64, 10u64)
    } else {
        (60, 5, 10)
    };
    let mut out = Outcome::new(
        "leases",
        format!("lease {lease} s, Redis paused {pause} s, {limit} acquires"),
    );
    let redis = tokio::task::spawn_blocking(redis)
        .await
        .expect("start redis");
    let policies = format!(
        "\n[policies.slots]\nalgorithm = \"concurrency\"\nlimit = {limit}\nlease = \"{lease}s\"\n"
    );
    let s = match start(a, &redis, &policies).await {
        Ok(s) => s,
        Err(e) => {
            out.set("error", e);
            return out;
        }
    };
    if in_flight(&s, limit).await != Some(0) {
        out.set("error", "the slots were not free before the pause");
        return out;
    }
    redis.cli(&["CLIENT", "PAUSE", &(pause * 1000).to_string(), "ALL"]);
    let paused_at = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..limit {
        let addr = s.http;
        tasks.push(tokio::spawn(async move {
            let body = r#"{"policy":"slots","identity":"user:slots"}"#;
            harness::check(addr, body, Duration::from_secs(3))
                .await
                .ok()
                .and_then(|r| r.json()["verdict"].as_str().map(str::to_string))
        }));
    }
    let mut verdicts = std::collections::BTreeMap::<String, u64>::new();
    for t in tasks {
        let v = t.await.ok().flatten().unwrap_or_else(|| "no answer".into());
        *verdicts.entry(v).or_default() += 1;
    }
    out.set("acquire_verdicts_during_pause", format!("{verdicts:?}"));
    let resumed = paused_at + Duration::from_secs(pause);
    tokio::time::sleep_until(resumed.into()).await;
    let bound = Duration::from_secs(lease + 15);
    let mut first_held = None;
    let free_after = loop {
        let seen = in_flight(&s, limit).await;
        if first_held.is_none()
            && let Some(n) = seen
        {
            first_held = Some(n);
        }
        if seen == Some(0) {
            break Some(resumed.elapsed().as_secs_f64());
        }
        if resumed.elapsed() > bound {
            break None;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    out.set(
        "slots_held_after_resume",
        first_held.map_or(-1, |n| n as i64),
    );
    match free_after {
        Some(secs) => out.set("seconds_until_all_free", (secs * 10.0).round() / 10.0),
        None => out.set("seconds_until_all_free", format!("> {}", bound.as_secs())),
    };
    out
}

/// 1M keys of 512-byte identities in Redis: `used_memory`. Each check names 16 policies, so
/// it writes 16 keys and the flood takes 1/16 of the requests.
pub(crate) async fn redis_memory(a: &Args) -> Outcome {
    const PER_CHECK: u64 = 16;
    let keys: u64 = if a.quick { 50_000 } else { 1_000_000 };
    let mut out = Outcome::new(
        "redis-memory",
        format!("{keys} keys of 512-byte identities, Redis"),
    );
    let redis = tokio::task::spawn_blocking(redis)
        .await
        .expect("start redis");
    let policies: String = (0..PER_CHECK)
        .map(|i| {
            format!(
                "\n[policies.p{i}]\nalgorithm = \"token-bucket\"\ncapacity = 10\nrate = \"1/min\"\n"
            )
        })
        .collect();
    let s = match start(a, &redis, &policies).await {
        Ok(s) => s,
        Err(e) => {
            out.set("error", e);
            return out;
        }
    };
    let used = |r: &RedisServer| -> f64 {
        r.cli(&["INFO", "memory"])
            .lines()
            .find_map(|l| l.strip_prefix("used_memory:"))
            .and_then(|v| v.trim().parse::<f64>().ok())
            .map_or(0.0, |b| (b / 1_048_576.0).round())
    };
    out.set("used_memory_mb_before", used(&redis));
    let names: Vec<String> = (0..PER_CHECK).map(|i| format!("\"p{i}\"")).collect();
    let names = names.join(",");
    let t = Instant::now();
    let bound = t + Duration::from_secs(if a.quick { 60 } else { 240 });
    let c = harness::flood(s.http, keys / PER_CHECK, 8, 32, bound, move |i| {
        format!(r#"{{"policies":[{names}],"identity":"{i:0>512}"}}"#)
    })
    .await;
    out.set("checks_answered_200", c.ok);
    out.set(
        "keys",
        redis.cli(&["DBSIZE"]).trim().parse::<u64>().unwrap_or(0),
    );
    out.set("used_memory_mb", used(&redis));
    out.set("seconds", t.elapsed().as_secs());
    out
}
