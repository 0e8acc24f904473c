//! One shard of the embedded store: a hash table of keyed states, what it costs in bytes, and
//! the summaries of the states it had to evict.
//!
//! A state of two 64-bit fields or fewer (GCRA, token bucket, leaky bucket, fixed window) is
//! held in a [`Cell`]: one 128-bit atomic word, so a check of a key already held decides under
//! the shard's *read* lock and writes with one compare-and-swap (see the crate docs). Other
//! states (sliding windows, concurrency) are boxed [`Entry`]s changed under the write lock.
//! The two shapes keep the table's slots at 64 bytes.
//!
//! The byte count is kept as the shard changes, so the store can compare its total against
//! `max_memory` with one atomic load. It counts what the shard allocates: the table itself
//! (its exact allocation, slots and control bytes), each key's heap copy and the heap part of
//! each state (a boxed entry, a sliding log's entries, a concurrency limit's leases), every
//! heap block rounded up as glibc's allocator does (16-byte steps, 8 bytes of header, 32 bytes
//! at least), and the sketches.
#![forbid(unsafe_code)]

use std::sync::atomic::{AtomicU64, Ordering};

use hashbrown::HashTable;
use portable_atomic::AtomicU128;
use sluice_core::algorithm::{State, fixed_window, gcra, leaky_bucket, token_bucket};
use sluice_core::{Algorithm, LeaseId, Timestamp};

use crate::summary::{self, Sketch};

/// Policies (distinct algorithms) with a sketch of their own, per shard; keys of further
/// policies share one sketch.
const MAX_POLICIES: usize = 64;
/// The policy index of keys summarized in the shared sketch.
const SHARED: u8 = u8::MAX;

/// A stored state and when it is back to its initial value.
#[derive(Debug, Clone)]
pub(crate) struct Entry {
    pub(crate) state: State,
    pub(crate) expires_at: Timestamp,
}

/// Which state a [`Cell`] holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum CellKind {
    Gcra,
    TokenBucket,
    LeakyBucket,
    FixedWindow,
}

/// A state of at most two 64-bit fields in one atomic word, and when it is back at rest.
///
/// `expires` only ever grows while the shard is read-locked (`fetch_max` after a successful
/// swap). The read path sends a state it sees at rest to the write path, which drops it; a
/// read that sees `expires` before another thread's `fetch_max` lands only takes that detour
/// (under the write lock every swap is complete). Decisions come from the word alone: a state
/// past its expiry decides exactly as no state, by each algorithm's own arithmetic.
#[derive(Debug)]
pub(crate) struct Cell {
    kind: CellKind,
    bits: AtomicU128,
    expires: AtomicU64,
}

/// Two fields in one word: `hi` in the upper 64 bits.
#[inline]
fn pack(hi: u64, lo: u64) -> u128 {
    (u128::from(hi) << 64) | u128::from(lo)
}

#[inline]
fn unpack(bits: u128) -> (u64, u64) {
    ((bits >> 64) as u64, bits as u64)
}

impl CellKind {
    /// The kind of word that holds `state`, and the word; `None` for states that need more.
    #[inline]
    fn encode(state: &State) -> Option<(CellKind, u128)> {
        Some(match *state {
            State::Gcra(gcra::State { tat }) => (CellKind::Gcra, u128::from(tat)),
            State::TokenBucket(token_bucket::State { tokens, last_ms }) => {
                (CellKind::TokenBucket, pack(tokens, last_ms))
            }
            State::LeakyBucket(leaky_bucket::State { level, last_ms }) => {
                (CellKind::LeakyBucket, pack(level, last_ms))
            }
            State::FixedWindow(fixed_window::State {
                window_start,
                count,
            }) => (CellKind::FixedWindow, pack(window_start, count)),
            _ => return None,
        })
    }

