//! Redis commands per decision, measured with `INFO commandstats` on a fresh server, for the
//! admitted and the denied path of every algorithm (the numbers in `docs/redis.md`).

use sluice_core::{Algorithm, CheckItem, LeakyMode, Rate, Store};
use sluice_redis::RedisStore;
use sluice_testkit::servers::RedisServer;
use std::collections::BTreeMap;
use std::time::Duration;

fn stats(server: &RedisServer) -> BTreeMap<String, (u64, f64)> {
    let text = server.cli(&["INFO", "commandstats"]);
    let mut out = BTreeMap::new();
    for line in text.lines() {
        let Some(rest) = line.strip_prefix("cmdstat_") else {
            continue;
        };
        let Some((name, fields)) = rest.split_once(':') else {
            continue;
        };
        let field = |f: &str| {
            fields
                .split(',')
                .find_map(|kv| kv.strip_prefix(&format!("{f}=")))
                .and_then(|v| v.trim().parse::<f64>().ok())
        };
        out.insert(
            name.to_string(),
            (
                field("calls").unwrap_or(0.0) as u64,
                field("usec_per_call").unwrap_or(0.0),
            ),
        );
    }
    out
}

/// Commands (other than the script call itself: FCALL or EVALSHA) per decision, and the
/// script call's µs per call.
async fn measure(
    server: &RedisServer,
    store: &RedisStore,
    alg: &Algorithm,
    key: &str,
    n: u64,
) -> (f64, f64, String) {
    server.cli(&["CONFIG", "RESETSTAT"]);
    for _ in 0..n {
        store
            .check(&[CheckItem {
                key,
                algorithm: alg,
                cost: 1,
            }])
            .await
            .unwrap();
    }
    let s = stats(server);
    // A check alone goes to its algorithm's batch function (FCALL) or script (EVALSHA); the
    // first call on a fresh server finds the library missing and loads it (one FCALL more).
    let script = ["evalsha", "fcall"]
        .iter()
        .filter_map(|c| s.get(*c))
        .fold((0, 0.0), |(n, us), &(c, u)| (n + c, us + u * c as f64));
    assert!(script.0 == n || script.0 == n + 1, "{s:?}");
    let evalsha = (script.0, script.1 / script.0 as f64);
    let mut inner = 0;
    let mut names = Vec::new();
    for (name, (calls, _)) in &s {
        if [
            "evalsha",
            "fcall",
            "function|load",
            "config|resetstat",
            "info",
            "eval",
        ]
        .contains(&name.as_str())
        {
            continue;
        }
        inner += calls;
        names.push(format!("{name}={:.2}", *calls as f64 / n as f64));
    }
    (inner as f64 / n as f64, evalsha.1, names.join(" "))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn commands_per_decision() {
    let server = RedisServer::redis();
    let store = RedisStore::builder(server.url())
        .timeout(Duration::from_secs(5))
        .connect()
        .await
        .unwrap();
    let slow = Rate::new(1, 3_600_000);
    let big = 1_000_000;
    let cases: Vec<(&str, Algorithm, Algorithm, f64, f64)> = vec![
        // (name, admitting policy, denying policy, max commands admitted, max denied); TIME included.
        (
            "token-bucket",
            Algorithm::TokenBucket {
                capacity: big,
                rate: slow,
            },
            Algorithm::TokenBucket {
                capacity: 1,
                rate: slow,
            },
            3.0,
            2.0,
        ),
        (
            "gcra",
            Algorithm::Gcra {
                rate: Rate::per_second(1_000_000),
                burst: big,
            },
            Algorithm::Gcra {
                rate: slow,
                burst: 0,
            },
            3.0,
            2.0,
        ),
        (
            "leaky-bucket",
            Algorithm::LeakyBucket {
                capacity: big,
                rate: slow,
                mode: LeakyMode::Policing,
            },
            Algorithm::LeakyBucket {
                capacity: 1,
                rate: slow,
                mode: LeakyMode::Policing,
            },
            3.0,
            2.0,
        ),
        (
            "fixed-window",
            Algorithm::FixedWindow {
                limit: big,
                window_ms: 1_000_000_000,
            },
            Algorithm::FixedWindow {
                limit: 1,
                window_ms: 1_000_000_000,
            },
            3.0,
            2.0,
        ),
        (
            "sliding-counter",
            Algorithm::SlidingWindowCounter {
                limit: big,
                window_ms: 1_000_000_000,
            },
            Algorithm::SlidingWindowCounter {
                limit: 1,
                window_ms: 1_000_000_000,
            },
            3.0,
            2.0,
        ),
        (
            "sliding-log",
            Algorithm::SlidingWindowLog {
                limit: 2000,
                window_ms: 100,
            },
            Algorithm::SlidingWindowLog {
                limit: 1,
                window_ms: 1_000_000,
            },
            // Counted in Redis, not read: ZCOUNT, ZRANGE of the newest entry, and ZRANGEBYSCORE
            // of one entry when denied or ZREMRANGEBYSCORE + ZADD + PEXPIRE when admitted.
            6.0,
            4.0,
        ),
        (
            "concurrency",
            Algorithm::Concurrency {
                limit: 2000,
                lease_ms: 100,
            },
            Algorithm::Concurrency {
                limit: 1,
                lease_ms: 1_000_000,
            },
            5.0,
            2.0,
        ),
    ];
    for (name, admit, deny, max_admit, max_deny) in cases {
        let (a, us_a, detail_a) = measure(
            &server,
            &store,
            &admit,
            &format!("rl:{{cmd}}:{name}-a"),
            500,
        )
        .await;
        // The first call of the denying policy admits; the rest deny.
        store
            .check(&[CheckItem {
                key: &format!("rl:{{cmd}}:{name}-d"),
                algorithm: &deny,
                cost: 1,
            }])
            .await
            .unwrap();
        let (d, us_d, detail_d) =
            measure(&server, &store, &deny, &format!("rl:{{cmd}}:{name}-d"), 500).await;
        eprintln!(
            "{name:16} admitted: {a:.2} commands ({detail_a}), EVALSHA {us_a:.2} µs | denied: {d:.2} ({detail_d}), EVALSHA {us_d:.2} µs"
        );
        assert!(a <= max_admit, "{name}: {a} commands per admitted decision");
        assert!(d <= max_deny, "{name}: {d} commands per denied decision");
    }
}

/// The sliding log's reads stay the same however many entries its window holds, while every
/// entry costs 1: one ZRANGE (the newest entry) per decision, never the whole set; a log that
/// holds an entry of cost > 1 is read whole (a second ZRANGE) until that entry leaves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sliding_log_reads_do_not_grow_with_its_entries() {
    let server = RedisServer::redis();
    let store = RedisStore::builder(server.url())
        .timeout(Duration::from_secs(5))
        .connect()
        .await
        .unwrap();
    let long = Algorithm::SlidingWindowLog {
        limit: 3000,
        window_ms: 1_000_000_000,
    };
    let key = "rl:{cmd}:long-log";
    // 2000 entries first, then 500 more measured: still one ZRANGE each.
    let (_, us_small, _) = measure(&server, &store, &long, key, 2000).await;
    let (a, us_large, detail) = measure(&server, &store, &long, key, 500).await;
    let zrange = |detail: &str| {
        detail
            .split(' ')
            .find_map(|kv| kv.strip_prefix("zrange="))
            .map(|v| v.parse::<f64>().unwrap())
    };
    eprintln!(
        "long log: {a:.2} commands ({detail}); EVALSHA {us_small:.2} µs over the first 2000, {us_large:.2} µs over the next 500"
    );
    assert_eq!(zrange(&detail), Some(1.0), "{detail}");
    // Full now (2500 + 500 = 3000): denials read one more entry, not the log.
    let (_, _, detail) = measure(&server, &store, &long, key, 600).await;
    assert!(detail.contains("zrangebyscore="), "{detail}");
    assert_eq!(zrange(&detail), Some(1.0), "{detail}");

    // An entry of cost 2 switches this key to reading the set whole.
    let multi = "rl:{cmd}:multi-cost-log";
    store
        .check(&[CheckItem {
            key: multi,
            algorithm: &long,
            cost: 2,
        }])
        .await
        .unwrap();
    let (_, _, detail) = measure(&server, &store, &long, multi, 50).await;
    assert_eq!(zrange(&detail), Some(2.0), "{detail}");
}
