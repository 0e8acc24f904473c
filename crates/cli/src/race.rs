//! `sluice race`: the guide's proof of atomicity as a tool. N concurrent requests at a limit of
//! L, first through a naive read-modify-write (GET, decide in the app, SET), then through
//! sluice. The naive path shows the race (it admits more than L); sluice must admit exactly L.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use clap::Args;
use serde::Serialize;
use sluice::{Algorithm, FailureMode, Identity, Limiter, Policy, Rate, StoreOptions, StoreUrl};
use sluice_redis::{RedisOptions, RedisStore, redis};

/// Arguments of `sluice race`.
#[derive(Debug, Clone, Args)]
pub struct RaceArgs {
    /// Store URL: memory, redis://host:port, redis+cluster://...
    #[arg(long, default_value = "memory", env = "SLUICE_STORE")]
    pub store: String,
    /// Concurrent requests.
    #[arg(long, default_value_t = 200)]
    pub requests: u64,
    /// The limit.
    #[arg(long, default_value_t = 10)]
    pub limit: u64,
    /// Machine-readable output.
    #[arg(long)]
    pub json: bool,
}

/// The result of a race.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct RaceReport {
    pub requests: u64,
    pub limit: u64,
    pub naive_admitted: u64,
    pub sluice_admitted: u64,
    /// Requests sluice could not decide (store errors); they are not counted as admitted.
    pub sluice_errors: u64,
}

impl RaceReport {
    /// True when sluice admitted exactly the limit (or every request, when there were fewer).
    pub fn exact(&self) -> bool {
        self.sluice_errors == 0 && self.sluice_admitted == self.limit.min(self.requests)
    }
}

/// Runs the race.
pub async fn run(args: &RaceArgs) -> Result<RaceReport, String> {
    if args.requests > 100_000 {
        return Err("--requests is capped at 100000".into());
    }
    let url: StoreUrl = args
        .store
        .parse()
        .map_err(|e: sluice::StoreError| e.to_string())?;
    let tag = format!("race:{:016x}", rand_id());
    let naive_key = format!("{tag}:naive");
    // The naive path's plain commands go through sluice-redis's connection, which knows every
    // URL form (Cluster, Sentinel, TLS, valkey://) and routes a key to its Cluster node.
    let redis = match &url {
        StoreUrl::Memory => None,
        StoreUrl::Redis(u) => {
            let options = RedisOptions {
                timeout: Duration::from_secs(5),
                ..Default::default()
            };
            let store = sluice_redis::connect(u, options)
                .await
                .map_err(|e| format!("cannot connect: {e}"))?;
            Some(Arc::new(store))
        }
    };
    let naive_admitted = match &redis {
        None => naive_memory(args.requests, args.limit).await,
        Some(store) => naive_redis(store, &naive_key, args.requests, args.limit).await?,
    };

    let options = StoreOptions {
        timeout: Duration::from_secs(5),
        ..Default::default()
    };
    let limiter = Limiter::connect(&args.store, options)
        .await
        .map_err(|e| format!("cannot use store: {e}"))?;
    // A bucket of `limit` that refills one token a day: no refill during the race.
    let algorithm = Algorithm::TokenBucket {
        capacity: args.limit,
        rate: Rate::new(1, 86_400_000),
    };
    let mut policy = Policy::new("race", algorithm).map_err(|e| e.to_string())?;
    policy.failure_mode = FailureMode::Closed;
    let policy = Arc::new(policy);
    let identity = Identity::new(tag.clone());
    let admitted = Arc::new(AtomicU64::new(0));
    let errors = Arc::new(AtomicU64::new(0));
    let start = Arc::new(tokio::sync::Barrier::new(args.requests as usize));
    let mut tasks = Vec::with_capacity(args.requests as usize);
    for _ in 0..args.requests {
        let (limiter, policy, identity) = (limiter.clone(), policy.clone(), identity.clone());
        let (admitted, errors, start) = (admitted.clone(), errors.clone(), start.clone());
        tasks.push(tokio::spawn(async move {
            start.wait().await;
            let c = limiter.check(&identity, &policy, 1).await;
            match c.verdict {
                sluice::Verdict::Decided if c.allowed => {
                    admitted.fetch_add(1, Ordering::Relaxed);
                }
                sluice::Verdict::Decided => {}
                _ => {
                    errors.fetch_add(1, Ordering::Relaxed);
                }
            }
        }));
    }
    for t in tasks {
        t.await.map_err(|e| e.to_string())?;
    }
    if let Some(store) = &redis {
        // The race's keys are the tool's own: leave nothing behind in the user's store.
        let sluice_key =
            store.server_key(&sluice::KeyScheme::default().key(&identity, &policy.name));
        delete_keys(store, &[naive_key, sluice_key]).await?;
    }
    Ok(RaceReport {
        requests: args.requests,
        limit: args.limit,
        naive_admitted,
        sluice_admitted: admitted.load(Ordering::Relaxed),
        sluice_errors: errors.load(Ordering::Relaxed),
    })
}

