//! `Config`: a `sluice.toml` read by the configuration crate (`sluice_config`), the code
//! `sluice serve` reads it with, so a Node app and the server take the same file, refuse the
//! same mistakes with the same `FILE:LINE: field: message` lines, and build the same
//! policies, store connection, hash key and lists from it. Also the algorithm list of the
//! core registry, from which `index.js` makes one `Policy` constructor per algorithm.

use std::sync::Arc;

use napi::{Error, Status};
use napi_derive::napi;
use sluice::core::algorithm::AlgorithmKind;
use sluice_config::ConfigErrors;

use crate::policy::Policy;

/// A configuration error for JS: the message is one `FILE:LINE: field: message` line per
/// problem; `index.js` turns it into a `ConfigError`.
pub(crate) fn config_error(e: &ConfigErrors) -> Error {
    Error::new(Status::InvalidArg, format!("ConfigError: {e}"))
}

/// A checked `sluice.toml`.
#[napi]
#[derive(Debug, Clone)]
pub struct Config {
    pub(crate) inner: Arc<sluice_config::Config>,
}

#[napi]
impl Config {
    /// Reads and checks the file at `path`; relative Envoy files resolve next to it.
    #[napi(factory)]
    pub fn load(path: String) -> napi::Result<Self> {
        sluice_config::Config::load(std::path::Path::new(&path))
            .map(|c| Self { inner: Arc::new(c) })
            .map_err(|e| config_error(&e))
    }

    /// Checks configuration `text`; `file` names it in errors (default `<inline>`).
    #[napi(factory)]
    pub fn parse(text: String, file: Option<String>) -> napi::Result<Self> {
        let file = file.unwrap_or_else(|| "<inline>".to_string());
        sluice_config::Config::parse(&text, &file, None)
            .map(|c| Self { inner: Arc::new(c) })
            .map_err(|e| config_error(&e))
    }

    /// The file it was read from (`null` for `Config.parse`).
    #[napi(getter)]
    pub fn path(&self) -> Option<String> {
        self.inner.path.as_ref().map(|p| p.display().to_string())
    }

    /// Every `[policies.NAME]`, in name order.
    #[napi(getter)]
    pub fn policy_list(&self) -> Vec<Policy> {
        self.inner
            .policies
            .values()
            .map(|pc| Policy {
                inner: Arc::clone(&pc.policy),
            })
            .collect()
    }

    /// `store.url` with any password hidden.
    #[napi(getter)]
    pub fn store_url(&self) -> String {
        sluice::url::redact(&self.inner.store.url)
    }
}

/// Every `[policies.NAME]` of a TOML text (a whole `sluice.toml` works), in name order, by
/// [`sluice_config::parse_policies`]. Envoy files and `env:` secrets are not read.
#[napi]
pub(crate) fn policies_from_toml(text: String, file: Option<String>) -> napi::Result<Vec<Policy>> {
    let file = file.unwrap_or_else(|| "<inline>".to_string());
    let policies = sluice_config::parse_policies(&text, &file).map_err(|e| config_error(&e))?;
    Ok(policies
        .into_values()
        .map(|pc| Policy { inner: pc.policy })
        .collect())
}

/// One algorithm of the core registry: its stable name and the parameters it takes.
#[napi(object)]
#[derive(Debug)]
pub(crate) struct AlgorithmEntry {
    /// `token-bucket`, `gcra`, ...
    pub name: String,
    /// `capacity`, `rate`, ... in the order messages list them.
    pub params: Vec<String>,
}

/// Every algorithm of the core registry, in its order.
#[napi]
pub(crate) fn algorithms() -> Vec<AlgorithmEntry> {
    AlgorithmKind::ALL
        .iter()
        .map(|k| AlgorithmEntry {
            name: k.name().to_string(),
            params: k.params().iter().map(|p| p.name().to_string()).collect(),
        })
        .collect()
}
