//! [`RedisStore`]: the [`Store`] on Redis or Valkey, standalone or Cluster.

use crate::protocol::{self, ROW};
use crate::scripts;
use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::cluster_async::ClusterConnection;
use redis::{ErrorKind, RedisError, ServerErrorKind, Value};
use sluice_core::key::key_slot;
use sluice_core::{Algorithm, CheckItem, Clock, LeaseId, MultiDecision, Store, StoreError};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

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
    /// Connects.
    pub async fn connect(self) -> Result<RedisStore, StoreError> {
        connect(&self.url, self.options).await
    }
}

#[derive(Clone)]
enum Conn {
    Single(ConnectionManager),
    Cluster(ClusterConnection),
}

impl Conn {
    async fn query(&self, cmd: &redis::Cmd) -> Result<Value, RedisError> {
        match self {
            Conn::Single(c) => c.clone().req_packed_command(cmd).await,
            Conn::Cluster(c) => c.clone().req_packed_command(cmd).await,
        }
        .and_then(Value::extract_error)
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
    if parsed.tls {
        return Err(StoreError::Invalid(
            "rediss:// (TLS) needs a TLS build of the Redis client, which this build does not include".into(),
        ));
    }
    if let Some(ns) = &options.namespace
        && ns.contains(['{', '}'])
    {
        return Err(StoreError::Invalid(
            "a key namespace cannot contain { or }".into(),
        ));
    }
    let connect_err =
        |e: RedisError| StoreError::Unavailable(format!("{}: {e}", crate::url::redact(url)));
    let conn = if parsed.cluster {
        let client = redis::cluster::ClusterClient::builder(parsed.nodes.clone())
            .connection_timeout(options.connect_timeout)
            .response_timeout(options.connect_timeout)
            .retries(3)
            .min_retry_wait(10)
            .max_retry_wait(200)
            .build()
            .map_err(|e| StoreError::Invalid(e.to_string()))?;
        let fut = client.get_async_connection();
        let c = tokio::time::timeout(options.connect_timeout, fut)
            .await
            .map_err(|_| StoreError::Timeout(options.connect_timeout.as_millis() as u64))?
            .map_err(connect_err)?;
        Conn::Cluster(c)
    } else {
        let client = redis::Client::open(parsed.nodes[0].as_str())
            .map_err(|e| StoreError::Invalid(e.to_string()))?;
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(options.connect_timeout))
            .set_number_of_retries(2)
            .set_min_delay(Duration::from_millis(10))
            .set_max_delay(Duration::from_millis(200));
        let fut = ConnectionManager::new_with_config(client, config);
        let c = tokio::time::timeout(options.connect_timeout, fut)
            .await
            .map_err(|_| StoreError::Timeout(options.connect_timeout.as_millis() as u64))?
            .map_err(connect_err)?;
        Conn::Single(c)
    };
    let pad = options
        .ttl_pad_ms
        .unwrap_or(if options.clock.is_some() { 600_000 } else { 0 });
    let store = RedisStore {
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
    };
    if store.mode == ScriptMode::Functions {
        let load = store.load_library();
        tokio::time::timeout(options.connect_timeout, load)
            .await
            .map_err(|_| StoreError::Timeout(options.connect_timeout.as_millis() as u64))??;
    }
    Ok(store)
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
            Err(_) => Err(StoreError::Timeout(ms)),
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

fn ints(v: Value) -> Result<Vec<i64>, StoreError> {
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
