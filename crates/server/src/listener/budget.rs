//! The connection budget shared by every listener: a global cap, a reserve for health and
//! admin, and fairness between client addresses that applies only under pressure.
//!
//! Why it is shaped this way: an app host with hundreds of pooled connections is the normal
//! client of a rate limiter, not an attacker. A fixed per-address cap closes its connections
//! while the process has thousands of descriptors to spare, and every closed connection is a
//! transport error in the app (which a careless client turns into "fail open"). So:
//! - below 3/4 of the global cap ([`PRESSURE_NUM`]/[`PRESSURE_DEN`]), an address may open
//!   any number of connections;
//! - at or above it, an address holding `per_ip` connections gets no more;
//! - at the cap, a newcomer takes the place of an *idle* connection of the heaviest address
//!   (its newest one, so the long-lived connections of a pool survive), then of the oldest
//!   idle connection anywhere; only connections doing work can hold the cap;
//! - addresses are grouped the way they are handed out: an IPv4 address, or an IPv6 /64 (one
//!   host commonly owns a whole /64, so counting single IPv6 addresses would be no cap at all).
//!
//! The bookkeeping is pure (no I/O): the listeners call [`ConnectionBudget::admit`] and keep
//! the returned permit for as long as the connection lives.
//!
//! Layout: this file admits and releases connections; `address` is the unit the per-address
//! caps count; `counts` keeps the counters and finds an idle connection to displace.

mod address;
mod counts;

use std::net::IpAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use parking_lot::Mutex;

use super::{RejectReason, effective_max_connections};
use crate::limits::ConnectionLimits;
pub use address::AddressGroup;
pub use counts::IdleHandle;
use counts::{Counts, DISPLACE_SCAN};

/// Pressure starts when the connections under the cap reach `PRESSURE_NUM / PRESSURE_DEN` of
/// it: per-address caps apply from there on.
pub const PRESSURE_NUM: usize = 3;
/// See [`PRESSURE_NUM`].
pub const PRESSURE_DEN: usize = 4;

/// How an accepted connection may be used.
#[derive(Debug)]
pub enum Admission {
    /// Any request.
    Full(ConnectionPermit),
    /// Only the listener's reserved paths (health, metrics, admin); one request per connection.
    ReserveOnly(ConnectionPermit),
    /// Not admitted: answer it (if it can be answered) and close it.
    Refused(RejectReason),
}

/// The connections open over all listeners, against the global and per-address caps. Shared
/// by the listeners of one server.
#[derive(Debug)]
pub struct ConnectionBudget {
    max: usize,
    reserve: usize,
    per_ip: usize,
    counts: Mutex<Counts>,
    bodies: super::body::BodiesInProgress,
}

impl ConnectionBudget {
    /// A budget of `max` connections plus `reserve`, at most `per_ip` from one address group
    /// under pressure (0: any), and no cap on bodies in progress.
    pub fn new(max: usize, reserve: usize, per_ip: usize) -> Arc<Self> {
        Self::with_body_cap(max, reserve, per_ip, 0)
    }

    /// [`new`](Self::new), with at most `bodies_per_ip` request bodies in progress from one
    /// address group under pressure (0: any).
    pub fn with_body_cap(
        max: usize,
        reserve: usize,
        per_ip: usize,
        bodies_per_ip: usize,
    ) -> Arc<Self> {
        Arc::new(Self {
            max: max.max(1),
            reserve,
            per_ip,
            counts: Mutex::new(Counts::default()),
            bodies: super::body::BodiesInProgress::new(bodies_per_ip),
        })
    }

