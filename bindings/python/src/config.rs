//! `Config`: a `sluice.toml` read by the configuration crate (`sluice_config`), the code
//! `sluice serve` reads it with, so a Python app and the server take the same file, refuse
//! the same mistakes with the same `FILE:LINE: field: message` lines, and build the same
//! policies, store connection, hash key and lists from it.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

use pyo3::prelude::*;
use sluice_config::Config;

use crate::ConfigError;
use crate::policy::PyPolicy;

/// A checked `sluice.toml`.
#[pyclass(name = "Config", module = "sluice", frozen)]
#[derive(Debug, Clone)]
pub struct PyConfig {
    pub(crate) inner: Arc<Config>,
}

/// A path as Python passes it: `str` or `os.PathLike`.
pub(crate) fn load(path: PathBuf) -> PyResult<Arc<Config>> {
    Config::load(&path)
        .map(Arc::new)
        .map_err(|e| ConfigError::new_err(e.to_string()))
}

#[pymethods]
impl PyConfig {
    /// Reads and checks the file at `path`; relative Envoy files resolve next to it. Raises
    /// `ConfigError` with every problem, one `FILE:LINE: field: message` line each.
    #[staticmethod]
    fn load(path: PathBuf) -> PyResult<Self> {
        load(path).map(|inner| Self { inner })
    }

    /// Checks configuration `text`; `file` names it in errors, relative Envoy files resolve
    /// against the current directory.
    #[staticmethod]
    #[pyo3(signature = (text, *, file="<inline>"))]
    fn parse(text: &str, file: &str) -> PyResult<Self> {
        Config::parse(text, file, None)
            .map(|c| Self { inner: Arc::new(c) })
            .map_err(|e| ConfigError::new_err(e.to_string()))
    }

    /// The file it was read from (`None` for `Config.parse`).
    #[getter]
    fn path(&self) -> Option<PathBuf> {
        self.inner.path.clone()
    }

    /// Every `[policies.NAME]`, by name.
    #[getter]
    fn policies(&self) -> BTreeMap<String, PyPolicy> {
        self.inner
            .policies
            .iter()
            .map(|(n, pc)| {
                (
                    n.clone(),
                    PyPolicy {
                        inner: Arc::clone(&pc.policy),
                    },
                )
            })
            .collect()
    }

    /// `store.url` with any password hidden.
    #[getter]
    fn store_url(&self) -> String {
        sluice::url::redact(&self.inner.store.url)
    }

    fn __repr__(&self) -> String {
        format!(
            "Config(path={:?}, policies={}, routes={})",
            self.inner.path,
            self.inner.policies.len(),
            self.inner.routes.len()
        )
    }
}
