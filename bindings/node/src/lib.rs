//! `sluice.node`: the sluice engine as a Node.js addon (napi-rs).
//!
//! A Node app gets the same [`sluice::Limiter`] a Rust service links: the algorithms, the
//! Redis scripts, batching, the deny cache, the circuit breaker and the failure modes are the
//! Rust crates' own, and so are the key names, so an Express app, a Rust service and
//! `sluice serve` on one Redis share one limit exactly. Nothing of a decision is rewritten in
//! JavaScript: `index.js` only shapes arguments and results, and the Express and Fastify
//! middleware only move a request's method, path, headers and peer into
//! [`guard::HttpGuard`] and its answer back out.
//!
//! Every call that waits on a store returns a Promise settled from napi's tokio runtime, so
//! a check never blocks the event loop.
//!
//! Unsafe code is denied (not forbidden): napi-derive's generated registration code allows
//! it locally, which `forbid` refuses; nothing written here uses it.
//!
//! # Layout
//! - [`policy`]: `Policy`, built from an algorithm name and options through the core
//!   registry, so errors read as in `sluice.toml`.
//! - [`config`]: `Config`, a `sluice.toml` read by `sluice_config` (the server's reader),
//!   and the core registry's algorithm list.
//! - [`decision`]: a [`sluice::Checked`] as the numbers and header values JS is given.
//! - [`limiter`]: `Limiter`: connect by URL, `check`, `release`, credential hashing.
//! - [`guard`]: `HttpGuard`: the tower layer's per-request work for the middleware.
#![deny(unsafe_code)]

mod config;
mod decision;
mod guard;
mod limiter;
mod policy;
mod reservation;

/// The addon's own allocator. A check allocates a few dozen small blocks (its identity and
/// key, the script arguments, the reply, the result's strings), many freed on another tokio
/// thread than the one that made them; glibc's malloc spent a fifth of the tokio threads' time
/// on those (`perf`, docs/benchmarks.md). JS memory is V8's and unaffected; napi copies every
/// value that crosses, so no block changes allocator.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

use napi::{Error, Status};

/// Worker threads of the addon's tokio runtime when `SLUICE_NODE_WORKER_THREADS` does not
/// say: one on a machine of one or two cores, else two.
///
/// Why not tokio's default (one per core): a check hops between tasks several times (the
/// batch's task, the Redis batcher, the connection, back through the batch's task to the
/// delivery), and with several workers those hops wake parked threads through futexes and
/// bounce between cores. On two cores shared with the JS thread and Redis itself, one worker
/// spent less CPU per decision than two (tokio's threads 5.65 against 6.60 µs, medians of
/// interleaved runs; docs/benchmarks.md, Node round 4). Past two cores a second worker keeps
/// the tokio side from becoming the limit before the JS thread does.
fn default_worker_threads() -> usize {
    match std::thread::available_parallelism().map_or(1, usize::from) {
        0..=2 => 1,
        _ => 2,
    }
}

/// Builds the runtime napi-rs runs the addon's futures on, before napi starts its own
/// default (which has one worker per core). `SLUICE_NODE_WORKER_THREADS` sets its workers;
/// tokio's own `TOKIO_WORKER_THREADS` is honoured when that is unset.
#[napi_derive::module_init]
fn init_runtime() {
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    builder.enable_all();
    let configured = std::env::var("SLUICE_NODE_WORKER_THREADS")
        .ok()
        .and_then(|v| v.trim().parse::<usize>().ok())
        .filter(|&n| n > 0);
    match configured {
        Some(n) => {
            builder.worker_threads(n);
        }
        None if std::env::var_os("TOKIO_WORKER_THREADS").is_some() => {}
        None => {
            builder.worker_threads(default_worker_threads());
        }
    }
    // Without a runtime of its own napi-rs builds its default one: the addon still works.
    if let Ok(runtime) = builder.build() {
        napi::bindgen_prelude::create_custom_tokio_runtime(runtime);
    }
}

/// A JS error for bad input (`err.code === 'InvalidArg'`).
pub(crate) fn invalid(message: impl Into<String>) -> Error {
    Error::new(Status::InvalidArg, message.into())
}

/// A JS error for a store that cannot be used (`err.code === 'GenericFailure'`).
pub(crate) fn store_error(message: impl Into<String>) -> Error {
    Error::new(Status::GenericFailure, message.into())
}

/// A whole, non-negative JS number as `u64`, or an error naming `what`.
pub(crate) fn whole(value: f64, what: &str) -> napi::Result<u64> {
    if value.is_finite() && value >= 0.0 && value.fract() == 0.0 && value <= 9_007_199_254_740_991.0
    {
        Ok(value as u64)
    } else {
        Err(invalid(format!(
            "{what} must be a whole number of at least 0, not {value}"
        )))
    }
}

/// A `u64` as a JS number (exact up to 2^53, which no count or duration here reaches).
pub(crate) fn number(value: u64) -> f64 {
    value as f64
}
