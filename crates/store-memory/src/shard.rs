//! One shard of the embedded store: a hash table of keyed states, what it costs in bytes, and
//! the summaries of the states it had to evict.
//!
//! A state of two 64-bit fields or fewer (GCRA, token bucket, leaky bucket, fixed window) is
//! held in a [`Cell`]: one 128-bit atomic word, so a check of a key already held decides under
//! the shard's *read* lock and writes with one compare-and-swap (module `cell`, which also
//! states the liveness rule: a state is held while its rest time is after now). Other
//! states (sliding windows, concurrency) are boxed [`Entry`]s changed under the write lock.
//! The two shapes keep the table's slots at 64 bytes.
//!
//! The byte count is kept as the shard changes, so the store can compare its total against
//! `max_memory` with one atomic load. It counts what the shard allocates: the table itself
//! (its exact allocation, slots and control bytes), the heap copy of each key too long to sit in
//! its slot and the heap part of each state (a boxed entry, a sliding log's entries, a concurrency limit's leases), every
//! heap block rounded up as glibc's allocator does (16-byte steps, 8 bytes of header, 32 bytes
//! at least), and the summaries of evicted keys: the table of their fingerprints and the
//! sketches.
//!
//! An evicted key's trace goes to the shard's [`Fingerprints`] table, found again only by the
//! same key; the traces the table has no room for go to the sketch of the key's policy. A check
//! of a key the map does not hold starts from the larger of the two bounds it finds.
#![forbid(unsafe_code)]

use hashbrown::HashTable;
use sluice_core::algorithm::{State, rest_time};
use sluice_core::{Algorithm, LeaseId, Timestamp};

use crate::cell::{Cell, CellKind};

use crate::fingerprints::{Fingerprints, Overflow};
use crate::summary::{self, Sketch, Trace};

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

/// How a slot holds its state.
#[derive(Debug)]
enum Value {
    Cell(Cell),
    Boxed(Box<Entry>),
}

impl Value {
    /// A cell when the state fits one and its expiry follows from it and `algorithm` (the
    /// slot's policy, `None` for keys of the shared sketch); else a box.
    fn of(entry: Entry, algorithm: Option<&Algorithm>) -> Self {
        let derived = algorithm.and_then(|a| rest_time(a, &entry.state));
        match (CellKind::encode(&entry.state), derived) {
            (Some((kind, bits)), Some(at)) => {
                debug_assert_eq!(
                    at, entry.expires_at,
                    "{:?} under {algorithm:?}",
                    entry.state
                );
                Value::Cell(Cell::new(kind, bits))
            }
            _ => Value::Boxed(Box::new(entry)),
        }
    }

