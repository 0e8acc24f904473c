//! [`RedisStore`]: the [`Store`] on Redis or Valkey, standalone or Cluster.

use crate::protocol::{self, ROW};
use crate::scripts;
use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::cluster_async::ClusterConnection;
use redis::sentinel::{SentinelClient, SentinelNodeConnectionInfo, SentinelServerType};
use redis::{
    ClientTlsConfig, ErrorKind, IntoConnectionInfo, RedisError, ServerErrorKind, TlsCertificates,
    TlsMode, Value,
};
use sluice_core::key::key_slot;
use sluice_core::{Algorithm, CheckItem, Clock, LeaseId, MultiDecision, Store, StoreError};
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// How the logic is installed on the server.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum ScriptMode {
    /// `EVALSHA`, falling back to `EVAL` (which also caches the script) on `NOSCRIPT`.
    #[default]
    Eval,
    /// A function library loaded with `FUNCTION LOAD REPLACE` and called with `FCALL`; it
    /// persists and replicates with the data. Reloaded if a server answers that it is missing.
    Functions,
}

/// Options of [`RedisStore`].
#[derive(Debug, Clone)]
pub struct RedisOptions {
    /// The longest a call may take before [`StoreError::Timeout`] (default 50 ms).
    pub timeout: Duration,
    /// The longest the initial connection may take (default 2 s).
    pub connect_timeout: Duration,
    /// Scripts or functions.
    pub mode: ScriptMode,
    /// A clock to take `now` from instead of the server's `TIME` (tests, simulations). The
    /// store then passes `now` to the scripts explicitly.
    pub clock: Option<Arc<dyn Clock>>,
    /// Text put in front of every key name (no `{` or `}`, so slots are unchanged); lets
    /// several independent users share one server (e.g. tests).
    pub namespace: Option<String>,
    /// Extra TTL (ms) on every write. `None`: 0 with the server clock; 10 minutes with an
    /// injected clock, because Redis expires keys on its own clock, not the injected one.
    pub ttl_pad_ms: Option<u64>,
    /// Send concurrent one-limit checks together in one script call (default true; only
    /// standalone servers in script mode with the server clock; see `src/batch.rs`).
    pub batch: bool,
}

impl Default for RedisOptions {
    fn default() -> Self {
        Self {
            timeout: Duration::from_millis(50),
            connect_timeout: Duration::from_secs(2),
            mode: ScriptMode::Eval,
            clock: None,
            namespace: None,
            ttl_pad_ms: None,
            batch: true,
        }
    }
}

/// Builds a [`RedisStore`].
#[derive(Debug, Clone)]
pub struct RedisStoreBuilder {
    url: String,
    options: RedisOptions,
}

impl RedisStoreBuilder {
    /// The per-call timeout.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.options.timeout = timeout;
        self
    }
    /// The initial connection timeout.
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.options.connect_timeout = timeout;
        self
    }
    /// Scripts (`EVALSHA`) or functions (`FCALL`).
    pub fn mode(mut self, mode: ScriptMode) -> Self {
        self.options.mode = mode;
        self
    }
    /// Takes `now` from `clock` instead of the server's `TIME`.
    pub fn clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.options.clock = Some(clock);
        self
    }
    /// Prefixes every key name.
    pub fn namespace(mut self, namespace: impl Into<String>) -> Self {
        self.options.namespace = Some(namespace.into());
        self
    }
    /// Extra TTL on every write.
    pub fn ttl_pad_ms(mut self, ms: u64) -> Self {
        self.options.ttl_pad_ms = Some(ms);
        self
    }
    /// Batch concurrent one-limit checks into one script call (default on).
    pub fn batch(mut self, on: bool) -> Self {
        self.options.batch = on;
        self
    }
    /// Connects.
    pub async fn connect(self) -> Result<RedisStore, StoreError> {
        connect(&self.url, self.options).await
    }
}

#[derive(Clone)]
enum Conn {
    Single(ConnectionManager),
    Cluster(ClusterConnection),
    Sentinel(Arc<SentinelConn>),
}

