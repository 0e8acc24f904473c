//! The limiter a configuration asks for: its store (with the control plane in the same
//! store), timeouts, key prefix, local share, and the file's lists, plans and ban rules.
//!
//! The Python and Node packages build their limiter from a `sluice.toml` through this
//! function, so an app that loads the file limits under the same keys, with the same deny
//! lists and bans, as `sluice serve` started on it.

use sluice::{KeyScheme, Limiter, LocalShare, StoreError, StoreOptions, StoreUrl};

use crate::Config;

/// Connects to the configured store and builds the limiter, with the file's `[lists]`,
/// `[plans]` and `ban` rules installed in its control plane.
pub async fn connect_limiter(config: &Config) -> Result<Limiter, StoreError> {
    let limiter = connect_store_limiter(config).await?;
    limiter.control().configure(config.control.clone());
    Ok(limiter)
}

/// The limiter on the configured store (timeout, key prefix, local share), its control plane
/// connected to the same store but not yet configured: `sluice serve` configures it, and
/// configures it again on a reload, itself.
pub async fn connect_store_limiter(config: &Config) -> Result<Limiter, StoreError> {
    let url: StoreUrl = config.store.url.parse()?;
    let options = StoreOptions {
        timeout: config.store.timeout,
        max_keys: config.store.max_keys,
        max_memory: Some(config.store.max_memory),
        unresponsive_after: config.store.unresponsive_after,
    };
    let (store, control) =
        sluice::control::connect(&url, &options, &config.store.key_prefix).await?;
    // Checked by the configuration (0 < share <= 1), so this cannot fail here.
    let share = LocalShare::new(config.store.local_share)
        .map_err(|e| StoreError::Invalid(format!("store.local_share: {e}")))?;
    Ok(Limiter::builder(store)
        .control(control)
        .local_share(share)
        .timeout(config.store.timeout)
        .key_scheme(KeyScheme::with_prefix(config.store.key_prefix.clone()))
        .build())
}
