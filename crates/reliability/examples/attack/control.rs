//! The control plane at size, against a real Redis and two `sluice serve` instances: a
//! million deny entries must leave every check decided (never `failed_open`), a write to a
//! large table must stay cheap and reach the other instance within a second, and automatic
//! bans of rotating identities must leave nothing behind once they end.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use sluice_testkit::servers::RedisServer;

use crate::harness::{self, Conn, Launch, Sluice, request};
use crate::{Args, Outcome};

async fn start(a: &Args, redis: &RedisServer, policies: &str) -> Result<Sluice, String> {
    let (server, http, grpc) = harness::server_section();
    let toml = format!("{server}\n[store]\nurl = \"{}\"\n{policies}", redis.url());
    Sluice::start(&a.bin, &toml, http, grpc, &Launch::default()).await
}

/// What a run of checks saw.
#[derive(Debug, Default)]
struct Probe {
    decided: u64,
    failed_open: u64,
    failed_closed: u64,
    admitted: u64,
    errors: u64,
    latencies_us: Vec<u64>,
}

impl Probe {
    fn add(&mut self, other: Probe) {
        self.decided += other.decided;
        self.failed_open += other.failed_open;
        self.failed_closed += other.failed_closed;
        self.admitted += other.admitted;
        self.errors += other.errors;
        self.latencies_us.extend(other.latencies_us);
    }

    fn total(&self) -> u64 {
        self.decided + self.failed_open + self.failed_closed + self.errors
    }

    fn percentile_ms(&mut self, p: f64) -> f64 {
        if self.latencies_us.is_empty() {
            return 0.0;
        }
        self.latencies_us.sort_unstable();
        let i = ((self.latencies_us.len() as f64 - 1.0) * p).round() as usize;
        self.latencies_us[i] as f64 / 1000.0
    }

    fn decided_pct(&self) -> f64 {
        (self.decided as f64 * 1000.0 / self.total().max(1) as f64).round() / 10.0
    }
}

/// `n` checks over `conns` keep-alive connections, one at a time each, with `body(i)`, or
/// until `stop` is set; each answer's verdict and latency counted.
async fn probe<F>(
    addr: SocketAddr,
    n: u64,
    conns: usize,
    stop: Option<std::sync::Arc<std::sync::atomic::AtomicBool>>,
    body: F,
) -> Probe
where
    F: Fn(u64) -> String + Send + Sync + 'static,
{
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU64, Ordering};
    let next = Arc::new(AtomicU64::new(0));
    let body = Arc::new(body);
    let mut tasks = Vec::new();
    for _ in 0..conns {
        let (next, body, stop) = (Arc::clone(&next), Arc::clone(&body), stop.clone());
        tasks.push(tokio::spawn(async move {
            let mut p = Probe::default();
            let mut conn: Option<Conn> = None;
            let deadline = Instant::now() + Duration::from_secs(300);
            loop {
                if stop.as_ref().is_some_and(|s| s.load(Ordering::Relaxed))
                    || Instant::now() > deadline
                    || p.errors > 100
                {
                    break;
                }
                let i = next.fetch_add(1, Ordering::Relaxed);
                if stop.is_none() && i >= n {
                    break;
                }
                if conn.is_none() {
                    conn = Conn::open(addr, Duration::from_secs(5)).await.ok();
                }
                let Some(c) = conn.as_mut() else {
                    p.errors += 1;
                    continue;
                };
                let req = request("POST", "/v1/check", Some(&body(i)), &[]);
                let t = Instant::now();
                match c.exchange(&[req], Duration::from_secs(10)).await {
                    Ok(mut answers) => {
                        p.latencies_us.push(t.elapsed().as_micros() as u64);
                        let v = answers.remove(0).json();
                        match v["verdict"].as_str() {
                            Some("failed_open") => p.failed_open += 1,
                            Some("failed_closed") => p.failed_closed += 1,
                            Some(_) => p.decided += 1,
                            None => p.errors += 1,
                        }
                        if v["allowed"] == true {
                            p.admitted += 1;
                        }
                    }
                    Err(_) => {
                        p.errors += 1;
                        conn = None;
                    }
                }
            }
            p
        }));
    }
    let mut out = Probe::default();
    for t in tasks {
        if let Ok(p) = t.await {
            out.add(p);
        }
    }
    out
}

/// The deny entry number `i`: addresses from 10.0.0.0 on.
fn address(i: u64) -> String {
    format!("10.{}.{}.{}", (i >> 16) & 255, (i >> 8) & 255, i & 255)
}

