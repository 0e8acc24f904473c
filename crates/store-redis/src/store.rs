//! [`RedisStore`]: the [`Store`] on Redis or Valkey, standalone or Cluster.

mod adjust;
mod call;
pub(crate) mod compensation;
mod connection;
mod nodes;
mod options;
mod raw;

pub use options::{DEFAULT_UNRESPONSIVE_AFTER, RedisOptions, RedisStoreBuilder, ScriptMode};

use crate::protocol::{self, ROW};
use crate::scripts;
use call::{LeaseGuard, ReleaseContext, batch_runner, release_runner};
use compensation::{Compensator, PendingRelease};
use connection::{Conn, LastAnswer, SentinelConn, is_auth_error, map_err, tls_certificates};
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::sentinel::{SentinelClient, SentinelNodeConnectionInfo, SentinelServerType};
use redis::{IntoConnectionInfo, RedisError, TlsMode, Value};
use sluice_core::algorithm::AlgorithmKind;
use sluice_core::key::key_slot;
use sluice_core::{Algorithm, CheckItem, Clock, LeaseId, MultiDecision, Store, StoreError};
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;
use tokio::sync::Semaphore;

/// A script with its SHA1 (cheap to clone).
#[derive(Debug, Clone)]
struct Lua {
    src: &'static str,
    sha: Arc<str>,
}

