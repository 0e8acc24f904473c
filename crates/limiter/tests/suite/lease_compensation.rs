//! Lease compensation through the facade: concurrency acquires that fail while Redis is
//! paused still run when it resumes; the slots they take are free again within 1 s of the
//! resume, not after the 60 s lease.

use std::sync::Arc;
use std::time::{Duration, Instant};

use sluice::{
    Algorithm, DenyCacheMode, FailureMode, Identity, Limiter, Policy, StoreOptions, StoreUrl,
    Verdict,
};
use sluice_testkit::servers::RedisServer;

const LIMIT: u64 = 8;
const PAUSE_MS: u64 = 2_500;

/// A limiter without a deny cache, so every check asks Redis.
async fn limiter(url: &str, timeout: Duration) -> Limiter {
    let options = StoreOptions {
        timeout,
        ..Default::default()
    };
    let store = url
        .parse::<StoreUrl>()
        .unwrap()
        .connect(&options)
        .await
        .unwrap();
    Limiter::builder(store)
        .timeout(timeout)
        .deny_cache(DenyCacheMode::Off)
        .build()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acquires_lost_in_a_pause_free_their_slots_within_a_second_of_the_resume() {
    let server = RedisServer::redis();
    let l = limiter(&server.url(), Duration::from_millis(50)).await;
    let mut p = Policy::new(
        "conc",
        Algorithm::Concurrency {
            limit: LIMIT,
            lease_ms: 60_000,
        },
    )
    .unwrap();
    p.failure_mode = FailureMode::Closed;
    let policy = Arc::new(p);
    let id = Identity::new("worker");
    // Warm the connection and the script cache.
    assert!(l.check(&id, &policy, 0).await.allowed);

    let paused_at = Instant::now();
    let out = server.cli(&["CLIENT", "PAUSE", &PAUSE_MS.to_string(), "ALL"]);
    assert!(out.contains("OK"), "CLIENT PAUSE: {out}");
    // Concurrent acquires: all reach the paused server before the circuit breaker opens.
    let mut tasks = Vec::new();
    for _ in 0..LIMIT {
        let (l, policy, id) = (l.clone(), Arc::clone(&policy), id.clone());
        tasks.push(tokio::spawn(async move { l.check(&id, &policy, 1).await }));
    }
    for t in tasks {
        let c = t.await.unwrap();
        assert!(
            matches!(c.verdict, Verdict::FailedClosed(_)) && !c.allowed,
            "the paused server cannot answer: {c:?}"
        );
    }
    let resume = paused_at + Duration::from_millis(PAUSE_MS);
    assert!(Instant::now() < resume, "the acquires outlasted the pause");
    tokio::time::sleep(resume.saturating_duration_since(Instant::now())).await;

    // Another instance (its own connection and breaker) wants the whole limit.
    let other = limiter(&server.url(), Duration::from_secs(2)).await;
    let deadline = resume + Duration::from_secs(1);
    let took = loop {
        let c = other.check(&id, &policy, LIMIT).await;
        if c.allowed {
            break resume.elapsed();
        }
        assert_eq!(c.verdict, Verdict::Decided, "{c:?}");
        assert!(
            Instant::now() < deadline,
            "slots still held by nobody 1 s after the resume: {c:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    eprintln!("the whole limit was free {took:?} after the resume");
}