/// Imports `n` deny entries through `addr` in calls of 10,000; the slowest call (ms) and
/// any refusal.
async fn import(addr: SocketAddr, n: u64) -> Result<f64, String> {
    let mut conn = Conn::open(addr, Duration::from_secs(5))
        .await
        .map_err(|e| e.to_string())?;
    let mut slowest: f64 = 0.0;
    let mut at = 0;
    while at < n {
        let chunk = (n - at).min(10_000);
        let entries: Vec<String> = (at..at + chunk).map(address).collect();
        let body = serde_json::json!({ "entries": entries }).to_string();
        let t = Instant::now();
        let answers = conn
            .exchange(
                &[request("POST", "/v1/lists/deny", Some(&body), &[])],
                Duration::from_secs(60),
            )
            .await
            .map_err(|e| e.to_string())?;
        slowest = slowest.max(t.elapsed().as_secs_f64() * 1000.0);
        if answers[0].status != 200 {
            return Err(format!(
                "import call at entry {at} answered {}: {}",
                answers[0].status,
                String::from_utf8_lossy(&answers[0].body)
            ));
        }
        at += chunk;
    }
    Ok(slowest)
}

/// Whether `identity` is denied as listed on `addr`.
async fn listed(addr: SocketAddr, identity: &str) -> bool {
    let body = format!("{{\"policy\":\"wide\",\"identity\":\"{identity}\"}}");
    match harness::check(addr, &body, Duration::from_secs(5)).await {
        Ok(a) => a.json()["policies"][0]["reason"] == "denied",
        Err(_) => false,
    }
}

