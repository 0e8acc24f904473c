//! `sluice-bench`: load drivers that measure sluice side by side with the alternatives.
//!
//! # Layout
//! - [`stats`]: latency samples, percentiles, process CPU time, the one-line JSON summary.
//! - [`redis_load`]: `sluice-bench redis`, the anchors harness's `EXTRA_CLIENTS` contract:
//!   CONC loops deciding on random keys through [`sluice::Limiter`] for WARMUP + DURATION s.
//! - [`ceiling`]: `sluice-bench ceiling`, `redis-benchmark` running sluice's own script (the
//!   ceiling a client could reach), reported in the same JSON form.
//! - [`redis_info`]: `INFO commandstats` / `MEMORY USAGE` helpers.
//! - [`flood`]: `sluice-bench flood`, a denied-path flood with and without the deny cache:
//!   Redis script calls per request.
//! - [`memory`]: `sluice-bench memory`, bytes per key (Redis and embedded) and growth from 1k
//!   to 1M identities.
//! - [`rls`]: `sluice-bench rls`, a bounded gRPC load driver for Envoy's ShouldRateLimit.
//!
//! Every loop here is bounded in time and count, and only talks to loopback addresses given
//! on the command line. `benches/embedded.rs` is the criterion comparison with `governor`.
#![forbid(unsafe_code)]

pub mod ceiling;
pub mod flood;
pub mod memory;
pub mod redis_info;
pub mod redis_load;
pub mod rls;
pub mod stats;

use sluice_core::Algorithm;
use sluice_core::algorithm::registry::AlgorithmKind;

/// The algorithm called `name`: a name or alias from the core registry, or its Lua code
/// (`tb`, `swc`, `cc`...), which these drivers also use as policy names.
pub fn algorithm_kind(name: &str) -> Result<AlgorithmKind, String> {
    name.parse::<AlgorithmKind>().or_else(|e| {
        AlgorithmKind::ALL
            .into_iter()
            .find(|k| k.lua_code() == name)
            .ok_or_else(|| e.to_string())
    })
}

/// `kind` admitting `amount` per `period_ms` (the registry's [`AlgorithmKind::for_quota`]),
/// or for concurrency `amount` leases that live `lease_ms` unless released.
pub fn quota_algorithm(
    kind: AlgorithmKind,
    amount: u64,
    period_ms: u64,
    lease_ms: u64,
) -> Algorithm {
    kind.for_quota(amount, period_ms)
        .unwrap_or(Algorithm::Concurrency {
            limit: amount,
            lease_ms,
        })
}

/// An algorithm by name with the like-for-like parameters of the anchors (the seed's token
/// bucket: 10 burst, 5/s, cost 1; windows: 10 per 2 s; GCRA burst 9 at 5/s; 10 leases of
/// 1 s), and its Lua code, the policy name the drivers use.
pub fn bench_algorithm(name: &str) -> Result<(Algorithm, &'static str), String> {
    let kind = algorithm_kind(name)?;
    Ok((quota_algorithm(kind, 10, 2000, 1000), kind.lua_code()))
}

/// xorshift64*: a cheap per-task random stream.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// A stream seeded from `seed` (any value).
    pub fn new(seed: u64) -> Self {
        Self(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }
    /// The next value.
    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    /// A value below `n`.
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n.max(1)
    }
}

/// Refuses anything but a loopback Redis URL: these drivers generate load.
pub fn require_loopback(url: &str) -> Result<(), String> {
    let host = url
        .split("://")
        .nth(1)
        .unwrap_or(url)
        .split(['/', '?'])
        .next()
        .unwrap_or("");
    let host = host.rsplit('@').next().unwrap_or(host);
    let ok = host.split(',').all(|h| {
        let name = h.rsplit_once(':').map_or(h, |(n, _)| n);
        matches!(name, "127.0.0.1" | "localhost" | "[::1]" | "::1")
    });
    if ok {
        Ok(())
    } else {
        Err(format!(
            "refusing non-loopback target {url}: benchmarks only run on 127.0.0.1"
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_only() {
        assert!(require_loopback("redis://127.0.0.1:6390/0").is_ok());
        assert!(require_loopback("redis+cluster://127.0.0.1:7000,127.0.0.1:7001").is_ok());
        assert!(require_loopback("redis://10.0.0.1:6379").is_err());
        assert!(require_loopback("http://localhost:8081").is_ok());
    }

    #[test]
    fn every_algorithm_is_valid() {
        for kind in AlgorithmKind::ALL {
            for name in [kind.name(), kind.lua_code()] {
                let (algorithm, code) = bench_algorithm(name).unwrap();
                algorithm.validate().unwrap();
                assert_eq!((algorithm.algorithm_kind(), code), (kind, kind.lua_code()));
                assert_eq!((algorithm.quota(), algorithm.window_ms() > 0), (10, true));
            }
        }
        assert!(bench_algorithm("token-bucket-ish").is_err());
        for kind in AlgorithmKind::ALL {
            let slow = memory::slow_algorithm(kind.name()).unwrap();
            assert_eq!((slow.quota(), slow.window_ms()), (10, 3_600_000), "{kind}");
        }
    }
}
