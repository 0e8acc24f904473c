//! `[server]` (listeners, the service's own limits, connection discipline, access tokens)
//! and the top-level secrets (`admin_token`, `identity_hash_key`).

use std::net::SocketAddr;
use std::time::Duration;

use super::check::hex32;
use super::error::{Checker, ConfigError};
use super::raw::{RawConfig, RawServer};
use super::{DEFAULT_GRPC, DEFAULT_HTTP, DEFAULT_PROXY, ServerConfig};
use crate::access::{Access, CONTROL_ENDPOINTS};
use crate::limits::{ConnectionLimits, GrpcLimits};

/// Largest `max_header_bytes`: a request head beyond 1 MiB is an attack, not a request.
const MAX_HEADER_BYTES_LIMIT: u64 = 1 << 20;
/// Smallest `max_header_bytes` the HTTP/1 server accepts as a read buffer.
const MIN_HEADER_BYTES: u64 = 8 * 1024;
/// Largest connection count accepted by any of the connection caps.
const MAX_CONNECTIONS_LIMIT: u64 = 10_000_000;
/// Largest `min_body_rate` (bytes per second): above 1 GiB/s no client could keep up.
const MAX_BODY_RATE: u64 = 1 << 30;

/// Checks `[server]`.
pub(super) fn check_server(ck: &mut Checker<'_>, raw: &RawConfig) -> ServerConfig {
    let s = &raw.server;
    let admin = s
        .admin
        .as_ref()
        .map(|_| ck.addr(&s.admin, "server.admin", DEFAULT_HTTP));
    ServerConfig {
        http: ck.addr(&s.http, "server.http", DEFAULT_HTTP),
        grpc: ck.addr(&s.grpc, "server.grpc", DEFAULT_GRPC),
        proxy: ck.addr(&s.proxy, "server.proxy", DEFAULT_PROXY),
        admin,
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
        connections: check_connections(ck, s),
        grpc_limits: check_grpc_limits(ck, s),
        api_token: ck.secret(&s.api_token, "server.api_token", "leave /v1/* open"),
        public_admin_without_token: s.public_admin_without_token,
        allowed_hosts: check_allowed_hosts(ck, s),
    }
}

/// Checks `server.allowed_hosts`: host names (or `name:port`), lowercased.
fn check_allowed_hosts(ck: &mut Checker<'_>, s: &RawServer) -> Vec<String> {
    let Some(hosts) = &s.allowed_hosts else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for h in hosts.get_ref() {
        let name = h.trim().trim_end_matches('.').to_ascii_lowercase();
        let valid = !name.is_empty()
            && name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"-.:[]_".contains(&b));
        if valid {
            out.push(name);
        } else {
            ck.at(
                hosts.span(),
                "server.allowed_hosts",
                format!(
                    "{h:?} is not a host name: expected names such as \"sluice.internal\" or \
                     \"sluice.internal:8080\" (no scheme, no path)"
                ),
            );
        }
    }
    out
}

/// The connection discipline of the HTTP listeners.
fn check_connections(ck: &mut Checker<'_>, s: &RawServer) -> ConnectionLimits {
    let d = ConnectionLimits::default();
    let limits = ConnectionLimits {
        header_read_timeout: ck.positive_duration(
            &s.header_read_timeout,
            "server.header_read_timeout",
            d.header_read_timeout,
        ),
        body_timeout: ck.positive_duration(&s.body_timeout, "server.body_timeout", d.body_timeout),
        idle_timeout: ck.positive_duration(&s.idle_timeout, "server.idle_timeout", d.idle_timeout),
        max_header_bytes: ck.bytes(
            &s.max_header_bytes,
            "server.max_header_bytes",
            d.max_header_bytes as u64,
            (MIN_HEADER_BYTES, MAX_HEADER_BYTES_LIMIT),
        ) as usize,
        max_connections: ck.count(
            &s.max_connections,
            "server.max_connections",
            d.max_connections as u64,
            MAX_CONNECTIONS_LIMIT,
        ) as usize,
        max_connections_per_ip: ck.count(
            &s.max_connections_per_ip,
            "server.max_connections_per_ip",
            d.max_connections_per_ip as u64,
            MAX_CONNECTIONS_LIMIT,
        ) as usize,
        reserve: ck.count(
            &s.connection_reserve,
            "server.connection_reserve",
            d.reserve as u64,
            MAX_CONNECTIONS_LIMIT,
        ) as usize,
        min_body_rate: ck.bytes(
            &s.min_body_rate,
            "server.min_body_rate",
            d.min_body_rate,
            (0, MAX_BODY_RATE),
        ),
        body_rate_grace: ck.positive_duration(
            &s.body_rate_grace,
            "server.body_rate_grace",
            d.body_rate_grace,
        ),
        max_bodies_per_ip: ck.count(
            &s.max_bodies_per_ip,
            "server.max_bodies_per_ip",
            d.max_bodies_per_ip as u64,
            MAX_CONNECTIONS_LIMIT,
        ) as usize,
        write_stall_timeout: ck.positive_duration(
            &s.write_stall_timeout,
            "server.write_stall_timeout",
            d.write_stall_timeout,
        ),
    };
    if limits.max_connections > 0
        && limits.reserve >= limits.max_connections
        && let Some(r) = &s.connection_reserve
    {
        ck.at(
            r.span(),
            "server.connection_reserve",
            format!(
                "must be below server.max_connections ({}), or nothing is left for ordinary requests",
                limits.max_connections
            ),
        );
    }
    limits
}

