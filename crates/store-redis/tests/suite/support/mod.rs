//! Shared by the integration tests: one Redis, one Valkey and one Cluster per test binary,
//! started on first use (their watchdogs kill them when the test process exits).
#![allow(dead_code, unreachable_pub)]

use sluice_core::{Algorithm, ManualClock, Rate, Store};
use sluice_redis::{RedisStore, ScriptMode};
use sluice_testkit::servers::{RedisCluster, RedisServer};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

static REDIS: OnceLock<RedisServer> = OnceLock::new();
static VALKEY: OnceLock<RedisServer> = OnceLock::new();
static CLUSTER: OnceLock<RedisCluster> = OnceLock::new();

pub fn redis() -> &'static RedisServer {
    REDIS.get_or_init(RedisServer::redis)
}
pub fn valkey() -> &'static RedisServer {
    VALKEY.get_or_init(RedisServer::valkey)
}
pub fn cluster() -> &'static RedisCluster {
    CLUSTER.get_or_init(RedisCluster::start)
}

/// The three server kinds every behaviour is checked on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Redis,
    Valkey,
    Cluster,
}

pub const KINDS: [Kind; 3] = [Kind::Redis, Kind::Valkey, Kind::Cluster];

pub fn url(kind: Kind) -> String {
    match kind {
        Kind::Redis => redis().url(),
        Kind::Valkey => valkey().url(),
        Kind::Cluster => cluster().url(),
    }
}

static NS: AtomicU64 = AtomicU64::new(0);

/// A namespace unique to this call, so tests sharing a server never share keys.
pub fn namespace(tag: &str) -> String {
    format!(
        "t{}-{}-{tag}:",
        std::process::id(),
        NS.fetch_add(1, Ordering::SeqCst)
    )
}

/// A store on `kind` with an injected manual clock (explicit `now`), a generous timeout (the
/// test machine is small and busy) and a fresh namespace.
pub async fn manual_store(kind: Kind, clock: &ManualClock, mode: ScriptMode) -> RedisStore {
    RedisStore::builder(url(kind))
        .clock(Arc::new(clock.clone()))
        .timeout(Duration::from_secs(5))
        .mode(mode)
        .namespace(namespace("m"))
        .connect()
        .await
        .expect("connect")
}

/// A store on `kind` using the server clock (`TIME`).
pub async fn server_clock_store(kind: Kind, tag: &str) -> RedisStore {
    RedisStore::builder(url(kind))
        .timeout(Duration::from_secs(5))
        .namespace(namespace(tag))
        .connect()
        .await
        .expect("connect")
}

pub fn as_dyn(s: RedisStore) -> Arc<dyn Store> {
    Arc::new(s)
}

/// Every algorithm, with small quotas so sequences hit denials.
pub fn algorithms() -> Vec<Algorithm> {
    use sluice_core::LeakyMode::*;
    vec![
        Algorithm::TokenBucket {
            capacity: 5,
            rate: Rate::per_second(1),
        },
        Algorithm::TokenBucket {
            capacity: 10,
            rate: Rate::new(6, 1400),
        },
        Algorithm::Gcra {
            rate: Rate::per_second(5),
            burst: 2,
        },
        Algorithm::Gcra {
            rate: Rate::new(3, 1000),
            burst: 0,
        },
        Algorithm::LeakyBucket {
            capacity: 4,
            rate: Rate::per_second(2),
            mode: Policing,
        },
        Algorithm::LeakyBucket {
            capacity: 3,
            rate: Rate::new(5, 300),
            mode: Shaping,
        },
        Algorithm::FixedWindow {
            limit: 5,
            window_ms: 1000,
        },
        Algorithm::FixedWindow {
            limit: 3,
            window_ms: 700,
        },
        Algorithm::SlidingWindowCounter {
            limit: 5,
            window_ms: 1000,
        },
        Algorithm::SlidingWindowCounter {
            limit: 7,
            window_ms: 300,
        },
        Algorithm::SlidingWindowLog {
            limit: 4,
            window_ms: 1000,
        },
        Algorithm::SlidingWindowLog {
            limit: 6,
            window_ms: 250,
        },
        Algorithm::Concurrency {
            limit: 3,
            lease_ms: 1000,
        },
        Algorithm::Concurrency {
            limit: 5,
            lease_ms: 300,
        },
    ]
}

/// A limit of exactly `n` admissions with no refill during a test, per algorithm.
pub fn exact_limits(n: u64) -> Vec<Algorithm> {
    vec![
        Algorithm::TokenBucket {
            capacity: n,
            rate: Rate::new(1, 3_600_000),
        },
        Algorithm::Gcra {
            rate: Rate::new(1, 3_600_000),
            burst: n - 1,
        },
        Algorithm::LeakyBucket {
            capacity: n,
            rate: Rate::new(1, 3_600_000),
            mode: sluice_core::LeakyMode::Policing,
        },
        Algorithm::FixedWindow {
            limit: n,
            window_ms: 1_000_000_000_000,
        },
        Algorithm::SlidingWindowCounter {
            limit: n,
            window_ms: 1_000_000_000_000,
        },
        Algorithm::SlidingWindowLog {
            limit: n,
            window_ms: 3_600_000,
        },
        Algorithm::Concurrency {
            limit: n,
            lease_ms: 3_600_000,
        },
    ]
}
