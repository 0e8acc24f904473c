//! `[server]` (listeners and the service's own limits) and the top-level secrets
//! (`admin_token`, `identity_hash_key`).

use std::time::Duration;

use super::check::{hex32, secret};
use super::error::Checker;
use super::raw::RawConfig;
use super::{DEFAULT_GRPC, DEFAULT_HTTP, DEFAULT_PROXY, ServerConfig};

/// Checks `[server]`.
pub(super) fn check_server(ck: &mut Checker<'_>, raw: &RawConfig) -> ServerConfig {
    let s = &raw.server;
    ServerConfig {
        http: ck.addr(&s.http, "server.http", DEFAULT_HTTP),
        grpc: ck.addr(&s.grpc, "server.grpc", DEFAULT_GRPC),
        proxy: ck.addr(&s.proxy, "server.proxy", DEFAULT_PROXY),
        max_body_bytes: ck.bounded(
            &s.max_body_bytes,
            "server.max_body_bytes",
            16 * 1024,
            16 * 1024 * 1024,
        ) as usize,
        max_policies_per_check: ck.bounded(
            &s.max_policies_per_check,
            "server.max_policies_per_check",
            16,
            256,
        ) as usize,
        shutdown_grace: ck.duration(
            &s.shutdown_grace,
            "server.shutdown_grace",
            Duration::from_secs(10),
        ),
        reload_poll: ck.duration(&s.reload_poll, "server.reload_poll", Duration::from_secs(2)),
    }
}

/// Checks `admin_token`: absent means the admin endpoints are open.
pub(super) fn check_admin_token(ck: &mut Checker<'_>, raw: &RawConfig) -> Option<String> {
    let t = raw.admin_token.as_ref()?;
    match secret(t.get_ref()) {
        Ok(v) if v.is_empty() => {
            ck.at(
                t.span(),
                "admin_token",
                "must not be empty (omit it to leave admin endpoints open)",
            );
            None
        }
        Ok(v) => Some(v),
        Err(e) => {
            ck.at(t.span(), "admin_token", e);
            None
        }
    }
}

/// Checks `identity_hash_key`: absent means the built-in key.
pub(super) fn check_identity_hash_key(ck: &mut Checker<'_>, raw: &RawConfig) -> [u8; 32] {
    match &raw.identity_hash_key {
        None => sluice::core::key::default_hash_key(),
        Some(k) => match secret(k.get_ref()).and_then(|v| hex32(&v)) {
            Ok(key) => key,
            Err(e) => {
                ck.at(k.span(), "identity_hash_key", e);
                sluice::core::key::default_hash_key()
            }
        },
    }
}