impl Conn {
    async fn query(&self, cmd: &redis::Cmd) -> Result<Value, RedisError> {
        match self {
            Conn::Single(c) => c.clone().req_packed_command(cmd).await,
            Conn::Cluster(c) => c.clone().req_packed_command(cmd).await,
            Conn::Sentinel(s) => {
                let r = s.current().req_packed_command(cmd).await;
                if let Err(e) = &r
                    && needs_rediscovery(e)
                {
                    s.rediscover();
                }
                r
            }
        }
        .and_then(Value::extract_error)
    }

    /// A call timed out: with Sentinel, the master may have moved.
    fn suspect(&self) {
        if let Conn::Sentinel(s) = self {
            s.rediscover();
        }
    }
}

/// Errors after which a Sentinel-managed master may no longer be the master at the address
/// the store is connected to.
fn needs_rediscovery(e: &RedisError) -> bool {
    e.is_io_error()
        || e.is_connection_dropped()
        || e.is_connection_refusal()
        || matches!(
            e.kind(),
            ErrorKind::Server(ServerErrorKind::ReadOnly | ServerErrorKind::MasterDown)
        )
        // A script refused on a demoted master can arrive wrapped in a script error.
        || e.to_string().contains("READONLY")
}

/// The master of a Sentinel-monitored group: a [`ConnectionManager`] to the address the
/// sentinels reported, replaced (in the background, one lookup at a time, at most every
/// 100 ms) when a call fails in a way that suggests a failover.
struct SentinelConn {
    sentinel: tokio::sync::Mutex<SentinelClient>,
    current: std::sync::RwLock<ConnectionManager>,
    config: ConnectionManagerConfig,
    connect_timeout: Duration,
    busy: AtomicBool,
    last: std::sync::Mutex<Option<Instant>>,
}

impl SentinelConn {
    fn current(&self) -> ConnectionManager {
        self.current
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    async fn master(
        sentinel: &mut SentinelClient,
        config: &ConnectionManagerConfig,
    ) -> Result<ConnectionManager, RedisError> {
        let client = sentinel.async_get_client().await?;
        ConnectionManager::new_with_config(client, config.clone()).await
    }

    fn rediscover(self: &Arc<Self>) {
        {
            let mut last = self
                .last
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            if last.is_some_and(|t| t.elapsed() < Duration::from_millis(100)) {
                return;
            }
            if self.busy.swap(true, Ordering::AcqRel) {
                return;
            }
            *last = Some(Instant::now());
        }
        let this = Arc::clone(self);
        tokio::spawn(async move {
            let mut sentinel = this.sentinel.lock().await;
            let found = tokio::time::timeout(
                this.connect_timeout,
                Self::master(&mut sentinel, &this.config),
            )
            .await;
            match found {
                Ok(Ok(conn)) => {
                    *this
                        .current
                        .write()
                        .unwrap_or_else(std::sync::PoisonError::into_inner) = conn;
                }
                Ok(Err(e)) => tracing::warn!("sentinel: master lookup failed: {e}"),
                Err(_) => tracing::warn!("sentinel: master lookup timed out"),
            }
            drop(sentinel);
            this.busy.store(false, Ordering::Release);
        });
    }
}

/// A script with its SHA1.
#[derive(Debug)]
struct Lua {
    src: &'static str,
    sha: String,
}

impl Lua {
    fn new(src: &'static str) -> Self {
        Self {
            src,
            sha: redis::Script::new(src).get_hash().to_string(),
        }
    }
}

/// Limiter state in Redis or Valkey (standalone or Cluster). Every decision is one atomic
/// script call; see `docs/redis.md`.
pub struct RedisStore {
    conn: Conn,
    cluster: bool,
    timeout: Duration,
    mode: ScriptMode,
    clock: Option<Arc<dyn Clock>>,
    namespace: String,
    pad: String,
    single: [Lua; 7],
    multi: Lua,
    release: Lua,
    id_prefix: String,
    counter: AtomicU64,
    batcher: Option<crate::batch::Batcher>,
}

impl std::fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisStore")
            .field("cluster", &self.cluster)
            .field("timeout", &self.timeout)
            .field("mode", &self.mode)
            .field("clock", &self.clock)
            .field("namespace", &self.namespace)
            .finish_non_exhaustive()
    }
}

