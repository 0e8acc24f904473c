//! `sluice-bench`: argument parsing only; the drivers are in the library.
//!
//! ```text
//! sluice-bench redis --redis redis://127.0.0.1:6390/0 --duration 10 --warmup 1 --conc 64 --keyspace 100000 --algorithm token-bucket
//! sluice-bench ceiling --port 6390 --algorithm gcra --pipeline 16
//! sluice-bench flood --redis redis://127.0.0.1:6390/0 --duration 5
//! sluice-bench memory-redis --redis redis://127.0.0.1:6390/0 --keys 100000
//! sluice-bench memory-embedded --algorithm gcra --keys 1000000
//! sluice-bench rls --target http://127.0.0.1:8081 --domain bench --key user
//! sluice-bench rls-burst --target http://127.0.0.1:8081 --domain bench --key user --value check
//! ```
#![forbid(unsafe_code)]

use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};
use sluice::DenyCacheMode;
use sluice_bench::{ceiling, flood, memory, redis_load, rls};

#[derive(Debug, Parser)]
#[command(
    version,
    about = "Load drivers that measure sluice side by side with the alternatives"
)]
struct Args {
    #[command(subcommand)]
    cmd: Cmd,
}

/// How long and how wide a load runs (`redis`, `flood` and `rls` take the same flags).
#[derive(Debug, Clone, Copy, clap::Args)]
struct Shape {
    /// Measured seconds (0.1 to 600).
    #[arg(long, default_value_t = 10.0)]
    duration: f64,
    /// Warm-up seconds (run, not counted; at most 60).
    #[arg(long, default_value_t = 1.0)]
    warmup: f64,
    /// Calls in flight (1 to 4096).
    #[arg(long, default_value_t = 64)]
    conc: usize,
    /// Distinct identities (`user:<n>`, or descriptor values for rls) picked at random.
    #[arg(long, default_value_t = 100_000)]
    keyspace: u64,
}

impl Shape {
    /// The flags within the bounds every loop here keeps.
    fn bounded(self) -> Self {
        Self {
            duration: self.duration.clamp(0.1, 600.0),
            warmup: self.warmup.clamp(0.0, 60.0),
            conc: self.conc.clamp(1, 4096),
            keyspace: self.keyspace.max(1),
        }
    }
}

#[derive(Debug, clap::Args)]
struct Load {
    /// Store URL (loopback Redis/Valkey, or `memory`).
    #[arg(long, default_value = "redis://127.0.0.1:6379/0")]
    redis: String,
    #[command(flatten)]
    shape: Shape,
    /// token-bucket, gcra, leaky-bucket, fixed-window, sliding-counter, sliding-log, concurrency.
    #[arg(long, default_value = "token-bucket")]
    algorithm: String,
    /// Deny cache: auto, off, exact, all.
    #[arg(long, default_value = "auto")]
    deny_cache: DenyCacheMode,
    /// Runtime worker threads (1: one event loop, like the Node anchors).
    #[arg(long, default_value_t = 1)]
    threads: usize,
    /// Per-call timeout, ms.
    #[arg(long, default_value_t = 1000)]
    timeout_ms: u64,
    /// Stop after this many counted decisions.
    #[arg(long, default_value_t = 100_000_000)]
    max_decisions: u64,
}

impl Load {
    fn config(&self) -> redis_load::LoadConfig {
        let Shape {
            duration,
            warmup,
            conc,
            keyspace,
        } = self.shape.bounded();
        redis_load::LoadConfig {
            url: self.redis.clone(),
            duration,
            warmup,
            conc,
            keyspace,
            algorithm: self.algorithm.clone(),
            deny_cache: self.deny_cache,
            threads: self.threads.max(1),
            timeout: Duration::from_millis(self.timeout_ms),
            max_decisions: self.max_decisions,
        }
    }
}

