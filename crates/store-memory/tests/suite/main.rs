//! The integration tests of the embedded store, as one test binary: each module was once its
//! own file under `tests/` (and so its own binary to build and link); here they build once.
//! All tests share one process and run on parallel threads; each builds its own store.
//!
//! Proptest keeps a module's regressions next to its source
//! (`summary_property.proptest-regressions`). One module:
//! `cargo test -p sluice-memory --test suite -- eviction::`.

mod conformance;
mod eviction;
mod eviction_flood;
mod multi_limit_property;
mod store;
mod summary_property;