/// Connects to `url` (see [`crate::url`] for the forms) with `options`; the URL's query options
/// override `options`.
pub async fn connect(url: &str, mut options: RedisOptions) -> Result<RedisStore, StoreError> {
    let parsed = crate::url::parse(url, &mut options)?;
    if let Some(ns) = &options.namespace
        && ns.contains(['{', '}'])
    {
        return Err(StoreError::Invalid(
            "a key namespace cannot contain { or }".into(),
        ));
    }
    let secret = crate::url::password(url);
    let scrub = |msg: String| -> String {
        match &secret {
            Some(pw) => msg
                .replace(pw.as_str(), "***")
                .replace(crate::url::percent_decode(pw).as_str(), "***"),
            None => msg,
        }
    };
    let connect_err = |e: RedisError| {
        let msg = scrub(format!("{}: {e}", crate::url::redact(url)));
        if is_auth_error(&e) {
            StoreError::Invalid(format!("authentication failed: {msg}"))
        } else {
            StoreError::Unavailable(msg)
        }
    };
    let invalid = |e: RedisError| StoreError::Invalid(scrub(e.to_string()));
    let certs = tls_certificates(&parsed)?;
    let timeout_err = || StoreError::Timeout(options.connect_timeout.as_millis() as u64);
    let manager_config = ConnectionManagerConfig::new()
        .set_connection_timeout(Some(options.connect_timeout))
        .set_number_of_retries(2)
        .set_min_delay(Duration::from_millis(10))
        .set_max_delay(Duration::from_millis(200));
    let conn = if parsed.cluster {
        if certs.is_some() {
            return Err(StoreError::Invalid(
                "ca=, cert= and key= are not supported for a Cluster with this build's TLS \
                 (native-tls): put the CA in the system trust store, or use #insecure"
                    .into(),
            ));
        }
        let client = redis::cluster::ClusterClient::builder(parsed.nodes.clone())
            .connection_timeout(options.connect_timeout)
            .response_timeout(options.connect_timeout)
            .retries(3)
            .min_retry_wait(10)
            .max_retry_wait(200)
            .build()
            .map_err(invalid)?;
        let fut = client.get_async_connection();
        let c = tokio::time::timeout(options.connect_timeout, fut)
            .await
            .map_err(|_| timeout_err())?
            .map_err(connect_err)?;
        Conn::Cluster(c)
    } else if let Some(target) = &parsed.sentinel {
        if certs.is_some() {
            return Err(StoreError::Invalid(
                "ca=, cert= and key= are not supported with Sentinel with this build's TLS \
                 (native-tls): put the CA in the system trust store, or use #insecure"
                    .into(),
            ));
        }
        let node = target
            .node_url
            .as_str()
            .into_connection_info()
            .map_err(invalid)?;
        let mut info = SentinelNodeConnectionInfo::default()
            .set_redis_connection_info(node.redis_settings().clone());
        if let redis::ConnectionAddr::TcpTls { insecure, .. } = node.addr() {
            info = info.set_tls_mode(if *insecure {
                TlsMode::Insecure
            } else {
                TlsMode::Secure
            });
        }
        let mut sentinel = SentinelClient::build(
            parsed.nodes.clone(),
            target.master.clone(),
            Some(info),
            SentinelServerType::Master,
        )
        .map_err(invalid)?;
        let fut = SentinelConn::master(&mut sentinel, &manager_config);
        let c = tokio::time::timeout(options.connect_timeout, fut)
            .await
            .map_err(|_| timeout_err())?
            .map_err(connect_err)?;
        Conn::Sentinel(Arc::new(SentinelConn {
            sentinel: tokio::sync::Mutex::new(sentinel),
            current: std::sync::RwLock::new(c),
            config: manager_config,
            connect_timeout: options.connect_timeout,
            busy: AtomicBool::new(false),
            last: std::sync::Mutex::new(None),
        }))
    } else {
        let client = match certs {
            Some(certs) => redis::Client::build_with_tls(parsed.nodes[0].as_str(), certs),
            None => redis::Client::open(parsed.nodes[0].as_str()),
        }
        .map_err(invalid)?;
        let fut = ConnectionManager::new_with_config(client, manager_config);
        let c = tokio::time::timeout(options.connect_timeout, fut)
            .await
            .map_err(|_| timeout_err())?
            .map_err(connect_err)?;
        Conn::Single(c)
    };
    let pad = options
        .ttl_pad_ms
        .unwrap_or(if options.clock.is_some() { 600_000 } else { 0 });
    let mut store = RedisStore {
        conn,
        cluster: parsed.cluster,
        timeout: options.timeout,
        mode: options.mode,
        clock: options.clock,
        namespace: options.namespace.unwrap_or_default(),
        pad: pad.to_string(),
        single: [
            Lua::new(scripts::TOKEN_BUCKET),
            Lua::new(scripts::GCRA),
            Lua::new(scripts::LEAKY_BUCKET),
            Lua::new(scripts::FIXED_WINDOW),
            Lua::new(scripts::SLIDING_WINDOW_COUNTER),
            Lua::new(scripts::SLIDING_WINDOW_LOG),
            Lua::new(scripts::CONCURRENCY),
        ],
        multi: Lua::new(scripts::MULTI),
        release: Lua::new(scripts::RELEASE),
        id_prefix: format!("{:012x}", rand::random::<u64>() & 0xffff_ffff_ffff),
        counter: AtomicU64::new(0),
        batcher: None,
    };
    if options.batch && store.mode == ScriptMode::Eval && store.clock.is_none() && !store.cluster {
        store.batcher = Some(crate::batch::Batcher::spawn(
            batch_runner(store.conn.clone()),
            store.pad.clone(),
        ));
    }
    if store.mode == ScriptMode::Functions {
        let load = store.load_library();
        tokio::time::timeout(options.connect_timeout, load)
            .await
            .map_err(|_| StoreError::Timeout(options.connect_timeout.as_millis() as u64))??;
    }
    Ok(store)
}

