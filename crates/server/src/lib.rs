//! `sluice serve`: the limiter as a standalone service, for stacks that do not link Rust.
//!
//! One process, three listeners, one configuration file:
//! - **HTTP** (default `127.0.0.1:8080`): the decision API (`POST /v1/check`, `POST
//!   /v1/release`, `/openapi.json`) for applications in any language, plus `/metrics`,
//!   `/healthz`, `/readyz` and `/admin/reload`.
//! - **gRPC** (default `127.0.0.1:8081`): Envoy's rate limit service and `grpc.health.v1`.
//! - **Reverse proxy** (default `127.0.0.1:8082`, opened only when routes are configured):
//!   sluice in front of an upstream, enforcing route policies with the `sluice-http` layer.
//!
//! The store is the embedded one unless the file names Redis, Valkey or a Cluster.
//!
//! # Layout
//! - [`config`] (the `sluice-config` crate, shared with the Python and Node packages): the TOML
//!   file, checked with `FILE:LINE: field: message` errors; [`envoy`] and [`limits`] live there too.
//! - [`state`]: the running configuration and limiter, swapped whole on reload; metrics.
//! - [`stats`]: live statistics for the console, `/v1/stats` and `sluice top` (heavy
//!   hitters, per-policy counters of the last minutes, store latency).
//! - [`api`]: the HTTP listener (decision API, health, metrics, admin).
//! - [`rls`]: the Envoy `ShouldRateLimit` gRPC service.
//! - [`proxy`]: the reverse proxy.
//! - [`listener`] (with [`limits`]): connection discipline on every listener (timeouts, head size,
//!   global and per-IP connection caps with a reserve for health and admin).
//! - [`telemetry`]: OpenTelemetry traces of decisions, exported over OTLP/gRPC.
//! - [`reload`]: SIGHUP, file watching, `/admin/reload`.
//! - `ui`: the operator console at `/ui`, its assets compiled in.
//! - [`cli`]: `sluice serve` and `sluice validate` arguments and entry points.
#![forbid(unsafe_code)]

pub mod api;
pub mod cli;
pub mod listener;
pub mod proxy;
pub mod reload;
pub mod rls;
pub mod state;
pub mod stats;
pub mod telemetry;
pub mod testing;
mod ui;

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;

use tokio::net::TcpListener;

/// The configuration file, read by [`sluice_config`] (shared with the Python and Node packages).
pub use sluice_config as config;
pub use sluice_config::{Config, ConfigError, ConfigErrors, envoy, limits};
pub use state::Shared;

