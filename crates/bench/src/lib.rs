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

use sluice_core::{Algorithm, LeakyMode, Rate};

/// The algorithms by their CLI names, with the like-for-like parameters of the anchors
/// (the seed's token bucket: 10 burst, 5/s, cost 1; windows: 10 per 2 s).
pub fn bench_algorithm(name: &str) -> Result<(Algorithm, &'static str), String> {
    let five = Rate::per_second(5);
    Ok(match name {
        "token-bucket" | "tb" => (
            Algorithm::TokenBucket {
                capacity: 10,
                rate: five,
            },
            "tb",
        ),
        "gcra" => (
            Algorithm::Gcra {
                rate: five,
                burst: 9,
            },
            "gcra",
        ),
        "leaky-bucket" | "lb" => (
            Algorithm::LeakyBucket {
                capacity: 10,
                rate: five,
                mode: LeakyMode::Policing,
            },
            "lb",
        ),
        "fixed-window" | "fw" => (
            Algorithm::FixedWindow {
                limit: 10,
                window_ms: 2000,
            },
            "fw",
        ),
        "sliding-counter" | "swc" => (
            Algorithm::SlidingWindowCounter {
                limit: 10,
                window_ms: 2000,
            },
            "swc",
        ),
        "sliding-log" | "swl" => (
            Algorithm::SlidingWindowLog {
                limit: 10,
                window_ms: 2000,
            },
            "swl",
        ),
        "concurrency" | "cc" => (
            Algorithm::Concurrency {
                limit: 10,
                lease_ms: 1000,
            },
            "cc",
        ),
        other => return Err(format!("unknown algorithm {other:?}")),
    })
}

/// Every algorithm's CLI name.
pub const ALGORITHMS: [&str; 7] = [
    "token-bucket",
    "gcra",
    "leaky-bucket",
    "fixed-window",
    "sliding-counter",
    "sliding-log",
    "concurrency",
];

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
        for a in ALGORITHMS {
            bench_algorithm(a).unwrap().0.validate().unwrap();
        }
    }
}