/// The certificates named by `?ca=`, `?cert=` and `?key=`, read from their files.
fn tls_certificates(parsed: &crate::url::ParsedUrl) -> Result<Option<TlsCertificates>, StoreError> {
    if parsed.ca.is_none() && parsed.client_cert.is_none() {
        return Ok(None);
    }
    let read = |what: &str, path: &str| {
        std::fs::read(path)
            .map_err(|e| StoreError::Invalid(format!("cannot read the TLS {what} {path:?}: {e}")))
    };
    let root_cert = parsed
        .ca
        .as_deref()
        .map(|p| read("CA file", p))
        .transpose()?;
    let client_tls = match &parsed.client_cert {
        Some((cert, key)) => Some(ClientTlsConfig {
            client_cert: read("client certificate", cert)?,
            client_key: read("client key", key)?,
        }),
        None => None,
    };
    Ok(Some(TlsCertificates {
        client_tls,
        root_cert,
    }))
}

fn is_auth_error(e: &RedisError) -> bool {
    if e.kind() == ErrorKind::AuthenticationFailed {
        return true;
    }
    let s = e.to_string();
    s.contains("WRONGPASS") || s.contains("NOAUTH") || s.contains("invalid password")
}

fn map_err(e: RedisError) -> StoreError {
    if e.is_timeout() {
        return StoreError::Timeout(0);
    }
    if e.is_io_error() || e.is_connection_dropped() || e.is_connection_refusal() {
        return StoreError::Unavailable(e.to_string());
    }
    match e.kind() {
        ErrorKind::Server(
            ServerErrorKind::ClusterDown
            | ServerErrorKind::TryAgain
            | ServerErrorKind::MasterDown
            | ServerErrorKind::BusyLoading
            | ServerErrorKind::ReadOnly,
        ) => StoreError::Unavailable(e.to_string()),
        ErrorKind::Server(ServerErrorKind::CrossSlot) => StoreError::Invalid(e.to_string()),
        _ if e.is_cluster_error() => StoreError::Unavailable(e.to_string()),
        _ => StoreError::Backend(e.to_string()),
    }
}

fn is_missing_function(e: &RedisError) -> bool {
    let s = e.to_string();
    s.contains("Function not found") || s.contains("function not found")
}

fn script_index(algorithm: &Algorithm) -> usize {
    match algorithm {
        Algorithm::TokenBucket { .. } => 0,
        Algorithm::Gcra { .. } => 1,
        Algorithm::LeakyBucket { .. } => 2,
        Algorithm::FixedWindow { .. } => 3,
        Algorithm::SlidingWindowCounter { .. } => 4,
        Algorithm::SlidingWindowLog { .. } => 5,
        Algorithm::Concurrency { .. } => 6,
    }
}

