//! Faults against the `sluice` facade on real servers: Redis killed mid-load and restarted,
//! paused with `CLIENT PAUSE`, `SCRIPT FLUSH` mid-load, `maxmemory` reached, a Cluster master
//! killed. For each: no call waits longer than the configured timeout plus a small margin; the
//! policy's failure mode is applied; enforcement resumes within 1 s of recovery (the circuit
//! breaker probes back); no task panics; no concurrency lease outlives its timeout.
//!
//! The figures printed with `[reliability]` are the ones in `docs/reliability.md`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use sluice::{Algorithm, FailureMode, Identity, Limiter, Policy, Rate, Verdict};
use sluice_core::key::key_slot;
use sluice_reliability::{Outcome, Tally, record};
use sluice_testkit::servers::{RedisCluster, RedisServer};

/// The store timeout every test configures.
const TIMEOUT: Duration = Duration::from_millis(50);
/// Scheduling slack allowed on top of the timeout (a busy 2-core CI machine, several test
/// binaries at once). The measured worst cases are far below; see docs/reliability.md.
const MARGIN: Duration = Duration::from_millis(150);
/// Enforcement must resume this soon after the store is back.
const RECOVERY: Duration = Duration::from_secs(1);

fn policy(name: &str, mode: FailureMode, algorithm: Algorithm) -> Arc<Policy> {
    let mut p = Policy::new(name, algorithm).unwrap();
    p.failure_mode = mode;
    Arc::new(p)
}

/// Large enough never to deny during a load phase, so every outcome is about the store.
fn roomy() -> Algorithm {
    Algorithm::TokenBucket {
        capacity: 1_000_000,
        rate: Rate::per_second(1000),
    }
}

async fn limiter(url: &str) -> Limiter {
    let options = sluice::StoreOptions {
        timeout: TIMEOUT,
        ..Default::default()
    };
    Limiter::connect(url, options).await.expect("connect")
}

