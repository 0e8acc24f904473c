//! `sluice-core`: everything about rate limiting that does not touch a socket.
//!
//! # Layout
//! - [`clock`]: the injected source of time. Decision logic never reads the wall clock itself.
//! - [`policy`]: what a limit is (algorithm + parameters), parsed from `5/s`, `10s`, ...
//! - [`algorithm`]: one module per algorithm, each a pure function
//!   `(state, params, now, cost) -> (decision, new state)` in integer time.
//! - [`decision`]: what a check answers (allowed, remaining, retry/reset times, shaping delay).
//! - [`key`]: the key scheme `rl:{<identity>}:<policy>` and identity hashing.
//! - [`store`]: the async [`store::Store`] trait every backend implements (embedded memory, Redis).
//!
//! Stores only move state; the meaning of a limit lives here, so the embedded store and the
//! Lua scripts can be checked against the same functions.
#![forbid(unsafe_code)]

pub mod algorithm;
pub mod clock;
pub mod decision;
pub mod key;
pub mod policy;
pub mod store;

pub use clock::{Clock, ManualClock, SystemClock, Timestamp};
pub use decision::{Decision, DenyReason, LeaseId, MultiDecision};
pub use key::{ClientNet, Identity, KeyScheme};
pub use policy::{Algorithm, DecisionMode, FailureMode, LeakyMode, Policy, PolicyError, Rate};
pub use store::{CheckItem, Store, StoreError};
