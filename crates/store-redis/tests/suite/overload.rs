//! Overload is not failure: a burst of concurrent checks on a healthy server waits in
//! sluice's own queue, and that wait never turns into a store timeout. Every check is decided
//! by the server, so exactly the limit is admitted.

use sluice_core::{Algorithm, CheckItem, Store, StoreError};
use sluice_redis::RedisStore;
use sluice_testkit::servers::RedisServer;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Concurrent checks in the burst.
const BURST: usize = 4_000;
/// The limit of the one identity they all hit.
const LIMIT: u64 = 100;

#[derive(Debug, Default)]
struct Tally {
    admitted: u64,
    denied: u64,
    timeouts: u64,
    overloaded: u64,
    other_errors: Vec<StoreError>,
}

impl Tally {
    /// Counts one check's outcome.
    fn add(&mut self, outcome: Result<sluice_core::MultiDecision, StoreError>) {
        match outcome {
            Ok(d) if d.allowed => self.admitted += 1,
            Ok(_) => self.denied += 1,
            Err(StoreError::Timeout(_)) => self.timeouts += 1,
            Err(StoreError::Overloaded(_)) => self.overloaded += 1,
            Err(e) => self.other_errors.push(e),
        }
    }

    /// Adds another tally's counts.
    fn merge(&mut self, other: Tally) {
        self.admitted += other.admitted;
        self.denied += other.denied;
        self.timeouts += other.timeouts;
        self.overloaded += other.overloaded;
        self.other_errors.extend(other.other_errors);
    }
}

/// The one identity's limit: `LIMIT` per 10 minutes.
fn limit() -> Algorithm {
    Algorithm::FixedWindow {
        limit: LIMIT,
        window_ms: 600_000,
    }
}

/// Warms up: the connection and the script are in place, and the server has answered.
async fn warm(store: &RedisStore, key: &str, algorithm: &Algorithm) {
    store
        .check(&[CheckItem {
            key,
            algorithm,
            cost: 0,
        }])
        .await
        .unwrap();
}

/// `BURST` checks of one key, all started at once on the calling (current-thread) runtime,
/// so the later ones spend a long time queued behind the earlier ones.
async fn burst(store: Arc<RedisStore>, key: &str) -> Tally {
    let algorithm = limit();
    let mut tasks = Vec::with_capacity(BURST);
    for _ in 0..BURST {
        let (store, key, algorithm) = (Arc::clone(&store), key.to_string(), algorithm.clone());
        tasks.push(tokio::spawn(async move {
            store
                .check(&[CheckItem {
                    key: &key,
                    algorithm: &algorithm,
                    cost: 1,
                }])
                .await
        }));
    }
    let mut tally = Tally::default();
    for t in tasks {
        tally.add(t.await.expect("check task panicked"));
    }
    tally
}

#[tokio::test(flavor = "current_thread")]
async fn a_burst_on_a_healthy_server_is_decided_not_timed_out() {
    let server = RedisServer::redis();
    let store = Arc::new(
        RedisStore::builder(server.url())
            .timeout(Duration::from_millis(50))
            .connect()
            .await
            .unwrap(),
    );
    let started = Instant::now();
    let tally = burst(Arc::clone(&store), "rl:{overload:1}:p").await;
    eprintln!("{tally:?} in {:?}", started.elapsed());
    assert!(tally.other_errors.is_empty(), "{:?}", tally.other_errors);
    assert_eq!(
        tally.timeouts, 0,
        "time in sluice's own queue counted as the store timing out: {tally:?}"
    );
    // The queue bound is generous (seconds): this burst stays far below it.
    assert_eq!(tally.overloaded, 0, "{tally:?}");
    assert_eq!(tally.admitted, LIMIT, "{tally:?}");
    assert_eq!(tally.denied, BURST as u64 - LIMIT, "{tally:?}");
}