    #[inline]
    fn decode(self, bits: u128) -> State {
        let (hi, lo) = unpack(bits);
        match self {
            CellKind::Gcra => State::Gcra(gcra::State { tat: bits as u64 }),
            CellKind::TokenBucket => State::TokenBucket(token_bucket::State {
                tokens: hi,
                last_ms: lo,
            }),
            CellKind::LeakyBucket => State::LeakyBucket(leaky_bucket::State {
                level: hi,
                last_ms: lo,
            }),
            CellKind::FixedWindow => State::FixedWindow(fixed_window::State {
                window_start: hi,
                count: lo,
            }),
        }
    }

    /// Whether a check under `algorithm` reads this kind of state (a stored state of another
    /// algorithm counts as absent, which only the write path handles).
    #[inline]
    fn serves(self, algorithm: &Algorithm) -> bool {
        matches!(
            (self, algorithm),
            (CellKind::Gcra, Algorithm::Gcra { .. })
                | (CellKind::TokenBucket, Algorithm::TokenBucket { .. })
                | (CellKind::LeakyBucket, Algorithm::LeakyBucket { .. })
                | (CellKind::FixedWindow, Algorithm::FixedWindow { .. })
        )
    }
}

/// What a compare-and-swap on a cell came to.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Swap {
    /// The new state is in.
    Done,
    /// Another thread changed the cell first: decide again from the new word.
    Raced,
    /// The new state does not fit this cell: take the write path.
    Unfit,
}

impl Cell {
    fn new(kind: CellKind, bits: u128, expires_at: Timestamp) -> Self {
        Self {
            kind,
            bits: AtomicU128::new(bits),
            expires: AtomicU64::new(expires_at),
        }
    }

    /// The word and the state it holds, if a check under `algorithm` at `now` reads it: a
    /// state back at rest goes to the write path, which drops it.
    #[inline]
    pub(crate) fn load_for(&self, algorithm: &Algorithm, now: Timestamp) -> Option<(u128, State)> {
        if !self.kind.serves(algorithm) || self.expires.load(Ordering::Relaxed) <= now {
            return None;
        }
        let bits = self.bits.load(Ordering::Acquire);
        Some((bits, self.kind.decode(bits)))
    }

    /// Replaces the word `seen` with `state` (back at rest at `expires_at`) unless another
    /// thread changed it since.
    #[inline]
    pub(crate) fn swap(&self, seen: u128, state: &State, expires_at: Timestamp) -> Swap {
        let Some((kind, bits)) = CellKind::encode(state).filter(|(k, _)| *k == self.kind) else {
            return Swap::Unfit;
        };
        debug_assert_eq!(kind, self.kind);
        match self
            .bits
            .compare_exchange_weak(seen, bits, Ordering::AcqRel, Ordering::Acquire)
        {
            Ok(_) => {
                self.expires.fetch_max(expires_at, Ordering::Relaxed);
                Swap::Done
            }
            Err(_) => Swap::Raced,
        }
    }

    fn entry(&self) -> Entry {
        Entry {
            state: self.kind.decode(self.bits.load(Ordering::Acquire)),
            expires_at: self.expires.load(Ordering::Relaxed),
        }
    }
}

/// How a slot holds its state.
#[derive(Debug)]
enum Value {
    Cell(Cell),
    Boxed(Box<Entry>),
}

impl Value {
    fn of(entry: Entry) -> Self {
        match CellKind::encode(&entry.state) {
            Some((kind, bits)) => Value::Cell(Cell::new(kind, bits, entry.expires_at)),
            None => Value::Boxed(Box::new(entry)),
        }
    }

    #[inline]
    fn expires_at(&self) -> Timestamp {
        match self {
            Value::Cell(c) => c.expires.load(Ordering::Relaxed),
            Value::Boxed(e) => e.expires_at,
        }
    }

    fn held(&self) -> Held<'_> {
        match self {
            Value::Cell(c) => Held::Copied(c.entry()),
            Value::Boxed(e) => Held::Ref(e),
        }
    }

    /// Heap bytes: the box and the state's own heap part.
    fn heap(&self) -> usize {
        match self {
            Value::Cell(_) => 0,
            Value::Boxed(e) => alloc_bytes(std::mem::size_of::<Entry>()) + state_heap(&e.state),
        }
    }
}