    /// The entry, with its expiry (a cell's from `algorithm`, the slot's policy).
    fn held(&self, algorithm: Option<&Algorithm>) -> Held<'_> {
        match self {
            Value::Cell(c) => {
                let (_, state) = c.read();
                let expires_at = algorithm
                    .and_then(|a| rest_time(a, &state))
                    .unwrap_or(Timestamp::MAX);
                Held::Copied(Entry { state, expires_at })
            }
            Value::Boxed(e) => Held::Ref(e),
        }
    }

    /// When the state is back at rest (a cell's from `algorithm`, the slot's policy).
    #[inline]
    fn expires_at(&self, algorithm: Option<&Algorithm>) -> Timestamp {
        match self {
            Value::Cell(c) => algorithm
                .and_then(|a| rest_time(a, &c.read().1))
                .unwrap_or(Timestamp::MAX),
            Value::Boxed(e) => e.expires_at,
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

/// The algorithm of policy index `policy` (`None` for the shared sketch's keys).
#[inline]
fn algorithm_of(policies: &[Policy], policy: u8) -> Option<&Algorithm> {
    policies.get(usize::from(policy)).map(|p| &p.algorithm)
}

/// Key bytes held in the slot itself; a longer key gets a heap block of its own.
pub(crate) const INLINE_KEY: usize = 29;

/// A slot's key and the index of the policy its state was written under (which sketch
/// summarizes the key if it is evicted). A key of up to [`INLINE_KEY`] bytes (most
/// `rl:{ip:...}:<policy>` and `rl:{user:...}:<policy>` keys) sits in the slot, so finding it
/// reads no cache line besides the slot's and costs no heap block; a longer one is boxed.
/// 32 bytes either way.
#[derive(Debug)]
enum Key {
    Inline {
        policy: u8,
        len: u8,
        bytes: [u8; INLINE_KEY],
    },
    Heap {
        policy: u8,
        bytes: Box<[u8]>,
    },
}

impl Key {
    fn new(key: &[u8], policy: u8) -> Self {
        if key.len() <= INLINE_KEY {
            let mut bytes = [0; INLINE_KEY];
            bytes[..key.len()].copy_from_slice(key);
            Key::Inline {
                policy,
                len: key.len() as u8,
                bytes,
            }
        } else {
            Key::Heap {
                policy,
                bytes: key.into(),
            }
        }
    }

    #[inline]
    fn bytes(&self) -> &[u8] {
        match self {
            Key::Inline { len, bytes, .. } => bytes.get(..usize::from(*len)).unwrap_or(bytes),
            Key::Heap { bytes, .. } => bytes,
        }
    }

    #[inline]
    fn policy(&self) -> u8 {
        match self {
            Key::Inline { policy, .. } | Key::Heap { policy, .. } => *policy,
        }
    }

    fn set_policy(&mut self, to: u8) {
        match self {
            Key::Inline { policy, .. } | Key::Heap { policy, .. } => *policy = to,
        }
    }

    /// Heap bytes: the block of a key too long for its slot.
    fn heap(&self) -> usize {
        match self {
            Key::Inline { .. } => 0,
            Key::Heap { bytes, .. } => alloc_bytes(bytes.len()),
        }
    }
}

/// A key and its state. Exactly one cache line, aligned to one, so a lookup that misses the
/// cache costs one line for the slot (and, for a key longer than [`INLINE_KEY`], one for its
/// bytes). The key's hash is not kept: growing the table hashes the keys again.
#[derive(Debug)]
#[repr(align(64))]
struct Slot {
    key: Key,
    value: Value,
}

impl Slot {
    #[inline]
    fn is(&self, key: &[u8]) -> bool {
        self.key.bytes() == key
    }
}

/// The hash a store places keys by: keyed with random keys, so clients choosing identities
/// cannot pile keys onto one shard or one probe chain. Each shard keeps a copy to hash its keys
/// again when its table grows.
pub(crate) type KeyHasher = ahash::RandomState;

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
    /// The evicted keys' own traces.
    fingerprints: Fingerprints,
    /// Traces that found no slot and went to a sketch, since the shard was made.
    pub(crate) overflowed: u64,
    /// The store's key hash, for hashing the keys again when the table grows or shrinks.
    hasher: KeyHasher,
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
    /// An empty shard whose sketches get `sketch_width` cells per row and whose table of
    /// evicted keys grows to `fingerprint_slots` slots.
    pub(crate) fn new(sketch_width: usize, fingerprint_slots: usize, hasher: KeyHasher) -> Self {
        Self {
            map: HashTable::new(),
            ops_since_sweep: 0,
            bytes: 0,
            reported: 0,
            policies: Vec::new(),
            shared: None,
            sketch_width,
            sketch_bytes: 0,
            fingerprints: Fingerprints::new(fingerprint_slots),
            overflowed: 0,
            hasher,
        }
    }

    /// Bytes of the summaries of evicted keys: the fingerprint table and the sketches.
    #[inline]
    pub(crate) fn summary_bytes(&self) -> usize {
        self.sketch_bytes + alloc_bytes(self.fingerprints.heap_bytes())
    }

    /// The table of evicted keys.
    pub(crate) fn fingerprints(&self) -> &Fingerprints {
        &self.fingerprints
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
        let policies = &self.policies;
        self.map
            .find(hash, |s| s.is(key.as_bytes()))
            .map(|s| s.value.held(algorithm_of(policies, s.key.policy())))
    }

    /// The cell of `key` and the algorithm its state was written under, if the key is held
    /// in a cell (the read path of a check).
    #[inline]
    pub(crate) fn cell(&self, hash: u64, key: &str) -> Option<(&Cell, &Algorithm)> {
        let slot = self.map.find(hash, |s| s.is(key.as_bytes()))?;
        match &slot.value {
            Value::Cell(c) => Some((c, algorithm_of(&self.policies, slot.key.policy())?)),
            Value::Boxed(_) => None,
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
            None if self.sketch_bytes == 0 && self.fingerprints.is_empty() => Lookup::Absent,
            None => self
                .evicted_bound(hash, algorithm, now)
                .and_then(|b| summary::restrictive_state(algorithm, b, now, evicted_lease))
                .map_or(Lookup::Absent, Lookup::Summarized),
        }
    }

    /// The bound on the evicted state of the key of `hash` under `algorithm`: the larger of
    /// its own trace in the fingerprint table and its sketch's bound (the key may have left a
    /// trace in each, the older one pushed out to the sketch). `None` when neither has one.
    fn evicted_bound(&self, hash: u64, algorithm: &Algorithm, now: Timestamp) -> Option<Trace> {
        let own = self
            .policy_of(algorithm)
            .and_then(|p| self.fingerprints.find(hash, p, now));
        let coarse = self.sketch_of(algorithm).and_then(|s| s.bound(hash, now));
        match (own, coarse) {
            (Some(a), Some(b)) => Some(Trace {
                amount: a.amount.max(b.amount),
                until: a.until.max(b.until),
            }),
            (a, b) => a.or(b),
        }
    }

    /// The policy index keys of `algorithm` are summarized under, if it has one.
    fn policy_of(&self, algorithm: &Algorithm) -> Option<u8> {
        match self.policies.iter().position(|p| p.algorithm == *algorithm) {
            Some(i) => Some(i as u8),
            None if self.policies.len() >= MAX_POLICIES => Some(SHARED),
            None => None,
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
        match self.map.find_entry(hash, |s| s.is(key.as_bytes())) {
            Ok(e) => {
                let (slot, _) = e.remove();
                self.bytes -= slot.key.heap() + slot.value.heap();
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
        let policy = self.policy_index(algorithm);
        let Some(entry) = self.replace_held(hash, key, entry, Some(policy)) else {
            return false;
        };
        let value = Value::of(entry, algorithm_of(&self.policies, policy));
        let key = Key::new(key.as_bytes(), policy);
        let added = key.heap() + value.heap();
        let table_before = self.table_bytes();
        let hasher = &self.hasher;
        self.map.insert_unique(hash, Slot { key, value }, |s| {
            hasher.hash_one(s.key.bytes())
        });
        self.bytes = self.bytes + added + self.table_bytes() - table_before;
        true
    }

    /// Replaces the entry of a key held; whether it was.
    pub(crate) fn replace(&mut self, hash: u64, key: &str, entry: Entry) -> bool {
        self.replace_held(hash, key, entry, None).is_none()
    }

    /// Replaces the entry of a key held, written under policy index `policy` (`None`: the
    /// slot's own); gives `entry` back if the key is not held.
    fn replace_held(
        &mut self,
        hash: u64,
        key: &str,
        entry: Entry,
        policy: Option<u8>,
    ) -> Option<Entry> {
        let Shard {
            map,
            policies,
            bytes,
            ..
        } = self;
        let Some(s) = map.find_mut(hash, |s| s.is(key.as_bytes())) else {
            return Some(entry);
        };
        if let Some(p) = policy {
            s.key.set_policy(p);
        }
        let algorithm = algorithm_of(policies, s.key.policy());
        // In place when the shape stays (no allocation); else a new value.
        let fits = || algorithm.and_then(|a| rest_time(a, &entry.state));
        match (&mut s.value, CellKind::encode(&entry.state)) {
            (Value::Cell(c), Some((kind, bits))) if c.kind() == kind && fits().is_some() => {
                debug_assert_eq!(fits(), Some(entry.expires_at), "{:?}", entry.state);
                c.set(bits);
            }
            (Value::Boxed(b), None) => {
                let removed = state_heap(&b.state);
                let added = state_heap(&entry.state);
                **b = entry;
                *bytes = *bytes + added - removed;
            }
            (value, _) => {
                let removed = value.heap();
                *value = Value::of(entry, algorithm);
                *bytes = *bytes + value.heap() - removed;
            }
        }
        None
    }

    /// Drops the entries back at rest by `now`; how many.
    pub(crate) fn sweep(&mut self, now: Timestamp) -> usize {
        let before = self.map.len();
        let Shard {
            map,
            bytes,
            policies,
            ..
        } = self;
        map.retain(|s| {
            let keep = s.value.expires_at(algorithm_of(policies, s.key.policy())) > now;
            if !keep {
                *bytes -= s.key.heap() + s.value.heap();
            }
            keep
        });
        self.ops_since_sweep = 0;
        before - self.map.len()
    }

    /// When each held entry is back at rest, appended to `out`.
    pub(crate) fn expiries(&self, out: &mut Vec<Timestamp>) {
        let policies = &self.policies;
        out.extend(
            self.map
                .iter()
                .map(|s| s.value.expires_at(algorithm_of(policies, s.key.policy()))),
        );
    }

    /// Evicts up to `*budget` entries back at rest by `cutoff` (strictly before it when
    /// `strictly_before`), writing a trace of every one still live at `now` into the
    /// fingerprint table, or into its policy's sketch when the table has no room for it.
    /// Returns `(at rest, informative)` counts and lowers `*budget` by their sum.
    pub(crate) fn evict(
        &mut self,
        cutoff: Timestamp,
        strictly_before: bool,
        budget: &mut usize,
        now: Timestamp,
    ) -> (usize, usize) {
        let (mut at_rest, mut informative) = (0, 0);
        let table_before = alloc_bytes(self.fingerprints.heap_bytes());
        let Shard {
            map,
            bytes,
            policies,
            shared,
            sketch_width,
            sketch_bytes,
            fingerprints,
            overflowed,
            hasher,
            ..
        } = self;
        map.retain(|s| {
            let e = s.value.held(algorithm_of(policies, s.key.policy()));
            let due = if strictly_before {
                e.expires_at < cutoff
            } else {
                e.expires_at == cutoff
            };
            if *budget == 0 || !due {
                return true;
            }
            *budget -= 1;
            *bytes -= s.key.heap() + s.value.heap();
            if e.expires_at <= now {
                at_rest += 1;
                return false;
            }
            informative += 1;
            let trace = summary::trace(&e.state, e.expires_at, now);
            let hash = hasher.hash_one(s.key.bytes());
            for out in fingerprints.record(hash, s.key.policy(), trace, now) {
                *overflowed += 1;
                let Overflow {
                    hash,
                    policy,
                    trace,
                } = out;
                let slot_sketch = match policies.get_mut(usize::from(policy)) {
                    Some(p) => &mut p.sketch,
                    None => &mut *shared,
                };
                let sketch = slot_sketch.get_or_insert_with(|| {
                    *sketch_bytes += Sketch::bytes_for(*sketch_width);
                    *bytes += Sketch::bytes_for(*sketch_width);
                    Sketch::new(*sketch_width)
                });
                sketch.record(hash, trace, now);
            }
            false
        });
        self.bytes = self.bytes + alloc_bytes(self.fingerprints.heap_bytes()) - table_before;
        (at_rest, informative)
    }

    /// Gives back table memory after evictions left the table mostly empty.
    pub(crate) fn shrink_if_sparse(&mut self) {
        let len = self.map.len();
        if self.map.capacity() > 4 * len + 64 {
            let before = self.table_bytes();
            let hasher = &self.hasher;
            self.map
                .shrink_to(2 * len, |s| hasher.hash_one(s.key.bytes()));
            self.bytes = self.bytes + self.table_bytes() - before;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_slot_fits_one_cache_line() {
        assert_eq!(std::mem::size_of::<Slot>(), 64);
        assert_eq!(std::mem::size_of::<Key>(), 32);
    }

    #[test]
    fn keys_up_to_29_bytes_sit_in_the_slot() {
        for len in [0, 1, 21, INLINE_KEY, INLINE_KEY + 1, 100] {
            let text: Vec<u8> = (0..len).map(|i| b'a' + (i % 26) as u8).collect();
            let mut key = Key::new(&text, 3);
            assert_eq!(key.bytes(), &text[..]);
            assert_eq!(key.policy(), 3);
            key.set_policy(7);
            assert_eq!((key.bytes(), key.policy()), (&text[..], 7));
            let heap = if len <= INLINE_KEY {
                0
            } else {
                alloc_bytes(len)
            };
            assert_eq!(key.heap(), heap, "{len}");
            // A key is never taken for a prefix or an extension of itself.
            let slot = Slot {
                key,
                value: Value::Cell(Cell::new(CellKind::Gcra, 1)),
            };
            assert!(slot.is(&text));
            assert!(len == 0 || !slot.is(&text[..len - 1]));
            assert!(!slot.is(&[&text[..], b"a"].concat()));
        }
    }
}
