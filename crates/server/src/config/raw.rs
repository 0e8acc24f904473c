//! The file as serde reads it: every value keeps its byte span (`toml::Spanned`), so the
//! checks in the sibling modules can point at the exact line. Unknown fields are refused here.

use std::collections::BTreeMap;

use serde::Deserialize;
use toml::Spanned;

use crate::descriptors::DomainFile;

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
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawServer {
    pub http: Option<Spanned<String>>,
    pub grpc: Option<Spanned<String>>,
    pub proxy: Option<Spanned<String>>,
    pub max_body_bytes: Option<Spanned<u64>>,
    pub max_policies_per_check: Option<Spanned<u64>>,
    pub shutdown_grace: Option<Spanned<String>>,
    pub reload_poll: Option<Spanned<String>>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawStore {
    pub url: Option<Spanned<String>>,
    pub timeout: Option<Spanned<String>>,
    pub failure_mode: Option<Spanned<String>>,
    pub max_keys: Option<Spanned<u64>>,
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
    pub window: Option<Spanned<String>>,
    pub mode: Option<Spanned<String>>,
    pub lease: Option<Spanned<String>>,
    pub identity: Option<Spanned<String>>,
    pub failure_mode: Option<Spanned<String>>,
    #[serde(default)]
    pub shadow: bool,
    pub shards: Option<Spanned<u32>>,
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
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawProxy {
    #[serde(default)]
    pub trusted_proxies: Vec<Spanned<String>>,
    pub upstream_timeout: Option<Spanned<String>>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawEnvoy {
    #[serde(default)]
    pub files: Vec<Spanned<String>>,
    #[serde(default)]
    pub domains: Vec<Spanned<DomainFile>>,
}
