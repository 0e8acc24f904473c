//! The attack driver behind `scripts/attack`: the eight findings of the hardening work run at
//! full scale against the real release `sluice` binary, each printing the figure that says
//! whether the protection held.
//!
//! ```text
//! cargo run --release -p sluice-reliability --example attack -- \
//!     --bin target/release/sluice [--only slowloris,eviction] [--quick] [--json]
//! ```
//!
//! Every server is a child process on free loopback ports with a generated configuration; the
//! Redis servers are real `redis-server` processes on free ports. Every child is killed when
//! its guard drops, and a watchdog shell kills it if the driver dies. Every load loop is
//! bounded in count and in time. `--quick` runs CI-scale sizes.
//!
//! The attacks (and their modules):
//! - `slowloris`, `descriptors`, `big-heads`, `pooled-host`, `slow-bodies` ([`connections`]):
//!   connection discipline;
//! - `eviction`, `memory` ([`flooding`]): what a flood of identities does to the embedded store;
//! - `overload`, `leases`, `redis-memory` ([`store`]): a busy and a paused Redis, and what
//!   long identities cost it;
//! - `reload`, `credentials`, `exposure` ([`operator`]): operator mistakes and exposure;
//! - `proxy-paths`, `count-outcome`, `client-identities` ([`proxy_edges`]): the reverse
//!   proxy against real FastAPI and Express upstreams;
//! - `public-control`, `cross-site` ([`boundary`]): the auth boundary and cross-site writes;
//! - `control-size`, `ban-expiry` ([`control`]): a million deny entries on two instances, and
//!   automatic bans of rotating identities that must leave nothing behind.
#![forbid(unsafe_code)]

mod boundary;
mod connections;
mod control;
mod flooding;
mod harness;
mod operator;
mod proxy_edges;
mod store;

use std::path::PathBuf;
use std::time::Instant;

use serde_json::{Map, Value, json};

/// What the driver was asked to do.
#[derive(Debug, Clone)]
pub(crate) struct Args {
    pub(crate) bin: PathBuf,
    pub(crate) only: Vec<String>,
    pub(crate) quick: bool,
    pub(crate) json: bool,
}

/// The names `--only` accepts, in the order they run.
const ATTACKS: [&str; 20] = [
    "slowloris",
    "descriptors",
    "big-heads",
    "pooled-host",
    "slow-bodies",
    "eviction",
    "overload",
    "reload",
    "leases",
    "credentials",
    "memory",
    "redis-memory",
    "exposure",
    "proxy-paths",
    "count-outcome",
    "client-identities",
    "public-control",
    "cross-site",
    "control-size",
    "ban-expiry",
];

fn args() -> Args {
    let mut a = Args {
        bin: PathBuf::from(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../target/release/sluice"
        )),
        only: Vec::new(),
        quick: false,
        json: false,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        match flag.as_str() {
            "--bin" => a.bin = it.next().expect("--bin PATH").into(),
            "--only" => {
                let names = it.next().expect("--only NAME[,NAME]");
                for n in names.split(',').map(str::trim).filter(|n| !n.is_empty()) {
                    if !ATTACKS.contains(&n) {
                        eprintln!("unknown attack {n:?}; known: {}", ATTACKS.join(", "));
                        std::process::exit(2);
                    }
                    a.only.push(n.to_string());
                }
            }
            "--quick" => a.quick = true,
            "--json" => a.json = true,
            "-h" | "--help" => {
                println!(
                    "attack [--bin PATH] [--only NAME[,NAME]] [--quick] [--json]\nattacks: {}",
                    ATTACKS.join(", ")
                );
                std::process::exit(0);
            }
            other => {
                eprintln!("unknown flag {other}");
                std::process::exit(2);
            }
        }
    }
    a
}

