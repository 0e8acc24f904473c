//! Connection discipline: every listener (HTTP API, proxy, gRPC) accepts through the same budget
//! so that slow or greedy clients cannot switch the service off.
//!
//! Why it exists: a server that accepts every connection and waits forever on each one lets a
//! single client hold all of the process's descriptors (idle sockets), all of its memory
//! (unfinished request heads) or all of its tasks (bodies that never end). Then `/healthz`,
//! `/v1/check` and the gRPC port stop answering, and with them the rate limiting.
//!
//! What it does:
//! - [`ConnectionBudget`]: a global cap on open connections over all listeners, kept below the
//!   process's descriptor limit, plus a per-client-IP cap. At the cap, a new connection first
//!   displaces the longest-held *idle* HTTP connection (one with no request in flight: an
//!   unfinished head, or keep-alive between requests), which is closed gracefully; so idle
//!   sockets, from any number of addresses, cannot hold the cap or the reserve, and only
//!   connections doing work can. When every connection is busy, connections beyond the cap,
//!   up to a small reserve, are admitted for the health and admin paths only, so monitoring
//!   still sees the service while it is saturated.
//! - [`raise_nofile_limit`]: raises `RLIMIT_NOFILE`'s soft limit to the hard limit at start; the
//!   default global cap is derived from the result.
//! - [`http`]: the HTTP listeners on hyper directly, with header-read, body and idle timeouts and
//!   a bounded request head.
//! - [`grpc`]: the gRPC listener's incoming stream under the same budget, and the tonic limits.
//! - Accept errors (out of descriptors, above all) are met with a short, growing pause instead of
//!   a busy loop or an exit.

pub mod grpc;
pub mod http;

use std::collections::{HashMap, VecDeque};
use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use parking_lot::Mutex;

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
    /// The client's IP address holds `max_connections_per_ip` connections already.
    PerIp,
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

/// How an accepted connection may be used.
#[derive(Debug)]
pub enum Admission {
    /// Any request.
    Full(ConnectionPermit),
    /// Only the listener's reserved paths (health, metrics, admin); one request per connection.
    ReserveOnly(ConnectionPermit),
    /// Close it at once.
    Refused(RejectReason),
}

#[derive(Debug, Default)]
struct Counts {
    /// Open connections admitted under the cap, and into the reserve.
    full: usize,
    reserve: usize,
    by_ip: HashMap<IpAddr, usize>,
    /// Displaceable connections, oldest first (entries of closed ones are dropped lazily).
    displaceable: VecDeque<Weak<IdleHandle>>,
    /// Connections told to close to make room, not yet closed, under the cap and in the
    /// reserve: their slots are spoken for.
    displacing_full: usize,
    displacing_reserve: usize,
}

/// Most entries one admission looks at when it seeks an idle connection to displace, so an
/// accept costs a bounded time even with thousands of busy connections.
const DISPLACE_SCAN: usize = 64;

/// How a connection that can be displaced tells the budget whether it is idle, and how the
/// budget tells it to close.
#[derive(Debug, Default)]
pub struct IdleHandle {
    in_flight: AtomicUsize,
    displaced: AtomicBool,
    close: tokio::sync::Notify,
    /// Admitted into the reserve: it only makes room for another reserve connection.
    reserve_only: bool,
}

impl IdleHandle {
    /// A request started on the connection.
    pub fn request_started(&self) {
        self.in_flight.fetch_add(1, Ordering::AcqRel);
    }

    /// A request (its response included) ended.
    pub fn request_ended(&self) {
        self.in_flight.fetch_sub(1, Ordering::AcqRel);
    }

    /// Resolves when the budget displaced this connection: close it gracefully.
    pub async fn displaced(&self) {
        self.close.notified().await;
    }

    fn is_idle(&self) -> bool {
        self.in_flight.load(Ordering::Acquire) == 0
    }
}

impl Counts {
    /// Tells the longest-held idle connection of the cap (`reserve_only == false`) or of the
    /// reserve to close; false when none of the first [`DISPLACE_SCAN`] candidates is one.
    fn displace_one(&mut self, reserve_only: bool) -> bool {
        for _ in 0..DISPLACE_SCAN.min(self.displaceable.len()) {
            let Some(weak) = self.displaceable.pop_front() else {
                break;
            };
            let Some(handle) = weak.upgrade() else {
                continue;
            };
            if handle.displaced.load(Ordering::Acquire) {
                continue;
            }
            if handle.reserve_only == reserve_only && handle.is_idle() {
                handle.displaced.store(true, Ordering::Release);
                handle.close.notify_one();
                if reserve_only {
                    self.displacing_reserve += 1;
                } else {
                    self.displacing_full += 1;
                }
                return true;
            }
            // Busy now, or of the other pool: it may be a candidate for a later admission.
            self.displaceable.push_back(weak);
        }
        false
    }
}

