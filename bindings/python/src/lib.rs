//! `sluice._sluice`: the sluice engine as a Python extension module.
//!
//! Python code gets the same [`sluice::Limiter`] a Rust service links: the algorithms, the
//! Redis scripts, batching, the deny cache, the circuit breaker and the failure modes are the
//! Rust crates' own, so a Python app, a Rust service and `sluice serve` on one Redis share
//! one limit exactly (same key names, same scripts). Nothing of the decision is rewritten in
//! Python; the pure-Python middleware in `python/sluice/` only moves bytes between the web
//! framework and [`http::HttpGuard`].
//!
//! Async methods run on a tokio runtime owned by the module (pyo3-async-runtimes) and return
//! asyncio futures, so a check never blocks the event loop; finished checks are handed back
//! to their loop in batches, one wake-up for all that finished meanwhile ([`completion`]).
//! The `_sync` variants release the GIL while they wait for the store.
//!
//! # Layout
//! - [`completion`]: asyncio futures completed from tokio in batches, without the GIL on
//!   tokio's side.
//! - [`policy`]: `Policy`, its per-algorithm constructors and `Policy.from_toml`.
//! - [`config`]: `Config`, a `sluice.toml` read by `sluice_config` (the server's reader).
//! - [`checked`]: `Checked`, and the glue that turns a [`sluice::Checked`] into its numbers
//!   and header values (the only part a Node binding would want to share).
//! - [`limiter`]: `Limiter`: connect by URL, `check`, `check_sync`, credential hashing.
//! - [`http`]: `HttpGuard`: rules per path prefix, identities, and the 429 answer, for the
//!   ASGI/WSGI middleware and the FastAPI dependency.
#![forbid(unsafe_code)]

mod checked;
mod completion;
mod config;
mod http;
mod limiter;
mod policy;
mod reservation;

use pyo3::create_exception;
use pyo3::exceptions::{PyConnectionError, PyValueError};
use pyo3::prelude::*;

create_exception!(
    _sluice,
    StoreError,
    PyConnectionError,
    "The store could not be reached or refused the request (connect, or release of a lease)."
);
create_exception!(
    _sluice,
    ConfigError,
    PyValueError,
    "A sluice.toml that cannot be used: one `FILE:LINE: field: message` line per problem."
);
create_exception!(
    _sluice,
    PolicyError,
    PyValueError,
    "A policy that cannot be built: unknown algorithm, missing or out-of-range parameters."
);

/// The extension module.
#[pymodule]
fn _sluice(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<policy::PyPolicy>()?;
    m.add_class::<checked::PyChecked>()?;
    m.add_class::<limiter::PyLimiter>()?;
    m.add_class::<reservation::PyReservation>()?;
    m.add_class::<reservation::PySettled>()?;
    m.add_class::<config::PyConfig>()?;
    m.add_class::<http::HttpGuard>()?;
    m.add_class::<http::HttpVerdict>()?;
    m.add("StoreError", m.py().get_type::<StoreError>())?;
    m.add("PolicyError", m.py().get_type::<PolicyError>())?;
    m.add("ConfigError", m.py().get_type::<ConfigError>())?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add_function(wrap_pyfunction!(limiter::hash_credential, m)?)?;
    Ok(())
}
