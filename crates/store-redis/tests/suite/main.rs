//! The integration tests of the Redis store, as one test binary: each module was once its own
//! file under `tests/`, and so its own binary that linked tokio and the redis client again;
//! here they build once.
//!
//! All tests share one process and run on parallel threads. [`support`] starts one Redis, one
//! Valkey and one Cluster for the whole process, on first use; tests on them keep to a
//! namespace of their own ([`support::namespace`]). A test that stops, pauses, flushes or
//! reconfigures a server, or reads its command statistics, starts a server of its own.
//! One module: `cargo test -p sluice-redis --test suite -- race::`.

mod support;

mod adjust_differential;
mod batch;
mod batch_functions;
mod batch_scripts;
mod commands;
mod conformance;
mod connection;
mod differential;
mod faults;
mod lease_compensation;
mod overload;
mod race;
mod security;