#[derive(Debug, Subcommand)]
enum Cmd {
    /// Decisions/s through the `Limiter` (the anchors' EXTRA_CLIENTS contract: one JSON line).
    Redis(Load),
    /// redis-benchmark running sluice's own script (one JSON line, same form).
    Ceiling {
        #[arg(long)]
        port: u16,
        #[arg(long, default_value = "token-bucket")]
        algorithm: String,
        #[arg(long, default_value_t = 50)]
        clients: u32,
        #[arg(long, default_value_t = 16)]
        pipeline: u32,
        #[arg(long, default_value_t = 500_000)]
        requests: u64,
        #[arg(long, default_value_t = 100_000)]
        keyspace: u64,
        /// Run this Lua file (the seed guide's token_bucket.lua) instead of sluice's script.
        #[arg(long)]
        guide: Option<std::path::PathBuf>,
    },
    /// A denied-path flood with the deny cache off, then on: Redis calls per request.
    Flood {
        #[command(flatten)]
        load: Load,
    },
    /// Redis bytes per key for each algorithm (FLUSHALLs the server: use a private one).
    MemoryRedis {
        #[arg(long)]
        redis: String,
        #[arg(long, default_value_t = 100_000)]
        keys: u64,
        #[arg(
            long,
            value_delimiter = ',',
            default_value = "token-bucket,gcra,leaky-bucket,fixed-window,sliding-counter,sliding-log,concurrency"
        )]
        algorithms: Vec<String>,
    },
    /// Embedded store bytes per key and decisions/s for one algorithm and key count.
    MemoryEmbedded {
        #[arg(long, default_value = "token-bucket")]
        algorithm: String,
        #[arg(long, default_value_t = 100_000)]
        keys: u64,
        #[arg(long, default_value_t = 2.0)]
        seconds: f64,
    },
    /// Envoy ShouldRateLimit calls/s against `sluice serve`'s gRPC listener.
    Rls {
        #[command(flatten)]
        to: rls::Target,
        #[command(flatten)]
        shape: Shape,
    },
    /// Envoy ShouldRateLimit correctness on one value: bursts of calls at once, 2 s apart.
    RlsBurst {
        #[command(flatten)]
        to: rls::Target,
        #[arg(long, default_value = "check")]
        value: String,
        #[arg(long, default_value_t = 3)]
        bursts: usize,
        #[arg(long, default_value_t = 20)]
        calls: usize,
        #[arg(long, default_value_t = 3.0)]
        sustained: f64,
    },
}

fn main() -> ExitCode {
    let args = Args::parse();
    let result: Result<Vec<serde_json::Value>, String> = match args.cmd {
        Cmd::Redis(load) => redis_load::run(load.config()).map(|v| vec![v]),
        Cmd::Ceiling {
            port,
            algorithm,
            clients,
            pipeline,
            requests,
            keyspace,
            guide,
        } => {
            ceiling::run(&ceiling::CeilingConfig {
                port,
                algorithm,
                clients,
                pipeline,
                requests: requests.min(20_000_000),
                keyspace,
                guide,
            })
        }
        .map(|v| vec![v]),
        Cmd::Flood { load } => {
            flood::run(&load.config(), &[DenyCacheMode::Off, DenyCacheMode::Exact])
        }
        Cmd::MemoryRedis {
            redis,
            keys,
            algorithms,
        } => algorithms
            .iter()
            .map(|a| memory::redis_bytes_per_key(&redis, a, keys.min(2_000_000)))
            .collect(),
        Cmd::MemoryEmbedded {
            algorithm,
            keys,
            seconds,
        } => memory::embedded(&algorithm, keys.min(5_000_000), seconds.clamp(0.1, 60.0))
            .map(|v| vec![v]),
        Cmd::Rls { to, shape } => {
            let Shape {
                duration,
                warmup,
                conc,
                keyspace,
            } = shape.bounded();
            rls::run(rls::RlsConfig {
                to,
                duration,
                warmup,
                conc,
                keyspace,
            })
            .map(|v| vec![v])
        }
        Cmd::RlsBurst {
            to,
            value,
            bursts,
            calls,
            sustained,
        } => rls::burst(rls::BurstConfig {
            to,
            value,
            bursts: bursts.min(60),
            calls: calls.clamp(1, 1000),
            sustained: sustained.clamp(0.0, 60.0),
        })
        .map(|v| vec![v]),
    };
    match result {
        Ok(lines) => {
            for l in lines {
                println!("{l}");
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("sluice-bench: {e}");
            ExitCode::FAILURE
        }
    }
}
