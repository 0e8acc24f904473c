//! One shard of the embedded store: a hash table of keyed states, what it costs in bytes, and
//! the summaries of the states it had to evict.
//!
//! The byte count is kept as the shard changes, so the store can compare its total against
//! `max_memory` with one atomic load. It counts what the shard allocates: the table itself
//! (its exact allocation, slots and control bytes), each key's heap copy and the heap part of
//! each state (a sliding log's entries, a concurrency limit's leases), every heap block rounded
//! up as glibc's allocator does (16-byte steps, 8 bytes of header, 32 bytes at least), and the
//! sketches.
#![forbid(unsafe_code)]

use hashbrown::HashTable;
use sluice_core::algorithm::State;
use sluice_core::{Algorithm, LeaseId, Timestamp};

use crate::summary::{self, Sketch};

/// Policies (distinct algorithms) with a sketch of their own, per shard; keys of further
/// policies share one sketch.
const MAX_POLICIES: usize = 64;
/// The policy index of keys summarized in the shared sketch.
const SHARED: u8 = u8::MAX;

/// A stored state and when it is back to its initial value.
#[derive(Debug)]
pub(crate) struct Entry {
    pub(crate) state: State,
    pub(crate) expires_at: Timestamp,
}

/// A key, its hash (kept for rehashing when the table grows), its entry and which sketch
/// summarizes it if it is evicted.
#[derive(Debug)]
struct Slot {
    hash: u64,
    key: Box<str>,
    entry: Entry,
    policy: u8,
}

/// An algorithm seen in this shard and the sketch of its evicted keys (made on first use).
#[derive(Debug)]
struct Policy {
    algorithm: Algorithm,
    sketch: Option<Sketch>,
}

/// What a check starts from for one key.
#[derive(Debug)]
pub(crate) enum Lookup<'a> {
    /// The key's stored, live state.
    Live(&'a State),
    /// The key's stored state is back at rest: the key starts fresh (and its slot may go).
    Stale,
    /// The key was evicted: the most restrictive state its summary allows.
    Summarized(State),
    /// Nothing known: the key starts fresh.
    Absent,
}

impl Lookup<'_> {
    /// The state to decide from.
    pub(crate) fn state(&self) -> Option<&State> {
        match self {
            Lookup::Live(s) => Some(s),
            Lookup::Summarized(s) => Some(s),
            Lookup::Stale | Lookup::Absent => None,
        }
    }
}

/// One shard (see the module docs).
#[derive(Debug)]
pub(crate) struct Shard {
    map: HashTable<Slot>,
    /// Checks since this shard last dropped its expired entries.
    pub ops_since_sweep: usize,
    /// Bytes allocated: the table, the keys' and states' heap blocks, the sketches.
    bytes: usize,
    /// The part of `bytes` already added to the store's total.
    reported: usize,
    policies: Vec<Policy>,
    shared: Option<Sketch>,
    /// Cells per sketch row.
    sketch_width: usize,
    /// Bytes of the sketches made so far.
    sketch_bytes: usize,
}

/// Bytes the allocator takes for a block of `n` bytes (glibc: 8 bytes of header, 16-byte
/// steps, 32 bytes at least).
#[inline]
fn alloc_bytes(n: usize) -> usize {
    if n == 0 {
        0
    } else {
        (n + 8).next_multiple_of(16).max(32)
    }
}

/// Heap bytes held by a state.
#[inline]
fn state_heap(state: &State) -> usize {
    match state {
        State::SlidingWindowLog(s) => {
            alloc_bytes(s.entries.capacity() * std::mem::size_of::<(u64, u64)>())
        }
        State::Concurrency(s) => {
            alloc_bytes(
                s.leases.capacity()
                    * std::mem::size_of::<sluice_core::algorithm::concurrency::Lease>(),
            ) + s
                .leases
                .iter()
                .map(|l| alloc_bytes(l.id.0.capacity()))
                .sum::<usize>()
        }
        _ => 0,
    }
}

impl Shard {
    /// An empty shard whose sketches get `sketch_width` cells per row.
    pub(crate) fn new(sketch_width: usize) -> Self {
        Self {
            map: HashTable::new(),
            ops_since_sweep: 0,
            bytes: 0,
            reported: 0,
            policies: Vec::new(),
            shared: None,
            sketch_width,
            sketch_bytes: 0,
        }
    }

    /// Keys held.
    #[inline]
    pub(crate) fn len(&self) -> usize {
        self.map.len()
    }

    /// The change of the shard's byte count since the last call, for the store's total.
    #[inline]
    pub(crate) fn take_bytes_delta(&mut self) -> isize {
        let delta = self.bytes as isize - self.reported as isize;
        self.reported = self.bytes;
        delta
    }

    fn table_bytes(&self) -> usize {
        alloc_bytes(self.map.allocation_size())
    }

    #[inline]
    pub(crate) fn get(&self, hash: u64, key: &str) -> Option<&Entry> {
        self.map.find(hash, |s| &*s.key == key).map(|s| &s.entry)
    }

