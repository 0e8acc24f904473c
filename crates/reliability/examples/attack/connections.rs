//! Finding 1, connections: slow request heads, descriptor exhaustion and huge unfinished
//! heads. The figures say how many connections the server keeps, whether its health and
//! decision endpoints still answer meanwhile, and how much memory the heads pin.

use std::net::IpAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::harness::{self, Launch, Sluice};
use crate::{Args, Outcome};

const POLICY: &str =
    "\n[policies.burst]\nalgorithm = \"token-bucket\"\ncapacity = 10\nrate = \"5/s\"\n";
const CHECK: &str = r#"{"policy":"burst","identity":"probe"}"#;
const PROBE_TIMEOUT: Duration = Duration::from_secs(3);
/// Loopback source addresses (127.0.0.2 upwards) that a many-client attack is spread over, so
/// each stays below the per-client-IP connection cap (256 by default) and the attack reaches
/// the limit it is about; the probes come from 127.0.0.1.
const SOURCES: usize = 40;

async fn start(a: &Args, launch: &Launch) -> Result<Sluice, String> {
    let (server, http, grpc) = harness::server_section();
    Sluice::start(&a.bin, &format!("{server}{POLICY}"), http, grpc, launch).await
}

/// Milliseconds a `/healthz` takes on a fresh connection, or `"no answer"`.
async fn healthz_ms(s: &Sluice) -> serde_json::Value {
    let t = Instant::now();
    match harness::get(s.http, "/healthz", PROBE_TIMEOUT).await {
        Ok(r) if r.status == 200 => json!(t.elapsed().as_millis() as u64),
        Ok(r) => json!(format!("status {}", r.status)),
        Err(e) => json!(format!("no answer ({})", e.kind())),
    }
}

async fn check_answers(s: &Sluice) -> bool {
    harness::check(s.http, CHECK, PROBE_TIMEOUT)
        .await
        .is_ok_and(|r| r.status == 200)
}

/// Opens a connection, sends `GET` and one header line, then one more header line every
/// 5 s, never finishing the head. Returns whether the server still holds it at `end`.
async fn slow_client(from: IpAddr, addr: std::net::SocketAddr, end: Instant) -> bool {
    let connect = harness::connect_from(Some(from), addr);
    let Ok(Ok(mut s)) = tokio::time::timeout(PROBE_TIMEOUT, connect).await else {
        return false;
    };
    if s.write_all(b"GET /healthz HTTP/1.1\r\nhost: sluice\r\n")
        .await
        .is_err()
    {
        return false;
    }
    let mut buf = [0u8; 1024];
    loop {
        let next = (Instant::now() + Duration::from_secs(5)).min(end);
        tokio::select! {
            // Any answer (408, 400) or a close means the server let go of the connection.
            _ = s.read(&mut buf) => return false,
            _ = tokio::time::sleep_until(next.into()) => {
                if Instant::now() >= end {
                    return true;
                }
                if s.write_all(b"x-slow: 1\r\n").await.is_err() {
                    return false;
                }
            }
        }
    }
}

/// 2,000 slowloris connections for 40 s, spread over 40 source addresses so the per-client
/// cap does not hide what the header-read timeout does: how many are still open, and does
/// `/healthz` answer (from 127.0.0.1).
pub(crate) async fn slowloris(a: &Args) -> Outcome {
    let (conns, hold) = if a.quick { (200, 5) } else { (2_000, 40) };
    let mut out = Outcome::new("slowloris", format!("{conns} connections, {hold} s"));
    let s = match start(a, &Launch::default()).await {
        Ok(s) => s,
        Err(e) => {
            out.set("error", e);
            return out;
        }
    };
    let end = Instant::now() + Duration::from_secs(hold);
    let gate = Arc::new(tokio::sync::Semaphore::new(100));
    let mut tasks = Vec::with_capacity(conns);
    for i in 0..conns {
        let (addr, gate) = (s.http, Arc::clone(&gate));
        let from = harness::attacker_ip(i % SOURCES);
        tasks.push(tokio::spawn(async move {
            let permit = gate.acquire_owned().await;
            let client = slow_client(from, addr, end);
            drop(permit);
            client.await
        }));
    }
    tokio::time::sleep(Duration::from_secs(hold / 2)).await;
    out.set("healthz_ms_midway", healthz_ms(&s).await);
    out.set("check_answers_midway", check_answers(&s).await);
    let mut open = 0u64;
    for t in tasks {
        if t.await.unwrap_or(false) {
            open += 1;
        }
    }
    out.set("open_at_end", open);
    out
}

