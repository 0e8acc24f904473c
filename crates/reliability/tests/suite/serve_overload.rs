//! Overload is not failure, through `sluice serve`: three servers share one Redis (default
//! store settings: `timeout = "50ms"`, fail open) while that Redis is kept busy by another
//! client's 80 ms scripts, the way three loaded serve processes' batches keep it busy. Many
//! `/v1/check` calls on one identity then wait past the timeout in Redis's own queue. The
//! finding this refuses: those calls were admitted `failed_open`, up to 3,000 of a limit of
//! 100. A busy store is not a failed one: nothing may fail open, and the limit holds.

use std::time::{Duration, Instant};

use serde_json::{Value, json};
use sluice_reliability::serve::{TestServer, client, start};
use sluice_testkit::servers::RedisServer;

/// The limit of the one identity every call spends.
const LIMIT: u64 = 100;

fn config(redis_url: &str) -> String {
    format!(
        r#"
[store]
url = "{redis_url}"

[policies.login]
algorithm = "sliding-log"
limit = {LIMIT}
window = "1h"
"#
    )
}

#[derive(Debug, Default)]
struct Verdicts {
    allowed: u64,
    denied: u64,
    failed_open: u64,
    failed_closed: u64,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busy_store_shared_by_three_servers_never_fails_open() {
    let redis = RedisServer::redis();
    let toml = config(&redis.url());
    let servers: Vec<TestServer> = vec![start(&toml).await, start(&toml).await, start(&toml).await];
    // Warm every server's connection (the store has answered each of them).
    for s in &servers {
        let res = client()
            .post(s.url("/v1/check"))
            .json(&json!({"policy": "login", "identity": "warm"}))
            .send()
            .await
            .unwrap();
        assert_eq!(res.status(), 200);
    }

    // Another client keeps Redis busy: 40 scripts of 80 ms back to back (about 3.2 s).
    let busy = redis.keep_busy(40, Duration::from_millis(80));

    // 3 servers x 20 clients, each a check every 10 ms for 2.5 s: about 3,000 checks.
    let mut tasks = Vec::new();
    for s in &servers {
        for _ in 0..20 {
            let url = s.url("/v1/check");
            tasks.push(tokio::spawn(async move {
                let c = client();
                let mut seen = Vec::new();
                let end = Instant::now() + Duration::from_millis(2_500);
                for _ in 0..300 {
                    if Instant::now() >= end {
                        break;
                    }
                    let res = c
                        .post(&url)
                        .json(&json!({"policy": "login", "identity": "victim"}))
                        .timeout(Duration::from_secs(10))
                        .send()
                        .await
                        .expect("the server answers");
                    assert_eq!(res.status(), 200);
                    seen.push(res.json::<Value>().await.unwrap());
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
                seen
            }));
        }
    }
    let mut v = Verdicts::default();
    for t in tasks {
        for answer in t.await.expect("client task") {
            match (answer["verdict"].as_str(), answer["allowed"].as_bool()) {
                (Some("decided"), Some(true)) => v.allowed += 1,
                (Some("decided"), Some(false)) => v.denied += 1,
                (Some("failed_open"), _) => v.failed_open += 1,
                (Some("failed_closed"), _) => v.failed_closed += 1,
                other => panic!("unexpected answer {other:?}: {answer}"),
            }
        }
    }
    busy.join().expect("busy client");
    eprintln!("[reliability] three servers, busy Redis: {v:?}");
    assert!(
        v.failed_closed > 0,
        "no check waited past its timeout: the test proves nothing: {v:?}"
    );
    assert_eq!(v.failed_open, 0, "a busy store failed open: {v:?}");
    assert!(v.allowed <= LIMIT, "more than the limit admitted: {v:?}");
    for s in servers {
        s.stop().await;
    }
}
