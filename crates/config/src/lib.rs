//! The configuration file: one TOML file, checked completely before anything runs.
//!
//! Parsing is two passes. Serde reads the file into raw structs whose values keep their byte
//! spans ([`raw`]), which catches syntax errors, unknown fields and wrong types with the exact
//! place. Validation then turns raw values into sluice types (`5/s` into a [`Rate`],
//! `token-bucket` into an [`Algorithm`]...) and collects every semantic error, each with the
//! line of the value at fault. `sluice validate` prints them as `FILE:LINE: field: message`; a
//! reload that fails keeps the running configuration and logs the same lines. The meaning of
//! every field is in `docs/configuration.md`.
//!
//! # Layout
//! - [`error`]: the error type and how a byte span becomes `FILE:LINE: field`.
//! - `raw`: the file as serde reads it.
//! - `check`: checks shared by the sections (durations, addresses, secrets).
//! - one module per section: `server` (with the top-level secrets), `store`, [`policy`],
//!   `routes` (with `[proxy]`), `envoy`, [`control`] (`[plans]`, `[lists]`, each policy's `ban`).
//!
//! [`Rate`]: sluice::Rate
//! [`Algorithm`]: sluice::Algorithm

#![forbid(unsafe_code)]

pub mod access;
mod check;
mod connect;
pub mod control;
pub mod envoy;
mod envoy_section;
pub mod error;
mod identity;
mod layers;
pub mod limits;
pub mod middleware;
pub mod policy;
mod raw;
mod routes;
mod server;
mod store;
mod telemetry;
#[cfg(test)]
mod tests;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use sluice::{FailureMode, Policy};

use sluice_http::headers::HeaderOptions;
use sluice_http::{IdentitySource as LayerSource, TrustedProxies};

use crate::envoy::Domains;
use crate::limits::{ConnectionLimits, GrpcLimits};

pub use access::Access;
pub use connect::{connect_limiter, connect_store_limiter};
pub use envoy_section::load_domain_yaml;
pub use error::{ConfigError, ConfigErrors, field_at, line_of};
pub use identity::IdentitySource;
pub use layers::{route_deciders, route_layers, route_rule};
pub use routes::{DEFAULT_CONNECT_TIMEOUT, DEFAULT_UPSTREAM_TIMEOUT};
pub use store::DEFAULT_MAX_MEMORY;
pub use telemetry::{DEFAULT_TELEMETRY_ENDPOINT, TelemetryConfig};

/// Default HTTP listener (decision API, metrics, health).
pub const DEFAULT_HTTP: &str = "127.0.0.1:8080";
/// Default gRPC listener (Envoy rate limit service, gRPC health).
pub const DEFAULT_GRPC: &str = "127.0.0.1:8081";
/// Default reverse proxy listener (only opened when routes are configured).
pub const DEFAULT_PROXY: &str = "127.0.0.1:8082";

/// A named policy with the identity the proxy limits it by.
#[derive(Debug, Clone)]
pub struct PolicyConfig {
    /// The policy (name, algorithm, failure mode, shadow, shards).
    pub policy: Arc<Policy>,
    /// The identity source for proxied requests.
    pub identity: IdentitySource,
    /// The same source as the `sluice-http` layer takes it (`None`: the client IP).
    pub layer_identity: Option<LayerSource>,
}

/// A reverse proxy route.
#[derive(Debug, Clone)]
pub struct Route {
    /// Path prefix (`/` matches everything). The longest matching prefix wins.
    pub prefix: String,
    /// Methods matched; empty means any.
    pub methods: Vec<http::Method>,
    /// Policies enforced, all or nothing.
    pub policies: Vec<String>,
    /// Where admitted requests go (`http://host:port`, optionally with a base path).
    pub upstream: http::Uri,
    /// Which responses are charged (`count = "failures"` etc.; default every request).
    pub count: sluice_http::Count,
    /// Match the prefix without regard to ASCII case (for upstreams that route that way).
    pub case_insensitive: bool,
    /// A reservation of each request's maximum cost, settled from the response's usage
    /// (`[routes.reserve]`, an LLM gateway's token budget).
    pub reserve: Option<sluice_http::settle::ReserveSpec>,
}

