//! Lease compensation: concurrency acquires that time out (or are abandoned) while the server
//! is paused still run when it resumes. The store releases them once the server answers again,
//! so no slot stays held by nobody for longer than the outage plus 1 s, even with a 60 s lease.

use sluice_core::{Algorithm, CheckItem, Store, StoreError};
use sluice_redis::RedisStore;
use sluice_testkit::servers::RedisServer;
use std::sync::Arc;
use std::time::{Duration, Instant};

const LIMIT: u64 = 10;
const LEASE_MS: u64 = 60_000;
const PAUSE_MS: u64 = 2_500;

fn concurrency() -> Algorithm {
    Algorithm::Concurrency {
        limit: LIMIT,
        lease_ms: LEASE_MS,
    }
}

async fn acquire(store: &RedisStore, key: &str, cost: u64) -> Result<bool, StoreError> {
    let algorithm = concurrency();
    store
        .check(&[CheckItem {
            key,
            algorithm: &algorithm,
            cost,
        }])
        .await
        .map(|d| d.allowed)
}

async fn store(url: &str, timeout: Duration, batch: bool) -> Arc<RedisStore> {
    Arc::new(
        RedisStore::builder(url)
            .timeout(timeout)
            .batch(batch)
            .connect()
            .await
            .unwrap(),
    )
}

/// `LIMIT` acquires of one slot each on `key`, all at once; each must fail (the server is
/// paused). With `abandon_after`, the caller stops waiting (drops the call) at that point,
/// as a caller with a shorter deadline than the store's timeout does.
async fn acquires_during_pause(
    store: &Arc<RedisStore>,
    key: &str,
    abandon_after: Option<Duration>,
) -> usize {
    let mut tasks = Vec::new();
    for _ in 0..LIMIT {
        let (store, key) = (Arc::clone(store), key.to_string());
        tasks.push(tokio::spawn(async move {
            match abandon_after {
                Some(after) => tokio::time::timeout(after, acquire(&store, &key, 1))
                    .await
                    .is_err(),
                // A paused server that answered just before: overload (denied) at first,
                // then a timeout once it has been silent for `unresponsive_after`.
                None => matches!(
                    acquire(&store, &key, 1).await,
                    Err(StoreError::Timeout(_)
                        | StoreError::Unavailable(_)
                        | StoreError::Overloaded(_))
                ),
            }
        }));
    }
    let mut failed = 0;
    for t in tasks {
        failed += usize::from(t.await.unwrap());
    }
    failed
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slots_taken_by_failed_acquires_are_free_within_a_second_of_the_resume() {
    let server = RedisServer::redis();
    let url = server.url();
    let timeout = Duration::from_millis(50);
    let batched = store(&url, timeout, true).await;
    let direct = store(&url, timeout, false).await;
    // A store timeout longer than the pause: its callers give up first.
    let patient = store(&url, Duration::from_secs(10), false).await;
    let cases = [
        ("rl:{lease:batched}:c", &batched, None),
        ("rl:{lease:direct}:c", &direct, None),
        (
            "rl:{lease:abandoned}:c",
            &patient,
            Some(Duration::from_millis(100)),
        ),
    ];
    // Warm the connections and the script cache.
    for (key, s, _) in &cases {
        assert!(acquire(s, key, 0).await.unwrap());
    }

    let paused_at = Instant::now();
    let out = server.cli(&["CLIENT", "PAUSE", &PAUSE_MS.to_string(), "ALL"]);
    assert!(out.contains("OK"), "CLIENT PAUSE: {out}");
    for (key, s, abandon) in &cases {
        let failed = acquires_during_pause(s, key, *abandon).await;
        assert_eq!(
            failed, LIMIT as usize,
            "{key}: every acquire fails while paused"
        );
    }
    let resume = paused_at + Duration::from_millis(PAUSE_MS);
    assert!(Instant::now() < resume, "the acquires outlasted the pause");
    tokio::time::sleep(resume.saturating_duration_since(Instant::now())).await;

    // From a fresh connection: the whole limit must be free again within 1 s of the resume
    // (the paused acquires ran at the resume and took every slot for 60 s).
    let probe = store(&url, Duration::from_secs(5), false).await;
    let deadline = resume + Duration::from_secs(1);
    for (key, _, _) in &cases {
        let took = loop {
            if acquire(&probe, key, LIMIT).await.unwrap() {
                break resume.elapsed();
            }
            assert!(
                Instant::now() < deadline,
                "{key}: slots still held by nobody 1 s after the resume"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        eprintln!("{key}: the full limit was free {took:?} after the resume");
        // The probe's own leases hold the limit: compensation freed only the lost ones.
        assert!(
            !acquire(&probe, key, 1).await.unwrap(),
            "{key}: limit holds"
        );
    }
}
