//! `Limiter`: a [`sluice::Limiter`] chosen by URL, checked from asyncio or from threads.
//!
//! Identities given as `credential=` are hashed with
//! [`sluice_http::identity::api_key_identity`], the function the Rust layer applies to an
//! `x-api-key` header and `sluice serve` to a `credential` field, so with the same hash key
//! all three limit one API key under one Redis key.

use std::sync::Arc;
use std::time::Duration;

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use sluice::core::key::{MAX_IDENTITY_LEN, default_hash_key};
use sluice::{Identity, Limiter, Policy, StoreOptions};
use sluice_http::HeaderOptions;
use sluice_http::identity::api_key_identity;

use crate::StoreError;
use crate::checked::PyChecked;
use crate::config::PyConfig;
use crate::policy::PyPolicy;

/// A secret as Python passes it: text (UTF-8) or bytes.
#[derive(Debug, FromPyObject)]
pub(crate) enum Secret {
    Text(String),
    Bytes(Vec<u8>),
}

impl Secret {
    fn as_bytes(&self) -> &[u8] {
        match self {
            Secret::Text(s) => s.as_bytes(),
            Secret::Bytes(b) => b,
        }
    }
}

/// Parses a hash key written as 64 hex digits (`openssl rand -hex 32`), as `sluice.toml`'s
/// `identity_hash_key` is written.
pub(crate) fn hash_key_from_hex(text: Option<&str>) -> PyResult<[u8; 32]> {
    let Some(s) = text.map(str::trim) else {
        return Ok(default_hash_key());
    };
    if s.len() != 64 || !s.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(PyValueError::new_err(
            "hash_key must be 64 hex digits (32 bytes), e.g. the output of `openssl rand -hex 32`",
        ));
    }
    let mut out = [0u8; 32];
    for (i, o) in out.iter_mut().enumerate() {
        *o = u8::from_str_radix(&s[2 * i..2 * i + 2], 16)
            .map_err(|e| PyValueError::new_err(e.to_string()))?;
    }
    Ok(out)
}

/// The identity of an API key or other credential: `key:h<hex>`, the keyed hash that the
/// Rust layer, the `sluice serve` proxy and its decision API use.
#[pyfunction]
#[pyo3(signature = (secret, hash_key=None))]
pub(crate) fn hash_credential(secret: Secret, hash_key: Option<&str>) -> PyResult<String> {
    let key = hash_key_from_hex(hash_key)?;
    Ok(api_key_identity(secret.as_bytes(), &key)
        .as_str()
        .to_string())
}

/// The identity of a check: `identity` as given or `credential` hashed; exactly one.
fn identity_of(
    identity: Option<String>,
    credential: Option<Secret>,
    hash_key: &[u8; 32],
) -> PyResult<Identity> {
    match (identity, credential) {
        (Some(_), Some(_)) => Err(PyValueError::new_err(
            "give either an identity or credential=, not both: a credential is hashed into the identity",
        )),
        (None, None) => Err(PyValueError::new_err(
            "missing identity (who is limited, e.g. \"user:42\") or credential= (an API key)",
        )),
        (Some(s), None) if s.is_empty() => Err(PyValueError::new_err("identity must not be empty")),
        (Some(s), None) if s.len() > MAX_IDENTITY_LEN => Err(PyValueError::new_err(format!(
            "identity is {} bytes; the most is {MAX_IDENTITY_LEN}",
            s.len()
        ))),
        (Some(s), None) => Ok(Identity::new(s)),
        (None, Some(c)) if c.as_bytes().is_empty() => {
            Err(PyValueError::new_err("credential must not be empty"))
        }
        (None, Some(c)) => Ok(api_key_identity(c.as_bytes(), hash_key)),
    }
}

/// Connection settings of `Limiter.connect`.
fn store_options(
    timeout_ms: u64,
    max_keys: Option<usize>,
    max_memory: Option<usize>,
) -> PyResult<StoreOptions> {
    if timeout_ms == 0 {
        return Err(PyValueError::new_err("timeout_ms must be at least 1"));
    }
    let mut options = StoreOptions {
        timeout: Duration::from_millis(timeout_ms),
        ..StoreOptions::default()
    };
    if let Some(n) = max_keys {
        options.max_keys = n;
    }
    options.max_memory = max_memory;
    Ok(options)
}

/// A rate limiter on one store.
#[pyclass(name = "Limiter", module = "sluice", frozen)]
#[derive(Debug, Clone)]
pub struct PyLimiter {
    pub(crate) limiter: Limiter,
    pub(crate) hash_key: [u8; 32],
    pub(crate) headers: HeaderOptions,
}

/// Everything one check needs, owned, so it can move to the tokio runtime.
struct CheckJob {
    limiter: Limiter,
    headers: HeaderOptions,
    policy: Arc<Policy>,
    identity: Identity,
    cost: u64,
}