/// The listeners.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerConfig {
    /// Decision API, `/metrics`, `/healthz`, `/readyz`.
    pub http: SocketAddr,
    /// Envoy rate limit service and gRPC health.
    pub grpc: SocketAddr,
    /// Reverse proxy (used when routes exist).
    pub proxy: SocketAddr,
    /// A separate listener for `/metrics` and `/admin/*` (none: they are served on `http`).
    pub admin: Option<SocketAddr>,
    /// Largest request body of the decision API.
    pub max_body_bytes: usize,
    /// Most policies in one `/v1/check`.
    pub max_policies_per_check: usize,
    /// How long to wait for requests in flight on shutdown.
    pub shutdown_grace: Duration,
    /// How often to look at the file's modification time (zero: only SIGHUP).
    pub reload_poll: Duration,
    /// Timeouts, head size and connection caps of the HTTP listeners.
    pub connections: ConnectionLimits,
    /// Keep-alive, streams and timeout of the gRPC listener.
    pub grpc_limits: GrpcLimits,
    /// Token required by the decision API (`/v1/*`); none means open.
    pub api_token: Option<String>,
    /// Serve `/metrics` and `/admin/*` on a non-loopback address without `admin_token`
    /// (refused unless this explicit override is set).
    pub public_admin_without_token: bool,
    /// Names (lowercase, `name` or `name:port`) accepted in `Host` and `Origin` besides
    /// loopback and the listeners' addresses (`api::site`).
    pub allowed_hosts: Vec<String>,
}

/// The store.
#[derive(Debug, Clone, PartialEq)]
pub struct StoreConfig {
    /// `memory`, `redis://...`, `rediss://...`, `redis+cluster://...`.
    pub url: String,
    /// Per-call timeout.
    pub timeout: Duration,
    /// How long a standalone Redis must answer nothing before a timed-out call counts as a
    /// store failure (failure mode) rather than overload (denied). At least `timeout`.
    pub unresponsive_after: Duration,
    /// The failure mode of policies that do not set one.
    pub failure_mode: FailureMode,
    /// Embedded store: most keys tracked.
    pub max_keys: usize,
    /// Embedded store: most bytes allocated before eviction.
    pub max_memory: usize,
    /// With `failure_mode = "local"`: the share of each policy's limit this instance grants on
    /// its own while the store is unreachable (`0 < share <= 1`).
    pub local_share: f64,
    /// Key prefix (`rl`).
    pub key_prefix: String,
}

/// The proxy's settings beyond its routes.
#[derive(Debug, Clone)]
pub struct ProxyConfig {
    /// Peers whose `X-Forwarded-For` is believed when finding the client address.
    pub trusted_proxies: TrustedProxies,
    /// Largest time to wait for the upstream's response headers (none: no limit).
    pub upstream_timeout: Option<Duration>,
    /// Largest time to wait for a TCP connection to the upstream.
    pub connect_timeout: Duration,
}

/// A checked configuration.
#[derive(Debug, Clone)]
pub struct Config {
    /// The file it came from (reloads read it again).
    pub path: Option<PathBuf>,
    /// Listeners and limits of the service itself.
    pub server: ServerConfig,
    /// The store.
    pub store: StoreConfig,
    /// Secret for hashing credential identities.
    pub identity_hash_key: [u8; 32],
    /// Token required by admin endpoints (`/metrics`, `/admin/*`); none means open.
    pub admin_token: Option<String>,
    /// Every policy is shadow: computed and counted, never enforced.
    pub shadow: bool,
    /// Also send the legacy `X-RateLimit-Limit/Remaining/Reset` headers.
    pub legacy_headers: bool,
    /// The informational headers of proxied and decided requests (`legacy` is
    /// [`legacy_headers`](Self::legacy_headers)).
    pub headers: HeaderOptions,
    /// Files whose changes trigger a reload: this file and the Envoy YAML files.
    pub watched: Vec<PathBuf>,
    /// Named policies.
    pub policies: BTreeMap<String, PolicyConfig>,
    /// Reverse proxy routes, longest prefix first.
    pub routes: Vec<Route>,
    /// Proxy settings.
    pub proxy: ProxyConfig,
    /// Envoy domains.
    pub domains: Arc<Domains>,
    /// Listener addresses set by flags rather than the file.
    pub listener_overrides: ListenerOverrides,
    /// Plans, ban rules and the file's allow and deny lists (`[plans]`, `[lists]`, `ban`).
    pub control: sluice::ControlConfig,
    /// OpenTelemetry trace export of decisions (`[telemetry]`, off by default).
    pub telemetry: TelemetryConfig,
}

