//! The configuration file: one TOML file, checked completely before anything runs.
//!
//! Parsing is two passes. Serde reads the file into raw structs whose values keep their byte
//! spans (`toml::Spanned`), which catches syntax errors, unknown fields and wrong types with
//! the exact place. Validation then turns raw values into sluice types (`5/s` into a
//! [`Rate`], `token-bucket` into an [`Algorithm`]...) and collects every semantic error, each
//! with the line of the value at fault. `sluice validate` prints them as `FILE:LINE: field:
//! message`; a reload that fails keeps the running configuration and logs the same lines.
//! The meaning of every field is in `docs/configuration.md`.

use std::collections::BTreeMap;
use std::fmt;
use std::net::SocketAddr;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use serde::Deserialize;
use sluice::core::policy::parse_duration_ms;
use sluice::{Algorithm, FailureMode, LeakyMode, Policy, Rate, StoreUrl};
use toml::Spanned;

use crate::descriptors::{DomainFile, Domains};

/// Default HTTP listener (decision API, metrics, health).
pub const DEFAULT_HTTP: &str = "127.0.0.1:8080";
/// Default gRPC listener (Envoy rate limit service, gRPC health).
pub const DEFAULT_GRPC: &str = "127.0.0.1:8081";
/// Default reverse proxy listener (only opened when routes are configured).
pub const DEFAULT_PROXY: &str = "127.0.0.1:8082";

/// One problem in a configuration file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    /// The file (as given on the command line, or `<inline>`).
    pub file: String,
    /// The 1-based line, when the problem has a place.
    pub line: Option<usize>,
    /// The field, as a dotted path (`policies.api.rate`).
    pub field: String,
    /// What is wrong.
    pub message: String,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.line {
            Some(l) => write!(f, "{}:{}: {}: {}", self.file, l, self.field, self.message),
            None => write!(f, "{}: {}: {}", self.file, self.field, self.message),
        }
    }
}

/// Every problem found in a configuration (never empty).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct ConfigErrors(pub Vec<ConfigError>);

impl fmt::Display for ConfigErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, e) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str("\n")?;
            }
            write!(f, "{e}")?;
        }
        Ok(())
    }
}

/// Where a policy's identity comes from when the reverse proxy enforces it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum IdentitySource {
    /// The client address (after trusted proxies).
    Ip,
    /// A request header, as is (an id set by an authenticating gateway).
    Header(http::HeaderName),
    /// A credential header (API key); hashed with the identity hash key before use.
    ApiKey(http::HeaderName),
    /// The bearer token of `Authorization`, hashed.
    Bearer,
    /// One shared limit for everyone.
    Global,
}

impl std::str::FromStr for IdentitySource {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let header = |h: &str| {
            http::HeaderName::from_bytes(h.trim().as_bytes())
                .map_err(|_| format!("invalid header name {h:?}"))
        };
        match s.split_once(':') {
            None if s == "ip" => Ok(IdentitySource::Ip),
            None if s == "bearer" => Ok(IdentitySource::Bearer),
            None if s == "global" => Ok(IdentitySource::Global),
            Some(("header", h)) => Ok(IdentitySource::Header(header(h)?)),
            Some(("api-key", h)) => Ok(IdentitySource::ApiKey(header(h)?)),
            _ => Err(format!(
                "unknown identity source {s:?}: expected ip, header:NAME, api-key:NAME, bearer or global"
            )),
        }
    }
}

/// A named policy with the identity the proxy limits it by.
#[derive(Debug, Clone)]
pub struct PolicyConfig {
    /// The policy (name, algorithm, failure mode, shadow, shards).
    pub policy: Arc<Policy>,
    /// The identity source for proxied requests.
    pub identity: IdentitySource,
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
    /// Largest request body of the decision API.
    pub max_body_bytes: usize,
    /// Most policies in one `/v1/check`.
    pub max_policies_per_check: usize,
    /// How long to wait for requests in flight on shutdown.
    pub shutdown_grace: Duration,
    /// How often to look at the file's modification time (zero: only SIGHUP).
    pub reload_poll: Duration,
}

/// The store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoreConfig {
    /// `memory`, `redis://...`, `rediss://...`, `redis+cluster://...`.
    pub url: String,
    /// Per-call timeout.
    pub timeout: Duration,
    /// The failure mode of policies that do not set one.
    pub failure_mode: FailureMode,
    /// Embedded store: most keys tracked.
    pub max_keys: usize,
    /// Key prefix (`rl`).
    pub key_prefix: String,
}

/// The proxy's settings beyond its routes.
#[derive(Debug, Clone, Default)]
pub struct ProxyConfig {
    /// Peers whose `X-Forwarded-For` is believed when finding the client address.
    pub trusted_proxies: Vec<String>,
    /// Largest time to wait for the upstream's response headers.
    pub upstream_timeout: Option<Duration>,
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
}

