//! The integration tests of the HTTP layer, as one test binary: each module was once its own
//! file under `tests/` (and so its own binary that linked tokio, axum and the stores again);
//! here they build once.
//!
//! All tests share one process and run on parallel threads; each serves its own app on a port
//! the OS chose. Shared helpers live in [`support`], the JWT keys in `fixtures/`. One module:
//! `cargo test -p sluice-http --test suite -- jwt::`.

mod support;

mod client_address_lists;
mod control_plane;
mod count_by_outcome;
mod decide;
mod identity;
mod jwt;
mod layer;
mod paths;
