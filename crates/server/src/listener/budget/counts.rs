//! The bookkeeping behind [`ConnectionBudget`](super::ConnectionBudget): open connections
//! by address group and by load, and the search for an idle connection to displace at the
//! cap. Kept apart from admission so the displacement rules (the heaviest address's newest
//! idle connection first, then the oldest idle one anywhere, each search bounded) read on
//! their own. Pure: no I/O, only counters and weak handles.

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::sync::Weak;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use super::AddressGroup;

/// Most entries one admission looks at when it seeks an idle connection to displace, so an
/// accept costs a bounded time even with thousands of busy connections.
pub(super) const DISPLACE_SCAN: usize = 64;

/// Most addresses, heaviest first, searched for an idle connection to displace.
pub(super) const HEAVIEST_SCAN: usize = 8;

/// How a connection that can be displaced tells the budget whether it is idle, and how the
/// budget tells it to close.
#[derive(Debug, Default)]
pub struct IdleHandle {
    in_flight: AtomicUsize,
    pub(super) displaced: AtomicBool,
    close: tokio::sync::Notify,
    /// Admitted into the reserve: it only makes room for another reserve connection.
    pub(super) reserve_only: bool,
}

impl IdleHandle {
    /// The handle of a connection admitted under the cap, or into the reserve.
    pub(super) fn new(reserve_only: bool) -> Self {
        Self {
            reserve_only,
            ..Self::default()
        }
    }

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

    /// Whether this live connection can make room in the cap (`reserve_only == false`) or in
    /// the reserve.
    fn can_make_room(&self, reserve_only: bool) -> bool {
        self.reserve_only == reserve_only
            && self.is_idle()
            && !self.displaced.load(Ordering::Acquire)
    }
}

/// One address group's open connections and its displaceable ones, newest last.
#[derive(Debug, Default)]
pub(super) struct AddressEntry {
    pub(super) open: usize,
    pub(super) displaceable: VecDeque<Weak<IdleHandle>>,
}

#[derive(Debug, Default)]
pub(super) struct Counts {
    /// Open connections admitted under the cap, and into the reserve.
    pub(super) full: usize,
    pub(super) reserve: usize,
    pub(super) by_address: HashMap<AddressGroup, AddressEntry>,
    /// `(open, group)` for every group with open connections: the heaviest is last.
    pub(super) by_load: BTreeSet<(usize, AddressGroup)>,
    /// Displaceable connections, oldest first (entries of closed ones are dropped lazily).
    pub(super) displaceable: VecDeque<Weak<IdleHandle>>,
    /// Connections told to close to make room, not yet closed, under the cap and in the
    /// reserve: their slots are spoken for.
    pub(super) displacing_full: usize,
    pub(super) displacing_reserve: usize,
}

impl Counts {
    /// Connections under the cap that are not on their way out.
    pub(super) fn live_full(&self) -> usize {
        self.full.saturating_sub(self.displacing_full)
    }

    pub(super) fn open_of(&self, group: AddressGroup) -> usize {
        self.by_address.get(&group).map_or(0, |e| e.open)
    }

    /// Moves `group`'s open count by `delta` (+1 or -1), keeping `by_load` in step.
    pub(super) fn add_open(&mut self, group: AddressGroup, up: bool) {
        let entry = self.by_address.entry(group).or_default();
        let before = entry.open;
        entry.open = if up {
            before + 1
        } else {
            before.saturating_sub(1)
        };
        let after = entry.open;
        if after == 0 {
            self.by_address.remove(&group);
        }
        if before > 0 {
            self.by_load.remove(&(before, group));
        }
        if after > 0 {
            self.by_load.insert((after, group));
        }
    }

    fn mark_displaced(&mut self, handle: &IdleHandle) {
        handle.displaced.store(true, Ordering::Release);
        handle.close.notify_one();
        if handle.reserve_only {
            self.displacing_reserve += 1;
        } else {
            self.displacing_full += 1;
        }
    }

    /// Tells the newest idle connection of the heaviest addresses (up to [`HEAVIEST_SCAN`]
    /// of them, none lighter than `newcomer`'s) to close; false when none of them has one
    /// within the scan bound.
    pub(super) fn displace_from_heaviest(&mut self, newcomer: AddressGroup) -> bool {
        let floor = self.open_of(newcomer);
        let heaviest: Vec<AddressGroup> = self
            .by_load
            .iter()
            .rev()
            .take(HEAVIEST_SCAN)
            .take_while(|(open, _)| *open >= floor.max(1))
            .map(|(_, g)| *g)
            .collect();
        let mut scanned = 0;
        for group in heaviest {
            let Some(entry) = self.by_address.get_mut(&group) else {
                continue;
            };
            let mut found = None;
            for i in (0..entry.displaceable.len()).rev() {
                if scanned >= DISPLACE_SCAN {
                    break;
                }
                scanned += 1;
                match entry.displaceable[i].upgrade() {
                    Some(h) if h.can_make_room(false) => {
                        found = Some((i, h));
                        break;
                    }
                    Some(_) => {}
                    None => {
                        entry.displaceable.remove(i);
                    }
                }
            }
            if let Some((i, handle)) = found {
                entry.displaceable.remove(i);
                self.mark_displaced(&handle);
                return true;
            }
            if scanned >= DISPLACE_SCAN {
                break;
            }
        }
        false
    }

    /// Tells the longest-held idle connection of the cap (`reserve_only == false`) or of the
    /// reserve to close; false when none of the first [`DISPLACE_SCAN`] candidates is one.
    pub(super) fn displace_oldest(&mut self, reserve_only: bool) -> bool {
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
            if handle.can_make_room(reserve_only) {
                self.mark_displaced(&handle);
                return true;
            }
            // Busy now, or of the other pool: it may be a candidate for a later admission.
            self.displaceable.push_back(weak);
        }
        false
    }
}