impl CheckJob {
    async fn run(self) -> PyChecked {
        let mut checked = self
            .limiter
            .check(&self.identity, &self.policy, self.cost)
            .await;
        PyChecked::new(&mut checked, self.limiter, &self.headers)
    }
}

impl PyLimiter {
    fn job(
        &self,
        policy: &PyPolicy,
        identity: Option<String>,
        cost: u64,
        credential: Option<Secret>,
    ) -> PyResult<CheckJob> {
        Ok(CheckJob {
            limiter: self.limiter.clone(),
            headers: self.headers,
            policy: Arc::clone(&policy.inner),
            identity: identity_of(identity, credential, &self.hash_key)?,
            cost,
        })
    }

    async fn open(
        url: String,
        options: StoreOptions,
        hash_key: [u8; 32],
        headers: HeaderOptions,
    ) -> PyResult<Self> {
        let limiter = Limiter::connect(&url, options).await.map_err(|e| {
            StoreError::new_err(format!(
                "cannot use store {}: {e}",
                sluice::url::redact(&url)
            ))
        })?;
        Ok(Self {
            limiter,
            hash_key,
            headers,
        })
    }
    /// The limiter of a checked configuration ([`sluice_config::connect_limiter`]).
    async fn from_checked(config: Arc<sluice_config::Config>) -> PyResult<Self> {
        let limiter = sluice_config::connect_limiter(&config).await.map_err(|e| {
            StoreError::new_err(format!(
                "cannot use store {}: {e}",
                sluice::url::redact(&config.store.url)
            ))
        })?;
        Ok(Self {
            limiter,
            hash_key: config.identity_hash_key,
            headers: config.headers,
        })
    }
}

/// A `Config`, or the path of a `sluice.toml` to load.
pub(crate) fn config_of(arg: &Bound<'_, PyAny>) -> PyResult<Arc<sluice_config::Config>> {
    if let Ok(c) = arg.extract::<PyRef<'_, PyConfig>>() {
        return Ok(Arc::clone(&c.inner));
    }
    let path: std::path::PathBuf = arg.extract()?;
    crate::config::load(path)
}