/// The connections open over all listeners, against the global and per-IP caps. Shared by the
/// listeners of one server.
#[derive(Debug)]
pub struct ConnectionBudget {
    max: usize,
    reserve: usize,
    per_ip: usize,
    counts: Mutex<Counts>,
}

impl ConnectionBudget {
    /// A budget of `max` connections plus `reserve`, at most `per_ip` from one address (0: any).
    pub fn new(max: usize, reserve: usize, per_ip: usize) -> Arc<Self> {
        Arc::new(Self {
            max: max.max(1),
            reserve,
            per_ip,
            counts: Mutex::new(Counts::default()),
        })
    }

    /// The budget for `limits` under the descriptor limit `nofile`.
    pub fn for_limits(limits: &ConnectionLimits, nofile: u64) -> Arc<Self> {
        Self::new(
            effective_max_connections(limits, nofile),
            limits.reserve,
            limits.max_connections_per_ip,
        )
    }

    /// The global cap (without the reserve).
    pub fn max_connections(&self) -> usize {
        self.max
    }

    /// Connections open now over all listeners.
    pub fn open(&self) -> usize {
        let counts = self.counts.lock();
        counts.full + counts.reserve
    }

    /// Admits a connection from `ip` on `listener`. A listener with no reserved paths
    /// (`uses_reserve == false`) is refused beyond the global cap instead of entering the
    /// reserve. A `displaceable` connection reports its requests through the permit's
    /// [`IdleHandle`] and closes when told, so that a later connection can take its place
    /// while it is idle.
    pub fn admit(
        self: &Arc<Self>,
        listener: &'static str,
        ip: IpAddr,
        uses_reserve: bool,
        displaceable: bool,
    ) -> Admission {
        let ip = canonical(ip);
        let mut counts = self.counts.lock();
        let from_ip = counts.by_ip.get(&ip).copied().unwrap_or(0);
        if self.per_ip > 0 && from_ip >= self.per_ip {
            return Admission::Refused(RejectReason::PerIp);
        }
        // Slots of displaced connections still closing are free already.
        let reserve_only = if counts.full.saturating_sub(counts.displacing_full) < self.max
            || counts.displace_one(false)
        {
            false
        } else if uses_reserve
            && (counts.reserve.saturating_sub(counts.displacing_reserve) < self.reserve
                || counts.displace_one(true))
        {
            true
        } else {
            return Admission::Refused(RejectReason::Global);
        };
        if reserve_only {
            counts.reserve += 1;
        } else {
            counts.full += 1;
        }
        *counts.by_ip.entry(ip).or_insert(0) += 1;
        let idle = displaceable.then(|| {
            let handle = Arc::new(IdleHandle {
                reserve_only,
                ..IdleHandle::default()
            });
            // Entries of closed connections go when the list has grown well past the open
            // connections: amortised O(1) per admission, bounded memory.
            if counts.displaceable.len() > 2 * (counts.full + counts.reserve) + DISPLACE_SCAN {
                counts.displaceable.retain(|w| w.strong_count() > 0);
            }
            counts.displaceable.push_back(Arc::downgrade(&handle));
            handle
        });
        drop(counts);
        metrics::gauge!("sluice_connections_open", "listener" => listener).increment(1.0);
        let permit = ConnectionPermit {
            budget: Arc::clone(self),
            listener,
            ip,
            reserve_only,
            idle,
        };
        if reserve_only {
            Admission::ReserveOnly(permit)
        } else {
            Admission::Full(permit)
        }
    }

    fn release(&self, ip: IpAddr, reserve_only: bool, displaced: bool) {
        let mut guard = self.counts.lock();
        let counts = &mut *guard;
        let (open, displacing) = if reserve_only {
            (&mut counts.reserve, &mut counts.displacing_reserve)
        } else {
            (&mut counts.full, &mut counts.displacing_full)
        };
        *open = open.saturating_sub(1);
        if displaced {
            *displacing = displacing.saturating_sub(1);
        }
        if let Some(n) = counts.by_ip.get_mut(&ip) {
            *n -= 1;
            if *n == 0 {
                counts.by_ip.remove(&ip);
            }
        }
    }
}

/// An IPv4 client seen through an IPv6 socket counts as its IPv4 address.
fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        IpAddr::V4(_) => ip,
    }
}

/// One open connection's place in the budget, given back on drop.
#[derive(Debug)]
pub struct ConnectionPermit {
    budget: Arc<ConnectionBudget>,
    listener: &'static str,
    ip: IpAddr,
    reserve_only: bool,
    idle: Option<Arc<IdleHandle>>,
}

impl ConnectionPermit {
    /// The handle of a displaceable connection.
    pub fn idle_handle(&self) -> Option<&Arc<IdleHandle>> {
        self.idle.as_ref()
    }
}

