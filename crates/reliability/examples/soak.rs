//! The soak driver behind `scripts/soak`: mixed load over many identities for a bounded time
//! on one store, with a report line every interval and a verdict at the end.
//!
//! ```text
//! cargo run --release -p sluice-reliability --example soak -- \
//!     --store memory|redis://127.0.0.1:6379 --seconds 600 --identities 1000000
//! ```
//!
//! Load: `--tasks` workers pick random identities out of `--identities` and check one of five
//! policies (token bucket, GCRA, fixed window, sliding counter, sliding log) with a random cost
//! 0..=3, as fast as the store answers. Beside it, 64 *tracked* identities each hammer a token
//! bucket of 500 that refills 1 per day, so the arithmetic is exact: each must end with exactly
//! `min(attempts, 500)` admitted; and 8 workers take and release concurrency leases (limit 4),
//! which must all be free at the end.
//!
//! Reported: checks/s, process RSS, keys held (embedded: `MemoryStore::len`; Redis: `DBSIZE`),
//! Redis `used_memory` and `connected_clients`, open file descriptors, live tokio tasks.
#![forbid(unsafe_code)]

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use sluice::{
    Algorithm, FailureMode, Identity, Limiter, Policy, Rate, Store, StoreOptions, Verdict,
};
use sluice_memory::MemoryStore;

struct Args {
    store: String,
    seconds: u64,
    identities: u64,
    tasks: usize,
    every: u64,
    max_keys: usize,
}

fn args() -> Args {
    let mut a = Args {
        store: "memory".into(),
        seconds: 600,
        identities: 1_000_000,
        tasks: 32,
        every: 30,
        max_keys: 1_000_000,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut val = || it.next().unwrap_or_else(|| panic!("{flag} needs a value"));
        match flag.as_str() {
            "--store" => a.store = val(),
            "--seconds" => a.seconds = val().parse().expect("--seconds N"),
            "--identities" => a.identities = val().parse().expect("--identities N"),
            "--tasks" => a.tasks = val().parse().expect("--tasks N"),
            "--every" => a.every = val().parse().expect("--every SECONDS"),
            "--max-keys" => a.max_keys = val().parse().expect("--max-keys N"),
            other => panic!("unknown flag {other}"),
        }
    }
    a
}

fn policy(name: &str, algorithm: Algorithm) -> Arc<Policy> {
    let mut p = Policy::new(name, algorithm).expect("valid policy");
    p.failure_mode = FailureMode::Closed;
    Arc::new(p)
}

fn rss_mb() -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .map_or(0.0, |kb| kb / 1024.0)
}

fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd")
        .map(|d| d.count())
        .unwrap_or(0)
}

fn redis_port(url: &str) -> Option<u16> {
    url.strip_prefix("redis://")?
        .rsplit(':')
        .next()?
        .trim_end_matches('/')
        .parse()
        .ok()
}

fn redis_info(port: u16) -> (u64, u64, u64) {
    let cli = |args: &[&str]| {
        std::process::Command::new("redis-cli")
            .args(["-h", "127.0.0.1", "-p", &port.to_string()])
            .args(args)
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .unwrap_or_default()
    };
    let keys = cli(&["DBSIZE"]).trim().parse().unwrap_or(0);
    let info = cli(&["INFO"]);
    let field = |name: &str| {
        info.lines()
            .find_map(|l| l.strip_prefix(&format!("{name}:")))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0)
    };
    (keys, field("used_memory"), field("connected_clients"))
}

#[derive(Debug, Default)]
struct Counters {
    checks: AtomicU64,
    allowed: AtomicU64,
    failed: AtomicU64,
}

#[derive(Debug, Clone, Copy)]
struct Sample {
    rss: f64,
    keys: u64,
    redis_mem: u64,
    clients: u64,
    fds: usize,
    tasks: usize,
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let a = args();
    let memory = (a.store == "memory")
        .then(|| Arc::new(MemoryStore::builder().max_keys(a.max_keys).build()));
    let limiter = match &memory {
        Some(m) => Limiter::builder(Arc::clone(m) as Arc<dyn Store>)
            .timeout(Duration::from_millis(200))
            .build(),
        None => Limiter::connect(
            &a.store,
            StoreOptions {
                timeout: Duration::from_millis(200),
                ..Default::default()
            },
        )
        .await
        .expect("connect to the store"),
    };
    let port = redis_port(&a.store);
    let run_id = format!("{:08x}", rand::random::<u32>());
    println!(
        "soak: store {} for {} s, {} identities, {} workers, run {run_id}",
        sluice::url::redact(&a.store),
        a.seconds,
        a.identities,
        a.tasks
    );

