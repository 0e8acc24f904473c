//! Leased mode on a real Redis (the testkit starts one): instances on their own connections
//! hammer one key together and never admit more than the limit, nor fall short by more than the
//! slices they hold; a shutdown gives the unspent units back, as an exact check then sees.

use std::sync::Arc;
use std::time::{Duration, Instant};

use sluice::leased::max_slice;
use sluice::{
    Algorithm, DecisionMode, DenyCacheMode, Identity, Limiter, Policy, StoreOptions, StoreUrl,
};
use sluice_testkit::servers::RedisServer;

const INSTANCES: usize = 4;

/// One instance: its own connection to the server.
async fn instance(url: &str) -> Limiter {
    let options = StoreOptions {
        timeout: Duration::from_millis(500),
        ..Default::default()
    };
    let store = url
        .parse::<StoreUrl>()
        .unwrap()
        .connect(&options)
        .await
        .unwrap();
    Limiter::builder(store)
        .timeout(Duration::from_millis(500))
        .deny_cache(DenyCacheMode::Off)
        .build()
}

fn leased(name: &str, algorithm: Algorithm, ttl_ms: u64) -> Arc<Policy> {
    let mut p = Policy::new(name, algorithm).unwrap();
    p.mode = DecisionMode::Leased { ttl_ms };
    p.validate().unwrap();
    Arc::new(p)
}

/// Four instances, 8 tasks each of at most 1500 checks (48k requests, at most 20 s in all), on
/// one key of `algorithm`, whose quota is `quota` (refill during the run included, at most
/// `refill_per_s` per second): never more than the quota, never short of it by more than the
/// instances' slices, and fewer reservations than admissions.
async fn hammer(algorithm: Algorithm, quota: u64, refill_per_s: u64) {
    let server = RedisServer::redis();
    let mut limiters = Vec::new();
    for _ in 0..INSTANCES {
        limiters.push(instance(&server.url()).await);
    }
    let policy = leased("hammer", algorithm.clone(), 60_000);
    let id = Identity::new("one-key");
    let started = Instant::now();
    let deadline = started + Duration::from_secs(20);
    let mut tasks = Vec::new();
    for l in &limiters {
        for _ in 0..8 {
            let (l, policy, id) = (l.clone(), Arc::clone(&policy), id.clone());
            tasks.push(tokio::spawn(async move {
                let mut admitted = 0u64;
                for _ in 0..1500 {
                    if Instant::now() > deadline {
                        break;
                    }
                    admitted += u64::from(l.check(&id, &policy, 1).await.allowed);
                }
                admitted
            }));
        }
    }
    let mut admitted = 0;
    for t in tasks {
        admitted += t.await.unwrap();
    }
    // The refill over the whole run, rounded up, plus one for the second it started in.
    let refill = (started.elapsed().as_secs() + 1) * refill_per_s;
    let slice = max_slice(&algorithm);
    let reservations: u64 = limiters
        .iter()
        .map(|l| l.lease_counters().reservations)
        .sum();
    let kind = algorithm.kind();
    assert!(
        admitted <= quota + refill,
        "{kind}: admitted {admitted} of a quota of {quota} (+{refill} refill)"
    );
    assert!(
        admitted >= quota - slice * INSTANCES as u64,
        "{kind}: admitted {admitted}, more than {} short of {quota}",
        slice * INSTANCES as u64
    );
    assert!(
        reservations > 0 && reservations < admitted,
        "{kind}: {reservations} reservations for {admitted} admitted"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn instances_hammering_one_key_admit_at_most_the_limit_and_at_least_limit_minus_their_slices()
{
    // A window far longer than the run: everything admitted is in one window.
    let window = Algorithm::FixedWindow {
        limit: 2000,
        window_ms: 3_600_000,
    };
    hammer(window, 2000, 0).await;
    // Buckets refilling one unit per 10 s: the quota is the capacity, give or take the refill.
    let bucket = Algorithm::TokenBucket {
        capacity: 2000,
        rate: sluice::Rate::new(1, 10_000),
    };
    hammer(bucket, 2000, 1).await;
    let gcra = Algorithm::Gcra {
        rate: sluice::Rate::new(1, 10_000),
        burst: 1999,
    };
    hammer(gcra, 2000, 1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_gives_unspent_units_back_to_the_store() {
    let server = RedisServer::redis();
    let l = instance(&server.url()).await;
    let algorithm = Algorithm::FixedWindow {
        limit: 1000,
        window_ms: 3_600_000,
    };
    let policy = leased("refund", algorithm.clone(), 60_000);
    let exact = Arc::new(Policy::new("refund", algorithm).unwrap());
    let id = Identity::new("client");
    // Slices grow by doubling: 1, 2, 4, ... ; 40 admissions leave part of one held.
    for _ in 0..40 {
        assert!(l.check(&id, &policy, 1).await.allowed);
    }
    let peek = |l: Limiter| {
        let (id, exact) = (id.clone(), Arc::clone(&exact));
        async move {
            let c = l.check(&id, &exact, 0).await;
            c.limits[0].decision.as_ref().unwrap().remaining
        }
    };
    let before = peek(l.clone()).await;
    let held = 1000 - 40 - before;
    assert!(held > 0, "nothing held after 40 admissions");
    let returned = l.shutdown().await;
    assert_eq!(returned, held);
    assert_eq!(peek(l.clone()).await, 1000 - 40);
    // Later checks reserve afresh.
    assert!(l.check(&id, &policy, 1).await.allowed);
    assert!(l.lease_counters().refunded_units >= held);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_bucket_slice_goes_back_on_shutdown_too() {
    let server = RedisServer::redis();
    let l = instance(&server.url()).await;
    // A slow refill (1 per 10 s), so the bucket gains nothing during the test.
    let algorithm = Algorithm::TokenBucket {
        capacity: 500,
        rate: sluice::Rate::new(1, 10_000),
    };
    let policy = leased("bucket", algorithm.clone(), 60_000);
    let exact = Arc::new(Policy::new("bucket", algorithm).unwrap());
    let id = Identity::new("client");
    for _ in 0..40 {
        assert!(l.check(&id, &policy, 1).await.allowed);
    }
    let remaining = |c: sluice::Checked| c.limits[0].decision.as_ref().unwrap().remaining;
    let before = remaining(l.check(&id, &exact, 0).await);
    let held = 500 - 40 - before;
    assert!(held > 0, "nothing held after 40 admissions");
    let returned = l.shutdown().await;
    // The refund keeps a margin of one unit plus the refill a store's clock may be ahead by.
    assert!(
        returned + 1 >= held && returned <= held,
        "returned {returned} of {held}"
    );
    assert_eq!(remaining(l.check(&id, &exact, 0).await), before + returned);
}
