//! The integration tests of `sluice serve`, as one test binary.
//!
//! Each module was once its own file under `tests/`, and so its own binary: each of them linked
//! and monomorphized tokio, axum, hyper and reqwest again, which made building the tests most
//! of the time `cargo test` takes. Here they are modules of one crate, built once.
//!
//! All tests share one process and run on parallel threads, so none may rely on being alone:
//! every server listens on a port the OS chose, writes to its own temporary directory, and
//! reads its settings from its configuration rather than from the environment. The metrics
//! are the one thing all servers of a process share (one Prometheus recorder): a test reads
//! series only its own server adds to (a policy name of its own), or counts what its server
//! did as the difference from what `/metrics` showed when it started; the connection-limit
//! tests, whose counters carry no more than the listener's name, take turns
//! ([`support::listener::turn`]). The one test that needs a process to itself, what a fresh
//! instance exports, is its own binary: `tests/grafana.rs`.
//!
//! Shared helpers live in [`support`]. One module: `cargo test -p sluice-server --test suite
//! --features testing -- rls::`.

mod support;

mod auth_boundary;
mod calendar;
mod config;
mod connections;
mod connections_fair;
mod console;
mod control_api;
mod control_import;
mod cross_site;
mod decision_api;
mod deploy_manifests;
mod envoy;
mod evictions;
mod examples;
mod exposure;
mod identity_warnings;
mod leased_config;
mod leased_serve;
mod local_mode;
mod proxy;
mod proxy_outcome;
mod proxy_paths;
mod proxy_reserve;
mod reload;
mod reserve_api;
mod rls;
mod rls_control_plane;
mod rls_leased;
mod route_limiting;
mod slow_bodies;
mod state_api;
mod telemetry;
