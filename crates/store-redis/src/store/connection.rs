//! The connection a [`super::RedisStore`] sends its calls on: one multiplexed, reconnecting
//! connection to a standalone server, a Cluster connection, or the current master of a
//! Sentinel group (found again when a call suggests a failover). Also the TLS files it is
//! opened with, and how the client's errors map to [`StoreError`].

use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::cluster_async::ClusterConnection;
use redis::sentinel::SentinelClient;
use redis::{ClientTlsConfig, ErrorKind, RedisError, ServerErrorKind, TlsCertificates, Value};
use sluice_core::StoreError;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

#[derive(Clone)]
pub(crate) enum Conn {
    /// A standalone server, with the time of its latest answer.
    Single(ConnectionManager, Arc<LastAnswer>),
    Cluster(ClusterConnection),
    Sentinel(Arc<SentinelConn>),
}

/// When one server last answered a call, and how long it may stay silent before it counts
/// as unresponsive. A server that answered any call within that window is alive: a call
/// that outlived its own timeout meanwhile waited behind other work (this process too busy
/// to read its answers, or the server busy with other clients' calls), which is overload,
/// not failure.
#[derive(Debug)]
pub(crate) struct LastAnswer {
    ms: std::sync::atomic::AtomicU64,
    window: Duration,
    /// The server's TCP address, to tell a busy server from a dead one ([`Self::reachable`]).
    addr: Option<(String, u16)>,
    /// The latest reachability probe: when it ended and what it found.
    probe: tokio::sync::Mutex<Option<(Instant, bool)>>,
}

/// How long one reachability probe's answer stands for the calls that time out after it.
const PROBE_FRESH: Duration = Duration::from_millis(100);
/// The longest a reachability probe waits for the TCP handshake.
const PROBE_TIMEOUT: Duration = Duration::from_millis(20);

/// Process-wide origin of [`LastAnswer`]'s milliseconds.
fn epoch() -> Instant {
    static EPOCH: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    *EPOCH.get_or_init(Instant::now)
}

impl LastAnswer {
    /// No answer yet; silent for longer than `window` means unresponsive. `addr` is the
    /// server's TCP address (none for a Unix socket).
    pub(crate) fn new(window: Duration, addr: Option<(String, u16)>) -> Self {
        Self {
            ms: std::sync::atomic::AtomicU64::new(0),
            window,
            addr,
            probe: tokio::sync::Mutex::new(None),
        }
    }

    /// The connection failed: the server's earlier answers say nothing about it now.
    fn forget(&self) {
        self.ms.store(0, Ordering::Relaxed);
    }

    /// Whether the server's port still accepts a TCP connection (within 20 ms). A busy or
    /// paused Redis does (the kernel completes the handshake); a killed one refuses at once,
    /// and an unreachable host does not answer. One probe serves every call that times out
    /// within 100 ms of it.
    async fn reachable(&self) -> bool {
        let Some((host, port)) = &self.addr else {
            return true;
        };
        let mut probe = self.probe.lock().await;
        if let Some((at, up)) = *probe
            && at.elapsed() < PROBE_FRESH
        {
            return up;
        }
        let up = matches!(
            tokio::time::timeout(
                PROBE_TIMEOUT,
                tokio::net::TcpStream::connect((host.as_str(), *port))
            )
            .await,
            Ok(Ok(_))
        );
        *probe = Some((Instant::now(), up));
        up
    }

    fn note(&self) {
        let ms = epoch().elapsed().as_millis() as u64 + 1;
        self.ms.fetch_max(ms, Ordering::Relaxed);
    }

    /// True when the server answered within `window` of now.
    fn alive(&self) -> bool {
        let last = self.ms.load(Ordering::Relaxed);
        last != 0
            && (epoch().elapsed().as_millis() as u64 + 1).saturating_sub(last)
                < self.window.as_millis() as u64
    }
}

impl Conn {
    /// Records that the server answered a call.
    pub(crate) fn note_answer(&self) {
        if let Conn::Single(_, last) = self {
            last.note();
        }
    }

    /// True when the server is known to be alive: it answered a call within its silence
    /// window ([`crate::RedisOptions::unresponsive_after`]), no call failed on the
    /// connection since, and its port still accepts connections. Only a standalone server can
    /// say: a Cluster's answers come from several nodes, one of which may be down.
    pub(crate) async fn answered_recently(&self) -> bool {
        match self {
            Conn::Single(_, last) => last.alive() && last.reachable().await,
            _ => false,
        }
    }

    /// Records that the connection failed (I/O error, dropped, refused).
    pub(crate) fn note_broken(&self) {
        if let Conn::Single(_, last) = self {
            last.forget();
        }
    }

    pub(crate) async fn query(&self, cmd: &redis::Cmd) -> Result<Value, RedisError> {
        match self {
            Conn::Single(c, _) => c.clone().req_packed_command(cmd).await,
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
    pub(crate) fn suspect(&self) {
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
pub(crate) struct SentinelConn {
    pub(crate) sentinel: tokio::sync::Mutex<SentinelClient>,
    pub(crate) current: std::sync::RwLock<ConnectionManager>,
    pub(crate) config: ConnectionManagerConfig,
    pub(crate) connect_timeout: Duration,
    pub(crate) busy: AtomicBool,
    pub(crate) last: std::sync::Mutex<Option<Instant>>,
}

impl SentinelConn {
    fn current(&self) -> ConnectionManager {
        self.current
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    pub(crate) async fn master(
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

/// The certificates named by `?ca=`, `?cert=` and `?key=`, read from their files.
pub(super) fn tls_certificates(
    parsed: &crate::url::ParsedUrl,
) -> Result<Option<TlsCertificates>, StoreError> {
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

pub(super) fn is_auth_error(e: &RedisError) -> bool {
    if e.kind() == ErrorKind::AuthenticationFailed {
        return true;
    }
    let s = e.to_string();
    s.contains("WRONGPASS") || s.contains("NOAUTH") || s.contains("invalid password")
}

pub(super) fn map_err(e: RedisError) -> StoreError {
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