impl RedisStore {
    /// A builder for a store at `url`.
    pub fn builder(url: impl Into<String>) -> RedisStoreBuilder {
        RedisStoreBuilder {
            url: url.into(),
            options: RedisOptions::default(),
        }
    }

    /// Whether this store talks to a Cluster.
    pub fn is_cluster(&self) -> bool {
        self.cluster
    }

    /// The script mode.
    pub fn mode(&self) -> ScriptMode {
        self.mode
    }

    /// The key name as sent to the server (with the namespace).
    pub fn server_key(&self, key: &str) -> String {
        let mut k = String::with_capacity(self.namespace.len() + key.len());
        k.push_str(&self.namespace);
        k.push_str(key);
        k
    }

    fn now_arg(&self) -> String {
        match &self.clock {
            Some(c) => c.now().to_string(),
            None => String::new(),
        }
    }

    fn next_id(&self) -> String {
        let n = self.counter.fetch_add(1, Ordering::Relaxed);
        format!("{}.{n:x}", self.id_prefix)
    }

    /// (Re)installs the function library on every master.
    pub async fn load_library(&self) -> Result<(), StoreError> {
        let mut cmd = redis::cmd("FUNCTION");
        cmd.arg("LOAD")
            .arg("REPLACE")
            .arg(scripts::FUNCTION_LIBRARY);
        self.conn.query(&cmd).await.map(|_| ()).map_err(map_err)
    }

    /// Runs a script (or its function) with `keys` and `args`, recovering from a flushed
    /// script cache or a missing library without the caller seeing it.
    async fn invoke(
        &self,
        lua: &Lua,
        function: &str,
        keys: &[String],
        args: &[String],
    ) -> Result<Value, RedisError> {
        match self.mode {
            ScriptMode::Eval => {
                let mut cmd = redis::cmd("EVALSHA");
                cmd.arg(&lua.sha).arg(keys.len()).arg(keys).arg(args);
                match self.conn.query(&cmd).await {
                    Err(e) if e.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
                        // EVAL runs the script and caches it again on the node that owns the keys.
                        let mut cmd = redis::cmd("EVAL");
                        cmd.arg(lua.src).arg(keys.len()).arg(keys).arg(args);
                        self.conn.query(&cmd).await
                    }
                    r => r,
                }
            }
            ScriptMode::Functions => {
                let mut cmd = redis::cmd("FCALL");
                cmd.arg(function).arg(keys.len()).arg(keys).arg(args);
                match self.conn.query(&cmd).await {
                    Err(e) if is_missing_function(&e) => {
                        let mut load = redis::cmd("FUNCTION");
                        load.arg("LOAD")
                            .arg("REPLACE")
                            .arg(scripts::FUNCTION_LIBRARY);
                        self.conn.query(&load).await?;
                        self.conn.query(&cmd).await
                    }
                    r => r,
                }
            }
        }
    }

    async fn invoke_timed(
        &self,
        lua: &Lua,
        function: &str,
        keys: &[String],
        args: &[String],
    ) -> Result<Value, StoreError> {
        let ms = self.timeout.as_millis() as u64;
        match tokio::time::timeout(self.timeout, self.invoke(lua, function, keys, args)).await {
            Err(_) => {
                self.conn.suspect();
                Err(StoreError::Timeout(ms))
            }
            Ok(Err(e)) => Err(match map_err(e) {
                StoreError::Timeout(_) => StoreError::Timeout(ms),
                other => other,
            }),
            Ok(Ok(v)) => Ok(v),
        }
    }

    fn check_slots(&self, keys: &[String]) -> Result<(), StoreError> {
        if !self.cluster || keys.len() < 2 {
            return Ok(());
        }
        let first = key_slot(keys[0].as_bytes());
        if let Some(k) = keys[1..].iter().find(|k| key_slot(k.as_bytes()) != first) {
            return Err(StoreError::Invalid(format!(
                "keys {:?} and {:?} are in different Cluster slots; check them in separate calls",
                keys[0], k
            )));
        }
        Ok(())
    }
}

