//! Connection discipline: the limits every listener enforces so that slow or greedy clients cannot
//! switch the service off.
//!
//! A rate limiter is attacked at its sockets before its policies: a client that opens thousands of
//! connections, sends headers one byte at a time or never finishes a body holds descriptors and
//! memory that the service needs for everyone else. These settings bound each of those resources.
//! They are parsed from `[server]` (see `docs/configuration.md`) and applied by the listeners.

use std::time::Duration;

/// Limits of the HTTP listeners (decision API, admin, proxy).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnectionLimits {
    /// Longest time a client may take to send a complete request head.
    pub header_read_timeout: Duration,
    /// Longest time a client may take to send a request body once its head arrived.
    pub body_timeout: Duration,
    /// How long a keep-alive connection may sit idle between requests.
    pub idle_timeout: Duration,
    /// Largest request head (request line and headers) in bytes.
    pub max_header_bytes: usize,
    /// Most connections open at once over all listeners; `0` means derived from the process's
    /// descriptor limit minus [`reserve`](Self::reserve).
    pub max_connections: usize,
    /// Most connections open at once from one client address (IPv4 address or IPv6 /64) while
    /// the listeners are under pressure, at 3/4 of `max_connections` or more (`0`: no cap).
    pub max_connections_per_ip: usize,
    /// Connections kept back from the global cap for `/healthz`, `/readyz` and `/admin/*`.
    pub reserve: usize,
    /// Slowest a request body may arrive, in bytes per second, once
    /// [`body_rate_grace`](Self::body_rate_grace) has passed (`0`: no minimum rate).
    pub min_body_rate: u64,
    /// How long a body may arrive at any pace before [`min_body_rate`](Self::min_body_rate)
    /// applies.
    pub body_rate_grace: Duration,
    /// Most request bodies in progress from one client address (IPv4 address or IPv6 /64)
    /// while the listeners are under pressure (`0`: no cap).
    pub max_bodies_per_ip: usize,
    /// Longest a response may wait for the client to read it (a write that makes no progress)
    /// before the connection is closed.
    pub write_stall_timeout: Duration,
}

impl Default for ConnectionLimits {
    fn default() -> Self {
        Self {
            header_read_timeout: Duration::from_secs(10),
            body_timeout: Duration::from_secs(30),
            idle_timeout: Duration::from_secs(60),
            max_header_bytes: 16 * 1024,
            max_connections: 0,
            max_connections_per_ip: 256,
            reserve: 64,
            min_body_rate: 1024,
            body_rate_grace: Duration::from_secs(5),
            max_bodies_per_ip: 32,
            write_stall_timeout: Duration::from_secs(5),
        }
    }
}

/// Limits of the gRPC listener (Envoy's rate limit service).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GrpcLimits {
    /// Interval of HTTP/2 keep-alive pings to idle clients.
    pub keepalive_interval: Duration,
    /// How long to wait for a keep-alive ping's answer before closing the connection.
    pub keepalive_timeout: Duration,
    /// Most concurrent streams on one connection.
    pub max_concurrent_streams: u32,
    /// Longest time one call may take.
    pub request_timeout: Duration,
    /// Threads serving the gRPC listener, each with its own single-threaded runtime;
    /// `Some(0)` serves it on the process's shared multi-threaded runtime. `None` derives it
    /// from the store: on the embedded store one per two cores (at least one), where a
    /// single-threaded runtime answers a call without waking a second worker, most of what an
    /// Envoy call cost beyond the gRPC stack; on Redis 0, since a call there waits on the
    /// store's connection tasks on the shared runtime and a hand-over between runtimes cost
    /// more than it saved (docs/benchmarks.md, "Envoy RLS, round 4").
    pub threads: Option<u32>,
}

impl Default for GrpcLimits {
    fn default() -> Self {
        Self {
            keepalive_interval: Duration::from_secs(30),
            keepalive_timeout: Duration::from_secs(10),
            max_concurrent_streams: 1024,
            request_timeout: Duration::from_secs(10),
            threads: None,
        }
    }
}