    /// What a check of `key` under `algorithm` starts from at `now`.
    #[inline]
    pub(crate) fn lookup(
        &self,
        hash: u64,
        key: &str,
        now: Timestamp,
        algorithm: &Algorithm,
        evicted_lease: &LeaseId,
    ) -> Lookup<'_> {
        match self.get(hash, key) {
            Some(e) if e.expires_at > now => Lookup::Live(&e.state),
            // Stored after any eviction of the key, so it is newer than the summary.
            Some(_) => Lookup::Stale,
            None if self.sketch_bytes == 0 => Lookup::Absent,
            None => self
                .sketch_of(algorithm)
                .and_then(|s| s.bound(hash, now))
                .and_then(|b| summary::restrictive_state(algorithm, b, now, evicted_lease))
                .map_or(Lookup::Absent, Lookup::Summarized),
        }
    }

    /// The sketch the evicted keys of `algorithm` went to, if one was made.
    fn sketch_of(&self, algorithm: &Algorithm) -> Option<&Sketch> {
        match self.policies.iter().find(|p| p.algorithm == *algorithm) {
            Some(p) => p.sketch.as_ref(),
            // Keys of a policy first seen with the table full went to the shared sketch.
            None if self.policies.len() >= MAX_POLICIES => self.shared.as_ref(),
            None => None,
        }
    }

    /// The index of `algorithm` in this shard's policies, adding it if there is room.
    fn policy_index(&mut self, algorithm: &Algorithm) -> u8 {
        if let Some(i) = self.policies.iter().position(|p| p.algorithm == *algorithm) {
            return i as u8;
        }
        if self.policies.len() >= MAX_POLICIES {
            return SHARED;
        }
        self.policies.push(Policy {
            algorithm: algorithm.clone(),
            sketch: None,
        });
        (self.policies.len() - 1) as u8
    }

    /// Removes `key`; whether it was held.
    #[inline]
    pub(crate) fn remove(&mut self, hash: u64, key: &str) -> bool {
        match self.map.find_entry(hash, |s| &*s.key == key) {
            Ok(e) => {
                let (slot, _) = e.remove();
                self.bytes -= alloc_bytes(slot.key.len()) + state_heap(&slot.entry.state);
                true
            }
            Err(_) => false,
        }
    }

    /// Stores `entry` under `key`, in place when held (no allocation); whether it is new.
    /// `algorithm` says which sketch summarizes the key if it is evicted.
    #[inline]
    pub(crate) fn put(
        &mut self,
        hash: u64,
        key: &str,
        entry: Entry,
        algorithm: &Algorithm,
    ) -> bool {
        let added = state_heap(&entry.state);
        if let Some(s) = self.map.find_mut(hash, |s| &*s.key == key) {
            let removed = state_heap(&s.entry.state);
            s.entry = entry;
            self.bytes = self.bytes + added - removed;
            return false;
        }
        let policy = self.policy_index(algorithm);
        let table_before = self.table_bytes();
        self.map.insert_unique(
            hash,
            Slot {
                hash,
                key: key.into(),
                entry,
                policy,
            },
            |s| s.hash,
        );
        self.bytes =
            self.bytes + alloc_bytes(key.len()) + added + self.table_bytes() - table_before;
        true
    }

    /// Replaces the entry of a key held; whether it was.
    pub(crate) fn replace(&mut self, hash: u64, key: &str, entry: Entry) -> bool {
        let added = state_heap(&entry.state);
        let Some(s) = self.map.find_mut(hash, |s| &*s.key == key) else {
            return false;
        };
        let removed = state_heap(&s.entry.state);
        s.entry = entry;
        self.bytes = self.bytes + added - removed;
        true
    }

    /// Drops the entries back at rest by `now`; how many.
    pub(crate) fn sweep(&mut self, now: Timestamp) -> usize {
        let before = self.map.len();
        let bytes = &mut self.bytes;
        self.map.retain(|s| {
            let keep = s.entry.expires_at > now;
            if !keep {
                *bytes -= alloc_bytes(s.key.len()) + state_heap(&s.entry.state);
            }
            keep
        });
        self.ops_since_sweep = 0;
        before - self.map.len()
    }

    /// When each held entry is back at rest, appended to `out`.
    pub(crate) fn expiries(&self, out: &mut Vec<Timestamp>) {
        out.extend(self.map.iter().map(|s| s.entry.expires_at));
    }

    /// Evicts up to `*budget` entries back at rest by `cutoff` (strictly before it when
    /// `strictly_before`), writing a trace of every one still live at `now` into its policy's
    /// sketch. Returns `(at rest, informative)` counts and lowers `*budget` by their sum.
    pub(crate) fn evict(
        &mut self,
        cutoff: Timestamp,
        strictly_before: bool,
        budget: &mut usize,
        now: Timestamp,
    ) -> (usize, usize) {
        let (mut at_rest, mut informative) = (0, 0);
        let Shard {
            map,
            bytes,
            policies,
            shared,
            sketch_width,
            sketch_bytes,
            ..
        } = self;
        map.retain(|s| {
            let e = &s.entry;
            let due = if strictly_before {
                e.expires_at < cutoff
            } else {
                e.expires_at == cutoff
            };
            if *budget == 0 || !due {
                return true;
            }
            *budget -= 1;
            *bytes -= alloc_bytes(s.key.len()) + state_heap(&e.state);
            if e.expires_at <= now {
                at_rest += 1;
                return false;
            }
            informative += 1;
            let slot_sketch = match policies.get_mut(usize::from(s.policy)) {
                Some(p) => &mut p.sketch,
                None => &mut *shared,
            };
            let sketch = slot_sketch.get_or_insert_with(|| {
                *sketch_bytes += Sketch::bytes_for(*sketch_width);
                *bytes += Sketch::bytes_for(*sketch_width);
                Sketch::new(*sketch_width)
            });
            sketch.record(s.hash, summary::trace(&e.state, e.expires_at, now), now);
            false
        });
        (at_rest, informative)
    }

    /// Gives back table memory after evictions left the table mostly empty.
    pub(crate) fn shrink_if_sparse(&mut self) {
        let len = self.map.len();
        if self.map.capacity() > 4 * len + 64 {
            let before = self.table_bytes();
            self.map.shrink_to(2 * len, |s| s.hash);
            self.bytes = self.bytes + self.table_bytes() - before;
        }
    }
}
