//! Overload is not failure: a burst of concurrent checks on a healthy Redis waits in sluice's
//! own queue, and that wait never turns into a fail-open admission. Every check is decided by
//! the store (or, beyond the queue bound, denied as overloaded), so at most the limit is
//! admitted.

use std::sync::Arc;
use std::time::{Duration, Instant};

use sluice::{Algorithm, Identity, Limiter, Policy, StoreError, StoreOptions, Verdict};
use sluice_testkit::servers::RedisServer;

/// Concurrent checks in the burst.
const BURST: usize = 4_000;
/// The limit of the one identity they all hit.
const LIMIT: u64 = 100;

#[derive(Debug, Default)]
struct Tally {
    admitted: u64,
    denied: u64,
    failed_open: u64,
    failed_closed: u64,
    overloaded: u64,
}

#[tokio::test(flavor = "current_thread")]
async fn a_burst_on_a_healthy_store_never_fails_open() {
    let server = RedisServer::redis();
    let options = StoreOptions {
        timeout: Duration::from_millis(50),
        ..Default::default()
    };
    let limiter = Limiter::connect(&server.url(), options).await.unwrap();
    let policy = Arc::new(
        Policy::new(
            "burst",
            Algorithm::FixedWindow {
                limit: LIMIT,
                window_ms: 600_000,
            },
        )
        .unwrap(),
    );
    let started = Instant::now();
    let mut tasks = Vec::with_capacity(BURST);
    for _ in 0..BURST {
        let (limiter, policy) = (limiter.clone(), Arc::clone(&policy));
        tasks.push(tokio::spawn(async move {
            limiter
                .check(&Identity::new("one-victim"), &policy, 1)
                .await
        }));
    }
    let mut tally = Tally::default();
    for t in tasks {
        let checked = t.await.expect("check task panicked");
        match (&checked.verdict, checked.allowed) {
            (Verdict::Decided, true) => tally.admitted += 1,
            (Verdict::Decided, false) => tally.denied += 1,
            (Verdict::FailedOpen(_), _) => tally.failed_open += 1,
            (Verdict::FailedClosed(StoreError::Overloaded(_)), allowed) => {
                assert!(!allowed, "an overloaded check is never admitted");
                tally.overloaded += 1;
            }
            (Verdict::FailedClosed(_), _) => tally.failed_closed += 1,
        }
    }
    eprintln!("{tally:?} in {:?}", started.elapsed());
    assert_eq!(
        tally.failed_open, 0,
        "a busy but healthy store failed open: {tally:?}"
    );
    assert_eq!(tally.failed_closed, 0, "{tally:?}");
    assert!(tally.admitted <= LIMIT, "{tally:?}");
    // The queue bound (seconds) is far above this burst: every check is decided.
    assert_eq!(tally.overloaded, 0, "{tally:?}");
    assert_eq!(tally.admitted, LIMIT, "{tally:?}");
    assert_eq!(tally.denied, BURST as u64 - LIMIT, "{tally:?}");
}