#[pymethods]
impl PyLimiter {
    /// Connects to `url` (`"memory"`, `redis://`, `rediss://`, `redis+cluster://`);
    /// awaitable. `timeout_ms` bounds every store call (default 50); `hash_key` (64 hex
    /// digits) must match the other services' `identity_hash_key` for `credential=` checks
    /// to share limits; `legacy_headers` adds `X-RateLimit-*` to `Checked.headers`.
    #[staticmethod]
    #[pyo3(signature = (url=String::from("memory"), *, timeout_ms=50, max_keys=None, max_memory=None, hash_key=None, legacy_headers=false))]
    fn connect<'py>(
        py: Python<'py>,
        url: String,
        timeout_ms: u64,
        max_keys: Option<usize>,
        max_memory: Option<usize>,
        hash_key: Option<&str>,
        legacy_headers: bool,
    ) -> PyResult<Bound<'py, PyAny>> {
        let options = store_options(timeout_ms, max_keys, max_memory)?;
        let key = hash_key_from_hex(hash_key)?;
        let headers = HeaderOptions {
            ratelimit: true,
            legacy: legacy_headers,
        };
        pyo3_async_runtimes::tokio::future_into_py(py, Self::open(url, options, key, headers))
    }

    /// `connect` for synchronous code (WSGI apps, scripts); the GIL is released meanwhile.
    #[staticmethod]
    #[pyo3(signature = (url=String::from("memory"), *, timeout_ms=50, max_keys=None, max_memory=None, hash_key=None, legacy_headers=false))]
    fn connect_sync(
        py: Python<'_>,
        url: String,
        timeout_ms: u64,
        max_keys: Option<usize>,
        max_memory: Option<usize>,
        hash_key: Option<&str>,
        legacy_headers: bool,
    ) -> PyResult<Self> {
        let options = store_options(timeout_ms, max_keys, max_memory)?;
        let key = hash_key_from_hex(hash_key)?;
        let headers = HeaderOptions {
            ratelimit: true,
            legacy: legacy_headers,
        };
        py.detach(|| {
            pyo3_async_runtimes::tokio::get_runtime()
                .block_on(Self::open(url, options, key, headers))
        })
    }

    /// The limiter a `sluice.toml` describes (a `Config` or a path): its store, timeouts,
    /// key prefix, `identity_hash_key`, `legacy_headers`, and the file's `[lists]`, `[plans]`
    /// and ban rules, built by the code `sluice serve` uses; awaitable.
    #[staticmethod]
    fn from_config<'py>(
        py: Python<'py>,
        config: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let config = config_of(config)?;
        pyo3_async_runtimes::tokio::future_into_py(py, Self::from_checked(config))
    }

    /// `from_config` for synchronous code; the GIL is released meanwhile.
    #[staticmethod]
    fn from_config_sync(py: Python<'_>, config: &Bound<'_, PyAny>) -> PyResult<Self> {
        let config = config_of(config)?;
        py.detach(|| pyo3_async_runtimes::tokio::get_runtime().block_on(Self::from_checked(config)))
    }

    /// Checks `policy` for `identity` (or a hashed `credential`) at `cost`; awaitable,
    /// giving a `Checked`. Never raises for a store failure: the policy's failure mode
    /// decides, and `Checked.verdict` says so.
    #[pyo3(signature = (policy, identity=None, *, cost=1, credential=None))]
    fn check<'py>(
        &self,
        py: Python<'py>,
        policy: &PyPolicy,
        identity: Option<String>,
        cost: u64,
        credential: Option<Secret>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let job = self.job(policy, identity, cost, credential)?;
        crate::completion::spawn(py, async move { Ok(job.run().await) })
    }

    /// `check` for synchronous code; the GIL is released while the store answers.
    #[pyo3(signature = (policy, identity=None, *, cost=1, credential=None))]
    fn check_sync(
        &self,
        py: Python<'_>,
        policy: &PyPolicy,
        identity: Option<String>,
        cost: u64,
        credential: Option<Secret>,
    ) -> PyResult<PyChecked> {
        let job = self.job(policy, identity, cost, credential)?;
        Ok(py.detach(|| pyo3_async_runtimes::tokio::get_runtime().block_on(job.run())))
    }

    /// Reserves `max_cost` of `policy` for `identity` (or a hashed `credential`) until it is
    /// settled with the real cost or `ttl_ms` ends (then it counts in full); awaitable giving
    /// a `Reservation` (`sluice::reservation`).
    #[pyo3(signature = (policy, identity=None, *, max_cost, ttl_ms=60000, credential=None))]
    fn reserve<'py>(
        &self,
        py: Python<'py>,
        policy: &PyPolicy,
        identity: Option<String>,
        max_cost: u64,
        ttl_ms: u64,
        credential: Option<Secret>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let identity = identity_of(identity, credential, &self.hash_key)?;
        let (limiter, policy) = (self.limiter.clone(), Arc::clone(&policy.inner));
        let reserve =
            crate::reservation::reserve(limiter, self.headers, policy, identity, max_cost, ttl_ms);
        pyo3_async_runtimes::tokio::future_into_py(py, reserve)
    }

    /// `reserve` for synchronous code; the GIL is released meanwhile.
    #[pyo3(signature = (policy, identity=None, *, max_cost, ttl_ms=60000, credential=None))]
    fn reserve_sync(
        &self,
        py: Python<'_>,
        policy: &PyPolicy,
        identity: Option<String>,
        max_cost: u64,
        ttl_ms: u64,
        credential: Option<Secret>,
    ) -> PyResult<Py<crate::reservation::PyReservation>> {
        let identity = identity_of(identity, credential, &self.hash_key)?;
        let (limiter, policy) = (self.limiter.clone(), Arc::clone(&policy.inner));
        let reserve =
            crate::reservation::reserve(limiter, self.headers, policy, identity, max_cost, ttl_ms);
        py.detach(|| pyo3_async_runtimes::tokio::get_runtime().block_on(reserve))
    }

    /// Settles the reservation `id` (made by any process sharing the store) with the real
    /// `cost`; awaitable giving a `Settled`.
    fn settle<'py>(&self, py: Python<'py>, id: String, cost: u64) -> PyResult<Bound<'py, PyAny>> {
        let settle = crate::reservation::settle(self.limiter.clone(), id, cost);
        pyo3_async_runtimes::tokio::future_into_py(py, settle)
    }

    /// `settle` for synchronous code; the GIL is released meanwhile.
    fn settle_sync(
        &self,
        py: Python<'_>,
        id: String,
        cost: u64,
    ) -> PyResult<crate::reservation::PySettled> {
        let settle = crate::reservation::settle(self.limiter.clone(), id, cost);
        py.detach(|| pyo3_async_runtimes::tokio::get_runtime().block_on(settle))
    }

    /// The identity a credential is limited as with this limiter's hash key.
    fn credential_identity(&self, secret: Secret) -> PyResult<String> {
        identity_of(None, Some(secret), &self.hash_key).map(|i| i.as_str().to_string())
    }

    /// The Redis (or memory) key a policy keeps an identity's state under.
    fn key(&self, policy: &PyPolicy, identity: &str) -> String {
        self.limiter
            .key_scheme()
            .key(&Identity::new(identity), &policy.inner.name)
    }

    /// `memory` or `redis`.
    #[getter]
    fn store(&self) -> &'static str {
        self.limiter.store().kind()
    }

    /// True while the circuit breaker is refusing to wait on a failing store.
    #[getter]
    fn circuit_open(&self) -> bool {
        self.limiter.store_circuit_open()
    }

    /// Denials answered locally (deny cache) without a store call.
    #[getter]
    fn deny_cache_hits(&self) -> u64 {
        self.limiter.deny_cache_hits()
    }

    fn __repr__(&self) -> String {
        format!("Limiter(store={:?})", self.limiter.store().kind())
    }
}
