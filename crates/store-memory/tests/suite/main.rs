//! The integration tests of the embedded store, as one test binary: each module was once its
//! own file under `tests/` (and so its own binary to build and link); here they build once.
//! All tests share one process and run on parallel threads; each builds its own store.
//!
//! Proptest keeps a module's regressions in `tests/proptest-regressions/<module>.txt`: it looks
//! for them beside the directory that holds `main.rs` (here `suite/`), and replays them before
//! any new case. One module:
//! `cargo test -p sluice-memory --test suite -- eviction::`.

mod conformance;
mod eviction;
mod eviction_flood;
mod multi_limit_property;
mod store;
mod summary_property;
