//! The `sluice` command line, as a library so the binary stays a thin argument parser and the
//! tools can be tested in-process.
//!
//! # Layout
//! - [`policy_args`]: the per-algorithm flags (`--capacity --rate`, `--limit --window`, ...) shared
//!   by `check`, `race` and `loadtest --expect`.
//! - [`admin`]: `sluice admin`, the runtime-control calls of a running `sluice serve`.
//! - [`check`]: N decisions on one key against any store.
//! - [`race`]: the guide's race test — a naive GET-then-SET next to sluice.
//! - [`loadtest`]: a constant-arrival-rate HTTP driver with the arithmetic's prediction beside
//!   the measured admitted count, and an SVG plot.
//! - [`verify`]: `sluice verify`, a planned arrival pattern against a running deployment,
//!   judged against the policy's arithmetic and the bounds of docs/guarantees.md.
//! - [`keyslot`]: Redis Cluster slots of keys.
//! - [`probe`]: `sluice probe URL`, the container image's health check.
//! - [`top`]: `sluice top`, the live view of a running `sluice serve` in the terminal.
//! - [`logging`]: which log filter applies (`SLUICE_LOG`, then `RUST_LOG`) and when to colour.
#![forbid(unsafe_code)]

pub mod admin;
pub mod check;
pub mod keyslot;
pub mod loadtest;
pub mod logging;
pub mod plot;
pub mod policy_args;
pub mod probe;
pub mod race;
pub mod top;
pub mod verify;
