//! `sluice`: the rate limiter as applications use it.
//!
//! A [`Limiter`] turns `(identity, policy, cost)` into a verdict. It owns the pieces that are
//! the same whatever the store: building key names, hot-key sharding, shadow policies, the
//! per-call timeout, the policy's failure mode (fail open or closed) and a circuit breaker
//! that stops waiting on a store that is down. The store itself is chosen by URL
//! ([`StoreUrl`]): `memory` (the embedded default), `redis://`, `rediss://`,
//! `redis+cluster://host:port,host:port`.
//!
//! # Layout
//! - [`limiter`]: [`Limiter`], [`Checked`], [`LimitResult`], [`Lease`].
//! - [`breaker`]: the circuit breaker.
//! - [`deny_cache`]: the local deny cache that answers repeated denials without the store.
//! - [`url`]: store selection by URL.
#![forbid(unsafe_code)]

pub mod breaker;
pub mod deny_cache;
pub mod limiter;
pub mod url;

pub use deny_cache::DenyCacheMode;
pub use limiter::{Checked, Lease, LimitResult, Limiter, LimiterBuilder, Verdict};
pub use sluice_core as core;
pub use sluice_core::{
    Algorithm, Decision, DenyReason, FailureMode, Identity, KeyScheme, LeakyMode, Policy, Rate,
    Store, StoreError,
};
pub use url::{StoreOptions, StoreUrl};