/// Runs `tasks` tasks checking `policy` (one identity per task) for `dur`, at most 5,000 calls
/// each. Every task is joined, so a panic fails the test.
async fn load(l: &Limiter, policy: &Arc<Policy>, tasks: usize, dur: Duration) -> Tally {
    let mut handles = Vec::new();
    for t in 0..tasks {
        let (l, policy) = (l.clone(), Arc::clone(policy));
        handles.push(tokio::spawn(async move {
            let id = Identity::new(format!("load:{t}:{}", policy.name));
            let mut tally = Tally::default();
            let end = Instant::now() + dur;
            for _ in 0..5_000 {
                if Instant::now() >= end {
                    break;
                }
                let start = Instant::now();
                let c = l.check(&id, &policy, 1).await;
                tally.add(start.elapsed(), Outcome::of(&c));
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
            tally
        }));
    }
    let mut total = Tally::default();
    for h in handles {
        total.merge(&h.await.expect("no load task panics"));
    }
    total
}

/// Polls until a check is decided by the store again; returns how long that took.
async fn time_to_recover(l: &Limiter, policy: &Arc<Policy>) -> Duration {
    let start = Instant::now();
    let id = Identity::new("recovery-probe");
    for _ in 0..1_000 {
        let c = l.check(&id, policy, 1).await;
        if c.verdict == Verdict::Decided {
            return start.elapsed();
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "no recovery within 10 s"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    start.elapsed()
}

/// After recovery the limit is enforced: a fresh identity gets exactly `limit` admissions.
async fn assert_enforced(l: &Limiter, tag: &str) {
    let p = policy(
        &format!("enf-{tag}"),
        FailureMode::Closed,
        Algorithm::FixedWindow {
            limit: 3,
            window_ms: 3_600_000,
        },
    );
    let id = Identity::new(format!("enforced:{tag}:{}", rand::random::<u64>()));
    let mut admitted = 0;
    for _ in 0..5 {
        let c = l.check(&id, &p, 1).await;
        assert_eq!(
            c.verdict,
            Verdict::Decided,
            "{tag}: store answers after recovery"
        );
        admitted += u64::from(c.allowed);
    }
    assert_eq!(admitted, 3, "{tag}: the limit holds after recovery");
}

fn assert_bounded(t: &Tally, what: &str) {
    assert!(
        t.worst <= TIMEOUT + MARGIN,
        "{what}: a call took {:?} (timeout {TIMEOUT:?})",
        t.worst
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_killed_mid_load_then_restarted() {
    let mut server = RedisServer::redis();
    let l = limiter(&server.url()).await;
    let open = policy("kill-open", FailureMode::Open, roomy());
    let closed = policy("kill-closed", FailureMode::Closed, roomy());

    let healthy = load(&l, &open, 2, Duration::from_millis(300)).await;
    assert_eq!(healthy.allowed, healthy.requests);

    // Kill in the middle of a load phase.
    let (lo, lc) = (l.clone(), l.clone());
    let (o, c) = (Arc::clone(&open), Arc::clone(&closed));
    let during_open =
        tokio::spawn(async move { load(&lo, &o, 2, Duration::from_millis(1500)).await });
    let during_closed =
        tokio::spawn(async move { load(&lc, &c, 2, Duration::from_millis(1500)).await });
    tokio::time::sleep(Duration::from_millis(200)).await;
    server.stop();
    let (during_open, during_closed) = (during_open.await.unwrap(), during_closed.await.unwrap());
    record(&during_open.line("kill (fail open)"));
    record(&during_closed.line("kill (fail closed)"));
    assert_bounded(&during_open, "kill, open");
    assert_bounded(&during_closed, "kill, closed");
    assert!(
        during_open.failed_open > 0 && during_open.denied == 0 && during_open.failed_closed == 0
    );
    assert!(during_closed.failed_closed > 0 && during_closed.failed_open == 0);
    assert!(
        l.store_circuit_open(),
        "the breaker opened while the store was down"
    );

    // Stay down long enough for the breaker's back-off to grow to its maximum.
    let down = load(&l, &closed, 2, Duration::from_secs(6)).await;
    record(&down.line("kill, 6 s more down (fail closed)"));
    assert_bounded(&down, "long outage");
    assert_eq!(down.failed_closed, down.requests);

    server.restart();
    let took = time_to_recover(&l, &open).await;
    record(&format!(
        "kill: enforcement resumed {:.0} ms after the restarted server answered PING",
        took.as_secs_f64() * 1000.0
    ));
    assert!(took < RECOVERY, "recovery took {took:?}");
    assert_enforced(&l, "kill").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_paused_then_unpaused() {
    let server = RedisServer::redis();
    let l = limiter(&server.url()).await;
    let open = policy("pause-open", FailureMode::Open, roomy());
    let closed = policy("pause-closed", FailureMode::Closed, roomy());
    // Concurrency leases taken while the server is paused: calls that time out may still run
    // once it resumes, taking a lease nobody holds. Each must expire after its lease time.
    let lease_ms = 1500;
    let conc = policy(
        "pause-conc",
        FailureMode::Closed,
        Algorithm::Concurrency { limit: 4, lease_ms },
    );

    let pause_ms = 1200;
    let paused_at = Instant::now();
    let out = server.cli(&["CLIENT", "PAUSE", &pause_ms.to_string(), "ALL"]);
    assert!(out.contains("OK"), "CLIENT PAUSE: {out}");
    let (lo, lc) = (l.clone(), l.clone());
    let (o, c) = (Arc::clone(&open), Arc::clone(&closed));
    let a = tokio::spawn(async move { load(&lo, &o, 2, Duration::from_millis(900)).await });
    let b = tokio::spawn(async move { load(&lc, &c, 2, Duration::from_millis(900)).await });
    // Lease attempts during the pause.
    let mut phantom_attempts = 0;
    for _ in 0..6 {
        let c = l.check(&Identity::new("conc"), &conc, 1).await;
        assert!(
            matches!(c.verdict, Verdict::FailedClosed(_)),
            "the paused server cannot answer: {c:?}"
        );
        phantom_attempts += 1;
    }
    let (a, b) = (a.await.unwrap(), b.await.unwrap());
    record(&a.line("CLIENT PAUSE (fail open)"));
    record(&b.line("CLIENT PAUSE (fail closed)"));
    assert_bounded(&a, "pause, open");
    assert_bounded(&b, "pause, closed");
    assert!(a.failed_open > 0 && b.failed_closed > 0);

    // Wait for the pause to end, then time the recovery from that moment.
    let resume = paused_at + Duration::from_millis(pause_ms);
    tokio::time::sleep(resume.saturating_duration_since(Instant::now())).await;
    let took = time_to_recover(&l, &open).await;
    record(&format!(
        "CLIENT PAUSE: enforcement resumed {:.0} ms after the pause ended",
        took.as_secs_f64() * 1000.0
    ));
    assert!(took < RECOVERY, "recovery took {took:?}");
    assert_enforced(&l, "pause").await;

    // Leases: whatever the queued calls took is gone after the lease time; then the full
    // limit is available and releases work.
    tokio::time::sleep(Duration::from_millis(lease_ms + 100)).await;
    let mut held = Vec::new();
    for _ in 0..4 {
        let c = l.check(&Identity::new("conc"), &conc, 1).await;
        assert!(
            c.allowed,
            "a lease slot is still taken after the lease timeout: {c:?}"
        );
        held.extend(c.leases);
    }
    assert!(
        !l.check(&Identity::new("conc"), &conc, 1).await.allowed,
        "the limit of 4 holds"
    );
    for lease in &held {
        assert!(l.release(lease).await.unwrap(), "lease released");
    }
    assert!(
        l.check(&Identity::new("conc"), &conc, 1).await.allowed,
        "released leases are free again"
    );
    record(&format!(
        "CLIENT PAUSE: {phantom_attempts} lease attempts during the pause; all 4 slots free {lease_ms} ms after"
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn script_flush_mid_load_is_invisible_and_exact() {
    let server = RedisServer::redis();
    let l = limiter(&server.url()).await;
    let limit = 400;
    let p = policy(
        "flush",
        FailureMode::Closed,
        Algorithm::FixedWindow {
            limit,
            window_ms: 3_600_000,
        },
    );
    let id = Identity::new("flush:shared");
    let mut handles = Vec::new();
    for _ in 0..4 {
        let (l, p, id) = (l.clone(), Arc::clone(&p), id.clone());
        handles.push(tokio::spawn(async move {
            let mut t = Tally::default();
            for _ in 0..150 {
                let start = Instant::now();
                let c = l.check(&id, &p, 1).await;
                t.add(start.elapsed(), Outcome::of(&c));
            }
            t
        }));
    }
    for _ in 0..5 {
        tokio::time::sleep(Duration::from_millis(15)).await;
        assert!(server.cli(&["SCRIPT", "FLUSH"]).contains("OK"));
    }
    let mut total = Tally::default();
    for h in handles {
        total.merge(&h.await.unwrap());
    }
    record(&total.line("SCRIPT FLUSH x5 mid-load"));
    assert_eq!(
        total.failed_closed + total.failed_open,
        0,
        "no caller sees a flush"
    );
    assert_eq!(total.allowed, limit, "exactly the limit admitted");
    assert_eq!(total.denied, 600 - limit);
    assert_bounded(&total, "flush");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn maxmemory_reached_applies_the_failure_mode_then_recovers() {
    let server = RedisServer::redis();
    let l = limiter(&server.url()).await;
    let open = policy("oom-open", FailureMode::Open, roomy());
    let closed = policy("oom-closed", FailureMode::Closed, roomy());
    assert!(load(&l, &open, 1, Duration::from_millis(100)).await.allowed > 0);

    // 1 MB with noeviction: Redis 7's baseline is about that, so writes fail at once.
    assert!(
        server
            .cli(&["CONFIG", "SET", "maxmemory-policy", "noeviction"])
            .contains("OK")
    );
    assert!(
        server
            .cli(&["CONFIG", "SET", "maxmemory", "1mb"])
            .contains("OK")
    );
    let reply = server.cli(&["SET", "filler", "x"]);
    assert!(reply.contains("OOM"), "the server refuses writes: {reply}");

    let a = load(&l, &open, 2, Duration::from_millis(600)).await;
    let b = load(&l, &closed, 2, Duration::from_millis(600)).await;
    record(&a.line("maxmemory 1mb noeviction (fail open)"));
    record(&b.line("maxmemory 1mb noeviction (fail closed)"));
    assert_bounded(&a, "oom, open");
    assert_bounded(&b, "oom, closed");
    assert_eq!(a.failed_open, a.requests, "every check fails open");
    assert_eq!(b.failed_closed, b.requests, "every check fails closed");

    assert!(
        server
            .cli(&["CONFIG", "SET", "maxmemory", "0"])
            .contains("OK")
    );
    let took = time_to_recover(&l, &open).await;
    record(&format!(
        "maxmemory: enforcement resumed {:.0} ms after the limit was lifted",
        took.as_secs_f64() * 1000.0
    ));
    assert!(took < RECOVERY, "recovery took {took:?}");
    assert_enforced(&l, "oom").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_master_killed_fails_over_and_enforcement_resumes() {
    let mut cluster = RedisCluster::start();
    let l = limiter(&cluster.url()).await;
    let open = policy("cl-open", FailureMode::Open, roomy());
    let closed = policy("cl-closed", FailureMode::Closed, roomy());
    // The identity of task 0 of the open policy decides which master dies.
    let victim_key = l
        .key_scheme()
        .key(&Identity::new("load:0:cl-open"), "cl-open");
    let slot = key_slot(victim_key.as_bytes());
    let victim = cluster
        .master_of_slot(slot)
        .expect("a master serves the slot");

    assert_eq!(
        load(&l, &open, 2, Duration::from_millis(200))
            .await
            .failed_open,
        0
    );
    let (lo, lc) = (l.clone(), l.clone());
    let (o, c) = (Arc::clone(&open), Arc::clone(&closed));
    let a = tokio::spawn(async move { load(&lo, &o, 4, Duration::from_millis(2500)).await });
    let b = tokio::spawn(async move { load(&lc, &c, 4, Duration::from_millis(2500)).await });
    tokio::time::sleep(Duration::from_millis(150)).await;
    let killed_at = Instant::now();
    cluster.kill(victim);
    let (a, b) = (a.await.unwrap(), b.await.unwrap());
    record(&a.line("Cluster master killed (fail open, 4 identities)"));
    record(&b.line("Cluster master killed (fail closed, 4 identities)"));
    assert_bounded(&a, "cluster, open");
    assert_bounded(&b, "cluster, closed");
    assert!(
        a.failed_open > 0,
        "checks on the dead master's slots failed open"
    );
    assert_eq!(a.failed_closed + b.failed_open, 0);

    cluster.wait_failover(slot, victim, Duration::from_secs(30));
    let failover = killed_at.elapsed();
    let took = time_to_recover(&l, &open).await;
    // The probe identity may live on another master; check the victim's slot itself too.
    let start = Instant::now();
    let victim_id = Identity::new("load:0:cl-open");
    loop {
        if l.check(&victim_id, &open, 1).await.verdict == Verdict::Decided {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "the failed-over slot never answered"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let took = took.max(start.elapsed());
    record(&format!(
        "Cluster: replica promoted {:.1} s after the kill; enforcement resumed {:.0} ms after the failover",
        failover.as_secs_f64(),
        took.as_secs_f64() * 1000.0
    ));
    assert!(took < RECOVERY, "recovery took {took:?}");
    assert_enforced(&l, "cluster").await;
}