/// How long until `identity` is denied as listed on `addr` (at most 10 s).
async fn in_force_after(addr: SocketAddr, identity: &str) -> Option<Duration> {
    let t = Instant::now();
    while t.elapsed() < Duration::from_secs(10) {
        if listed(addr, identity).await {
            return Some(t.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    None
}

const SIZE_POLICIES: &str = r#"
[policies.api]
algorithm = "fixed-window"
limit = 5
window = "1h"

[policies.wide]
algorithm = "fixed-window"
limit = 1000000000
window = "1h"
"#;

/// Two servers on one Redis; checks on the empty control plane, then `entries` deny entries
/// imported through the first while the second keeps checking, then checks again and one
/// more entry: every check's verdict, p50/p99 latency before and after, 50 identities at 5/h,
/// the single add's status and latency, and how soon each change is in force on the other.
pub(crate) async fn control_size(a: &Args) -> Outcome {
    let (entries, checks) = if a.quick {
        (20_000u64, 400u64)
    } else {
        (1_000_000, 20_000)
    };
    let mut out = Outcome::new(
        "control-size",
        format!("{entries} deny entries, 2 servers on one Redis, {checks} checks each phase"),
    );
    let redis = tokio::task::spawn_blocking(RedisServer::redis)
        .await
        .expect("start redis");
    let (sa, sb) = match (
        start(a, &redis, SIZE_POLICIES).await,
        start(a, &redis, SIZE_POLICIES).await,
    ) {
        (Ok(x), Ok(y)) => (x, y),
        (Err(e), _) | (_, Err(e)) => {
            out.set("error", e);
            return out;
        }
    };
    let wide = |i: u64| {
        format!(
            "{{\"policy\":\"wide\",\"identity\":\"ip:192.168.{}.{}\"}}",
            (i >> 8) & 255,
            i & 255
        )
    };
    let mut empty = probe(sb.http, checks, 8, None, wide).await;
    let rss_empty = sb.rss_mb();

    // The import, with checks going on on the other instance (a listed and an unlisted
    // address in turn).
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let during = tokio::spawn(probe(sb.http, 0, 4, Some(stop.clone()), move |i| {
        let who = if i % 2 == 0 {
            format!("ip:{}", address(i % 20_000))
        } else {
            format!("ip:192.168.1.{}", i % 250)
        };
        format!("{{\"policy\":\"wide\",\"identity\":\"{who}\"}}")
    }));
    let t = Instant::now();
    let imported = import(sa.http, entries).await;
    let import_s = t.elapsed().as_secs_f64();
    let last = format!("ip:{}", address(entries - 1));
    let synced = in_force_after(sb.http, &last).await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let mut while_importing = during.await.unwrap_or_default();
    match imported {
        Ok(slowest) => {
            out.set("import_s", (import_s * 10.0).round() / 10.0);
            out.set("slowest_import_call_ms", slowest.round());
        }
        Err(e) => {
            out.set("error", e);
            return out;
        }
    }
    out.set(
        "other_instance_caught_up_ms",
        synced.map_or(-1.0, |d| d.as_millis() as f64),
    );
    out.set("checks_during_import", while_importing.total());
    out.set("decided_during_import_pct", while_importing.decided_pct());
    out.set("failed_open_during_import", while_importing.failed_open);
    out.set("failed_closed_during_import", while_importing.failed_closed);
    out.set("p99_during_import_ms", while_importing.percentile_ms(0.99));

    let mut full = probe(sb.http, checks, 8, None, wide).await;
    let rss_full = sb.rss_mb();
    out.set("p50_empty_ms", empty.percentile_ms(0.5));
    out.set("p99_empty_ms", empty.percentile_ms(0.99));
    out.set("p50_full_ms", full.percentile_ms(0.5));
    out.set("p99_full_ms", full.percentile_ms(0.99));
    out.set("decided_full_pct", full.decided_pct());
    out.set("failed_open_full", full.failed_open + empty.failed_open);
    out.set(
        "memory_per_entry_bytes",
        ((rss_full - rss_empty) * 1024.0 * 1024.0 / entries as f64).round(),
    );

    // 50 identities at 5 per hour, 20 checks each: 250 at most may pass.
    let limited = probe(sa.http, 1_000, 8, None, |i| {
        format!("{{\"policy\":\"api\",\"identity\":\"user:{}\"}}", i % 50)
    })
    .await;
    out.set("admitted_of_1000_at_5_per_h_x50", limited.admitted);
    out.set("failed_open_limited", limited.failed_open);

    // One more entry through the first instance.
    let t = Instant::now();
    let one = harness::send(
        sa.http,
        request(
            "POST",
            "/v1/lists/deny",
            Some("{\"entry\":\"203.0.113.0/24\"}"),
            &[],
        ),
        Duration::from_secs(10),
    )
    .await;
    out.set(
        "one_more_add",
        format!(
            "{} in {:.1} ms",
            one.as_ref().map_or(0, |a| a.status),
            t.elapsed().as_secs_f64() * 1000.0
        ),
    );
    let other = in_force_after(sb.http, "ip:203.0.113.9").await;
    out.set(
        "one_more_in_force_on_other_ms",
        other.map_or(-1.0, |d| d.as_millis() as f64),
    );
    drop((sa, sb, redis));
    out
}

/// Two servers on one Redis, a policy that bans for 1 s after one denial; `n` rotating
/// identities each admitted on one instance and denied on the other (so banned): what is
/// left of the bans and their escalation levels, in Redis and in each instance's memory,
/// 3 s after the last ban ended.
pub(crate) async fn ban_expiry(a: &Args) -> Outcome {
    let n: u64 = if a.quick { 200 } else { 2_000 };
    let mut out = Outcome::new(
        "ban-expiry",
        format!("{n} identities banned automatically for 1 s, 2 servers on one Redis"),
    );
    let policies = r#"
[policies.api]
algorithm = "fixed-window"
limit = 1
window = "1h"
ban = { after = 1, within = "1m", duration = "1s" }
"#;
    let redis = tokio::task::spawn_blocking(RedisServer::redis)
        .await
        .expect("start redis");
    let (sa, sb) = match (
        start(a, &redis, policies).await,
        start(a, &redis, policies).await,
    ) {
        (Ok(x), Ok(y)) => (x, y),
        (Err(e), _) | (_, Err(e)) => {
            out.set("error", e);
            return out;
        }
    };
    let body = |i: u64| format!("{{\"policy\":\"api\",\"identity\":\"rotating:{i}\"}}");
    let first = probe(sa.http, n, 8, None, body).await;
    let second = probe(sb.http, n, 8, None, body).await;
    out.set("admitted_first", first.admitted);
    out.set("admitted_second", second.admitted);
    let hlen = |name: &str| {
        let key = redis.cli(&["KEYS", &format!("*control*:{name}")]);
        let key = key.lines().next().unwrap_or("").trim().to_string();
        if key.is_empty() {
            return 0;
        }
        redis
            .cli(&["HLEN", &key])
            .trim()
            .parse::<u64>()
            .unwrap_or(0)
    };
    out.set("bans_at_peak", hlen("bans"));
    out.set("levels_at_peak", hlen("levels"));
    // The last ban ends 1 s after it was set; 3 s more.
    tokio::time::sleep(Duration::from_secs(4)).await;
    out.set("bans_left_in_redis", hlen("bans"));
    out.set("levels_left_in_redis", hlen("levels"));
    let keys = redis.cli(&["KEYS", "*control*"]);
    out.set(
        "control_keys_left",
        keys.lines()
            .filter(|l| !l.trim().is_empty())
            .map(|l| l.rsplit(':').next().unwrap_or("").to_string())
            .collect::<Vec<_>>()
            .join(","),
    );
    for (name, s) in [("a", &sa), ("b", &sb)] {
        let stats = harness::get(s.http, "/v1/stats", Duration::from_secs(5))
            .await
            .map(|a| a.json())
            .unwrap_or_default();
        out.set(
            &format!("bans_left_in_memory_{name}"),
            stats["control"]["sizes"]["bans"].clone(),
        );
    }
    drop((sa, sb, redis));
    out
}
