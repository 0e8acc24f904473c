//! `sluice-redis`: the [`sluice_core::Store`] on Redis and Valkey, standalone or Cluster.
//!
//! # Layout
//! - `lua/*.lua`: one file per algorithm (a check function registered in `CHECK`), the
//!   all-or-nothing dispatcher `check.lua` and `release.lua`, each with its KEYS/ARGV contract
//!   and Redis command count on top. [`scripts`] assembles them at compile time into one script
//!   per algorithm, one multi-limit script and one function library, so each algorithm's logic
//!   exists once.
//! - [`store`]: [`RedisStore`] — connections (multiplexed, reconnecting; Cluster with
//!   MOVED/ASK handled by the client), `EVALSHA` with `EVAL` fallback on `NOSCRIPT`, `FCALL`
//!   with reload, per-call timeouts, error mapping.
//! - [`url`]: `redis://`, `rediss://` (TLS), `redis+cluster://`, `redis+sentinel://` and friends.
//! - [`sharding`]: hot-key sharding helpers.
//!
//! The formulas are those of `sluice_core::algorithm` (`docs/algorithms.md`); a differential
//! test holds the scripts equal to the Rust functions. See `docs/redis.md`.
//!
//! # Features
//! - `client` (default): everything above. Without it only [`url`]'s scheme list and
//!   `redact` remain, so the `sluice` facade built without Redis still recognises a Redis URL
//!   (and says which feature it needs) without compiling the client or TLS.
#![forbid(unsafe_code)]

#[cfg(feature = "client")]
mod batch;
#[cfg(feature = "client")]
mod protocol;
#[cfg(feature = "client")]
pub mod scripts;
#[cfg(feature = "client")]
pub mod sharding;
#[cfg(feature = "client")]
pub mod store;
pub mod url;

/// The Redis client crate, for callers of [`RedisStore::command`].
#[cfg(feature = "client")]
pub use redis;
#[cfg(feature = "client")]
pub use scripts::{function_library, scripts};
#[cfg(feature = "client")]
pub use sharding::shard_algorithm;
#[cfg(feature = "client")]
pub use store::{RedisOptions, RedisStore, RedisStoreBuilder, ScriptMode, connect};
