//! The fault, bound, hostile-input and security suites, as one test binary: each module was
//! once its own file under `tests/` (and so its own binary that linked `sluice serve` again);
//! here they build once.
//!
//! All tests share one process and run on parallel threads; every server they start listens on
//! a port the OS chose. One module: `cargo test -p sluice-reliability --test suite -- hostile::`.

mod bounds;
mod faults;
mod fuzz_regressions;
mod hostile;
mod secured_server;
mod security;
mod serve_faults;
mod serve_overload;
