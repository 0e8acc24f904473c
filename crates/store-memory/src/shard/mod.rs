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
//!
//! The shard is split by concern: [`slot`] is what one table slot holds and what it costs in
//! bytes, [`probe`] finds, stores and replaces keys, [`reclaim`] drops and evicts entries and
//! gives table memory back; this file holds the shard itself and its policies (which
//! algorithm a slot's state was written under, and the summaries of evicted keys). The
//! compare-and-swap step of a check is in `crate::cell`.
#![forbid(unsafe_code)]

mod probe;
mod reclaim;
mod slot;

use hashbrown::HashTable;
use sluice_core::algorithm::State;
use sluice_core::{Algorithm, Timestamp};

use crate::fingerprints::Fingerprints;
use crate::summary::{Sketch, Trace};

pub(crate) use slot::{Entry, Held};
use slot::{Slot, alloc_bytes};

/// Policies (distinct algorithms) with a sketch of their own, per shard; keys of further
/// policies share one sketch.
const MAX_POLICIES: usize = 64;
/// The policy index of keys summarized in the shared sketch.
const SHARED: u8 = u8::MAX;

/// The algorithm of policy index `policy` (`None` for the shared sketch's keys).
#[inline]
fn algorithm_of(policies: &[Policy], policy: u8) -> Option<&Algorithm> {
    policies.get(usize::from(policy)).map(|p| &p.algorithm)
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
}