/// Opens `idle` idle sockets to `addr`, spread round-robin over the first `sources` attacker
/// addresses, and holds them; returns the ones that connected.
async fn hold_idle(addr: std::net::SocketAddr, idle: usize, sources: usize) -> Vec<TcpStream> {
    let held = Arc::new(Mutex::new(Vec::with_capacity(idle)));
    let next = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for _ in 0..32 {
        let (held, next) = (Arc::clone(&held), Arc::clone(&next));
        tasks.push(tokio::spawn(async move {
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed) as usize;
                if i >= idle {
                    break;
                }
                let from = Some(harness::attacker_ip(i % sources));
                let c =
                    tokio::time::timeout(Duration::from_secs(1), harness::connect_from(from, addr))
                        .await;
                if let Ok(Ok(stream)) = c {
                    held.lock().push(stream);
                }
            }
        }));
    }
    for t in tasks {
        let _ = t.await;
    }
    std::mem::take(&mut *held.lock())
}

/// Holds `idle` sockets from `sources` attacker addresses, then probes from 127.0.0.1; records
/// the figures under `prefix`.
async fn idle_phase(s: &Sluice, out: &mut Outcome, prefix: &str, idle: usize, sources: usize) {
    let held = hold_idle(s.http, idle, sources).await;
    out.set(&format!("{prefix}sockets_connected"), held.len() as u64);
    tokio::time::sleep(Duration::from_secs(1)).await;
    // Each held socket is open, or was closed by the server (EOF or reset); a non-blocking
    // peek on the raw socket tells which without waiting.
    let sockets: Vec<std::net::TcpStream> =
        held.into_iter().filter_map(|t| t.into_std().ok()).collect();
    let kept = sockets
        .iter()
        .filter(|c| {
            let mut b = [0u8; 1];
            matches!(c.peek(&mut b), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock)
        })
        .count();
    out.set(&format!("{prefix}sockets_kept_open_by_server"), kept as u64);
    out.set(&format!("{prefix}healthz_ms"), healthz_ms(s).await);
    out.set(&format!("{prefix}check_answers"), check_answers(s).await);
    out.set(
        &format!("{prefix}grpc_answers"),
        harness::grpc_answers(s.grpc, PROBE_TIMEOUT).await,
    );
    drop(sockets);
    tokio::time::sleep(Duration::from_secs(2)).await;
    out.set(
        &format!("{prefix}healthz_ms_after_release"),
        healthz_ms(s).await,
    );
    // Cumulative over the server's life: the second phase's figures include the first's.
    let mut refused = Vec::new();
    for reason in [
        "per_ip",
        "global",
        "reserve_only",
        "accept_error",
        "header_timeout",
    ] {
        let label = format!("reason=\"{reason}\"");
        let n = harness::counter_sum(s, "sluice_connections_rejected_total", &[&label]).await;
        refused.push(format!("{reason} {n}"));
    }
    out.set(&format!("{prefix}rejected_so_far"), refused.join(", "));
}

/// Under a descriptor limit, one client (from 127.0.0.2) holding more idle sockets than the
/// limit: do `/healthz`, `/v1/check` and the gRPC port still answer other clients (probes from
/// 127.0.0.1), and how many of the attacker's sockets does the server keep open? Then the same
/// sockets from 5 addresses (below the per-client cap each), against the global cap and its
/// reserve (figures prefixed `spread_`).
pub(crate) async fn descriptors(a: &Args) -> Outcome {
    let (limit, idle) = if a.quick { (256, 300) } else { (1_024, 1_100) };
    let mut out = Outcome::new(
        "descriptors",
        format!("{idle} idle sockets from 127.0.0.2, then from 5 addresses; limit {limit}"),
    );
    let launch = Launch {
        nofile: Some(limit),
        ..Launch::default()
    };
    let mut s = match start(a, &launch).await {
        Ok(s) => s,
        Err(e) => {
            out.set("error", e);
            return out;
        }
    };
    idle_phase(&s, &mut out, "", idle, 1).await;
    idle_phase(&s, &mut out, "spread_", idle, 5).await;
    out.set("server_running", s.is_running());
    out
}