impl Config {
    /// Reads and checks a file.
    pub fn load(path: &Path) -> Result<Config, ConfigErrors> {
        let name = path.display().to_string();
        let src = std::fs::read_to_string(path).map_err(|e| {
            ConfigErrors(vec![ConfigError {
                file: name.clone(),
                line: None,
                field: "-".into(),
                message: e.to_string(),
            }])
        })?;
        let mut c = parse(&src, &name, path.parent())?;
        c.path = Some(path.to_path_buf());
        c.watched.insert(0, path.to_path_buf());
        Ok(c)
    }

    /// Checks configuration text; `dir` resolves relative Envoy file paths.
    pub fn parse(src: &str, file: &str, dir: Option<&Path>) -> Result<Config, ConfigErrors> {
        parse(src, file, dir)
    }

    /// The settings that need a new store connection when they change.
    pub fn store_identity(&self) -> (String, Duration, usize, String) {
        (
            self.store.url.clone(),
            self.store.timeout,
            self.store.max_keys,
            self.store.key_prefix.clone(),
        )
    }
}

// ---------------------------------------------------------------------------------------------
// Raw file structure.

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawConfig {
    #[serde(default)]
    shadow: bool,
    #[serde(default)]
    legacy_headers: bool,
    admin_token: Option<Spanned<String>>,
    identity_hash_key: Option<Spanned<String>>,
    #[serde(default)]
    server: RawServer,
    #[serde(default)]
    store: RawStore,
    #[serde(default)]
    policies: BTreeMap<Spanned<String>, Spanned<RawPolicy>>,
    #[serde(default)]
    routes: Vec<Spanned<RawRoute>>,
    #[serde(default)]
    proxy: RawProxy,
    #[serde(default)]
    envoy: RawEnvoy,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawServer {
    http: Option<Spanned<String>>,
    grpc: Option<Spanned<String>>,
    proxy: Option<Spanned<String>>,
    max_body_bytes: Option<Spanned<u64>>,
    max_policies_per_check: Option<Spanned<u64>>,
    shutdown_grace: Option<Spanned<String>>,
    reload_poll: Option<Spanned<String>>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawStore {
    url: Option<Spanned<String>>,
    timeout: Option<Spanned<String>>,
    failure_mode: Option<Spanned<String>>,
    max_keys: Option<Spanned<u64>>,
    key_prefix: Option<Spanned<String>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPolicy {
    algorithm: Spanned<String>,
    capacity: Option<Spanned<u64>>,
    rate: Option<Spanned<String>>,
    burst: Option<Spanned<u64>>,
    limit: Option<Spanned<u64>>,
    window: Option<Spanned<String>>,
    mode: Option<Spanned<String>>,
    lease: Option<Spanned<String>>,
    identity: Option<Spanned<String>>,
    failure_mode: Option<Spanned<String>>,
    #[serde(default)]
    shadow: bool,
    shards: Option<Spanned<u32>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRoute {
    prefix: Spanned<String>,
    #[serde(default)]
    methods: Vec<Spanned<String>>,
    #[serde(default)]
    policies: Vec<Spanned<String>>,
    upstream: Spanned<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawProxy {
    #[serde(default)]
    trusted_proxies: Vec<Spanned<String>>,
    upstream_timeout: Option<Spanned<String>>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawEnvoy {
    #[serde(default)]
    files: Vec<Spanned<String>>,
    #[serde(default)]
    domains: Vec<Spanned<DomainFile>>,
}

// ---------------------------------------------------------------------------------------------
// Locating errors.

/// The 1-based line of a byte offset.
pub fn line_of(src: &str, offset: usize) -> usize {
    let end = offset.min(src.len());
    src.as_bytes()[..end]
        .iter()
        .filter(|&&b| b == b'\n')
        .count()
        + 1
}

/// The dotted field at a byte offset of a TOML file: the enclosing table header (with the
/// index of an array of tables) and the key on that line.
pub fn field_at(src: &str, offset: usize) -> String {
    let offset = offset.min(src.len());
    let line_start = src[..offset].rfind('\n').map_or(0, |i| i + 1);
    let line_end = src[offset..].find('\n').map_or(src.len(), |i| offset + i);
    let line = src[line_start..line_end].trim();
    let header_of = |upto: usize| -> String {
        let before = &src[..upto];
        let mut header = String::new();
        for l in before.lines().rev() {
            let t = l.trim();
            if let Some(h) = t.strip_prefix("[[").and_then(|t| t.split("]]").next()) {
                let h = h.trim();
                let n = before
                    .lines()
                    .filter(|l| {
                        l.trim()
                            .strip_prefix("[[")
                            .and_then(|t| t.split("]]").next())
                            .map(str::trim)
                            == Some(h)
                    })
                    .count();
                header = format!("{h}[{}]", n.saturating_sub(1));
                break;
            }
            if let Some(h) = t.strip_prefix('[').and_then(|t| t.split(']').next()) {
                header = h.trim().to_string();
                break;
            }
        }
        header
    };
    if line.starts_with('[') {
        return header_of(line_end);
    }
    let header = header_of(line_start);
    let key = line
        .split_once('=')
        .map(|(k, _)| k.trim().trim_matches('"').to_string());
    match (header.is_empty(), key) {
        (_, None) => {
            if header.is_empty() {
                "-".into()
            } else {
                header
            }
        }
        (true, Some(k)) => k,
        (false, Some(k)) => format!("{header}.{k}"),
    }
}

struct Checker<'a> {
    src: &'a str,
    file: &'a str,
    errors: Vec<ConfigError>,
}

impl Checker<'_> {
    fn at(&mut self, span: Range<usize>, field: impl Into<String>, message: impl Into<String>) {
        self.errors.push(ConfigError {
            file: self.file.to_string(),
            line: Some(line_of(self.src, span.start)),
            field: field.into(),
            message: message.into(),
        });
    }
}

fn secret(s: &str) -> Result<String, String> {
    match s.strip_prefix("env:") {
        Some(var) => {
            std::env::var(var).map_err(|_| format!("environment variable {var} is not set"))
        }
        None => Ok(s.to_string()),
    }
}

fn hex32(s: &str) -> Result<[u8; 32], String> {
    let s = s.trim();
    let bad = || {
        "must be 64 hex digits (32 bytes), e.g. the output of `openssl rand -hex 32`".to_string()
    };
    if s.len() != 64 {
        return Err(bad());
    }
    let mut out = [0u8; 32];
    for (i, o) in out.iter_mut().enumerate() {
        *o = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).map_err(|_| bad())?;
    }
    Ok(out)
}

fn failure_mode(s: &str) -> Result<FailureMode, String> {
    match s {
        "open" => Ok(FailureMode::Open),
        "closed" => Ok(FailureMode::Closed),
        other => Err(format!(
            "unknown failure mode {other:?}: expected open or closed"
        )),
    }
}

fn duration(s: &str) -> Result<Duration, String> {
    parse_duration_ms(s)
        .map(Duration::from_millis)
        .map_err(|e| e.to_string())
}

fn parse(src: &str, file: &str, dir: Option<&Path>) -> Result<Config, ConfigErrors> {
    let raw: RawConfig = match toml::from_str(src) {
        Ok(r) => r,
        Err(e) => {
            let span = e.span().unwrap_or(0..0);
            let message = e.message().trim().to_string();
            let mut field = if message.starts_with("unknown field")
                || message.starts_with("invalid")
                || message.starts_with("missing field")
                || message.contains("expected")
            {
                field_at(src, span.start)
            } else {
                "-".to_string()
            };
            if let Some(m) = message
                .strip_prefix("missing field `")
                .and_then(|m| m.split('`').next())
            {
                field = if field == "-" {
                    m.to_string()
                } else {
                    format!("{field}.{m}")
                };
            }
            return Err(ConfigErrors(vec![ConfigError {
                file: file.to_string(),
                line: Some(line_of(src, span.start)),
                field,
                message,
            }]));
        }
    };
    let mut ck = Checker {
        src,
        file,
        errors: Vec::new(),
    };

    // [server]
    let addr = |ck: &mut Checker<'_>,
                v: &Option<Spanned<String>>,
                field: &str,
                default: &str|
     -> SocketAddr {
        let fallback: SocketAddr = default.parse().expect("default address");
        match v {
            None => fallback,
            Some(s) => s.get_ref().parse().unwrap_or_else(|_| {
                ck.at(
                    s.span(),
                    field,
                    format!(
                        "invalid address {:?}: expected IP:PORT such as 127.0.0.1:8080",
                        s.get_ref()
                    ),
                );
                fallback
            }),
        }
    };
    let s = &raw.server;
    let http = addr(&mut ck, &s.http, "server.http", DEFAULT_HTTP);
    let grpc = addr(&mut ck, &s.grpc, "server.grpc", DEFAULT_GRPC);
    let proxy_addr = addr(&mut ck, &s.proxy, "server.proxy", DEFAULT_PROXY);
    let mut bounded = |v: &Option<Spanned<u64>>, field: &str, default: u64, max: u64| -> u64 {
        match v {
            None => default,
            Some(n) if *n.get_ref() == 0 || *n.get_ref() > max => {
                ck.at(n.span(), field, format!("must be between 1 and {max}"));
                default
            }
            Some(n) => *n.get_ref(),
        }
    };
    let max_body_bytes = bounded(
        &s.max_body_bytes,
        "server.max_body_bytes",
        16 * 1024,
        16 * 1024 * 1024,
    ) as usize;
    let max_policies = bounded(
        &s.max_policies_per_check,
        "server.max_policies_per_check",
        16,
        256,
    ) as usize;
    let dur = |ck: &mut Checker<'_>,
               v: &Option<Spanned<String>>,
               field: &str,
               default: Duration|
     -> Duration {
        match v {
            None => default,
            Some(s) => duration(s.get_ref()).unwrap_or_else(|e| {
                ck.at(s.span(), field, e);
                default
            }),
        }
    };
    let shutdown_grace = dur(
        &mut ck,
        &s.shutdown_grace,
        "server.shutdown_grace",
        Duration::from_secs(10),
    );
    let reload_poll = dur(
        &mut ck,
        &s.reload_poll,
        "server.reload_poll",
        Duration::from_secs(2),
    );

    // [store]
    let st = &raw.store;
    let url = match &st.url {
        None => "memory".to_string(),
        Some(u) => {
            if let Err(e) = u.get_ref().parse::<StoreUrl>() {
                ck.at(u.span(), "store.url", e.to_string());
            }
            u.get_ref().clone()
        }
    };
    let timeout = dur(
        &mut ck,
        &st.timeout,
        "store.timeout",
        Duration::from_millis(50),
    );
    if timeout.is_zero() {
        ck.at(
            st.timeout.as_ref().map_or(0..0, |t| t.span()),
            "store.timeout",
            "must be above 0",
        );
    }
    let default_failure = match &st.failure_mode {
        None => FailureMode::Open,
        Some(f) => failure_mode(f.get_ref()).unwrap_or_else(|e| {
            ck.at(f.span(), "store.failure_mode", e);
            FailureMode::Open
        }),
    };
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

    // Secrets.
    let admin_token = raw
        .admin_token
        .as_ref()
        .and_then(|t| match secret(t.get_ref()) {
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
        });
    let identity_hash_key = match &raw.identity_hash_key {
        None => sluice::core::key::default_hash_key(),
        Some(k) => match secret(k.get_ref()).and_then(|v| hex32(&v)) {
            Ok(key) => key,
            Err(e) => {
                ck.at(k.span(), "identity_hash_key", e);
                sluice::core::key::default_hash_key()
            }
        },
    };

    // [policies.NAME]
    let mut policies = BTreeMap::new();
    for (name, p) in &raw.policies {
        let n = name.get_ref();
        let field = format!("policies.{n}");
        if let Err(e) = sluice::core::policy::validate_policy_name(n) {
            ck.at(name.span(), &field, e.to_string());
            continue;
        }
        if let Some(pc) = check_policy(&mut ck, n, p, default_failure, raw.shadow) {
            policies.insert(n.clone(), pc);
        }
    }

    // [[routes]]
    let mut routes = Vec::new();
    for (i, r) in raw.routes.iter().enumerate() {
        let field = format!("routes[{i}]");
        let rr = r.get_ref();
        let mut ok = true;
        if !rr.prefix.get_ref().starts_with('/') {
            ck.at(
                rr.prefix.span(),
                format!("{field}.prefix"),
                "must start with /",
            );
            ok = false;
        }
        let mut methods = Vec::new();
        for m in &rr.methods {
            match http::Method::from_bytes(m.get_ref().to_ascii_uppercase().as_bytes()) {
                Ok(method) => methods.push(method),
                Err(_) => {
                    ck.at(
                        m.span(),
                        format!("{field}.methods"),
                        format!("invalid method {:?}", m.get_ref()),
                    );
                    ok = false;
                }
            }
        }
        for p in &rr.policies {
            if !raw.policies.keys().any(|k| k.get_ref() == p.get_ref()) {
                ck.at(
                    p.span(),
                    format!("{field}.policies"),
                    format!("unknown policy {:?}", p.get_ref()),
                );
                ok = false;
            }
        }
        let upstream = match rr.upstream.get_ref().parse::<http::Uri>() {
            Ok(u)
                if u.scheme_str() == Some("http")
                    && u.authority().is_some()
                    && u.query().is_none() =>
            {
                Some(u)
            }
            Ok(u) if u.scheme_str() == Some("https") => {
                ck.at(rr.upstream.span(), format!("{field}.upstream"), format!("{u}: https upstreams are not supported; terminate TLS in front of the upstream or use plain http on a private network"));
                None
            }
            _ => {
                ck.at(
                    rr.upstream.span(),
                    format!("{field}.upstream"),
                    format!(
                        "invalid upstream {:?}: expected http://HOST:PORT[/base]",
                        rr.upstream.get_ref()
                    ),
                );
                None
            }
        };
        if let (true, Some(upstream)) = (ok, upstream) {
            routes.push(Route {
                prefix: rr.prefix.get_ref().clone(),
                methods,
                policies: rr.policies.iter().map(|p| p.get_ref().clone()).collect(),
                upstream,
            });
        }
    }
    routes.sort_by_key(|r| std::cmp::Reverse(r.prefix.len()));

    // [proxy]
    let mut trusted = Vec::new();
    for t in &raw.proxy.trusted_proxies {
        let v = t.get_ref();
        let ok = v.parse::<ipnet::IpNet>().is_ok() || v.parse::<std::net::IpAddr>().is_ok();
        if ok {
            trusted.push(v.clone());
        } else {
            ck.at(
                t.span(),
                "proxy.trusted_proxies",
                format!("invalid network {v:?}: expected an address or CIDR such as 10.0.0.0/8"),
            );
        }
    }
    let upstream_timeout =
        raw.proxy
            .upstream_timeout
            .as_ref()
            .and_then(|t| match duration(t.get_ref()) {
                Ok(d) if !d.is_zero() => Some(d),
                Ok(_) => None,
                Err(e) => {
                    ck.at(t.span(), "proxy.upstream_timeout", e);
                    None
                }
            });

    // [envoy]
    let mut domain_files: Vec<DomainFile> = Vec::new();
    for d in &raw.envoy.domains {
        domain_files.push(d.get_ref().clone());
    }
    let mut yaml_errors = Vec::new();
    let mut watched = Vec::new();
    for f in &raw.envoy.files {
        let rel = Path::new(f.get_ref());
        let path = match dir {
            Some(d) if rel.is_relative() => d.join(rel),
            _ => rel.to_path_buf(),
        };
        watched.push(path.clone());
        match std::fs::read_to_string(&path) {
            Err(e) => ck.at(f.span(), "envoy.files", format!("{}: {e}", path.display())),
            Ok(text) => match load_domain_yaml(&text, &path.display().to_string()) {
                Ok(d) => domain_files.push(d),
                Err(e) => yaml_errors.push(e),
            },
        }
    }
    let domains = match Domains::compile(&domain_files, raw.shadow) {
        Ok(d) => d,
        Err(e) => {
            let span = raw
                .envoy
                .domains
                .first()
                .map(|d| d.span())
                .or_else(|| raw.envoy.files.first().map(|f| f.span()))
                .unwrap_or(0..0);
            ck.at(span, "envoy.domains", e);
            Domains::default()
        }
    };

    let mut errors = ck.errors;
    errors.extend(yaml_errors);
    if !errors.is_empty() {
        errors.sort_by(|a, b| (&a.file, a.line).cmp(&(&b.file, b.line)));
        return Err(ConfigErrors(errors));
    }
    Ok(Config {
        path: None,
        server: ServerConfig {
            http,
            grpc,
            proxy: proxy_addr,
            max_body_bytes,
            max_policies_per_check: max_policies,
            shutdown_grace,
            reload_poll,
        },
        store: StoreConfig {
            url,
            timeout,
            failure_mode: default_failure,
            max_keys,
            key_prefix,
        },
        identity_hash_key,
        admin_token,
        shadow: raw.shadow,
        legacy_headers: raw.legacy_headers,
        watched,
        policies,
        routes,
        proxy: ProxyConfig {
            trusted_proxies: trusted,
            upstream_timeout,
        },
        domains: Arc::new(domains),
    })
}

/// Parses one envoyproxy/ratelimit YAML file; errors carry the YAML line.
pub fn load_domain_yaml(text: &str, file: &str) -> Result<DomainFile, ConfigError> {
    serde_yaml::from_str::<DomainFile>(text).map_err(|e| {
        let line = e.location().map(|l| l.line());
        let mut msg = e.to_string();
        if let Some(i) = msg.rfind(" at line ") {
            msg.truncate(i);
        }
        // serde_yaml prefixes the path: `descriptors[0].rate_limit: message`.
        let (field, message) = match msg.split_once(": ") {
            Some((path, m)) if !path.contains(' ') => (path.to_string(), m.to_string()),
            _ => ("domain".to_string(), msg),
        };
        ConfigError {
            file: file.to_string(),
            line,
            field,
            message,
        }
    })
}

fn check_policy(
    ck: &mut Checker<'_>,
    name: &str,
    p: &Spanned<RawPolicy>,
    default_failure: FailureMode,
    global_shadow: bool,
) -> Option<PolicyConfig> {
    let f = |k: &str| format!("policies.{name}.{k}");
    let r = p.get_ref();
    let header = p.span();
    let before = ck.errors.len();
    let alg_name = r.algorithm.get_ref().as_str();
    let need_u64 = |ck: &mut Checker<'_>, v: &Option<Spanned<u64>>, k: &str| -> u64 {
        match v {
            Some(n) => *n.get_ref(),
            None => {
                ck.at(header.clone(), f(k), format!("{alg_name} needs {k}"));
                1
            }
        }
    };
    let rate = |ck: &mut Checker<'_>| -> Rate {
        match &r.rate {
            Some(s) => s.get_ref().parse::<Rate>().unwrap_or_else(|e| {
                ck.at(s.span(), f("rate"), e.to_string());
                Rate::per_second(1)
            }),
            None => {
                ck.at(
                    header.clone(),
                    f("rate"),
                    format!("{alg_name} needs rate (such as 5/s, 300/min)"),
                );
                Rate::per_second(1)
            }
        }
    };
    let window =
        |ck: &mut Checker<'_>, v: &Option<Spanned<String>>, k: &str, default: Option<u64>| -> u64 {
            match (v, default) {
                (Some(s), _) => match parse_duration_ms(s.get_ref()) {
                    Ok(0) => {
                        ck.at(s.span(), f(k), "must be above 0");
                        1
                    }
                    Ok(ms) => ms,
                    Err(e) => {
                        ck.at(s.span(), f(k), e.to_string());
                        1
                    }
                },
                (None, Some(d)) => d,
                (None, None) => {
                    ck.at(
                        header.clone(),
                        f(k),
                        format!("{alg_name} needs {k} (such as 10s, 1m)"),
                    );
                    1
                }
            }
        };
    let algorithm = match alg_name {
        "token-bucket" => Algorithm::TokenBucket {
            capacity: need_u64(ck, &r.capacity, "capacity"),
            rate: rate(ck),
        },
        "gcra" => Algorithm::Gcra {
            rate: rate(ck),
            burst: r.burst.as_ref().map_or(0, |b| *b.get_ref()),
        },
        "leaky-bucket" => {
            let mode = match r.mode.as_ref().map(|m| (m.get_ref().as_str(), m.span())) {
                None | Some(("policing", _)) => LeakyMode::Policing,
                Some(("shaping", _)) => LeakyMode::Shaping,
                Some((other, span)) => {
                    ck.at(
                        span,
                        f("mode"),
                        format!(
                            "unknown leaky-bucket mode {other:?}: expected policing or shaping"
                        ),
                    );
                    LeakyMode::Policing
                }
            };
            Algorithm::LeakyBucket {
                capacity: need_u64(ck, &r.capacity, "capacity"),
                rate: rate(ck),
                mode,
            }
        }
        "fixed-window" => Algorithm::FixedWindow {
            limit: need_u64(ck, &r.limit, "limit"),
            window_ms: window(ck, &r.window, "window", None),
        },
        "sliding-counter" => Algorithm::SlidingWindowCounter {
            limit: need_u64(ck, &r.limit, "limit"),
            window_ms: window(ck, &r.window, "window", None),
        },
        "sliding-log" => Algorithm::SlidingWindowLog {
            limit: need_u64(ck, &r.limit, "limit"),
            window_ms: window(ck, &r.window, "window", None),
        },
        "concurrency" => Algorithm::Concurrency {
            limit: need_u64(ck, &r.limit, "limit"),
            lease_ms: window(ck, &r.lease, "lease", Some(30_000)),
        },
        other => {
            ck.at(
                r.algorithm.span(),
                f("algorithm"),
                format!(
                    "unknown algorithm {other:?}: expected token-bucket, gcra, leaky-bucket, fixed-window, \
                     sliding-counter, sliding-log or concurrency"
                ),
            );
            return None;
        }
    };
    // Parameters that do not belong to the algorithm are mistakes worth reporting.
    let allowed: &[&str] = match alg_name {
        "token-bucket" => &["capacity", "rate"],
        "gcra" => &["rate", "burst"],
        "leaky-bucket" => &["capacity", "rate", "mode"],
        "concurrency" => &["limit", "lease"],
        _ => &["limit", "window"],
    };
    let given: [(&str, Option<Range<usize>>); 7] = [
        ("capacity", r.capacity.as_ref().map(|v| v.span())),
        ("rate", r.rate.as_ref().map(|v| v.span())),
        ("burst", r.burst.as_ref().map(|v| v.span())),
        ("limit", r.limit.as_ref().map(|v| v.span())),
        ("window", r.window.as_ref().map(|v| v.span())),
        ("mode", r.mode.as_ref().map(|v| v.span())),
        ("lease", r.lease.as_ref().map(|v| v.span())),
    ];
    for (k, span) in given {
        if let Some(span) = span
            && !allowed.contains(&k)
        {
            ck.at(
                span,
                f(k),
                format!("{alg_name} takes no {k} (it takes {})", allowed.join(", ")),
            );
        }
    }
    if ck.errors.len() == before
        && let Err(e) = algorithm.validate()
    {
        ck.at(r.algorithm.span(), f("algorithm"), e.to_string());
    }
    let failure = match &r.failure_mode {
        None => default_failure,
        Some(m) => failure_mode(m.get_ref()).unwrap_or_else(|e| {
            ck.at(m.span(), f("failure_mode"), e);
            default_failure
        }),
    };
    let shards = match &r.shards {
        None => 1,
        Some(s) if *s.get_ref() == 0 || *s.get_ref() > 1024 => {
            ck.at(s.span(), f("shards"), "must be between 1 and 1024");
            1
        }
        Some(s) => *s.get_ref(),
    };
    let identity = match &r.identity {
        None => IdentitySource::Ip,
        Some(i) => i.get_ref().parse().unwrap_or_else(|e| {
            ck.at(i.span(), f("identity"), e);
            IdentitySource::Ip
        }),
    };
    if ck.errors.len() != before {
        return None;
    }
    let policy = Policy {
        name: name.to_string(),
        algorithm,
        failure_mode: failure,
        shadow: r.shadow || global_shadow,
        shards,
    };
    Some(PolicyConfig {
        policy: Arc::new(policy),
        identity,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn errs(src: &str) -> Vec<String> {
        match Config::parse(src, "sluice.toml", None) {
            Ok(_) => panic!("expected errors in:\n{src}"),
            Err(e) => e.0.iter().map(|e| e.to_string()).collect(),
        }
    }

    fn one(src: &str) -> String {
        let e = errs(src);
        assert_eq!(e.len(), 1, "{e:?}");
        e.into_iter().next().unwrap()
    }

    const GOOD: &str = r#"
shadow = false
identity_hash_key = "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f"

[server]
http = "127.0.0.1:0"
grpc = "127.0.0.1:0"

[store]
url = "memory"
timeout = "50ms"
failure_mode = "closed"

[policies.burst]
algorithm = "token-bucket"
capacity = 10
rate = "5/s"
identity = "api-key:x-api-key"

[policies.daily]
algorithm = "fixed-window"
limit = 1000
window = "1d"
failure_mode = "open"

[policies.uploads]
algorithm = "concurrency"
limit = 2

[[routes]]
prefix = "/api"
methods = ["get", "POST"]
policies = ["burst", "daily"]
upstream = "http://127.0.0.1:8000"

[[routes]]
prefix = "/api/v2/"
policies = ["burst"]
upstream = "http://127.0.0.1:8001/base"

[[envoy.domains]]
domain = "edge"
[[envoy.domains.descriptors]]
key = "remote_address"
rate_limit = { unit = "minute", requests_per_unit = 10 }
"#;

    #[test]
    fn a_complete_file_parses() {
        let c = Config::parse(GOOD, "sluice.toml", None).unwrap();
        assert_eq!(c.policies.len(), 3);
        let burst = &c.policies["burst"];
        assert_eq!(
            burst.policy.algorithm,
            Algorithm::TokenBucket {
                capacity: 10,
                rate: Rate::per_second(5)
            }
        );
        assert_eq!(
            burst.policy.failure_mode,
            FailureMode::Closed,
            "inherits the store's failure mode"
        );
        assert_eq!(c.policies["daily"].policy.failure_mode, FailureMode::Open);
        assert_eq!(
            c.policies["uploads"].policy.algorithm,
            Algorithm::Concurrency {
                limit: 2,
                lease_ms: 30_000
            }
        );
        assert!(matches!(burst.identity, IdentitySource::ApiKey(_)));
        assert_eq!(c.routes[0].prefix, "/api/v2/", "longest prefix first");
        assert_eq!(
            c.routes[1].methods,
            vec![http::Method::GET, http::Method::POST]
        );
        assert!(c.domains.has("edge"));
        assert_eq!(c.identity_hash_key[1], 1);
    }

    #[test]
    fn the_empty_file_is_the_default() {
        let c = Config::parse("", "x.toml", None).unwrap();
        assert_eq!(c.server.http, DEFAULT_HTTP.parse().unwrap());
        assert_eq!(c.store.url, "memory");
        assert!(c.policies.is_empty());
    }

    #[test]
    fn syntax_errors_name_their_line() {
        let e = one("[store]\nurl = \"memory\n");
        assert!(e.starts_with("sluice.toml:2: "), "{e}");
    }

    #[test]
    fn unknown_fields_name_line_and_field() {
        let e = one("[store]\nurl = \"memory\"\ntimeuot = \"5ms\"\n");
        assert!(
            e.starts_with("sluice.toml:3: store.timeuot: unknown field"),
            "{e}"
        );
        let e = one("[policies.a]\nalgorithm = \"gcra\"\nrate = \"1/s\"\nbrust = 3\n");
        assert!(
            e.starts_with("sluice.toml:4: policies.a.brust: unknown field"),
            "{e}"
        );
    }

    #[test]
    fn wrong_types_name_line_and_field() {
        let e =
            one("[policies.a]\nalgorithm = \"token-bucket\"\ncapacity = \"ten\"\nrate = \"1/s\"\n");
        assert!(
            e.starts_with("sluice.toml:3: policies.a.capacity: invalid type"),
            "{e}"
        );
        let e = one("[server]\nmax_body_bytes = -1\n");
        assert!(
            e.starts_with("sluice.toml:2: server.max_body_bytes:"),
            "{e}"
        );
    }

    #[test]
    fn missing_fields_name_the_table() {
        let e = one("\n[policies.a]\ncapacity = 3\n");
        assert!(
            e.starts_with("sluice.toml:2: policies.a.algorithm: missing field"),
            "{e}"
        );
        let e = one("[[routes]]\nprefix = \"/\"\n");
        assert!(
            e.starts_with("sluice.toml:1: routes[0].upstream: missing field"),
            "{e}"
        );
    }

    #[test]
    fn semantic_errors_name_their_line() {
        let src = "\
[policies.a]
algorithm = \"token-bucket\"
capacity = 10
rate = \"5/x\"

[policies.b]
algorithm = \"leaky-buckets\"

[policies.c]
algorithm = \"fixed-window\"
limit = 3

[policies.d]
algorithm = \"gcra\"
rate = \"1/s\"
capacity = 4
failure_mode = \"sometimes\"
shards = 0
identity = \"cookie\"

[store]
url = \"mysql://x\"
timeout = \"fast\"
";
        let e = errs(src);
        let want = [
            "sluice.toml:4: policies.a.rate: invalid rate",
            "sluice.toml:7: policies.b.algorithm: unknown algorithm \"leaky-buckets\"",
            "sluice.toml:9: policies.c.window: fixed-window needs window",
            "sluice.toml:16: policies.d.capacity: gcra takes no capacity",
            "sluice.toml:17: policies.d.failure_mode: unknown failure mode",
            "sluice.toml:18: policies.d.shards: must be between 1 and 1024",
            "sluice.toml:19: policies.d.identity: unknown identity source",
            "sluice.toml:22: store.url: invalid request: unknown store URL",
            "sluice.toml:23: store.timeout: invalid duration",
        ];
        assert_eq!(e.len(), want.len(), "{e:#?}");
        for (got, want) in e.iter().zip(want) {
            assert!(
                got.starts_with(want),
                "{got}\n  does not start with\n{want}"
            );
        }
    }

    #[test]
    fn algorithm_limits_are_checked() {
        let e = one("[policies.a]\nalgorithm = \"token-bucket\"\ncapacity = 0\nrate = \"1/s\"\n");
        assert!(
            e.starts_with("sluice.toml:2: policies.a.algorithm: capacity must be at least 1"),
            "{e}"
        );
        let e = one("[policies.\"bad name\"]\nalgorithm = \"gcra\"\nrate = \"1/s\"\n");
        assert!(e.starts_with("sluice.toml:1: policies.bad name:"), "{e}");
    }

    #[test]
    fn route_errors_name_their_line() {
        let src = "\
[policies.p]
algorithm = \"gcra\"
rate = \"1/s\"

[[routes]]
prefix = \"api\"
policies = [\"p\", \"nope\"]
upstream = \"ftp://x\"
methods = [\"GE T\"]
";
        let e = errs(src);
        assert_eq!(e.len(), 4, "{e:#?}");
        assert!(e[0].starts_with("sluice.toml:6: routes[0].prefix: must start with /"));
        assert!(e[1].starts_with("sluice.toml:7: routes[0].policies: unknown policy \"nope\""));
        assert!(e[2].starts_with("sluice.toml:8: routes[0].upstream: invalid upstream"));
        assert!(e[3].starts_with("sluice.toml:9: routes[0].methods: invalid method"));
    }

    #[test]
    fn server_and_secret_errors_name_their_line() {
        let src = "admin_token = \"env:SLUICE_TEST_SURELY_UNSET_VAR\"\nidentity_hash_key = \"short\"\n[server]\nhttp = \"localhost\"\nmax_policies_per_check = 0\n[proxy]\ntrusted_proxies = [\"10.0.0.0/99\"]\n";
        let e = errs(src);
        assert_eq!(e.len(), 5, "{e:#?}");
        assert!(e[0].starts_with("sluice.toml:1: admin_token: environment variable"));
        assert!(e[1].starts_with("sluice.toml:2: identity_hash_key: must be 64 hex digits"));
        assert!(e[2].starts_with("sluice.toml:4: server.http: invalid address"));
        assert!(e[3].starts_with("sluice.toml:5: server.max_policies_per_check: must be between"));
        assert!(e[4].starts_with("sluice.toml:7: proxy.trusted_proxies: invalid network"));
    }

    #[test]
    fn inline_envoy_errors_name_their_line() {
        let src = "\
[[envoy.domains]]
domain = \"edge\"
[[envoy.domains.descriptors]]
key = \"k\"
rate_limit = { unit = \"fortnight\", requests_per_unit = 1 }
";
        let e = one(src);
        assert!(
            e.contains("sluice.toml:5:") || e.contains("sluice.toml:3:"),
            "{e}"
        );
        assert!(e.contains("fortnight"), "{e}");
        let dup = "[[envoy.domains]]\ndomain = \"a\"\n[[envoy.domains]]\ndomain = \"a\"\n";
        let e = one(dup);
        assert!(
            e.starts_with("sluice.toml:1: envoy.domains: duplicate domain"),
            "{e}"
        );
    }

    #[test]
    fn yaml_files_load_with_lines() {
        let dir = std::env::temp_dir().join(format!("sluice-config-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("good.yaml"), "domain: edge\ndescriptors:\n  - key: remote_address\n    rate_limit:\n      unit: second\n      requests_per_unit: 5\n").unwrap();
        std::fs::write(dir.join("bad.yaml"), "domain: other\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: second\n      requests_per_unit: many\n").unwrap();
        let c = Config::parse("[envoy]\nfiles = [\"good.yaml\"]\n", "s.toml", Some(&dir)).unwrap();
        assert!(c.domains.has("edge"));
        let e = Config::parse(
            "[envoy]\nfiles = [\"good.yaml\", \"bad.yaml\", \"missing.yaml\"]\n",
            "s.toml",
            Some(&dir),
        )
        .unwrap_err();
        let lines: Vec<String> = e.0.iter().map(|e| e.to_string()).collect();
        assert_eq!(lines.len(), 2, "{lines:#?}");
        assert!(
            lines.iter().any(|l| l.ends_with(
                "bad.yaml:6: descriptors[0].rate_limit.requests_per_unit: invalid type: string \"many\", expected u32"
            ) || l.contains("bad.yaml:6:")),
            "{lines:#?}"
        );
        assert!(
            lines
                .iter()
                .any(|l| l.starts_with("s.toml:2: envoy.files:") && l.contains("missing.yaml")),
            "{lines:#?}"
        );
        std::fs::remove_dir_all(&dir).ok();
    }

    #[test]
    fn field_paths() {
        let src = "a = 1\n[x]\nb = 2\n[[r]]\nc = 3\n[[r]]\nd = 4\n";
        assert_eq!(field_at(src, 0), "a");
        assert_eq!(field_at(src, src.find("b =").unwrap()), "x.b");
        assert_eq!(field_at(src, src.find("c =").unwrap()), "r[0].c");
        assert_eq!(field_at(src, src.find("d =").unwrap()), "r[1].d");
    }
}
