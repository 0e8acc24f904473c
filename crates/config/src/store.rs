//! `[store]`: where the limit state lives and what happens when it does not answer.

use std::time::Duration;

use sluice::{FailureMode, StoreUrl};

use super::StoreConfig;
use super::check::failure_mode;
use super::error::Checker;
use super::raw::RawStore;

/// The embedded store's default memory bound: 512 MiB.
pub const DEFAULT_MAX_MEMORY: u64 = 512 << 20;
/// Below 1 MiB the embedded store would evict nearly everything.
const MIN_MAX_MEMORY: u64 = 1 << 20;

/// Checks `[store]`.
pub(super) fn check_store(ck: &mut Checker<'_>, st: &RawStore) -> StoreConfig {
    let url = match &st.url {
        None => "memory".to_string(),
        Some(u) => {
            if let Err(e) = u.get_ref().parse::<StoreUrl>() {
                ck.at(u.span(), "store.url", e.to_string());
            }
            u.get_ref().clone()
        }
    };
    let timeout = ck.duration(&st.timeout, "store.timeout", Duration::from_millis(50));
    if timeout.is_zero() {
        ck.at(
            st.timeout.as_ref().map_or(0..0, |t| t.span()),
            "store.timeout",
            "must be above 0",
        );
    }
    // Unset: the default, or the timeout when that is longer.
    let unresponsive_after = ck.duration(
        &st.unresponsive_after,
        "store.unresponsive_after",
        sluice::StoreOptions::default()
            .unresponsive_after
            .max(timeout),
    );
    if unresponsive_after < timeout {
        ck.at(
            st.unresponsive_after.as_ref().map_or(0..0, |t| t.span()),
            "store.unresponsive_after",
            format!(
                "must be at least store.timeout ({} ms): a server silent for less than one call's timeout cannot be told from a slow answer",
                timeout.as_millis()
            ),
        );
    }
    let failure_mode = match &st.failure_mode {
        None => FailureMode::Open,
        Some(f) => failure_mode(f.get_ref()).unwrap_or_else(|e| {
            ck.at(f.span(), "store.failure_mode", e);
            FailureMode::Open
        }),
    };
    let local_share = match &st.local_share {
        None => 1.0,
        Some(v) if !(*v.get_ref() > 0.0 && *v.get_ref() <= 1.0) => {
            ck.at(
                v.span(),
                "store.local_share",
                "must be above 0 and at most 1 (the share of each policy's limit one instance grants on its own)",
            );
            1.0
        }
        Some(v) => *v.get_ref(),
    };
    let max_memory = ck.bytes(
        &st.max_memory,
        "store.max_memory",
        DEFAULT_MAX_MEMORY,
        (MIN_MAX_MEMORY, u64::MAX),
    ) as usize;
    let max_keys = match &st.max_keys {
        None => 1_000_000,
        Some(n) if *n.get_ref() == 0 => {
            ck.at(n.span(), "store.max_keys", "must be at least 1");
            1_000_000
        }
        Some(n) => *n.get_ref() as usize,
    };
    let key_prefix = match &st.key_prefix {
        None => "rl".to_string(),
        Some(p) => {
            if sluice::core::policy::validate_policy_name(p.get_ref()).is_err() {
                ck.at(
                    p.span(),
                    "store.key_prefix",
                    "must be 1 to 64 ASCII letters, digits, '-', '_' or '.'",
                );
            }
            p.get_ref().clone()
        }
    };
    StoreConfig {
        url,
        timeout,
        unresponsive_after,
        failure_mode,
        max_keys,
        max_memory,
        local_share,
        key_prefix,
    }
}
