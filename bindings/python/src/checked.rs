//! `Checked`: a check's result as numbers and header values (the name of Rust's
//! [`sluice::Checked`] and of the Node package's result).
//!
//! This is the glue a second binding (Node) would share: [`Summary::of`] reads a
//! [`Checked`] the way `sluice serve`'s decision API does (the leading decision of
//! `sluice_http::headers::lead_of`, numbers scaled for sharded policies by `Shown`) and
//! takes the header values from `sluice_http::headers::rate_limit_header_pairs`, so the numbers,
//! the `RateLimit` fields and `Retry-After` match the Rust layer and the server byte for
//! byte.

use pyo3::prelude::*;
use pyo3::types::PyDict;
use sluice::{Checked, Lease, Limiter, Verdict};
use sluice_http::HeaderOptions;
use sluice_http::headers::{lead_of, rate_limit_header_pairs};

use crate::StoreError;

/// What Python code is told about a check.
#[derive(Debug, Clone, Default)]
pub(crate) struct Summary {
    pub(crate) allowed: bool,
    pub(crate) limit: u64,
    pub(crate) remaining: u64,
    pub(crate) retry_after_ms: u64,
    pub(crate) reset_after_ms: u64,
    pub(crate) delay_ms: u64,
    /// `decided`, `failed_open` or `failed_closed`.
    pub(crate) verdict: &'static str,
    /// Why the leading decision denied (`limited`, `cost_exceeds_limit`, ...), if it did.
    pub(crate) reason: Option<&'static str>,
    /// `(name, value)` with the names spelled as clients usually write them.
    pub(crate) headers: Vec<(String, String)>,
}

impl Summary {
    /// The summary of `checked`, with headers as `opts` says.
    pub(crate) fn of(checked: &Checked, opts: &HeaderOptions) -> Self {
        let lead = lead_of(checked);
        let (limit, remaining, reset_after_ms, reason) = lead.leader.map_or((0, 0, 0, None), |s| {
            (
                s.limit(),
                s.remaining(),
                s.decision.reset_after_ms,
                s.decision.reason.map(reason_name),
            )
        });
        let reason = match checked.verdict {
            Verdict::FailedClosed(_) => Some("store_unavailable"),
            _ if checked.allowed => None,
            _ => reason,
        };
        let headers = rate_limit_header_pairs(checked, opts);
        Self {
            allowed: checked.allowed,
            limit,
            remaining,
            retry_after_ms: lead.wait_ms(),
            reset_after_ms,
            delay_ms: checked.delay_ms(),
            verdict: checked.verdict.as_str(),
            reason,
            headers,
        }
    }
}

fn reason_name(r: sluice::DenyReason) -> &'static str {
    match r {
        sluice::DenyReason::Limited => "limited",
        sluice::DenyReason::CostExceedsLimit => "cost_exceeds_limit",
        sluice::DenyReason::OtherLimitDenied => "other_limit_denied",
        sluice::DenyReason::StoreUnavailable => "store_unavailable",
        sluice::DenyReason::Banned => "banned",
        sluice::DenyReason::Denied => "denied",
    }
}

/// Releases `leases` one after the other; the first error is returned (the others are still
/// tried: an unreleased lease only expires after the policy's lease timeout).
pub(crate) async fn release_all(limiter: &Limiter, leases: &[Lease]) -> Result<usize, String> {
    let mut released = 0;
    let mut first_error = None;
    for lease in leases {
        match limiter.release(lease).await {
            Ok(true) => released += 1,
            Ok(false) => {}
            Err(e) => {
                first_error.get_or_insert_with(|| e.to_string());
            }
        }
    }
    match first_error {
        Some(e) => Err(e),
        None => Ok(released),
    }
}

/// The answer to `Limiter.check`, and the base of `Reservation` (the check of its maximum).
#[pyclass(name = "Checked", module = "sluice", frozen, subclass)]
#[derive(Debug)]
pub struct PyChecked {
    pub(crate) summary: Summary,
    pub(crate) limiter: Limiter,
    /// Concurrency leases taken by the check; taken out by `release`.
    pub(crate) leases: parking_lot::Mutex<Vec<Lease>>,
}

impl PyChecked {
    /// The Python view of `checked`, with headers as `opts` say; takes its concurrency
    /// leases, which `release` gives back through `limiter`.
    pub(crate) fn new(checked: &mut Checked, limiter: Limiter, opts: &HeaderOptions) -> Self {
        Self {
            summary: Summary::of(checked, opts),
            limiter,
            leases: parking_lot::Mutex::new(std::mem::take(&mut checked.leases)),
        }
    }
}

#[pymethods]
impl PyChecked {
    /// Whether to let the request through (shadow denials and fail-open admit).
    #[getter]
    fn allowed(&self) -> bool {
        self.summary.allowed
    }
    /// How many more cost-1 requests would be admitted now.
    #[getter]
    fn remaining(&self) -> u64 {
        self.summary.remaining
    }
    /// The policy's quota (0 when the store failed).
    #[getter]
    fn limit(&self) -> u64 {
        self.summary.limit
    }
    /// How long to wait before retrying, in ms (0 when admitted).
    #[getter]
    fn retry_after_ms(&self) -> u64 {
        self.summary.retry_after_ms
    }
    /// How long until the limit is back to full, in ms.
    #[getter]
    fn reset_after_ms(&self) -> u64 {
        self.summary.reset_after_ms
    }
    /// For a shaping leaky bucket: how long to hold the request before passing it on, in ms.
    #[getter]
    fn delay_ms(&self) -> u64 {
        self.summary.delay_ms
    }
    /// `decided`, `failed_open` (store failed, admitted) or `failed_closed` (store failed,
    /// denied).
    #[getter]
    fn verdict(&self) -> &'static str {
        self.summary.verdict
    }
    /// Why it was denied: `limited`, `cost_exceeds_limit` or `store_unavailable`.
    #[getter]
    fn reason(&self) -> Option<&'static str> {
        self.summary.reason
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
    /// How many concurrency leases the check holds (until `release`).
    #[getter]
    fn leases(&self) -> usize {
        self.leases.lock().len()
    }

    /// Gives back the concurrency leases this check took (awaitable); returns how many the
    /// store still held. Calling it again releases nothing.
    fn release<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let leases = std::mem::take(&mut *self.leases.lock());
        let limiter = self.limiter.clone();
        crate::completion::spawn(py, async move {
            release_all(&limiter, &leases)
                .await
                .map_err(StoreError::new_err)
        })
    }

    /// `release` for synchronous code; the GIL is released while the store answers.
    fn release_sync(&self, py: Python<'_>) -> PyResult<usize> {
        let leases = std::mem::take(&mut *self.leases.lock());
        let limiter = self.limiter.clone();
        py.detach(|| {
            pyo3_async_runtimes::tokio::get_runtime()
                .block_on(release_all(&limiter, &leases))
                .map_err(StoreError::new_err)
        })
    }

    fn __bool__(&self) -> bool {
        self.summary.allowed
    }

    fn __repr__(&self) -> String {
        let s = &self.summary;
        format!(
            "Checked(allowed={}, limit={}, remaining={}, retry_after_ms={}, reset_after_ms={}, verdict={:?})",
            if s.allowed { "True" } else { "False" },
            s.limit,
            s.remaining,
            s.retry_after_ms,
            s.reset_after_ms,
            s.verdict
        )
    }
}