/// The measured result of one attack.
#[derive(Debug)]
pub(crate) struct Outcome {
    /// The attack's name (as `--only` takes it).
    pub(crate) name: &'static str,
    /// The size it ran at.
    pub(crate) size: String,
    /// The figures, by name.
    pub(crate) figures: Map<String, Value>,
}

impl Outcome {
    pub(crate) fn new(name: &'static str, size: impl Into<String>) -> Self {
        Outcome {
            name,
            size: size.into(),
            figures: Map::new(),
        }
    }

    /// Records one figure.
    pub(crate) fn set(&mut self, key: &str, value: impl Into<Value>) -> &mut Self {
        self.figures.insert(key.to_string(), value.into());
        self
    }

    fn line(&self, seconds: f64) -> String {
        let figures: Vec<String> = self
            .figures
            .iter()
            .map(|(k, v)| match v {
                Value::String(s) => format!("{k}={s}"),
                other => format!("{k}={other}"),
            })
            .collect();
        format!(
            "{:<12} [{}] {} ({seconds:.0} s)",
            self.name,
            self.size,
            figures.join("; ")
        )
    }
}

/// Raises this process's descriptor soft limit to the hard limit (the attacks hold thousands
/// of sockets).
fn raise_own_descriptor_limit() -> u64 {
    match rlimit::increase_nofile_limit(u64::MAX) {
        Ok(n) => n,
        Err(e) => {
            eprintln!("could not raise the descriptor limit: {e}");
            rlimit::getrlimit(rlimit::Resource::NOFILE).map_or(1024, |(soft, _)| soft)
        }
    }
}

async fn run_one(name: &str, a: &Args) -> Outcome {
    match name {
        "slowloris" => connections::slowloris(a).await,
        "descriptors" => connections::descriptors(a).await,
        "big-heads" => connections::big_heads(a).await,
        "pooled-host" => connections::pooled_host(a).await,
        "slow-bodies" => connections::slow_bodies(a).await,
        "eviction" => flooding::eviction(a).await,
        "memory" => flooding::memory(a).await,
        "redis-memory" => store::redis_memory(a).await,
        "overload" => store::overload(a).await,
        "leases" => store::leases(a).await,
        "reload" => operator::reload(a).await,
        "credentials" => operator::credentials(a).await,
        "exposure" => operator::exposure(a).await,
        "proxy-paths" => proxy_edges::paths(a).await,
        "count-outcome" => proxy_edges::count_outcome(a).await,
        "client-identities" => proxy_edges::client_identities(a).await,
        "public-control" => boundary::public_control(a).await,
        "cross-site" => boundary::cross_site(a).await,
        "control-size" => control::control_size(a).await,
        "ban-expiry" => control::ban_expiry(a).await,
        _ => unreachable!("names are checked in args()"),
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let a = args();
    if !a.bin.exists() {
        eprintln!(
            "{} does not exist: build it with cargo build --release --bin sluice",
            a.bin.display()
        );
        std::process::exit(2);
    }
    let nofile = raise_own_descriptor_limit();
    if nofile < 12_000 {
        eprintln!("warning: descriptor limit {nofile}; the big-heads attack needs about 10,000");
    }
    let started = Instant::now();
    let mut results = Vec::new();
    for name in ATTACKS {
        if !a.only.is_empty() && !a.only.iter().any(|o| o == name) {
            continue;
        }
        let t = Instant::now();
        let outcome = run_one(name, &a).await;
        let seconds = t.elapsed().as_secs_f64();
        println!("{}", outcome.line(seconds));
        results.push(json!({
            "attack": outcome.name,
            "size": outcome.size,
            "figures": Value::Object(outcome.figures),
            "seconds": (seconds * 10.0).round() / 10.0,
        }));
    }
    if a.json {
        let summary = json!({
            "binary": a.bin.display().to_string(),
            "quick": a.quick,
            "seconds": started.elapsed().as_secs(),
            "attacks": results,
        });
        println!("{}", serde_json::to_string_pretty(&summary).expect("json"));
    }
}