/// Runs `lua/batch.lua` on `conn` (EVALSHA, EVAL when the script cache was flushed).
fn batch_runner(conn: Conn) -> crate::batch::Runner {
    let lua = Arc::new(Lua::new(scripts::BATCH));
    Arc::new(move |keys: Vec<String>, args: Vec<String>| {
        let (conn, lua) = (conn.clone(), Arc::clone(&lua));
        Box::pin(async move {
            let mut cmd = redis::cmd("EVALSHA");
            cmd.arg(&lua.sha).arg(keys.len()).arg(&keys).arg(&args);
            match conn.query(&cmd).await {
                Err(e) if e.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
                    let mut cmd = redis::cmd("EVAL");
                    cmd.arg(lua.src).arg(keys.len()).arg(&keys).arg(&args);
                    conn.query(&cmd).await
                }
                r => r,
            }
            .map_err(map_err)
        })
    })
}

pub(crate) fn ints(v: Value) -> Result<Vec<i64>, StoreError> {
    match v {
        Value::Array(items) => items
            .into_iter()
            .map(|x| match x {
                Value::Int(i) => Ok(i),
                other => Err(StoreError::Backend(format!(
                    "unexpected script reply item {other:?}"
                ))),
            })
            .collect(),
        other => Err(StoreError::Backend(format!(
            "unexpected script reply {other:?}"
        ))),
    }
}

#[async_trait::async_trait]
impl Store for RedisStore {
    async fn check(&self, items: &[CheckItem<'_>]) -> Result<MultiDecision, StoreError> {
        if items.is_empty() {
            return Ok(MultiDecision {
                allowed: true,
                decisions: Vec::new(),
            });
        }
        let keys: Vec<String> = items.iter().map(|i| self.server_key(i.key)).collect();
        self.check_slots(&keys)?;
        let mut args = Vec::with_capacity(2 + items.len() * ROW);
        args.push(self.now_arg());
        args.push(self.pad.clone());
        let mut tokens = Vec::with_capacity(items.len());
        for item in items {
            let token = if protocol::needs_token(item.algorithm, item.cost) {
                protocol::token_for(&self.next_id(), item.cost)
            } else {
                String::new()
            };
            protocol::push_item_args(&mut args, item.algorithm, item.cost, &token);
            tokens.push(token);
        }
        if let (Some(batcher), [_]) = (&self.batcher, items) {
            let ms = self.timeout.as_millis() as u64;
            let key = keys.into_iter().next().unwrap_or_default();
            let item_args = args.split_off(2);
            return match tokio::time::timeout(self.timeout, batcher.check(key, item_args)).await {
                Err(_) => {
                    self.conn.suspect();
                    Err(StoreError::Timeout(ms))
                }
                Ok(Err(StoreError::Timeout(_))) => Err(StoreError::Timeout(ms)),
                Ok(Err(e)) => Err(e),
                Ok(Ok(row)) => protocol::decode(items, &tokens, &row),
            };
        }
        let lua = if items.len() == 1 {
            &self.single[script_index(items[0].algorithm)]
        } else {
            &self.multi
        };
        let reply = self
            .invoke_timed(lua, scripts::FN_CHECK, &keys, &args)
            .await?;
        protocol::decode(items, &tokens, &ints(reply)?)
    }

    async fn release(
        &self,
        key: &str,
        algorithm: &Algorithm,
        lease: &LeaseId,
    ) -> Result<bool, StoreError> {
        if !matches!(algorithm, Algorithm::Concurrency { .. }) {
            return Ok(false);
        }
        let keys = [self.server_key(key)];
        let args = [self.now_arg(), self.pad.clone(), lease.0.clone()];
        match self
            .invoke_timed(&self.release, scripts::FN_RELEASE, &keys, &args)
            .await?
        {
            Value::Int(i) => Ok(i == 1),
            other => Err(StoreError::Backend(format!(
                "unexpected release reply {other:?}"
            ))),
        }
    }

    fn kind(&self) -> &'static str {
        if self.cluster {
            "redis-cluster"
        } else {
            "redis"
        }
    }

    fn requires_single_slot(&self) -> bool {
        self.cluster
    }
}