    let mixed = Arc::new([
        policy(
            "soak-tb",
            Algorithm::TokenBucket {
                capacity: 5,
                rate: Rate::per_second(1),
            },
        ),
        policy(
            "soak-gcra",
            Algorithm::Gcra {
                rate: Rate::per_second(2),
                burst: 3,
            },
        ),
        policy(
            "soak-fw",
            Algorithm::FixedWindow {
                limit: 5,
                window_ms: 10_000,
            },
        ),
        policy(
            "soak-swc",
            Algorithm::SlidingWindowCounter {
                limit: 5,
                window_ms: 10_000,
            },
        ),
        policy(
            "soak-swl",
            Algorithm::SlidingWindowLog {
                limit: 3,
                window_ms: 5_000,
            },
        ),
    ]);
    let tracked_limit = 500;
    let tracked_policy = policy(
        "soak-tracked",
        Algorithm::TokenBucket {
            capacity: tracked_limit,
            rate: Rate::new(1, 86_400_000),
        },
    );
    let conc_policy = policy(
        "soak-conc",
        Algorithm::Concurrency {
            limit: 4,
            lease_ms: 60_000,
        },
    );

    let stop = Arc::new(AtomicBool::new(false));
    let counters = Arc::new(Counters::default());
    let deadline = Instant::now() + Duration::from_secs(a.seconds);
    let mut workers = Vec::new();
    for w in 0..a.tasks {
        let (limiter, mixed, stop, counters) = (
            limiter.clone(),
            Arc::clone(&mixed),
            Arc::clone(&stop),
            Arc::clone(&counters),
        );
        let n = a.identities;
        workers.push(tokio::spawn(async move {
            let mut i: u64 = 0;
            while !stop.load(Ordering::Relaxed) && Instant::now() < deadline {
                let r: u64 = rand::random();
                let id = Identity::new(format!("soak:{}", r % n));
                let p = &mixed[((r >> 32) % 5) as usize];
                let cost = (r >> 48) % 4;
                let c = limiter.check(&id, p, cost).await;
                counters.checks.fetch_add(1, Ordering::Relaxed);
                if c.allowed {
                    counters.allowed.fetch_add(1, Ordering::Relaxed);
                }
                if c.verdict != Verdict::Decided {
                    counters.failed.fetch_add(1, Ordering::Relaxed);
                }
                i += 1;
                if i.is_multiple_of(64) {
                    tokio::task::yield_now().await;
                }
            }
            w
        }));
    }
    // Tracked identities: attempts and admissions per identity.
    let mut tracked = Vec::new();
    for t in 0..64 {
        let (limiter, p, stop) = (
            limiter.clone(),
            Arc::clone(&tracked_policy),
            Arc::clone(&stop),
        );
        let id = Identity::new(format!("soak-tracked:{run_id}:{t}"));
        tracked.push(tokio::spawn(async move {
            let (mut attempts, mut admitted, mut failed) = (0u64, 0u64, 0u64);
            while !stop.load(Ordering::Relaxed) && Instant::now() < deadline && attempts < 100_000 {
                let c = limiter.check(&id, &p, 1).await;
                attempts += 1;
                admitted += u64::from(c.allowed && c.verdict == Verdict::Decided);
                failed += u64::from(c.verdict != Verdict::Decided);
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            (attempts, admitted, failed)
        }));
    }
    // Concurrency: take a lease, hold it briefly, release it.
    let mut leasers = Vec::new();
    for w in 0..8 {
        let (limiter, p, stop) = (limiter.clone(), Arc::clone(&conc_policy), Arc::clone(&stop));
        let id = Identity::new(format!("soak-conc:{run_id}"));
        leasers.push(tokio::spawn(async move {
            let (mut taken, mut release_errors) = (0u64, 0u64);
            while !stop.load(Ordering::Relaxed) && Instant::now() < deadline {
                let c = limiter.check(&id, &p, 1).await;
                if c.allowed {
                    taken += c.leases.len() as u64;
                    tokio::time::sleep(Duration::from_millis(1 + w)).await;
                    for l in &c.leases {
                        if limiter.release(l).await != Ok(true) {
                            release_errors += 1;
                        }
                    }
                } else {
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
            }
            (taken, release_errors)
        }));
    }

    let sample = || {
        let (keys, redis_mem, clients) = match (&memory, port) {
            (Some(m), _) => (m.len() as u64, 0, 0),
            (None, Some(p)) => redis_info(p),
            _ => (0, 0, 0),
        };
        Sample {
            rss: rss_mb(),
            keys,
            redis_mem,
            clients,
            fds: open_fds(),
            tasks: tokio::runtime::Handle::current()
                .metrics()
                .num_alive_tasks(),
        }
    };
    let start = Instant::now();
    let mut samples: Vec<(u64, Sample)> = Vec::new();
    let mut last_checks = 0;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        tokio::time::sleep(left.min(Duration::from_secs(a.every))).await;
        let s = sample();
        let checks = counters.checks.load(Ordering::Relaxed);
        let elapsed = start.elapsed().as_secs();
        println!(
            "t={elapsed:>4}s checks={checks} ({:.0}/s) allowed={} failed={} rss={:.1}MB keys={} redis_used_memory={:.1}MB redis_clients={} fds={} tasks={}",
            (checks - last_checks) as f64 / a.every.max(1) as f64,
            counters.allowed.load(Ordering::Relaxed),
            counters.failed.load(Ordering::Relaxed),
            s.rss,
            s.keys,
            s.redis_mem as f64 / 1048576.0,
            s.clients,
            s.fds,
            s.tasks
        );
        last_checks = checks;
        samples.push((elapsed, s));
        if Instant::now() >= deadline {
            break;
        }
    }
    stop.store(true, Ordering::Relaxed);
    for w in workers {
        w.await.expect("worker panicked");
    }
    let mut ok = true;
    let (mut attempts, mut admitted, mut expected, mut failed) = (0, 0, 0, 0);
    for t in tracked {
        let (att, adm, f) = t.await.expect("tracked worker panicked");
        attempts += att;
        admitted += adm;
        failed += f;
        expected += att.min(tracked_limit);
        if adm != att.min(tracked_limit) && f == 0 {
            ok = false;
        }
    }
    println!(
        "arithmetic: 64 tracked identities, {attempts} attempts, {admitted} admitted, expected min(attempts, {tracked_limit}) each = {expected}, {failed} store failures"
    );
    if admitted != expected {
        ok = false;
    }
    let (mut taken, mut release_errors) = (0, 0);
    for l in leasers {
        let (t, e) = l.await.expect("lease worker panicked");
        taken += t;
        release_errors += e;
    }
    // Every lease was released: all 4 slots are free.
    let mut held = Vec::new();
    for _ in 0..4 {
        let c = limiter
            .check(
                &Identity::new(format!("soak-conc:{run_id}")),
                &conc_policy,
                1,
            )
            .await;
        if !c.allowed {
            ok = false;
        }
        held.extend(c.leases);
    }
    for l in &held {
        let _ = limiter.release(l).await;
    }
    // A release that times out is not a leak: that lease expires after its lease time.
    println!(
        "leases: {taken} taken and released ({release_errors} releases failed and were left to expire); all 4 slots free at the end: {}",
        held.len() == 4
    );
    // Growth: compare the second quarter of the run with the end.
    if samples.len() >= 4 {
        let (t1, a1) = samples[samples.len() / 4];
        let (t2, a2) = *samples.last().expect("samples");
        println!(
            "growth from t={t1}s to t={t2}s: rss {:.1} -> {:.1} MB, keys {} -> {}, redis clients {} -> {}, fds {} -> {}, tasks {} -> {}",
            a1.rss,
            a2.rss,
            a1.keys,
            a2.keys,
            a1.clients,
            a2.clients,
            a1.fds,
            a2.fds,
            a1.tasks,
            a2.tasks
        );
        if a2.clients > a1.clients + 2 || a2.fds > a1.fds + 8 || a2.tasks > a1.tasks + 8 {
            println!("GROWTH: connections, descriptors or tasks grew");
            ok = false;
        }
        if a2.rss > a1.rss * 1.5 + 32.0 {
            println!("GROWTH: memory grew by more than half");
            ok = false;
        }
    }
    let total = counters.checks.load(Ordering::Relaxed);
    println!(
        "soak {}: {total} checks in {} s ({:.0}/s), {} store failures",
        if ok { "ok" } else { "FAILED" },
        start.elapsed().as_secs(),
        total as f64 / start.elapsed().as_secs_f64(),
        counters.failed.load(Ordering::Relaxed)
    );
    if !ok {
        std::process::exit(1);
    }
}
