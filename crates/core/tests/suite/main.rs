//! The integration tests of `sluice-core`, as one test binary: each module was once its own
//! file under `tests/` (and so its own binary to build and link); here they build once.
//!
//! Proptest keeps each module's regressions next to its source
//! (`adjust_properties.proptest-regressions`). One module:
//! `cargo test -p sluice-core --test suite -- properties::`.

mod adjust_properties;
mod properties;