/// The limits of the gRPC listener.
fn check_grpc_limits(ck: &mut Checker<'_>, s: &RawServer) -> GrpcLimits {
    let d = GrpcLimits::default();
    GrpcLimits {
        keepalive_interval: ck.positive_duration(
            &s.grpc_keepalive_interval,
            "server.grpc_keepalive_interval",
            d.keepalive_interval,
        ),
        keepalive_timeout: ck.positive_duration(
            &s.grpc_keepalive_timeout,
            "server.grpc_keepalive_timeout",
            d.keepalive_timeout,
        ),
        max_concurrent_streams: ck.bounded(
            &s.grpc_max_concurrent_streams,
            "server.grpc_max_concurrent_streams",
            u64::from(d.max_concurrent_streams),
            1_000_000,
        ) as u32,
        request_timeout: ck.positive_duration(
            &s.grpc_request_timeout,
            "server.grpc_request_timeout",
            d.request_timeout,
        ),
        threads: s
            .grpc_threads
            .as_ref()
            .map(|_| ck.count(&s.grpc_threads, "server.grpc_threads", 0, 256) as u32),
    }
}

/// Checks `admin_token`: absent means the admin endpoints are open.
pub(super) fn check_admin_token(ck: &mut Checker<'_>, raw: &RawConfig) -> Option<String> {
    ck.secret(
        &raw.admin_token,
        "admin_token",
        "leave admin endpoints open",
    )
}

/// Checks `identity_hash_key`: absent means the built-in key.
pub(super) fn check_identity_hash_key(ck: &mut Checker<'_>, raw: &RawConfig) -> [u8; 32] {
    let Some(k) = &raw.identity_hash_key else {
        return sluice::core::key::default_hash_key();
    };
    let skipped = ck.skip_env_secrets
        && k.get_ref()
            .strip_prefix("env:")
            .is_some_and(|v| std::env::var(v).is_err());
    if skipped {
        return sluice::core::key::default_hash_key();
    }
    match ck.resolve_secret(k.get_ref()).and_then(|v| hex32(&v)) {
        Ok(key) => key,
        Err(e) => {
            ck.at(k.span(), "identity_hash_key", e);
            sluice::core::key::default_hash_key()
        }
    }
}

/// The listener that serves the control endpoints (`server.admin` when set, else `server.http`)
/// and the setting that names it.
fn control_listener(http: SocketAddr, admin: Option<SocketAddr>) -> (SocketAddr, &'static str) {
    match admin {
        Some(a) => (a, "server.admin"),
        None => (http, "server.http"),
    }
}

/// The auth boundary's one rule, checked at start and on every reload: the listener that
/// serves the endpoints that change state (and `/metrics`) binds beyond loopback only when
/// `admin_token` guards them, or when `server.public_admin_without_token` says so.
/// `http`/`admin` are the addresses listened on (a reload keeps the running ones).
pub(super) fn admin_exposure_at(
    c: &super::Config,
    http: SocketAddr,
    admin: Option<SocketAddr>,
) -> Option<ConfigError> {
    let (addr, field) = control_listener(http, admin);
    let admin_guarded = c.accepted_tokens(Access::Control).1 == "admin_token";
    if admin_guarded || c.server.public_admin_without_token || addr.ip().is_loopback() {
        return None;
    }
    Some(ConfigError {
        file: c
            .path
            .as_ref()
            .map_or_else(|| "<defaults>".into(), |p| p.display().to_string()),
        line: None,
        field: field.into(),
        message: format!(
            "the endpoints that change limits ({CONTROL_ENDPOINTS}), /v1/stats and /metrics \
             would be served on {addr}, which is not a loopback address, without admin_token: \
             set admin_token (such as \"env:SLUICE_ADMIN_TOKEN\"), move them to a loopback \
             server.admin, or set server.public_admin_without_token = true"
        ),
    })
}

/// [`admin_exposure_at`] at the addresses `c` names.
pub(super) fn admin_exposure(c: &super::Config) -> Option<ConfigError> {
    admin_exposure_at(c, c.server.http, c.server.admin)
}

/// What `sluice serve` warns about at start (and on a reload that brings it in): control
/// endpoints served beyond loopback without a token, by `server.public_admin_without_token`.
pub(super) fn exposure_warnings(c: &super::Config) -> Vec<String> {
    let (addr, field) = control_listener(c.server.http, c.server.admin);
    if !c.server.public_admin_without_token || addr.ip().is_loopback() {
        return Vec::new();
    }
    let guard = match c.accepted_tokens(Access::Control).1 {
        "admin_token" => return Vec::new(),
        "api_token" => "only server.api_token (which every application holds) guards them",
        _ => "no token guards them: anyone who can reach it can change every limit",
    };
    vec![format!(
        "server.public_admin_without_token = true: the endpoints that change limits \
         ({CONTROL_ENDPOINTS}), /v1/stats and /metrics are served on {addr} ({field}), beyond \
         loopback, and {guard}; set admin_token, or serve them on a loopback server.admin"
    )]
}
