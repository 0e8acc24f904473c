//! `Reservation` and `Settled`: [`sluice::Limiter::reserve`] from Python, for calls whose cost
//! is known only after they ran (an LLM call's tokens).
//!
//! `await limiter.reserve(policy, identity, max_cost=2000)` checks and consumes the maximum;
//! `await reservation.settle(used)` gives back what was not used (or charges the excess as
//! debt), once. A reservation dropped or collected unsettled stays spent in full: nothing is
//! refunded without a settle. `limiter.settle(id, cost)` settles one made by another process
//! sharing the store.

use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyDict;
use sluice::{Identity, Limiter, Policy, Reservation, SettleError, Settled};
use sluice_http::HeaderOptions;

use crate::StoreError;
use crate::checked::Summary;

/// An admitted (or denied) reservation: the check of the maximum, and the handle to settle.
#[pyclass(name = "Reservation", module = "sluice", frozen)]
#[derive(Debug)]
pub struct PyReservation {
    summary: Summary,
    id: Option<String>,
    max_cost: u64,
    /// Taken by the first settle.
    handle: Mutex<Option<Reservation>>,
}

/// What a settle did.
#[pyclass(name = "Settled", module = "sluice", frozen, get_all)]
#[derive(Debug, Clone)]
pub struct PySettled {
    /// The policy reserved from.
    policy: String,
    /// The identity reserved for (a credential's hash).
    identity: String,
    /// The maximum reserved.
    max_cost: u64,
    /// The real cost it was settled with.
    cost: u64,
    /// Units given back.
    refunded: u64,
    /// Units charged beyond the maximum.
    debt: u64,
}

impl From<Settled> for PySettled {
    fn from(s: Settled) -> Self {
        PySettled {
            policy: s.policy,
            identity: s.identity,
            max_cost: s.max_cost,
            cost: s.actual,
            refunded: s.refunded,
            debt: s.debt,
        }
    }
}

#[pymethods]
impl PySettled {
    fn __repr__(&self) -> String {
        format!(
            "Settled(policy={:?}, max_cost={}, cost={}, refunded={}, debt={})",
            self.policy, self.max_cost, self.cost, self.refunded, self.debt
        )
    }
}

fn settle_error(e: SettleError) -> PyErr {
    match e {
        SettleError::Store(sluice::StoreError::Invalid(m)) => PyValueError::new_err(m),
        SettleError::Store(e) => StoreError::new_err(format!(
            "the reservation was not settled and counts in full: {e}"
        )),
        other => PyRuntimeError::new_err(other.to_string()),
    }
}

/// Reserves `max_cost` of `policy` for `identity` for `ttl_ms`.
pub(crate) async fn reserve(
    limiter: Limiter,
    headers: HeaderOptions,
    policy: Arc<Policy>,
    identity: Identity,
    max_cost: u64,
    ttl_ms: u64,
) -> PyResult<PyReservation> {
    let reserved = limiter
        .reserve(&identity, &policy, max_cost, Duration::from_millis(ttl_ms))
        .await
        .map_err(|e| match e {
            sluice::StoreError::Invalid(m) => PyValueError::new_err(m),
            other => StoreError::new_err(format!("could not reserve: {other}")),
        })?;
    Ok(PyReservation {
        summary: Summary::of(&reserved.checked, &headers),
        id: reserved.reservation.as_ref().map(|r| r.id().to_string()),
        max_cost,
        handle: Mutex::new(reserved.reservation),
    })
}

/// Settles the reservation `id` with `cost`.
pub(crate) async fn settle(limiter: Limiter, id: String, cost: u64) -> PyResult<PySettled> {
    limiter
        .settle(&id, cost)
        .await
        .map(PySettled::from)
        .map_err(settle_error)
}

#[pymethods]
impl PyReservation {
    /// Whether the request may go ahead (its maximum is reserved when `id` is set).
    #[getter]
    fn allowed(&self) -> bool {
        self.summary.allowed
    }
    /// The id that settles it from any process sharing the store; `None` when denied, or
    /// admitted without consuming (failed open, allow-listed): nothing to settle.
    #[getter]
    fn id(&self) -> Option<String> {
        self.id.clone()
    }
    /// The maximum reserved.
    #[getter]
    fn max_cost(&self) -> u64 {
        self.max_cost
    }
    /// What is left of the budget with the maximum reserved.
    #[getter]
    fn remaining(&self) -> u64 {
        self.summary.remaining
    }
    /// The policy's quota.
    #[getter]
    fn limit(&self) -> u64 {
        self.summary.limit
    }
    /// How long until a denied reservation would fit, in ms.
    #[getter]
    fn retry_after_ms(&self) -> u64 {
        self.summary.retry_after_ms
    }
    /// `RateLimit-Policy`, `RateLimit` and, on a denial, `Retry-After`, as a dict.
    #[getter]
    fn headers<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let d = PyDict::new(py);
        for (n, v) in &self.summary.headers {
            d.set_item(n, v)?;
        }
        Ok(d)
    }

    /// Settles it with the real `cost`; awaitable giving a `Settled`. Raises `RuntimeError`
    /// when settled already or never reserved, `StoreError` when the store failed (the
    /// reservation then counts in full).
    fn settle<'py>(&self, py: Python<'py>, cost: u64) -> PyResult<Bound<'py, PyAny>> {
        let handle = self.take()?;
        pyo3_async_runtimes::tokio::future_into_py(py, async move {
            handle
                .settle(cost)
                .await
                .map(PySettled::from)
                .map_err(settle_error)
        })
    }

    /// `settle` for synchronous code; the GIL is released meanwhile.
    fn settle_sync(&self, py: Python<'_>, cost: u64) -> PyResult<PySettled> {
        let handle = self.take()?;
        py.detach(|| {
            pyo3_async_runtimes::tokio::get_runtime()
                .block_on(handle.settle(cost))
                .map(PySettled::from)
                .map_err(settle_error)
        })
    }

    fn __bool__(&self) -> bool {
        self.summary.allowed
    }

    fn __repr__(&self) -> String {
        format!(
            "Reservation(allowed={}, id={:?}, max_cost={})",
            self.summary.allowed, self.id, self.max_cost
        )
    }
}

impl PyReservation {
    fn take(&self) -> PyResult<Reservation> {
        self.handle.lock().take().ok_or_else(|| {
            PyRuntimeError::new_err(if self.id.is_some() {
                "the reservation was settled already"
            } else {
                "nothing was reserved (denied, or admitted without consuming): nothing to settle"
            })
        })
    }
}
