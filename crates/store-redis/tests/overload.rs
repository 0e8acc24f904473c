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
}

/// `BURST` checks of one key, all started at once on the calling (current-thread) runtime,
/// so the later ones spend a long time queued behind the earlier ones.
async fn burst(store: Arc<RedisStore>, key: &str) -> Tally {
    let algorithm = Algorithm::FixedWindow {
        limit: LIMIT,
        window_ms: 600_000,
    };
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
    let algorithm = Algorithm::FixedWindow {
        limit: LIMIT,
        window_ms: 600_000,
    };
    // Warm up: the connection and the script are in place, the server has answered.
    let key = "rl:{overload:stall}:p".to_string();
    store
        .check(&[CheckItem {
            key: &key,
            algorithm: &algorithm,
            cost: 0,
        }])
        .await
        .unwrap();
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