/// A process too busy to read its answers: the only worker thread stalls for longer than
/// the timeout, again and again, while checks are in flight (what three `sluice serve`
/// processes and their clients on two cores do to each other). The server answers every
/// call within a millisecond, so no check may come back as a store timeout (which would
/// fail open): each is decided, or refused as overload (denied).
#[tokio::test(flavor = "current_thread")]
async fn a_stalled_process_is_overloaded_not_a_store_timeout() {
    let server = RedisServer::redis();
    let store = Arc::new(
        RedisStore::builder(server.url())
            .timeout(Duration::from_millis(20))
            .connect()
            .await
            .unwrap(),
    );
    let algorithm = limit();
    let key = "rl:{overload:stall}:p".to_string();
    warm(&store, &key, &algorithm).await;
    let mut tally = Tally::default();
    for _round in 0..20 {
        let mut tasks = Vec::new();
        for _ in 0..50 {
            let (store, key, algorithm) = (Arc::clone(&store), key.clone(), algorithm.clone());
            tasks.push(tokio::spawn(async move {
                store
                    .check(&[CheckItem {
                        key: &key,
                        algorithm: &algorithm,
                        cost: 1,
                    }])
                    .await
            }));
        }
        // Let the calls go out, then stall the thread past their timeout.
        tokio::task::yield_now().await;
        tokio::task::yield_now().await;
        std::thread::sleep(Duration::from_millis(60));
        for t in tasks {
            tally.add(t.await.expect("check task panicked"));
        }
    }
    eprintln!("{tally:?}");
    assert!(tally.other_errors.is_empty(), "{:?}", tally.other_errors);
    assert_eq!(
        tally.timeouts, 0,
        "a stalled process blamed the store: {tally:?}"
    );
    assert!(tally.admitted <= LIMIT, "{tally:?}");
}

/// A server busy with another client's work: it runs 80 ms scripts back to back for about
/// 2.5 s, so checks sent meanwhile wait up to 80 ms in the server's own queue, past their
/// 50 ms timeout, while the server keeps answering between the scripts. That is a busy
/// store, not a failed one: no check may come back as a store timeout (which fails open);
/// each is decided or answered overloaded (denied), and the limit holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_busy_with_other_clients_is_overloaded_not_failed() {
    let server = RedisServer::redis();
    let store = Arc::new(
        RedisStore::builder(server.url())
            .timeout(Duration::from_millis(50))
            .connect()
            .await
            .unwrap(),
    );
    let algorithm = limit();
    let key = "rl:{overload:busy}:p".to_string();
    warm(&store, &key, &algorithm).await;
    // Another client: 30 scripts of 80 ms, one after another (about 2.4 s).
    let busy = server.keep_busy(30, Duration::from_millis(80));

    // Checkers: 16 tasks, each a check every 5 ms, while the other client is busy.
    let mut tasks = Vec::new();
    for _ in 0..16 {
        let (store, key, algorithm) = (Arc::clone(&store), key.clone(), algorithm.clone());
        tasks.push(tokio::spawn(async move {
            let mut tally = Tally::default();
            let end = Instant::now() + Duration::from_millis(2_200);
            for _ in 0..1_000 {
                if Instant::now() >= end {
                    break;
                }
                let outcome = store
                    .check(&[CheckItem {
                        key: &key,
                        algorithm: &algorithm,
                        cost: 1,
                    }])
                    .await;
                tally.add(outcome);
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            tally
        }));
    }
    let mut tally = Tally::default();
    for t in tasks {
        tally.merge(t.await.expect("check task panicked"));
    }
    busy.join().expect("busy client");
    eprintln!("{tally:?}");
    assert!(tally.other_errors.is_empty(), "{:?}", tally.other_errors);
    assert!(
        tally.overloaded > 0,
        "the busy server never made a check wait past its timeout: the test proves nothing: {tally:?}"
    );
    assert_eq!(
        tally.timeouts, 0,
        "a busy server was taken for a failed one (those checks fail open): {tally:?}"
    );
    // A check answered overloaded may still have been decided by the server later, so the
    // caller sees at most the limit admitted (never more: nothing failed open).
    assert!(tally.admitted > 0 && tally.admitted <= LIMIT, "{tally:?}");
}