/// Listener addresses given on the command line, which win over the file's.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ListenerOverrides {
    /// `--http`.
    pub http: Option<SocketAddr>,
    /// `--grpc`.
    pub grpc: Option<SocketAddr>,
    /// `--proxy`.
    pub proxy: Option<SocketAddr>,
    /// `--admin`.
    pub admin: Option<SocketAddr>,
}

/// How a file is checked.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CheckOptions {
    /// Accept `env:NAME` secrets whose variable is unset (`sluice validate --no-secrets`), so a
    /// file can be checked away from the environment it runs in. Never used to serve.
    pub skip_env_secrets: bool,
}

impl Config {
    /// Reads and checks a file.
    pub fn load(path: &Path) -> Result<Config, ConfigErrors> {
        Self::load_with(path, CheckOptions::default())
    }

    /// Reads and checks a file with `options`.
    pub fn load_with(path: &Path, options: CheckOptions) -> Result<Config, ConfigErrors> {
        let src = read(path)?;
        Self::from_file_text(path, &src, options)
    }

    /// Checks `src`, the text just read from `path` (relative Envoy files resolve next to it).
    pub fn from_file_text(
        path: &Path,
        src: &str,
        options: CheckOptions,
    ) -> Result<Config, ConfigErrors> {
        let name = path.display().to_string();
        let mut c = parse(src, &name, path.parent(), options)?;
        c.path = Some(path.to_path_buf());
        c.watched.insert(0, path.to_path_buf());
        Ok(c)
    }

    /// Replaces listener addresses with command-line flags, and remembers them so a reload
    /// keeps them (the file's addresses do not apply while a flag overrides them).
    pub fn override_listeners(&mut self, flags: ListenerOverrides) {
        let o = &mut self.listener_overrides;
        for (flag, addr, kept) in [
            (flags.http, &mut self.server.http, &mut o.http),
            (flags.grpc, &mut self.server.grpc, &mut o.grpc),
            (flags.proxy, &mut self.server.proxy, &mut o.proxy),
        ] {
            if let Some(a) = flag {
                *addr = a;
                *kept = Some(a);
            }
        }
        if let Some(a) = flags.admin {
            self.server.admin = Some(a);
            o.admin = Some(a);
        }
    }

    /// Checks configuration text; `dir` resolves relative Envoy file paths.
    pub fn parse(src: &str, file: &str, dir: Option<&Path>) -> Result<Config, ConfigErrors> {
        parse(src, file, dir, CheckOptions::default())
    }

    /// [`Config::parse`] with `options`.
    pub fn parse_with(
        src: &str,
        file: &str,
        dir: Option<&Path>,
        options: CheckOptions,
    ) -> Result<Config, ConfigErrors> {
        parse(src, file, dir, options)
    }

    /// Refuses to serve the endpoints that change limits, `/v1/stats` and `/metrics` on a
    /// non-loopback address without `admin_token`, unless `server.public_admin_without_token`
    /// says so. Checked once the command line's addresses are applied.
    pub fn check_exposure(&self) -> Result<(), ConfigErrors> {
        match server::admin_exposure(self) {
            None => Ok(()),
            Some(e) => Err(ConfigErrors(vec![e])),
        }
    }

    /// [`Config::check_exposure`] with the tokens of this configuration and the listeners
    /// at `http` and `admin` (a reload keeps the running listeners).
    pub fn check_exposure_at(
        &self,
        http: std::net::SocketAddr,
        admin: Option<std::net::SocketAddr>,
    ) -> Result<(), ConfigErrors> {
        match server::admin_exposure_at(self, http, admin) {
            None => Ok(()),
            Some(e) => Err(ConfigErrors(vec![e])),
        }
    }

