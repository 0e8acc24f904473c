//! The integration tests of `sluice-core`, as one test binary: each module was once its own
//! file under `tests/` (and so its own binary to build and link); here they build once.
//!
//! Proptest keeps a module's regressions in `tests/proptest-regressions/<module>.txt`: it looks
//! for them beside the directory that holds `main.rs` (here `suite/`), and replays them before
//! any new case. One module:
//! `cargo test -p sluice-core --test suite -- properties::`.

mod adjust_properties;
mod properties;
