//! Failures: a stopped server answers errors within the timeout; a restart and `SCRIPT
//! FLUSH` / `FUNCTION FLUSH` never show a caller NOSCRIPT (or a missing function); a killed
//! Cluster master is replaced by its replica and decisions continue.

use crate::support;

use sluice_core::key::key_slot;
use sluice_core::{Algorithm, CheckItem, Rate, Store, StoreError};
use sluice_redis::{RedisStore, ScriptMode};
use sluice_testkit::servers::{RedisCluster, RedisServer};
use std::sync::Arc;
use std::time::{Duration, Instant};

fn bucket() -> Algorithm {
    Algorithm::TokenBucket {
        capacity: 1_000_000,
        rate: Rate::per_second(1),
    }
}

async fn one(store: &RedisStore, key: &str, alg: &Algorithm) -> Result<bool, StoreError> {
    store
        .check(&[CheckItem {
            key,
            algorithm: alg,
            cost: 1,
        }])
        .await
        .map(|d| d.allowed)
}

fn is_availability_error(e: &StoreError) -> bool {
    matches!(e, StoreError::Timeout(_) | StoreError::Unavailable(_))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stopped_server_errors_within_the_timeout_and_restart_recovers_without_noscript() {
    let mut server = RedisServer::redis();
    let timeout = Duration::from_millis(50);
    let store = RedisStore::builder(server.url())
        .timeout(timeout)
        .connect()
        .await
        .unwrap();
    let alg = bucket();
    let key = "rl:{fault:1}:p";
    assert!(one(&store, key, &alg).await.unwrap());

    server.stop();
    let mut slowest = Duration::ZERO;
    for _ in 0..20 {
        let t = Instant::now();
        let r = one(&store, key, &alg).await;
        let took = t.elapsed();
        slowest = slowest.max(took);
        let e = r.expect_err("the server is down");
        assert!(is_availability_error(&e), "unexpected error {e:?}");
    }
    eprintln!("slowest error answer with the server down: {slowest:?} (timeout {timeout:?})");
    // The timeout bounds every call (plus scheduling slack on a busy 2-core machine).
    assert!(
        slowest < timeout + Duration::from_millis(100),
        "slowest {slowest:?}"
    );

    // Restarted empty: its script cache is empty, so EVALSHA answers NOSCRIPT; callers must
    // only ever see availability errors until the reconnect, then answers.
    server.restart();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match one(&store, key, &alg).await {
            Ok(allowed) => {
                assert!(allowed);
                break;
            }
            Err(e) => assert!(is_availability_error(&e), "caller saw {e:?}"),
        }
        assert!(Instant::now() < deadline, "no recovery within 10 s");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    for _ in 0..50 {
        assert!(one(&store, key, &alg).await.unwrap());
    }
}

/// `SCRIPT FLUSH` (or `FUNCTION FLUSH`) while 8 tasks check: no error reaches a caller, and the
/// admitted count is still exactly the limit. On a server of its own: the flushes would reach
/// every other test's scripts, and the command statistics read at the end must be this run's.
async fn flush_mid_run(mode: ScriptMode) {
    let server = RedisServer::redis();
    let store = Arc::new(
        RedisStore::builder(server.url())
            .timeout(Duration::from_secs(5))
            .mode(mode)
            .namespace(support::namespace("flush"))
            .connect()
            .await
            .unwrap(),
    );
    let limit = 300;
    let alg = Algorithm::FixedWindow {
        limit,
        window_ms: 1_000_000_000_000,
    };
    // The tasks keep checking until the flushes are over (at least 100 checks each, at most
    // 5,000), so the flushes always land mid-run whatever the machine's speed.
    let flushing = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let mut tasks = Vec::new();
    for _ in 0..8 {
        let (store, alg, flushing) = (store.clone(), alg.clone(), flushing.clone());
        tasks.push(tokio::spawn(async move {
            let mut admitted = 0u64;
            for i in 0..5_000 {
                if i >= 100 && !flushing.load(std::sync::atomic::Ordering::SeqCst) {
                    break;
                }
                admitted += u64::from(
                    one(&store, "rl:{flush}:p", &alg)
                        .await
                        .expect("no caller-visible error"),
                );
                tokio::task::yield_now().await;
            }
            admitted
        }));
    }
    // In script mode the batches of one policy run from the batch function library when
    // the server takes functions (src/store/call.rs), so both caches go, as in a restart.
    let flushes: &[&[&str]] = match mode {
        ScriptMode::Eval => &[&["SCRIPT", "FLUSH"], &["FUNCTION", "FLUSH"]],
        ScriptMode::Functions => &[&["FUNCTION", "FLUSH"]],
    };
    for _ in 0..10 {
        for flush in flushes {
            assert_eq!(server.cli(flush).trim(), "OK");
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // One more check after the last flush: the logic is certainly gone from the server now.
    let mut admitted = u64::from(
        one(&store, "rl:{flush}:p", &alg)
            .await
            .expect("no caller-visible error"),
    );
    flushing.store(false, std::sync::atomic::Ordering::SeqCst);
    for t in tasks {
        admitted += t.await.unwrap();
    }
    assert_eq!(admitted, limit);
    // The flushes did hit the run: the store had to reinstall its logic (EVAL fallback, or
    // FUNCTION LOAD beyond the one at connect).
    let stats = server.cli(&["INFO", "commandstats"]);
    let calls = |name: &str| {
        stats
            .lines()
            .find_map(|l| l.strip_prefix(&format!("cmdstat_{name}:calls=")))
            .and_then(|r| r.split(',').next())
            .and_then(|n| n.parse::<u64>().ok())
            .unwrap_or(0)
    };
    match mode {
        ScriptMode::Eval => assert!(
            calls("eval") + calls("function|load") > 1,
            "no EVAL fallback or reload seen:\n{stats}"
        ),
        ScriptMode::Functions => assert!(calls("function|load") > 1, "no reload seen:\n{stats}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn script_flush_mid_run_is_invisible() {
    flush_mid_run(ScriptMode::Eval).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn function_flush_mid_run_is_invisible() {
    flush_mid_run(ScriptMode::Functions).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_cluster_master_fails_over_and_decisions_continue() {
    let mut cluster = RedisCluster::start();
    let store = RedisStore::builder(cluster.url())
        .timeout(Duration::from_millis(500))
        .connect()
        .await
        .unwrap();
    let alg = bucket();
    let key = "rl:{user:42}:p";
    let slot = key_slot(key.as_bytes());
    for _ in 0..20 {
        assert!(one(&store, key, &alg).await.unwrap());
    }
    let master = cluster
        .master_of_slot(slot)
        .expect("a master serves the slot");
    cluster.kill(master);
    let killed = Instant::now();
    let mut errors = 0;
    let deadline = killed + Duration::from_secs(30);
    let mut ok_in_a_row = 0;
    while ok_in_a_row < 20 {
        match one(&store, key, &alg).await {
            Ok(allowed) => {
                assert!(allowed);
                ok_in_a_row += 1;
            }
            Err(e) => {
                assert!(is_availability_error(&e), "unexpected error {e:?}");
                errors += 1;
                ok_in_a_row = 0;
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
        assert!(
            Instant::now() < deadline,
            "decisions did not resume within 30 s ({errors} errors)"
        );
    }
    eprintln!(
        "failover: decisions resumed {:?} after the kill, {errors} errors meanwhile",
        killed.elapsed()
    );
    let new_master = cluster.master_of_slot(slot).expect("a promoted master");
    assert_ne!(new_master, master);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cross_slot_checks_are_refused_without_sending() {
    let store = RedisStore::builder(support::cluster().url())
        .timeout(Duration::from_secs(5))
        .connect()
        .await
        .unwrap();
    let alg = bucket();
    let (a, b) = ("rl:{user:1}:p", "rl:{user:2}:p");
    assert_ne!(key_slot(a.as_bytes()), key_slot(b.as_bytes()));
    let items = [
        CheckItem {
            key: a,
            algorithm: &alg,
            cost: 1,
        },
        CheckItem {
            key: b,
            algorithm: &alg,
            cost: 1,
        },
    ];
    assert!(matches!(
        store.check(&items).await,
        Err(StoreError::Invalid(_))
    ));
    assert!(store.requires_single_slot());
    // The same identity's limits share a slot and go in one call.
    let items = [
        CheckItem {
            key: "rl:{user:1}:minute",
            algorithm: &alg,
            cost: 1,
        },
        CheckItem {
            key: "rl:{user:1}:day",
            algorithm: &alg,
            cost: 1,
        },
    ];
    assert!(store.check(&items).await.unwrap().allowed);
}