impl Drop for ConnectionPermit {
    fn drop(&mut self) {
        let displaced = self
            .idle
            .as_ref()
            .is_some_and(|h| h.displaced.load(Ordering::Acquire));
        self.budget.release(self.ip, self.reserve_only, displaced);
        metrics::gauge!("sluice_connections_open", "listener" => self.listener).decrement(1.0);
    }
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

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn the_reserve_opens_after_the_cap_and_closes_after_it() {
        let b = ConnectionBudget::new(2, 1, 0);
        let a1 = b.admit("http", ip("127.0.0.1"), true, false);
        let a2 = b.admit("http", ip("127.0.0.2"), true, false);
        assert!(matches!(a1, Admission::Full(_)) && matches!(a2, Admission::Full(_)));
        assert!(matches!(
            b.admit("proxy", ip("127.0.0.3"), false, false),
            Admission::Refused(RejectReason::Global)
        ));
        let r = b.admit("http", ip("127.0.0.3"), true, false);
        assert!(matches!(r, Admission::ReserveOnly(_)));
        assert!(matches!(
            b.admit("http", ip("127.0.0.4"), true, false),
            Admission::Refused(RejectReason::Global)
        ));
        assert_eq!(b.open(), 3);
        drop((a1, r));
        assert_eq!(b.open(), 1);
        assert!(matches!(
            b.admit("http", ip("127.0.0.4"), true, false),
            Admission::Full(_)
        ));
    }

    #[test]
    fn at_the_cap_an_idle_connection_is_displaced_and_a_busy_one_is_not() {
        let b = ConnectionBudget::new(2, 1, 0);
        let idle = b.admit("http", ip("127.0.0.2"), true, true);
        let busy = b.admit("http", ip("127.0.0.3"), true, true);
        let (Admission::Full(idle), Admission::Full(busy)) = (idle, busy) else {
            panic!("both fit under the cap");
        };
        busy.idle_handle().unwrap().request_started();
        // At the cap: the idle one makes room, so the newcomer gets a full connection.
        let newcomer = b.admit("http", ip("127.0.0.1"), true, true);
        assert!(matches!(newcomer, Admission::Full(_)));
        let handle = Arc::clone(idle.idle_handle().unwrap());
        let told = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap()
            .block_on(async {
                tokio::time::timeout(Duration::from_secs(1), handle.displaced())
                    .await
                    .is_ok()
            });
        assert!(told, "the idle connection is told to close");
        // Nothing idle is left (the displaced one is closing, the other two are busy or new
        // with a request): the next one only gets the reserve, then nothing.
        let Admission::Full(newcomer) = newcomer else {
            unreachable!()
        };
        newcomer.idle_handle().unwrap().request_started();
        let reserve = b.admit("http", ip("127.0.0.4"), true, false);
        assert!(matches!(reserve, Admission::ReserveOnly(_)));
        assert!(matches!(
            b.admit("http", ip("127.0.0.5"), true, false),
            Admission::Refused(RejectReason::Global)
        ));
        // The displaced connection closes: its slot was already counted as free.
        drop(idle);
        assert_eq!(b.open(), 3);
        assert!(matches!(
            b.admit("http", ip("127.0.0.5"), true, false),
            Admission::Refused(RejectReason::Global)
        ));
        // A busy connection that goes idle can be displaced in turn.
        busy.idle_handle().unwrap().request_ended();
        assert!(matches!(
            b.admit("http", ip("127.0.0.5"), true, false),
            Admission::Full(_)
        ));
    }

    #[test]
    fn the_list_of_displaceable_connections_stays_bounded() {
        let b = ConnectionBudget::new(1_000, 0, 0);
        for i in 0..10_000u32 {
            let a = b.admit(
                "http",
                ip(&format!("10.0.{}.{}", i / 250, i % 250)),
                true,
                true,
            );
            drop(a);
        }
        let len = b.counts.lock().displaceable.len();
        assert!(
            len <= 2 * DISPLACE_SCAN + 1,
            "{len} entries kept for 0 open connections"
        );
    }

    #[test]
    fn per_ip_cap_counts_each_address_and_mapped_v4_as_v4() {
        let b = ConnectionBudget::new(100, 0, 2);
        let held: Vec<_> = (0..2)
            .map(|_| b.admit("http", ip("10.0.0.1"), true, false))
            .collect();
        assert!(held.iter().all(|a| matches!(a, Admission::Full(_))));
        assert!(matches!(
            b.admit("grpc", ip("::ffff:10.0.0.1"), true, false),
            Admission::Refused(RejectReason::PerIp)
        ));
        assert!(matches!(
            b.admit("http", ip("10.0.0.2"), true, false),
            Admission::Full(_)
        ));
        drop(held);
        assert!(matches!(
            b.admit("http", ip("10.0.0.1"), true, false),
            Admission::Full(_)
        ));
    }

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
