//! Automatic batching (src/batch.rs): concurrent one-limit checks share script calls, and each
//! is decided exactly as if it had been sent alone.

use futures::future::join_all;
use sluice_core::{Algorithm, CheckItem, Rate, Store};
use sluice_redis::RedisStore;
use sluice_testkit::servers::RedisServer;
use std::sync::Arc;
use std::time::Duration;

fn script_calls(server: &RedisServer) -> u64 {
    let info = server.cli(&["INFO", "commandstats"]);
    info.lines()
        .filter(|l| {
            ["cmdstat_evalsha:", "cmdstat_eval:", "cmdstat_fcall:"]
                .iter()
                .any(|c| l.starts_with(c))
        })
        .filter_map(|l| {
            l.split("calls=")
                .nth(1)?
                .split(',')
                .next()?
                .parse::<u64>()
                .ok()
        })
        .sum()
}

async fn flood(
    store: &Arc<RedisStore>,
    keys: usize,
    per_key: usize,
    algorithm: &Algorithm,
) -> Vec<usize> {
    let calls = (0..keys * per_key).map(|i| {
        let store = Arc::clone(store);
        let (key, algorithm) = (format!("rl:{{b{}}}:p", i % keys), algorithm.clone());
        async move {
            let d = store
                .check(&[CheckItem {
                    key: &key,
                    algorithm: &algorithm,
                    cost: 1,
                }])
                .await
                .unwrap();
            (i % keys, d.allowed)
        }
    });
    let mut admitted = vec![0; keys];
    for (k, ok) in join_all(calls).await {
        admitted[k] += usize::from(ok);
    }
    admitted
}

#[tokio::test]
async fn concurrent_checks_share_calls_and_admit_exactly() {
    let server = RedisServer::redis();
    let store = Arc::new(
        RedisStore::builder(server.url())
            .timeout(Duration::from_secs(10))
            .connect()
            .await
            .unwrap(),
    );
    server.cli(&["CONFIG", "RESETSTAT"]);
    let hour = 3_600_000;
    for algorithm in [
        Algorithm::TokenBucket {
            capacity: 7,
            rate: Rate::new(1, hour),
        },
        Algorithm::Gcra {
            rate: Rate::new(1, hour),
            burst: 6,
        },
        Algorithm::FixedWindow {
            limit: 7,
            window_ms: hour,
        },
        Algorithm::SlidingWindowLog {
            limit: 7,
            window_ms: hour,
        },
    ] {
        server.cli(&["FLUSHALL"]);
        let before = script_calls(&server);
        // 40 keys x 20 concurrent checks at a limit of 7: exactly 7 admitted per key.
        let admitted = flood(&store, 40, 20, &algorithm).await;
        assert!(
            admitted.iter().all(|&n| n == 7),
            "{algorithm:?}: {admitted:?}"
        );
        let calls = script_calls(&server) - before;
        assert!(
            calls < 800,
            "{algorithm:?}: {calls} script calls for 800 checks: nothing was batched"
        );
    }
}

#[tokio::test]
async fn batching_can_be_turned_off() {
    let server = RedisServer::redis();
    let store = Arc::new(
        RedisStore::builder(server.url())
            .timeout(Duration::from_secs(10))
            .batch(false)
            .connect()
            .await
            .unwrap(),
    );
    server.cli(&["CONFIG", "RESETSTAT"]);
    let algorithm = Algorithm::TokenBucket {
        capacity: 3,
        rate: Rate::new(1, 3_600_000),
    };
    let admitted = flood(&store, 10, 10, &algorithm).await;
    assert!(admitted.iter().all(|&n| n == 3), "{admitted:?}");
    // At least one call per check (a cold script cache adds a failed EVALSHA before each EVAL).
    assert!(script_calls(&server) >= 100);
}
