//! `sluice`: the rate limiter as applications use it.
//!
//! A [`Limiter`] turns `(identity, policy, cost)` into a verdict. It owns the pieces that are
//! the same whatever the store: building key names, hot-key sharding, shadow policies, the
//! per-call timeout, the policy's failure mode (fail open, fail closed, or decide locally) and
//! a circuit breaker that stops waiting on a store that is down. A store that is merely busy
//! is not failing: a check that cannot be decided because sluice itself is saturated is
//! denied (`StoreError::Overloaded`), never failed open. The store itself is chosen by URL
//! ([`StoreUrl`]): `memory` (the embedded default), `redis://`, `rediss://`,
//! `redis+cluster://host:port,host:port`.
//!
//! # Layout
//! - [`limiter`]: [`Limiter`], [`Checked`], [`LimitResult`], [`Lease`]; its `store_call`
//!   module awaits store calls (bounds, breaker, failure accounting).
//! - [`breaker`]: the circuit breaker.
//! - [`control`]: overrides, plans, bans, allow and deny lists changed at runtime.
//! - [`deny_cache`]: the local deny cache that answers repeated denials without the store.
//! - [`local`]: `failure_mode = "local"`, the embedded store that decides while the store is
//!   unreachable.
//! - [`leased`]: `mode = "leased"`, slices of a key's quota spent in-process.
//! - [`lease_token`]: a check's concurrency leases as text, to release in a later request.
//! - [`observer`]: a hook that sees every decision and store call (live views).
//! - [`reservation`]: reserve a maximum cost, settle the real one (never over-spent).
//! - [`url`]: store selection by URL.
//!
//! # Features
//! Each store is a Cargo feature, both on by default: `memory` (the embedded store) and
//! `redis` (Redis and Valkey, with the `redis` client and TLS through native-tls). An
//! application that only needs the embedded store builds with
//! `default-features = false, features = ["memory"]` and compiles neither the client nor
//! TLS; a URL whose store is not compiled in is refused with an error naming the feature.
#![forbid(unsafe_code)]

pub mod breaker;
pub mod control;
pub mod deny_cache;
pub mod lease_token;
pub mod leased;
pub mod limiter;
pub mod local;
pub mod observer;
pub mod reservation;
pub mod url;

pub use control::{
    BanEntry, BanRule, ControlConfig, ControlPlane, ListEntry, ListKind, OverrideEntry,
    OverrideTarget,
};
pub use deny_cache::DenyCacheMode;
pub use lease_token::{LeaseToken, LeaseTokenError, TokenLease};
pub use leased::LeaseCounters;
pub use limiter::{Checked, Lease, LimitResult, Limiter, LimiterBuilder, Verdict};
pub use local::{InvalidLocalShare, LocalShare};
pub use observer::{DecisionEvent, DecisionObserver, Outcome};
pub use reservation::{Reservation, Reserved, SettleError, Settled};
pub use sluice_core as core;
pub use sluice_core::{
    Algorithm, Decision, DecisionMode, DenyReason, FailureMode, Identity, KeyScheme, LeakyMode,
    Policy, Rate, Store, StoreError,
};
pub use url::{StoreOptions, StoreUrl};
