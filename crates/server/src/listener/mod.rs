//! Connection discipline: every listener (HTTP API, proxy, gRPC) accepts through the same budget
//! so that slow or greedy clients cannot switch the service off.
//!
//! Why it exists: a server that accepts every connection and waits forever on each one lets a
//! single client hold all of the process's descriptors (idle sockets), all of its memory
//! (unfinished request heads) or all of its tasks (bodies that never end). Then `/healthz`,
//! `/v1/check` and the gRPC port stop answering, and with them the rate limiting.
//!
//! What it does:
//! - [`budget`]: a global cap on open connections over all listeners, kept below the
//!   process's descriptor limit, plus a per-address cap (IPv4 address, IPv6 /64) that applies
//!   only under pressure, from 3/4 of the cap. At the cap, a new connection first displaces an
//!   *idle* HTTP connection (one with no request in flight: an unfinished head, or keep-alive
//!   between requests) of the heaviest address, then the longest-held idle one anywhere,
//!   which is closed gracefully; so idle sockets, from any number of addresses, cannot hold
//!   the cap or the reserve, and only connections doing work can. When every connection is
//!   busy, connections beyond the cap, up to a small reserve, are admitted for the health and
//!   admin paths only, so monitoring still sees the service while it is saturated.
//! - [`body`]: the minimum body rate, the per-address cap on bodies in progress and the write
//!   stall timeout, so trickling bodies and unread responses cannot hold the busy connections.
//! - A refused HTTP connection is answered (503 problem+json, `Retry-After`,
//!   `Connection: close`) rather than closed silently, so clients see a refusal and not a
//!   transport error; a bounded number of such answers are written at once.
//! - [`raise_nofile_limit`]: raises `RLIMIT_NOFILE`'s soft limit to the hard limit at start; the
//!   default global cap is derived from the result.
//! - [`http`]: the HTTP listeners on hyper directly, with header-read, body and idle timeouts and
//!   a bounded request head.
//! - [`grpc`]: the gRPC listener's incoming stream under the same budget, and the tonic limits.
//! - Accept errors (out of descriptors, above all) are met with a short, growing pause instead of
//!   a busy loop or an exit.

pub mod body;
pub mod budget;
pub mod grpc;
pub mod http;

use std::time::Duration;

pub use budget::{AddressGroup, Admission, ConnectionBudget, ConnectionPermit, IdleHandle};

use crate::limits::ConnectionLimits;

/// Descriptors the process keeps for itself beyond client connections: listeners, store
/// connections, the configuration watcher, log files.
pub const DESCRIPTOR_HEADROOM: u64 = 128;

/// Largest global cap derived from the descriptor limit (for an unlimited `RLIMIT_NOFILE`).
const DERIVED_CAP_CEILING: u64 = 1 << 20;

/// Raises the soft `RLIMIT_NOFILE` to the hard limit and returns the soft limit now in force.
/// On a failure the current soft limit is kept (and returned) with a warning.
pub fn raise_nofile_limit() -> u64 {
    match rlimit::increase_nofile_limit(u64::MAX) {
        Ok(n) => n,
        Err(e) => {
            let soft = rlimit::getrlimit(rlimit::Resource::NOFILE)
                .map(|(soft, _)| soft)
                .unwrap_or(1024);
            tracing::warn!(error = %e, soft, "could not raise the descriptor limit; keeping it");
            soft
        }
    }
}

/// The global connection cap for `limits` under a descriptor limit of `nofile`: the configured
/// `max_connections`, or when that is 0 the descriptor limit less the reserve and the process's
/// own headroom. Either way the cap plus the reserve stays below the descriptor limit.
pub fn effective_max_connections(limits: &ConnectionLimits, nofile: u64) -> usize {
    let nofile = nofile.min(DERIVED_CAP_CEILING + DESCRIPTOR_HEADROOM + limits.reserve as u64);
    let fits = nofile
        .saturating_sub(DESCRIPTOR_HEADROOM)
        .saturating_sub(limits.reserve as u64)
        .max(1) as usize;
    if limits.max_connections == 0 {
        fits
    } else if limits.max_connections > fits {
        tracing::warn!(
            configured = limits.max_connections,
            used = fits,
            nofile,
            "server.max_connections plus the reserve exceeds the descriptor limit; lowered"
        );
        fits
    } else {
        limits.max_connections
    }
}