fn rand_id() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(std::process::id() as u64);
    h.finish()
}

/// Deletes the race's keys (one `DEL` per key, so each can live on its own Cluster slot).
async fn delete_keys(store: &RedisStore, keys: &[String]) -> Result<(), String> {
    for key in keys {
        store
            .command(redis::cmd("DEL").arg(key))
            .await
            .map_err(|e| format!("cleaning up the race's keys: {e}"))?;
    }
    Ok(())
}

/// The naive limiter on Redis: GET the counter, decide in the application, SET it back.
async fn naive_redis(
    store: &Arc<RedisStore>,
    key: &str,
    requests: u64,
    limit: u64,
) -> Result<u64, String> {
    let admitted = Arc::new(AtomicU64::new(0));
    let start = Arc::new(tokio::sync::Barrier::new(requests as usize));
    let mut tasks = Vec::with_capacity(requests as usize);
    for _ in 0..requests {
        let (store, key, admitted, start) = (
            Arc::clone(store),
            key.to_string(),
            admitted.clone(),
            start.clone(),
        );
        tasks.push(tokio::spawn(async move {
            start.wait().await;
            naive_once(&store, &key, limit, &admitted).await
        }));
    }
    for t in tasks {
        t.await.map_err(|e| e.to_string())??;
    }
    Ok(admitted.load(Ordering::Relaxed))
}

async fn naive_once(
    store: &RedisStore,
    key: &str,
    limit: u64,
    admitted: &AtomicU64,
) -> Result<(), String> {
    let reply = store
        .command(redis::cmd("GET").arg(key))
        .await
        .map_err(|e| e.to_string())?;
    let used: Option<u64> = redis::from_redis_value(reply).map_err(|e| e.to_string())?;
    let used = used.unwrap_or(0);
    if used >= limit {
        return Ok(());
    }
    store
        .command(redis::cmd("SET").arg(key).arg(used + 1).arg("EX").arg(60))
        .await
        .map_err(|e| e.to_string())?;
    admitted.fetch_add(1, Ordering::Relaxed);
    Ok(())
}

/// The naive limiter in process memory: read, wait a millisecond (as a round trip to a shared
/// store would), write.
async fn naive_memory(requests: u64, limit: u64) -> u64 {
    let counter = Arc::new(std::sync::Mutex::new(0u64));
    let admitted = Arc::new(AtomicU64::new(0));
    let start = Arc::new(tokio::sync::Barrier::new(requests as usize));
    let mut tasks = Vec::new();
    for _ in 0..requests {
        let (counter, admitted, start) = (counter.clone(), admitted.clone(), start.clone());
        tasks.push(tokio::spawn(async move {
            start.wait().await;
            let used = *counter.lock().unwrap();
            tokio::time::sleep(Duration::from_millis(1)).await;
            if used < limit {
                *counter.lock().unwrap() = used + 1;
                admitted.fetch_add(1, Ordering::Relaxed);
            }
        }));
    }
    for t in tasks {
        let _ = t.await;
    }
    admitted.load(Ordering::Relaxed)
}