impl Lua {
    fn new(src: &'static str) -> Self {
        Self {
            src,
            sha: redis::Script::new(src).get_hash().into(),
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
    release: Arc<Lua>,
    id_prefix: String,
    counter: AtomicU64,
    batcher: Option<crate::batch::Batcher>,
    queue_wait: Duration,
    /// In-flight slots of calls that are not batched: beyond, calls wait (sluice's own
    /// queue), so each call's timeout measures its round trip, not a pipeline backlog.
    direct: Semaphore,
    compensator: Compensator,
}

/// Most unbatched calls in flight at once on one store.
const DIRECT_IN_FLIGHT: usize = 128;

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
        let addr = parsed.nodes[0]
            .as_str()
            .into_connection_info()
            .ok()
            .and_then(|info| match info.addr() {
                redis::ConnectionAddr::Tcp(host, port)
                | redis::ConnectionAddr::TcpTls { host, port, .. } => Some((host.clone(), *port)),
                _ => None,
            });
        Conn::Single(
            c,
            Arc::new(LastAnswer::new(
                options.unresponsive_after.max(options.timeout),
                addr,
            )),
        )
    };
    let pad = options
        .ttl_pad_ms
        .unwrap_or(if options.clock.is_some() { 600_000 } else { 0 });
    let compensator = Compensator::spawn(release_runner(ReleaseContext {
        conn: conn.clone(),
        mode: options.mode,
        timeout: options.timeout,
        lua: Arc::new(Lua::new(&scripts::RELEASE)),
        clock: options.clock.clone(),
        pad: pad.to_string(),
    }));
    let mut store = RedisStore {
        conn,
        cluster: parsed.cluster,
        timeout: options.timeout,
        mode: options.mode,
        clock: options.clock,
        namespace: options.namespace.unwrap_or_default(),
        pad: pad.to_string(),
        single: AlgorithmKind::ALL.map(|kind| Lua::new(scripts::single(kind))),
        multi: Lua::new(&scripts::MULTI),
        release: Arc::new(Lua::new(&scripts::RELEASE)),
        id_prefix: format!("{:012x}", rand::random::<u64>() & 0xffff_ffff_ffff),
        counter: AtomicU64::new(0),
        batcher: None,
        queue_wait: options.queue_wait,
        direct: Semaphore::new(DIRECT_IN_FLIGHT),
        compensator,
    };
    if options.batch && store.mode == ScriptMode::Eval && store.clock.is_none() {
        let node_of: Option<crate::batch::NodeOf> = if store.cluster {
            let fetch = nodes::ClusterNodes::fetch(store.conn.clone());
            let map = tokio::time::timeout(options.connect_timeout, fetch)
                .await
                .map_err(|_| StoreError::Timeout(options.connect_timeout.as_millis() as u64))?;
            Some(Arc::new(map))
        } else {
            None
        };
        store.batcher = Some(crate::batch::Batcher::spawn(
            batch_runner(store.conn.clone(), store.timeout, store.cluster),
            store.pad.clone(),
            store.queue_wait,
            store.compensator.clone(),
            node_of,
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

fn is_missing_function(e: &RedisError) -> bool {
    let s = e.to_string();
    s.contains("Function not found") || s.contains("function not found")
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
            .arg(scripts::function_library());
        self.conn.query(&cmd).await.map(|_| ()).map_err(map_err)
    }

    /// Waits (at most the queue bound) for an in-flight slot of an unbatched call.
    async fn direct_slot(&self) -> Result<tokio::sync::SemaphorePermit<'_>, StoreError> {
        match tokio::time::timeout(self.queue_wait, self.direct.acquire()).await {
            Ok(Ok(slot)) => Ok(slot),
            Ok(Err(_)) => Err(StoreError::Unavailable("store closed".into())),
            Err(_) => Err(StoreError::Overloaded(format!(
                "no free in-flight slot within the queue bound of {} ms",
                self.queue_wait.as_millis()
            ))),
        }
    }

    /// Runs a script (or its function) under the per-call timeout, after waiting (at most
    /// the queue bound) for an in-flight slot.
    async fn invoke_timed(
        &self,
        lua: &Lua,
        function: &'static str,
        keys: &[String],
        args: &[String],
    ) -> Result<Value, StoreError> {
        let _slot = self.direct_slot().await?;
        call::invoke_timed(
            &self.conn,
            self.mode,
            self.timeout,
            lua,
            function,
            keys.to_vec(),
            args.to_vec(),
        )
        .await
    }

    /// Decides `items` (independent one-limit checks, token-free algorithms) in one batch
    /// call at `now_us`, as the batcher would send them: to the one-policy script when they
    /// share one, or to `lua/batch.lua` when `generic` (or they do not). For tests holding
    /// the batch scripts to each other and to separate calls; not a stable API.
    #[doc(hidden)]
    pub async fn batch_at(
        &self,
        items: &[CheckItem<'_>],
        now_us: u64,
        generic: bool,
    ) -> Result<Vec<sluice_core::Decision>, StoreError> {
        use crate::batch::{Item, decode, encode, script_for};
        let owned: Vec<Item> = items
            .iter()
            .map(|i| Item {
                key: self.server_key(i.key),
                algorithm: i.algorithm.clone(),
                cost: i.cost,
                token: String::new(),
            })
            .collect();
        let refs: Vec<&Item> = owned.iter().collect();
        let script = script_for(&refs, generic);
        let (keys, args) = encode(
            script,
            &refs,
            now_us.to_string(),
            self.pad.clone(),
            self.cluster,
        );
        let run = batch_runner(self.conn.clone(), self.timeout, self.cluster);
        let flat = ints(run(script, refs.len(), keys, args).await?)?;
        let rows = decode(script, &refs, &flat)?;
        let tokens = vec![String::new(); items.len()];
        let mut out = Vec::with_capacity(items.len());
        for (i, row) in rows.iter().enumerate() {
            out.extend(protocol::decode(&items[i..=i], &tokens[i..=i], row)?.decisions);
        }
        Ok(out)
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
        let mut tokens = Vec::with_capacity(items.len());
        // Concurrency acquires: their lease ids are known now, so a call whose outcome is
        // lost can be compensated by releasing them.
        let mut leases = Vec::new();
        for (item, key) in items.iter().zip(&keys) {
            let token = if protocol::needs_token(item.algorithm, item.cost) {
                protocol::token_for(&self.next_id(), item.cost)
            } else {
                String::new()
            };
            if let Some(lease_ms) = item.algorithm.lease_ms()
                && !token.is_empty()
            {
                leases.push(PendingRelease::new(key.clone(), token.clone(), lease_ms));
            }
            tokens.push(token);
        }
        if let (Some(batcher), [item]) = (&self.batcher, items)
            && (!self.cluster || crate::batch::cluster_batches(item.algorithm))
        {
            // The batching task applies the timeout to the script call and compensates the
            // lease itself (it alone knows whether the item was sent).
            let batched = crate::batch::Item {
                key: keys.into_iter().next().unwrap_or_default(),
                algorithm: item.algorithm.clone(),
                cost: item.cost,
                token: tokens[0].clone(),
            };
            let row = batcher.check(batched, leases.pop()).await?;
            return protocol::decode(items, &tokens, &row);
        }
        let mut args = Vec::with_capacity(2 + items.len() * ROW);
        args.push(self.now_arg());
        args.push(self.pad.clone());
        for (item, token) in items.iter().zip(&tokens) {
            protocol::push_item_args(&mut args, item.algorithm, item.cost, token);
        }
        let lua = if items.len() == 1 {
            &self.single[items[0].algorithm.algorithm_kind().index()]
        } else {
            &self.multi
        };
        // Never sent: nothing to compensate.
        let _slot = self.direct_slot().await?;
        let guard = LeaseGuard::new(&self.compensator, leases);
        let decided = call::invoke_timed(
            &self.conn,
            self.mode,
            self.timeout,
            lua,
            scripts::FN_CHECK,
            keys,
            args,
        )
        .await
        .and_then(ints)
        .and_then(|reply| protocol::decode(items, &tokens, &reply));
        match decided {
            // Decided (the caller holds whatever leases were taken), or refused unsent.
            Ok(_) | Err(StoreError::Invalid(_)) => guard.disarm(),
            // The call may have run, or may still run (a timed-out call answered as overload
            // included): the guard releases its leases.
            Err(_) => drop(guard),
        }
        decided
    }

    async fn release(
        &self,
        key: &str,
        algorithm: &Algorithm,
        lease: &LeaseId,
    ) -> Result<bool, StoreError> {
        // Only an algorithm with leases has one to release.
        let Some(lease_ms) = algorithm.lease_ms() else {
            return Ok(false);
        };
        let keys = [self.server_key(key)];
        let args = [self.now_arg(), self.pad.clone(), lease.0.clone()];
        // A release that fails (or is abandoned) is retried in the background: its caller
        // has let go of the lease either way.
        let retry = PendingRelease::new(keys[0].clone(), lease.0.clone(), lease_ms);
        let guard = LeaseGuard::new(&self.compensator, vec![retry]);
        let released = self
            .invoke_timed(&self.release, scripts::FN_RELEASE, &keys, &args)
            .await
            .and_then(|reply| match reply {
                Value::Int(i) => Ok(i == 1),
                other => Err(StoreError::Backend(format!(
                    "unexpected release reply {other:?}"
                ))),
            });
        match released {
            Ok(_) | Err(StoreError::Invalid(_)) => guard.disarm(),
            Err(_) => drop(guard),
        }
        released
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

    async fn reset(&self, key: &str) -> Result<bool, StoreError> {
        self.reset_key(key).await
    }

    async fn adjust(
        &self,
        key: &str,
        algorithm: &Algorithm,
        adjustment: sluice_core::algorithm::Adjustment,
    ) -> Result<sluice_core::Decision, StoreError> {
        self.adjust_key(key, algorithm, adjustment).await
    }

    /// A call waits at most the queue bound for its turn, then its round trip takes at most
    /// the timeout of the largest batch (plus scheduling slack).
    fn call_bound(&self) -> Option<Duration> {
        let round_trip = call::batch_timeout(self.timeout, crate::batch::MAX_BATCH);
        Some(self.queue_wait + round_trip + Duration::from_millis(200))
    }
}
