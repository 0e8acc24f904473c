//! The integration tests of the `sluice` command line, as one test binary: each module was
//! once its own file under `tests/` (and so its own binary to build and link); here they build
//! once. They run the built binary (`CARGO_BIN_EXE_sluice`) against real servers.
//!
//! All tests share one process and run on parallel threads; every server they start listens on
//! a port the OS chose. Shared helpers live in [`support`]. One module:
//! `cargo test -p sluice-cli --test suite -- verify::`.

mod support;

mod admin;
mod check_params;
mod image;
mod leased_check;
mod loadtest;
mod logging;
mod tools;
mod top;
mod verify;
