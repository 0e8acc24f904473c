//! The file as serde reads it: every value keeps its byte span (`toml::Spanned`), so the
//! checks in the sibling modules can point at the exact line. Unknown fields are refused here.

use std::collections::BTreeMap;

use serde::Deserialize;
use serde::de::{self, Deserializer, Visitor};
use toml::Spanned;

use super::control::{ParamsText, RawBan, RawControl, RawLists};
use super::identity::{RawIdentity, RawJwt};
use crate::envoy::DomainFile;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawConfig {
    #[serde(default)]
    pub shadow: bool,
    #[serde(default)]
    pub legacy_headers: bool,
    pub admin_token: Option<Spanned<String>>,
    pub identity_hash_key: Option<Spanned<String>>,
    #[serde(default)]
    pub server: RawServer,
    #[serde(default)]
    pub store: RawStore,
    #[serde(default)]
    pub policies: BTreeMap<Spanned<String>, Spanned<RawPolicy>>,
    #[serde(default)]
    pub routes: Vec<Spanned<RawRoute>>,
    #[serde(default)]
    pub proxy: RawProxy,
    #[serde(default)]
    pub envoy: RawEnvoy,
    #[serde(default)]
    pub plans: BTreeMap<Spanned<String>, BTreeMap<Spanned<String>, Spanned<ParamsText>>>,
    #[serde(default)]
    pub lists: RawLists,
    #[serde(default)]
    pub control: RawControl,
    pub jwt: Option<Spanned<RawJwt>>,
    #[serde(default)]
    pub telemetry: super::telemetry::RawTelemetry,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawServer {
    pub http: Option<Spanned<String>>,
    pub grpc: Option<Spanned<String>>,
    pub proxy: Option<Spanned<String>>,
    pub admin: Option<Spanned<String>>,
    pub max_body_bytes: Option<Spanned<u64>>,
    pub max_policies_per_check: Option<Spanned<u64>>,
    pub shutdown_grace: Option<Spanned<RawDuration>>,
    pub reload_poll: Option<Spanned<RawDuration>>,
    pub header_read_timeout: Option<Spanned<RawDuration>>,
    pub body_timeout: Option<Spanned<RawDuration>>,
    pub idle_timeout: Option<Spanned<RawDuration>>,
    pub max_header_bytes: Option<Spanned<RawBytes>>,
    pub max_connections: Option<Spanned<u64>>,
    pub max_connections_per_ip: Option<Spanned<u64>>,
    pub connection_reserve: Option<Spanned<u64>>,
    pub min_body_rate: Option<Spanned<RawBytes>>,
    pub body_rate_grace: Option<Spanned<RawDuration>>,
    pub max_bodies_per_ip: Option<Spanned<u64>>,
    pub write_stall_timeout: Option<Spanned<RawDuration>>,
    pub grpc_keepalive_interval: Option<Spanned<RawDuration>>,
    pub grpc_keepalive_timeout: Option<Spanned<RawDuration>>,
    pub grpc_max_concurrent_streams: Option<Spanned<u64>>,
    pub grpc_request_timeout: Option<Spanned<RawDuration>>,
    pub grpc_threads: Option<Spanned<u64>>,
    pub api_token: Option<Spanned<String>>,
    #[serde(default)]
    pub public_admin_without_token: bool,
    pub allowed_hosts: Option<Spanned<Vec<String>>>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawStore {
    pub url: Option<Spanned<String>>,
    pub timeout: Option<Spanned<RawDuration>>,
    pub unresponsive_after: Option<Spanned<RawDuration>>,
    pub failure_mode: Option<Spanned<String>>,
    pub local_share: Option<Spanned<f64>>,
    pub max_keys: Option<Spanned<u64>>,
    pub max_memory: Option<Spanned<RawBytes>>,
    pub key_prefix: Option<Spanned<String>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawPolicy {
    pub algorithm: Spanned<String>,
    pub capacity: Option<Spanned<u64>>,
    pub rate: Option<Spanned<String>>,
    pub burst: Option<Spanned<u64>>,
    pub limit: Option<Spanned<u64>>,
    pub window: Option<Spanned<RawDuration>>,
    pub mode: Option<Spanned<String>>,
    pub lease: Option<Spanned<RawDuration>>,
    /// How long a leased-mode slice lives (`mode = "leased"` only).
    pub lease_ttl: Option<Spanned<RawDuration>>,
    pub identity: Option<Spanned<RawIdentity>>,
    pub failure_mode: Option<Spanned<String>>,
    #[serde(default)]
    pub shadow: bool,
    pub shards: Option<Spanned<u32>>,
    pub ban: Option<Spanned<RawBan>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawRoute {
    pub prefix: Spanned<String>,
    #[serde(default)]
    pub methods: Vec<Spanned<String>>,
    #[serde(default)]
    pub policies: Vec<Spanned<String>>,
    pub upstream: Spanned<String>,
    pub count: Option<Spanned<super::routes::RawCount>>,
    #[serde(default)]
    pub case_insensitive: bool,
    pub reserve: Option<Spanned<super::routes::RawReserve>>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawProxy {
    #[serde(default)]
    pub trusted_proxies: Vec<Spanned<String>>,
    pub upstream_timeout: Option<Spanned<RawDuration>>,
    pub connect_timeout: Option<Spanned<RawDuration>>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawEnvoy {
    #[serde(default)]
    pub files: Vec<Spanned<String>>,
    #[serde(default)]
    pub domains: Vec<Spanned<DomainFile>>,
}

/// A duration as written (`"50ms"`, `"10s"`). A bare number is refused with a hint, since
/// `timeout = 50` could mean milliseconds or seconds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct RawDuration(pub String);

impl std::ops::Deref for RawDuration {
    type Target = str;
    fn deref(&self) -> &str {
        &self.0
    }
}

impl<'de> Deserialize<'de> for RawDuration {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = RawDuration;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a duration string such as \"50ms\" or \"10s\"")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<RawDuration, E> {
                Ok(RawDuration(v.to_string()))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<RawDuration, E> {
                Err(E::custom(format!(
                    "invalid type: integer `{v}`, expected a duration string such as \"{v}ms\" or \"{v}s\""
                )))
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<RawDuration, E> {
                Err(E::custom(format!(
                    "invalid type: integer `{v}`, expected a duration string such as \"{v}ms\" or \"{v}s\""
                )))
            }
        }
        d.deserialize_any(V)
    }
}

/// A size in bytes: an integer, or a string with a unit (`"512KiB"`, `"256MiB"`, `"1GiB"`,
/// `"100MB"`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct RawBytes(pub u64);

/// Parses `"256MiB"`, `"1GiB"`, `"64KB"`, `"4096"` or `"4096B"` into bytes.
pub(super) fn parse_bytes(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let bad = || {
        format!(
            "invalid size {s:?}: expected bytes such as 65536, \"512KiB\", \"256MiB\" or \"1GiB\""
        )
    };
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: u64 = num.parse().map_err(|_| bad())?;
    let mult: u64 = match unit.trim() {
        "" | "B" => 1,
        "KiB" => 1 << 10,
        "MiB" => 1 << 20,
        "GiB" => 1 << 30,
        "TiB" => 1 << 40,
        "KB" | "kB" => 1_000,
        "MB" => 1_000_000,
        "GB" => 1_000_000_000,
        "TB" => 1_000_000_000_000,
        _ => return Err(bad()),
    };
    n.checked_mul(mult).ok_or_else(bad)
}

impl<'de> Deserialize<'de> for RawBytes {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = RawBytes;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a size such as 65536 or \"256MiB\"")
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<RawBytes, E> {
                Ok(RawBytes(v))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<RawBytes, E> {
                u64::try_from(v)
                    .map(RawBytes)
                    .map_err(|_| E::custom(format!("invalid size {v}: must not be negative")))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<RawBytes, E> {
                parse_bytes(v).map(RawBytes).map_err(E::custom)
            }
        }
        d.deserialize_any(V)
    }
}
