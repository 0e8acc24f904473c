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
use sluice::{Identity, Limiter, Policy, Reservation, SettleError, Settled};
use sluice_http::HeaderOptions;

use crate::StoreError;
use crate::checked::PyChecked;

/// An admitted (or denied) reservation: a `Checked` (the check of the maximum, so its
/// numbers and headers read as a check's do), and the handle to settle.
#[pyclass(name = "Reservation", module = "sluice", frozen, extends = PyChecked)]
#[derive(Debug)]
pub struct PyReservation {
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
) -> PyResult<Py<PyReservation>> {
    let mut reserved = limiter
        .reserve(&identity, &policy, max_cost, Duration::from_millis(ttl_ms))
        .await
        .map_err(|e| match e {
            sluice::StoreError::Invalid(m) => PyValueError::new_err(m),
            other => StoreError::new_err(format!("could not reserve: {other}")),
        })?;
    let checked = PyChecked::new(&mut reserved.checked, limiter, &headers);
    let reservation = PyReservation {
        id: reserved.reservation.as_ref().map(|r| r.id().to_string()),
        max_cost,
        handle: Mutex::new(reserved.reservation),
    };
    Python::attach(|py| Py::new(py, (reservation, checked)))
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

    fn __repr__(slf: PyRef<'_, Self>) -> String {
        format!(
            "Reservation(allowed={}, id={:?}, max_cost={})",
            if slf.as_super().summary.allowed {
                "True"
            } else {
                "False"
            },
            slf.id,
            slf.max_cost
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