/// A stored entry as read: borrowed from its box or copied out of its cell.
#[derive(Debug)]
pub(crate) enum Held<'a> {
    Ref(&'a Entry),
    Copied(Entry),
}

impl std::ops::Deref for Held<'_> {
    type Target = Entry;
    fn deref(&self) -> &Entry {
        match self {
            Held::Ref(e) => e,
            Held::Copied(e) => e,
        }
    }
}

/// A key, its hash (kept for rehashing when the table grows), its state and which sketch
/// summarizes it if it is evicted.
#[derive(Debug)]
struct Slot {
    hash: u64,
    key: Box<str>,
    value: Value,
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
    Live(Held<'a>),
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
            Lookup::Live(e) => Some(&e.state),
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
    pub(crate) fn get(&self, hash: u64, key: &str) -> Option<Held<'_>> {
        self.map.find(hash, |s| &*s.key == key).map(|s| s.value.held())
    }

    /// The cell of `key`, if the key is held in one (the read path of a check).
    #[inline]
    pub(crate) fn cell(&self, hash: u64, key: &str) -> Option<&Cell> {
        match self.map.find(hash, |s| &*s.key == key).map(|s| &s.value) {
            Some(Value::Cell(c)) => Some(c),
            _ => None,
        }
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
            Some(e) if e.expires_at > now => Lookup::Live(e),
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
                self.bytes -= alloc_bytes(slot.key.len()) + slot.value.heap();
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
        let Some(entry) = self.replace_held(hash, key, entry) else {
            return false;
        };
        let value = Value::of(entry);
        let added = value.heap();
        let policy = self.policy_index(algorithm);
        let table_before = self.table_bytes();
        self.map.insert_unique(
            hash,
            Slot {
                hash,
                key: key.into(),
                value,
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
        self.replace_held(hash, key, entry).is_none()
    }

    /// Replaces the entry of a key held; gives `entry` back if the key is not held.
    fn replace_held(&mut self, hash: u64, key: &str, entry: Entry) -> Option<Entry> {
        let Some(s) = self.map.find_mut(hash, |s| &*s.key == key) else {
            return Some(entry);
        };
        // In place when the shape stays (no allocation); else a new value.
        match (&mut s.value, CellKind::encode(&entry.state)) {
            (Value::Cell(c), Some((kind, bits))) if c.kind == kind => {
                *c.bits.get_mut() = bits;
                *c.expires.get_mut() = entry.expires_at;
            }
            (Value::Boxed(b), None) => {
                let removed = state_heap(&b.state);
                let added = state_heap(&entry.state);
                **b = entry;
                self.bytes = self.bytes + added - removed;
            }
            (value, _) => {
                let removed = value.heap();
                *value = Value::of(entry);
                self.bytes = self.bytes + value.heap() - removed;
            }
        }
        None
    }

    /// Drops the entries back at rest by `now`; how many.
    pub(crate) fn sweep(&mut self, now: Timestamp) -> usize {
        let before = self.map.len();
        let bytes = &mut self.bytes;
        self.map.retain(|s| {
            let keep = s.value.expires_at() > now;
            if !keep {
                *bytes -= alloc_bytes(s.key.len()) + s.value.heap();
            }
            keep
        });
        self.ops_since_sweep = 0;
        before - self.map.len()
    }

    /// When each held entry is back at rest, appended to `out`.
    pub(crate) fn expiries(&self, out: &mut Vec<Timestamp>) {
        out.extend(self.map.iter().map(|s| s.value.expires_at()));
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
            let e = s.value.held();
            let due = if strictly_before {
                e.expires_at < cutoff
            } else {
                e.expires_at == cutoff
            };
            if *budget == 0 || !due {
                return true;
            }
            *budget -= 1;
            *bytes -= alloc_bytes(s.key.len()) + s.value.heap();
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