/// Why a connection was refused or cut short; the `reason` label of
/// `sluice_connections_rejected_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RejectReason {
    /// The global cap and its reserve are in use.
    Global,
    /// Under pressure, the client's address holds `max_connections_per_ip` connections
    /// already.
    PerIp,
    /// Under pressure, the client's address has `max_bodies_per_ip` request bodies in
    /// progress already.
    BodiesPerIp,
    /// A request body fell below `min_body_rate` after `body_rate_grace`.
    BodyTooSlow,
    /// A response write made no progress for `write_stall_timeout`.
    WriteStall,
    /// A reserve connection asked for a path other than health, metrics or admin.
    ReserveOnly,
    /// Accepting failed (descriptors exhausted, for example).
    AcceptError,
    /// The request head did not arrive within `header_read_timeout`, or was too large.
    HeaderTimeout,
    /// The request body did not arrive within `body_timeout`.
    BodyTimeout,
    /// No request for `idle_timeout`.
    Idle,
    /// Closed while idle to make room for a new connection at the cap.
    Displaced,
}

impl RejectReason {
    /// The metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            RejectReason::Global => "global",
            RejectReason::PerIp => "per_ip",
            RejectReason::BodiesPerIp => "bodies_per_ip",
            RejectReason::BodyTooSlow => "body_too_slow",
            RejectReason::WriteStall => "write_stall",
            RejectReason::ReserveOnly => "reserve_only",
            RejectReason::AcceptError => "accept_error",
            RejectReason::HeaderTimeout => "header_timeout",
            RejectReason::BodyTimeout => "body_timeout",
            RejectReason::Idle => "idle",
            RejectReason::Displaced => "displaced",
        }
    }
}

/// Counts one refused or closed connection.
pub(crate) fn count_rejected(listener: &'static str, reason: RejectReason) {
    metrics::counter!("sluice_connections_rejected_total", "listener" => listener, "reason" => reason.as_str())
        .increment(1);
}

/// The pause after an accept error: 10 ms, doubling up to 1 s while errors continue.
#[derive(Debug)]
pub(crate) struct AcceptBackoff {
    next: Duration,
}

impl AcceptBackoff {
    const FIRST: Duration = Duration::from_millis(10);
    const MAX: Duration = Duration::from_secs(1);

    pub(crate) fn new() -> Self {
        Self { next: Self::FIRST }
    }

    /// A connection was accepted: the next error starts from the shortest pause again.
    pub(crate) fn reset(&mut self) {
        self.next = Self::FIRST;
    }

    /// How long to pause after `error`, or `None` for errors that concern only the one
    /// connection being accepted (it reset before we took it) and need no pause.
    pub(crate) fn on_error(
        &mut self,
        listener: &'static str,
        error: &std::io::Error,
    ) -> Option<Duration> {
        use std::io::ErrorKind;
        if matches!(
            error.kind(),
            ErrorKind::ConnectionAborted | ErrorKind::ConnectionReset | ErrorKind::Interrupted
        ) {
            return None;
        }
        count_rejected(listener, RejectReason::AcceptError);
        let pause = self.next;
        if pause == Self::FIRST {
            tracing::warn!(listener, error = %error, "accept failed; pausing accepts (descriptors exhausted?)");
        }
        self.next = (self.next * 2).min(Self::MAX);
        Some(pause)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn derived_cap_stays_below_the_descriptor_limit() {
        let limits = ConnectionLimits::default();
        let cap = effective_max_connections(&limits, 1024);
        assert_eq!(
            cap as u64 + limits.reserve as u64 + DESCRIPTOR_HEADROOM,
            1024
        );
        let set = ConnectionLimits {
            max_connections: 5000,
            ..limits.clone()
        };
        assert_eq!(effective_max_connections(&set, 1024), cap);
        let small = ConnectionLimits {
            max_connections: 40,
            ..limits.clone()
        };
        assert_eq!(effective_max_connections(&small, 1024), 40);
        assert_eq!(effective_max_connections(&limits, 10), 1);
        assert!(effective_max_connections(&limits, u64::MAX) as u64 <= DERIVED_CAP_CEILING);
    }

    #[test]
    fn accept_backoff_grows_and_resets() {
        let mut b = AcceptBackoff::new();
        let emfile = std::io::Error::from_raw_os_error(24);
        assert_eq!(b.on_error("http", &emfile), Some(Duration::from_millis(10)));
        assert_eq!(b.on_error("http", &emfile), Some(Duration::from_millis(20)));
        for _ in 0..10 {
            b.on_error("http", &emfile);
        }
        assert_eq!(b.on_error("http", &emfile), Some(Duration::from_secs(1)));
        let aborted = std::io::Error::from(std::io::ErrorKind::ConnectionAborted);
        assert_eq!(b.on_error("http", &aborted), None);
        b.reset();
        assert_eq!(b.on_error("http", &emfile), Some(Duration::from_millis(10)));
    }
}
