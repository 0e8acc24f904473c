//! Finding, storing and replacing a key in a shard's table: the lookups of a check (the read
//! path's cell, the write path's [`Lookup`]) and the writes that keep the byte count exact.
//!
//! Apart from the slot layout and from eviction because this is the per-check path: every
//! check reads through [`Shard::cell`] or [`Shard::lookup`], and only writes come here for
//! [`Shard::put`] / [`Shard::replace`].
#![forbid(unsafe_code)]

use sluice_core::{Algorithm, LeaseId, Timestamp};

use super::slot::{Entry, Held, Key, Slot, Value, state_heap};
use super::{Lookup, Shard, algorithm_of};
use crate::cell::{Cell, CellKind};
use crate::summary;
use sluice_core::algorithm::rest_time;

impl Shard {
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
}
