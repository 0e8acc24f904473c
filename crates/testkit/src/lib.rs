//! `sluice-testkit`: what the workspace's tests share.
//!
//! - [`servers`]: real Redis, Valkey, Cluster, TLS and Sentinel servers on free loopback
//!   ports, so store tests run against the real thing, never a mock.
//! - [`upstream`]: real FastAPI and Express apps behind the reverse proxy, counting what
//!   reached their handlers.
//! - [`metrics`]: a recorder that logs the metric keys a code path emits, for the unit tests
//!   that pin each literal label.
//! - [`conformance`]: the store conformance suite, one set of cases every
//!   [`sluice_core::Store`] must pass, stamped out per backend by [`store_conformance_tests!`].
#![forbid(unsafe_code)]

pub mod metrics;
pub mod servers;
pub mod upstream;

pub mod conformance;
