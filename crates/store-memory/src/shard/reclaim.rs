//! Giving memory back from a shard: dropping entries back at rest, evicting live ones (each
//! leaving a trace in the fingerprint table or its policy's sketch) and shrinking a table
//! that eviction left mostly empty.
//!
//! Apart from the per-check path because it runs only when the store sweeps or goes over
//! `max_keys` / `max_memory` (`crate::evict` decides when and how many).
#![forbid(unsafe_code)]

use sluice_core::Timestamp;

use super::slot::alloc_bytes;
use super::{Shard, algorithm_of};
use crate::fingerprints::Overflow;
use crate::summary::{self, Sketch};

impl Shard {
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