/// Thousands of unfinished 380 KB request heads from 40 source addresses (so the per-client cap
/// does not refuse them before the head-size limit is reached): peak server RSS, and RSS after
/// the clients have gone.
pub(crate) async fn big_heads(a: &Args) -> Outcome {
    let (count, kb) = if a.quick {
        (200usize, 380usize)
    } else {
        (5_000, 380)
    };
    let mut out = Outcome::new("big-heads", format!("{count} heads of {kb} KB"));
    let s = match start(a, &Launch::default()).await {
        Ok(s) => s,
        Err(e) => {
            out.set("error", e);
            return out;
        }
    };
    let mut head = b"GET /healthz HTTP/1.1\r\nhost: sluice\r\nx-pad: ".to_vec();
    head.resize(kb * 1024, b'a');
    let head = Arc::new(head);
    out.set("rss_mb_before", s.rss_mb().round());

    let pid = s.pid();
    let peak = Arc::new(Mutex::new(0.0f64));
    let sampling = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let sampler = {
        let (peak, sampling) = (Arc::clone(&peak), Arc::clone(&sampling));
        tokio::spawn(async move {
            while sampling.load(Ordering::Relaxed) {
                let status =
                    std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
                let rss = status
                    .lines()
                    .find_map(|l| l.strip_prefix("VmRSS:"))
                    .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
                    .unwrap_or(0.0)
                    / 1024.0;
                {
                    let mut p = peak.lock();
                    *p = p.max(rss);
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        })
    };

    let deadline = Instant::now() + Duration::from_secs(if a.quick { 30 } else { 240 });
    let held = Arc::new(Mutex::new(Vec::with_capacity(count)));
    let refused = Arc::new(AtomicU64::new(0));
    let next = Arc::new(AtomicU64::new(0));
    let t = Instant::now();
    let mut tasks = Vec::new();
    let sources = Arc::new(AtomicU64::new(0));
    for _ in 0..64 {
        let (held, refused, next, head, addr, sources) = (
            Arc::clone(&held),
            Arc::clone(&refused),
            Arc::clone(&next),
            Arc::clone(&head),
            s.http,
            Arc::clone(&sources),
        );
        tasks.push(tokio::spawn(async move {
            while next.fetch_add(1, Ordering::Relaxed) < count as u64 && Instant::now() < deadline {
                let from = harness::attacker_ip(
                    sources.fetch_add(1, Ordering::Relaxed) as usize % SOURCES,
                );
                let sent = tokio::time::timeout(Duration::from_secs(10), async {
                    let mut c = harness::connect_from(Some(from), addr).await?;
                    c.write_all(&head).await?;
                    Ok::<TcpStream, std::io::Error>(c)
                })
                .await;
                match sent {
                    Ok(Ok(c)) => held.lock().push(c),
                    _ => {
                        refused.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
        }));
    }
    for t in tasks {
        let _ = t.await;
    }
    out.set(
        "send_seconds",
        (t.elapsed().as_secs_f64() * 10.0).round() / 10.0,
    );
    out.set("heads_sent", held.lock().len() as u64);
    out.set("heads_refused", refused.load(Ordering::Relaxed));
    tokio::time::sleep(Duration::from_secs(3)).await;
    out.set("healthz_ms_while_held", healthz_ms(&s).await);
    let peak_rss = peak.lock().max(s.peak_rss_mb());
    out.set("peak_rss_mb", peak_rss.round());
    held.lock().clear();
    tokio::time::sleep(Duration::from_secs(5)).await;
    sampling.store(false, Ordering::Relaxed);
    let _ = sampler.await;
    out.set("rss_mb_after_client_left", s.rss_mb().round());
    out
}

/// One app host (127.0.0.1) with a pool of kept-alive connections to one instance on default
/// settings: 300 connections, then 600, 3,000 checks each time. The figure is the transport
/// errors (closed without an answer): a fixed per-address cap of 256 caused 308 at 300
/// connections and 46 % of requests at 600.
pub(crate) async fn pooled_host(a: &Args) -> Outcome {
    const REQUESTS: usize = 3_000;
    let mut out = Outcome::new(
        "pooled-host",
        format!("300 and 600 kept-alive connections from one address, {REQUESTS} checks each"),
    );
    let s = match start(a, &Launch::default()).await {
        Ok(s) => s,
        Err(e) => {
            out.set("error", e);
            return out;
        }
    };
    for conns in [300usize, 600] {
        let per_conn = REQUESTS / conns;
        let ok = Arc::new(AtomicU64::new(0));
        let transport = Arc::new(AtomicU64::new(0));
        let mut tasks = Vec::with_capacity(conns);
        for i in 0..conns {
            let (ok, transport, addr) = (Arc::clone(&ok), Arc::clone(&transport), s.http);
            tasks.push(tokio::spawn(async move {
                let body = format!(r#"{{"policy":"burst","identity":"pool-{i}"}}"#);
                let req = harness::request("POST", "/v1/check", Some(&body), &[]);
                let Ok(mut c) = harness::Conn::open(addr, PROBE_TIMEOUT).await else {
                    transport.fetch_add(per_conn as u64, Ordering::Relaxed);
                    return;
                };
                for done in 0..per_conn {
                    match c.exchange(std::slice::from_ref(&req), PROBE_TIMEOUT).await {
                        Ok(_) => {
                            ok.fetch_add(1, Ordering::Relaxed);
                        }
                        Err(_) => {
                            transport.fetch_add((per_conn - done) as u64, Ordering::Relaxed);
                            return;
                        }
                    }
                }
            }));
        }
        let t = Instant::now();
        for task in tasks {
            let _ = task.await;
        }
        out.set(&format!("answered_at_{conns}"), ok.load(Ordering::Relaxed));
        out.set(
            &format!("transport_errors_at_{conns}"),
            transport.load(Ordering::Relaxed),
        );
        out.set(
            &format!("seconds_at_{conns}"),
            (t.elapsed().as_secs_f64() * 10.0).round() / 10.0,
        );
    }
    out.set(
        "rejected_per_ip",
        harness::counter_sum(
            &s,
            "sluice_connections_rejected_total",
            &["reason=\"per_ip\""],
        )
        .await,
    );
    out
}

/// Keeps one slow body going from `from` until `end`: a `/v1/check` head announcing 10,000
/// bytes, then one byte a second; when the server ends it, reconnects after 200 ms.
async fn slow_body_client(from: IpAddr, addr: std::net::SocketAddr, end: Instant) {
    let head = b"POST /v1/check HTTP/1.1\r\nhost: sluice\r\ncontent-type: application/json\r\ncontent-length: 10000\r\n\r\n{";
    while Instant::now() < end {
        let connect = harness::connect_from(Some(from), addr);
        if let Ok(Ok(mut c)) = tokio::time::timeout(PROBE_TIMEOUT, connect).await
            && c.write_all(head).await.is_ok()
        {
            let mut buf = [0u8; 1024];
            while Instant::now() < end {
                tokio::select! {
                    // An answer (408, 503) or a close: the server let go of this body.
                    _ = c.read(&mut buf) => break,
                    () = tokio::time::sleep(Duration::from_secs(1)) => {
                        if c.write_all(b" ").await.is_err() {
                            break;
                        }
                    }
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// 1,100 slow request bodies from 5 addresses (220 each, under the per-address connection
/// cap) against a descriptor limit of 1,024, the attacker reconnecting whenever a body is
/// ended; a check from 127.0.0.1 every 500 ms on a fresh connection. The figure is the share
/// of checks answered `200` within 1 s (the finding: 1 of 23 over 45 s).
pub(crate) async fn slow_bodies(a: &Args) -> Outcome {
    let (limit, bodies, secs) = if a.quick {
        (256u64, 275usize, 12u64)
    } else {
        (1_024, 1_100, 45)
    };
    let mut out = Outcome::new(
        "slow-bodies",
        format!("{bodies} slow bodies from 5 addresses, {secs} s; limit {limit}"),
    );
    let launch = Launch {
        nofile: Some(limit),
        ..Launch::default()
    };
    let s = match start(a, &launch).await {
        Ok(s) => s,
        Err(e) => {
            out.set("error", e);
            return out;
        }
    };
    let end = Instant::now() + Duration::from_secs(secs);
    let attackers: Vec<_> = (0..bodies)
        .map(|i| tokio::spawn(slow_body_client(harness::attacker_ip(i % 5), s.http, end)))
        .collect();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (mut probes, mut answered) = (0u64, 0u64);
    let mut slowest_ms = 0u64;
    while Instant::now() + Duration::from_secs(1) < end {
        let t = Instant::now();
        probes += 1;
        if let Ok(r) = harness::check(s.http, CHECK, Duration::from_secs(1)).await
            && r.status == 200
        {
            answered += 1;
            slowest_ms = slowest_ms.max(t.elapsed().as_millis() as u64);
        }
        tokio::time::sleep(Duration::from_millis(500).saturating_sub(t.elapsed())).await;
    }
    out.set(
        "checks_answered_within_1s",
        format!("{answered} of {probes}"),
    );
    out.set(
        "answered_pct",
        (answered as f64 * 1000.0 / probes.max(1) as f64).round() / 10.0,
    );
    out.set("slowest_answer_ms", slowest_ms);
    for reason in [
        "body_too_slow",
        "bodies_per_ip",
        "reserve_only",
        "global",
        "displaced",
    ] {
        let label = format!("reason=\"{reason}\"");
        out.set(
            &format!("rejected_{reason}"),
            harness::counter_sum(&s, "sluice_connections_rejected_total", &[&label]).await,
        );
    }
    for t in attackers {
        let _ = t.await;
    }
    out
}