    /// Warnings about how the control endpoints are exposed (logged at start).
    pub fn exposure_warnings(&self) -> Vec<String> {
        server::exposure_warnings(self)
    }

    /// The settings that need a new store connection when they change.
    pub fn store_identity(&self) -> (String, Duration, Duration, usize, usize, u64, String) {
        (
            self.store.url.clone(),
            self.store.timeout,
            self.store.unresponsive_after,
            self.store.max_keys,
            self.store.max_memory,
            self.store.local_share.to_bits(),
            self.store.key_prefix.clone(),
        )
    }
}

/// The policies of a configuration text and nothing else: the `[policies.NAME]` tables,
/// checked as [`Config::parse`] checks them (with the store's default failure mode and the
/// identity settings they name). Envoy files and `env:` secrets are not read, so the text of
/// a complete `sluice.toml` gives its policies wherever it is read from. The Python and Node
/// `Policy.all_from_toml` are this function.
pub fn parse_policies(
    src: &str,
    file: &str,
) -> Result<BTreeMap<String, PolicyConfig>, ConfigErrors> {
    let raw: raw::RawConfig = toml::from_str(src).map_err(|e| error::from_toml(src, file, &e))?;
    let mut ck = error::Checker::new(src, file);
    ck.skip_env_secrets = true;
    let store = store::check_store(&mut ck, &raw.store);
    let jwt = identity::check_jwt(&mut ck, &raw, None);
    let policies = policy::check_policies(&mut ck, &raw, store.failure_mode, jwt.as_ref());
    let mut errors = ck.errors;
    if !errors.is_empty() {
        errors.sort_by(|a, b| (&a.file, a.line).cmp(&(&b.file, b.line)));
        return Err(ConfigErrors(errors));
    }
    Ok(policies)
}

/// The text of a configuration file; a file that cannot be read is named in the error.
pub fn read(path: &Path) -> Result<String, ConfigErrors> {
    std::fs::read_to_string(path).map_err(|e| {
        ConfigErrors(vec![ConfigError {
            file: path.display().to_string(),
            line: None,
            field: String::new(),
            message: format!("cannot read the configuration file: {e}"),
        }])
    })
}

/// Both passes over one file: serde, then one check per section. Every error is collected,
/// sorted by line.
fn parse(
    src: &str,
    file: &str,
    dir: Option<&Path>,
    options: CheckOptions,
) -> Result<Config, ConfigErrors> {
    let raw: raw::RawConfig = toml::from_str(src).map_err(|e| error::from_toml(src, file, &e))?;
    let mut ck = error::Checker::new(src, file);
    ck.skip_env_secrets = options.skip_env_secrets;
    let server = server::check_server(&mut ck, &raw);
    let store = store::check_store(&mut ck, &raw.store);
    let admin_token = server::check_admin_token(&mut ck, &raw);
    let identity_hash_key = server::check_identity_hash_key(&mut ck, &raw);
    let jwt = identity::check_jwt(&mut ck, &raw, dir);
    let policies = policy::check_policies(&mut ck, &raw, store.failure_mode, jwt.as_ref());
    let routes = routes::check_routes(&mut ck, &raw);
    let proxy = routes::check_proxy(&mut ck, &raw.proxy);
    let envoy = envoy_section::check_envoy(&mut ck, &raw, dir);
    let control = control::check_control(&mut ck, &raw, &policies);
    let telemetry = telemetry::check_telemetry(&mut ck, &raw.telemetry);

    let mut errors = ck.errors;
    errors.extend(envoy.yaml_errors);
    if !errors.is_empty() {
        errors.sort_by(|a, b| (&a.file, a.line).cmp(&(&b.file, b.line)));
        return Err(ConfigErrors(errors));
    }
    Ok(Config {
        path: None,
        server,
        store,
        identity_hash_key,
        admin_token,
        shadow: raw.shadow,
        legacy_headers: raw.legacy_headers,
        headers: HeaderOptions {
            ratelimit: true,
            legacy: raw.legacy_headers,
        },
        watched: envoy.files,
        policies,
        routes,
        proxy,
        domains: Arc::new(envoy.domains),
        listener_overrides: ListenerOverrides::default(),
        control,
        telemetry,
    })
}