/// Why the server could not start or stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// The configuration file has errors (each as `FILE:LINE: field: message`).
    #[error("{0}")]
    Config(#[from] ConfigErrors),
    /// The store could not be set up.
    #[error("store: {0}")]
    Store(#[from] sluice::StoreError),
    /// A listener could not be bound or failed.
    #[error("{what}: {source}")]
    Io {
        /// Which listener or operation.
        what: String,
        /// The error.
        #[source]
        source: std::io::Error,
    },
    /// The gRPC server failed.
    #[error("grpc: {0}")]
    Grpc(#[from] tonic::transport::Error),
}

/// The bound listeners. Bind them first (port 0 picks a free port), read the addresses, then
/// hand them to [`run`].
#[derive(Debug)]
pub struct Listeners {
    /// Decision API, metrics, health.
    pub http: TcpListener,
    /// Envoy rate limit service.
    pub grpc: TcpListener,
    /// Reverse proxy (only when routes are configured).
    pub proxy: Option<TcpListener>,
    /// Operator endpoints (`/metrics`, `/admin/*`, health) on their own address, when
    /// `server.admin` is set; the HTTP listener then serves neither `/metrics` nor `/admin/*`.
    pub admin: Option<TcpListener>,
}

/// The addresses the listeners are bound to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BoundAddrs {
    /// HTTP listener.
    pub http: SocketAddr,
    /// gRPC listener.
    pub grpc: SocketAddr,
    /// Proxy listener, when open.
    pub proxy: Option<SocketAddr>,
    /// Admin listener, when `server.admin` is set.
    pub admin: Option<SocketAddr>,
}

async fn bind(addr: SocketAddr, what: &str) -> Result<TcpListener, ServeError> {
    TcpListener::bind(addr)
        .await
        .map_err(|source| ServeError::Io {
            what: format!("binding the {what} listener to {addr}"),
            source,
        })
}

impl Listeners {
    /// Binds the addresses of `config` (the proxy only when it has routes).
    pub async fn bind(config: &Config) -> Result<Self, ServeError> {
        let http = bind(config.server.http, "HTTP").await?;
        let grpc = bind(config.server.grpc, "gRPC").await?;
        let proxy = if config.routes.is_empty() {
            None
        } else {
            Some(bind(config.server.proxy, "proxy").await?)
        };
        let admin = match config.server.admin {
            Some(addr) => Some(bind(addr, "admin").await?),
            None => None,
        };
        Ok(Self {
            http,
            grpc,
            proxy,
            admin,
        })
    }

    /// The bound addresses.
    pub fn addrs(&self) -> BoundAddrs {
        let addr = |l: &TcpListener| l.local_addr().expect("bound listener has an address");
        BoundAddrs {
            http: addr(&self.http),
            grpc: addr(&self.grpc),
            proxy: self.proxy.as_ref().map(addr),
            admin: self.admin.as_ref().map(addr),
        }
    }
}

/// Runs the service until `shutdown` resolves, then stops accepting, lets requests in flight
/// finish (up to `server.shutdown_grace`) and returns.
pub async fn run(
    config: Config,
    listeners: Listeners,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), ServeError> {
    let limits = listener_limits(&config);
    let limiter = state::build_limiter(&config).await?;
    let grace = config.server.shutdown_grace;
    let shared = Shared::new(config, limiter);
    run_shared(shared, listeners, limits, shutdown, grace).await
}

async fn run_shared(
    shared: Shared,
    listeners: Listeners,
    (conn_limits, grpc_limits): (limits::ConnectionLimits, limits::GrpcLimits),
    shutdown: impl Future<Output = ()> + Send,
    grace: std::time::Duration,
) -> Result<(), ServeError> {
    let addrs = listeners.addrs();
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let stopped = move || {
        let mut rx = stop_rx.clone();
        async move {
            let _ = rx.wait_for(|s| *s).await;
        }
    };

    // Connection discipline: one budget over all listeners, below the descriptor limit.
    let nofile = listener::raise_nofile_limit();
    let budget = listener::ConnectionBudget::for_limits(&conn_limits, nofile);

    // gRPC: Envoy's rate limit service and health.
    let (health, health_service) = tonic_health::server::health_reporter();
    health.set_serving::<envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::RateLimitServiceServer<rls::RlsService>>().await;
    let grpc_router = listener::grpc::server_builder(&grpc_limits)
        .layer(listener::grpc::ReserveGateLayer)
        .add_service(health_service)
        .add_service(rls::RlsService::new(shared.clone()).server());
    let grpc_budget = Arc::clone(&budget);
    let grpc_stopped = stopped.clone();
    let grpc = listener::grpc::serve_on_threads(
        listener::grpc::thread_count(
            &grpc_limits,
            shared.runtime().config.store.url.trim() == "memory",
        ),
        listeners.grpc,
        move |socket| {
            grpc_router.clone().serve_with_incoming_shutdown(
                listener::grpc::incoming(socket, Arc::clone(&grpc_budget)),
                grpc_stopped(),
            )
        },
    );
    let separate_admin = listeners.admin.is_some();
    let http = listener::http::serve(
        listener::http::HttpListener {
            name: "http",
            socket: listeners.http,
            router: if separate_admin {
                api::decision_router(shared.clone())
            } else {
                api::router(shared.clone())
            },
            limits: conn_limits.clone(),
            reserved: Some(listener::http::api_reserved_paths),
            budget: Arc::clone(&budget),
        },
        stopped(),
    );
    let proxy = async {
        match listeners.proxy {
            Some(socket) => {
                let l = listener::http::HttpListener {
                    name: "proxy",
                    socket,
                    router: proxy::router(shared.clone()),
                    limits: conn_limits.clone(),
                    reserved: None,
                    budget: Arc::clone(&budget),
                };
                listener::http::serve(l, stopped()).await
            }
            None => Ok(()),
        }
    };
    let admin = async {
        match listeners.admin {
            Some(socket) => {
                let l = listener::http::HttpListener {
                    name: "admin",
                    socket,
                    router: api::admin_router(shared.clone()),
                    limits: conn_limits.clone(),
                    reserved: Some(listener::http::api_reserved_paths),
                    budget: Arc::clone(&budget),
                };
                listener::http::serve(l, stopped()).await
            }
            None => Ok(()),
        }
    };
    let watcher = reload::watch(shared.clone(), stopped());

    let proxy_addr = addrs
        .proxy
        .map_or_else(|| "off".to_owned(), |a| a.to_string());
    let admin_addr = addrs
        .admin
        .map_or_else(|| "on the HTTP listener".to_owned(), |a| a.to_string());
    for warning in startup_warnings(shared.runtime().config.as_ref()) {
        tracing::warn!("{warning}");
    }
    tracing::info!(
        http = %addrs.http,
        grpc = %addrs.grpc,
        proxy = %proxy_addr,
        admin = %admin_addr,
        store = shared.runtime().limiter.store().kind(),
        max_connections = budget.max_connections(),
        nofile,
        "sluice serving"
    );
    let servers = async {
        let (g, h, p, a, ()) = tokio::join!(grpc, http, proxy, admin, watcher);
        g?;
        h.map_err(|source| ServeError::Io {
            what: "HTTP listener".into(),
            source,
        })?;
        p.map_err(|source| ServeError::Io {
            what: "proxy listener".into(),
            source,
        })?;
        a.map_err(|source| ServeError::Io {
            what: "admin listener".into(),
            source,
        })?;
        Ok::<(), ServeError>(())
    };
    tokio::pin!(servers);
    tokio::select! {
        r = &mut servers => return r,
        () = shutdown => {
            tracing::info!("shutting down: no new connections, finishing requests in flight");
            health.set_not_serving::<envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::RateLimitServiceServer<rls::RlsService>>().await;
            let _ = stop_tx.send(true);
        }
    }
    let served = match tokio::time::timeout(grace, &mut servers).await {
        Ok(r) => r,
        Err(_) => {
            tracing::warn!("requests still in flight after {grace:?}; stopping anyway");
            Ok(())
        }
    };
    // Units held in leased slices (`mode = "leased"`) go back to the store.
    let limiter = shared.runtime().limiter.clone();
    let _ = tokio::time::timeout(grace, limiter.shutdown()).await;
    // Trace spans still queued go to the collector (`[telemetry]`).
    shared.telemetry().shutdown(grace).await;
    served
}

/// The connection and gRPC limits of `config` (`[server]`).
fn listener_limits(config: &Config) -> (limits::ConnectionLimits, limits::GrpcLimits) {
    (
        config.server.connections.clone(),
        config.server.grpc_limits.clone(),
    )
}

/// What an operator should hear about at start, though the configuration is valid: settings
/// that work on one machine but weaken the protection of a shared deployment.
pub fn startup_warnings(config: &Config) -> Vec<String> {
    let mut out = config.exposure_warnings();
    let shared_store = config.store.url.trim() != "memory";
    if shared_store && config.identity_hash_key == sluice::core::key::default_hash_key() {
        out.push(
            "identity_hash_key is not set: credentials are hashed with the built-in key, which \
             is public, so anyone who can read the shared store can test guessed API keys \
             against its key names; set identity_hash_key (such as \"env:SLUICE_IDENTITY_HASH_KEY\", \
             64 hex digits) to the same secret on every instance"
                .to_owned(),
        );
    }
    out
}

/// Resolves on SIGTERM or ctrl-c.
pub async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {},
        () = term => {},
    }
}
