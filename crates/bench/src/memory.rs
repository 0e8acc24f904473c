//! `sluice-bench memory`: bytes per key and growth with the number of identities.
//!
//! - Redis: for each algorithm, N identities each make one decision under a slow policy
//!   (10 per hour, so no key expires during the measurement); then `MEMORY USAGE` of sampled
//!   keys (the key's own cost) and the growth of `used_memory` divided by N (what the server
//!   really spends, dict overhead and TTL entry included).
//! - Embedded: the growth of this process's resident set while N keys are inserted, divided
//!   by N (run each algorithm in a fresh process: the allocator does not hand memory back),
//!   and decisions/s over random keys among the N afterwards.

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::json;
use sluice::{Identity, Limiter, Policy, StoreOptions, StoreUrl};
use sluice_core::{Algorithm, CheckItem};
use sluice_memory::MemoryStore;

use crate::redis_info::{connect, info_field};
use crate::{Rng, algorithm_kind, quota_algorithm};

/// Each algorithm with a policy slow enough that one decision leaves a key for an hour:
/// 10 per hour (10 leases of an hour for concurrency).
pub fn slow_algorithm(name: &str) -> Result<Algorithm, String> {
    let hour = 3_600_000;
    Ok(quota_algorithm(algorithm_kind(name)?, 10, hour, hour))
}

/// Redis bytes per key for `algorithm` over `keys` identities (FLUSHALL first: use the
/// benchmark's own server).
pub fn redis_bytes_per_key(
    url: &str,
    algorithm: &str,
    keys: u64,
) -> Result<serde_json::Value, String> {
    let mut conn = connect(url)?;
    let _: () = redis::cmd("FLUSHALL")
        .query(&mut conn)
        .map_err(|e| e.to_string())?;
    let before = info_field(&mut conn, "memory", "used_memory")?;
    let policy = Arc::new(Policy::new("m", slow_algorithm(algorithm)?).map_err(|e| e.to_string())?);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    rt.block_on(async {
        let parsed: StoreUrl = url.parse().map_err(|e: sluice::StoreError| e.to_string())?;
        let options = StoreOptions {
            timeout: Duration::from_secs(2),
            ..Default::default()
        };
        let limiter = Limiter::builder(parsed.connect(&options).await.map_err(|e| e.to_string())?)
            .timeout(Duration::from_secs(2))
            .build();
        let conc = 64u64;
        let mut tasks = Vec::new();
        for w in 0..conc {
            let (limiter, policy) = (limiter.clone(), Arc::clone(&policy));
            tasks.push(tokio::spawn(async move {
                let mut n = w;
                while n < keys {
                    let c = limiter
                        .check(&Identity::new(format!("user:{n}")), &policy, 1)
                        .await;
                    if !c.allowed {
                        return Err(format!("prefill denied: {:?}", c.verdict));
                    }
                    n += conc;
                }
                Ok(())
            }));
        }
        for t in tasks {
            t.await.map_err(|e| e.to_string())??;
        }
        Ok::<(), String>(())
    })?;
    let after = info_field(&mut conn, "memory", "used_memory")?;
    let dbsize: u64 = redis::cmd("DBSIZE")
        .query(&mut conn)
        .map_err(|e| e.to_string())?;
    let mut rng = Rng::new(7);
    let mut usage = Vec::new();
    for _ in 0..200 {
        let key = format!("rl:{{user:{}}}:m", rng.below(keys));
        let bytes: Option<u64> = redis::cmd("MEMORY")
            .arg("USAGE")
            .arg(&key)
            .arg("SAMPLES")
            .arg(0)
            .query(&mut conn)
            .map_err(|e| e.to_string())?;
        usage.extend(bytes);
    }
    let avg = usage.iter().sum::<u64>() as f64 / usage.len().max(1) as f64;
    Ok(json!({
        "store": "redis",
        "algorithm": algorithm,
        "keys": keys,
        "dbsize": dbsize,
        "memory_usage_bytes_per_key": avg,
        "used_memory_bytes_per_key": (after - before) / keys.max(1) as f64,
    }))
}

/// Resident set size of this process, bytes (Linux `/proc/self/statm`, 4 KiB pages).
pub fn rss_bytes() -> Option<u64> {
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    Some(pages * 4096)
}

/// Embedded bytes per key and decisions/s for `algorithm` with `keys` identities, in this
/// process; `seconds` bounds the timed phase.
pub fn embedded(algorithm: &str, keys: u64, seconds: f64) -> Result<serde_json::Value, String> {
    let alg = slow_algorithm(algorithm)?;
    let store = MemoryStore::builder().build();
    let mut key = String::with_capacity(64);
    let name = |key: &mut String, n: u64| {
        use std::fmt::Write as _;
        key.clear();
        let _ = write!(key, "rl:{{user:{n}}}:m");
    };
    let rss0 = rss_bytes().unwrap_or(0);
    let t0 = Instant::now();
    for n in 0..keys {
        name(&mut key, n);
        let d = store.check_now(&[CheckItem {
            key: &key,
            algorithm: &alg,
            cost: 1,
        }]);
        if !d.allowed {
            return Err("prefill denied".into());
        }
    }
    let insert_s = t0.elapsed().as_secs_f64();
    let rss1 = rss_bytes().unwrap_or(0);
    // Steady state: random existing keys, cost 1 (admitted up to 10 times per key, then denied).
    let mut rng = Rng::new(11);
    let deadline = Instant::now() + Duration::from_secs_f64(seconds);
    let (mut done, start) = (0u64, Instant::now());
    while done < 50_000_000 {
        for _ in 0..1024 {
            name(&mut key, rng.below(keys));
            std::hint::black_box(store.check_now(&[CheckItem {
                key: &key,
                algorithm: &alg,
                cost: 1,
            }]));
        }
        done += 1024;
        if Instant::now() >= deadline {
            break;
        }
    }
    let elapsed = start.elapsed().as_secs_f64();
    Ok(json!({
        "store": "memory",
        "algorithm": algorithm,
        "keys": keys,
        "held": store.len(),
        "rss_bytes_per_key": rss1.saturating_sub(rss0) as f64 / keys.max(1) as f64,
        "inserts_per_s": keys as f64 / insert_s,
        "decisions_per_s": done as f64 / elapsed,
        "ns_per_decision": elapsed * 1e9 / done as f64,
    }))
}