    /// The budget for `limits` under the descriptor limit `nofile`.
    pub fn for_limits(limits: &ConnectionLimits, nofile: u64) -> Arc<Self> {
        Self::with_body_cap(
            effective_max_connections(limits, nofile),
            limits.reserve,
            limits.max_connections_per_ip,
            limits.max_bodies_per_ip,
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

    /// Whether the connections under the cap have reached 3/4 of it: per-address caps apply.
    pub fn under_pressure(&self) -> bool {
        let live = self.counts.lock().live_full();
        live * PRESSURE_DEN >= self.max * PRESSURE_NUM
    }

    /// The request bodies in progress, by address group.
    pub(crate) fn bodies(&self) -> &super::body::BodiesInProgress {
        &self.bodies
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
        let group = AddressGroup::of(ip);
        let mut counts = self.counts.lock();
        let pressure = counts.live_full() * PRESSURE_DEN >= self.max * PRESSURE_NUM;
        if self.per_ip > 0 && pressure && counts.open_of(group) >= self.per_ip {
            return Admission::Refused(RejectReason::PerIp);
        }
        // Slots of displaced connections still closing are free already.
        let reserve_only = if counts.live_full() < self.max
            || counts.displace_from_heaviest(group)
            || counts.displace_oldest(false)
        {
            false
        } else if uses_reserve
            && (counts.reserve.saturating_sub(counts.displacing_reserve) < self.reserve
                || counts.displace_oldest(true))
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
        counts.add_open(group, true);
        let idle = displaceable.then(|| {
            let handle = Arc::new(IdleHandle::new(reserve_only));
            // Entries of closed connections go when a list has grown well past the open
            // connections: amortised O(1) per admission, bounded memory.
            let open = counts.full + counts.reserve;
            if counts.displaceable.len() > 2 * open + DISPLACE_SCAN {
                counts.displaceable.retain(|w| w.strong_count() > 0);
            }
            counts.displaceable.push_back(Arc::downgrade(&handle));
            if !reserve_only && let Some(entry) = counts.by_address.get_mut(&group) {
                if entry.displaceable.len() > 2 * entry.open + 8 {
                    entry.displaceable.retain(|w| w.strong_count() > 0);
                }
                entry.displaceable.push_back(Arc::downgrade(&handle));
            }
            handle
        });
        drop(counts);
        metrics::gauge!("sluice_connections_open", "listener" => listener).increment(1.0);
        let permit = ConnectionPermit {
            budget: Arc::clone(self),
            listener,
            group,
            reserve_only,
            idle,
        };
        if reserve_only {
            Admission::ReserveOnly(permit)
        } else {
            Admission::Full(permit)
        }
    }

    fn release(&self, group: AddressGroup, reserve_only: bool, displaced: bool) {
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
        counts.add_open(group, false);
    }
}

/// One open connection's place in the budget, given back on drop.
#[derive(Debug)]
pub struct ConnectionPermit {
    budget: Arc<ConnectionBudget>,
    listener: &'static str,
    group: AddressGroup,
    reserve_only: bool,
    idle: Option<Arc<IdleHandle>>,
}

impl ConnectionPermit {
    /// The handle of a displaceable connection.
    pub fn idle_handle(&self) -> Option<&Arc<IdleHandle>> {
        self.idle.as_ref()
    }

    /// The address group the connection counts against.
    pub fn group(&self) -> AddressGroup {
        self.group
    }
}

impl Drop for ConnectionPermit {
    fn drop(&mut self) {
        let displaced = self
            .idle
            .as_ref()
            .is_some_and(|h| h.displaced.load(Ordering::Acquire));
        self.budget
            .release(self.group, self.reserve_only, displaced);
        metrics::gauge!("sluice_connections_open", "listener" => self.listener).decrement(1.0);
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn full(a: Admission) -> ConnectionPermit {
        match a {
            Admission::Full(p) => p,
            other => panic!("expected a full admission, got {other:?}"),
        }
    }

    /// Whether `permit`'s connection was told to close (without waiting).
    fn told_to_close(permit: &ConnectionPermit) -> bool {
        permit
            .idle_handle()
            .unwrap()
            .displaced
            .load(Ordering::Acquire)
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
        let idle = full(b.admit("http", ip("127.0.0.2"), true, true));
        let busy = full(b.admit("http", ip("127.0.0.3"), true, true));
        busy.idle_handle().unwrap().request_started();
        // At the cap: the idle one makes room, so the newcomer gets a full connection.
        let newcomer = full(b.admit("http", ip("127.0.0.1"), true, true));
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
    fn the_lists_of_displaceable_connections_stay_bounded() {
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
        let counts = b.counts.lock();
        assert!(
            counts.displaceable.len() <= 2 * DISPLACE_SCAN + 1,
            "{} entries kept for 0 open connections",
            counts.displaceable.len()
        );
        assert!(counts.by_address.is_empty() && counts.by_load.is_empty());
    }

    /// The finding: one app host with 300 pooled connections lost 10 % of its requests to a
    /// fixed per-address cap of 256 while the process had 19,808 connections to spare.
    #[test]
    fn the_per_address_cap_applies_only_under_pressure() {
        let b = ConnectionBudget::new(100, 0, 2);
        let host: Vec<_> = (0..60)
            .map(|_| full(b.admit("http", ip("10.0.0.1"), true, false)))
            .collect();
        assert!(!b.under_pressure());
        // Others fill the cap to 3/4: now the busy host gets no more, a new address still does.
        let others: Vec<_> = (0..15)
            .map(|i| full(b.admit("http", ip(&format!("10.0.1.{i}")), true, false)))
            .collect();
        assert!(b.under_pressure());
        assert!(matches!(
            b.admit("http", ip("10.0.0.1"), true, false),
            Admission::Refused(RejectReason::PerIp)
        ));
        assert!(matches!(
            b.admit("grpc", ip("::ffff:10.0.0.1"), true, false),
            Admission::Refused(RejectReason::PerIp)
        ));
        let light = full(b.admit("http", ip("10.0.2.1"), true, false));
        drop((others, light));
        assert!(!b.under_pressure());
        assert!(matches!(
            b.admit("http", ip("10.0.0.1"), true, false),
            Admission::Full(_)
        ));
        drop(host);
    }

    #[test]
    fn ipv6_addresses_count_per_64() {
        assert_eq!(
            AddressGroup::of(ip("2001:db8:1:2::1")),
            AddressGroup::of(ip("2001:db8:1:2:ffff:ffff:ffff:ffff"))
        );
        assert_ne!(
            AddressGroup::of(ip("2001:db8:1:2::1")),
            AddressGroup::of(ip("2001:db8:1:3::1"))
        );
        assert_eq!(
            AddressGroup::of(ip("::ffff:192.0.2.7")),
            AddressGroup::V4("192.0.2.7".parse().unwrap())
        );
        // Under pressure, a /64 is one client however many addresses it uses.
        let b = ConnectionBudget::new(4, 0, 2);
        let _filler = full(b.admit("http", ip("192.0.2.1"), true, false));
        let _a = full(b.admit("http", ip("2001:db8:1:2::1"), true, false));
        let _b = full(b.admit("http", ip("2001:db8:1:2::2"), true, false));
        assert!(b.under_pressure());
        assert!(matches!(
            b.admit("http", ip("2001:db8:1:2::3"), true, false),
            Admission::Refused(RejectReason::PerIp)
        ));
        assert!(matches!(
            b.admit("http", ip("2001:db8:1:3::1"), true, false),
            Admission::Full(_)
        ));
    }

    #[test]
    fn at_the_cap_the_heaviest_address_gives_up_its_newest_idle_connection() {
        let b = ConnectionBudget::new(6, 0, 0);
        let heavy: Vec<_> = (0..4)
            .map(|_| full(b.admit("http", ip("10.0.0.1"), true, true)))
            .collect();
        let light_old = full(b.admit("http", ip("10.0.0.2"), true, true));
        let light = full(b.admit("http", ip("10.0.0.3"), true, true));
        // The heavy address's newest connection is busy: its newest idle one goes.
        heavy[3].idle_handle().unwrap().request_started();
        let newcomer = full(b.admit("http", ip("10.0.0.4"), true, true));
        assert!(
            told_to_close(&heavy[2]),
            "the heavy address's newest idle one"
        );
        for p in [&heavy[0], &heavy[1], &heavy[3], &light_old, &light] {
            assert!(!told_to_close(p));
        }
        drop((newcomer, light));
    }
}
