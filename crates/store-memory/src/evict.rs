//! Keeping the store under `max_keys` and `max_memory` without resetting anybody's limit.
//!
//! Eviction runs on the thread whose write took the store over a limit (one at a time; others
//! carry on). It first drops every entry back at its initial value: those carry no
//! information. If the store is still over, it evicts live entries, soonest back at rest first,
//! down to 95% of each limit (so a full store does not scan on every insert); each one leaves
//! a trace in the shard's table of evicted keys ([`crate::fingerprints`]) or, when that is full,
//! in its policy's sketch ([`crate::summary`]); later checks of the key start from it. The order only decides who loses precision: whatever is evicted, no key ends up less
//! restricted than it was. It is not least-recently-used.
#![forbid(unsafe_code)]

use std::sync::atomic::Ordering;

use sluice_core::Timestamp;

use crate::MemoryStore;

/// Rounds of eviction per call: each takes at least 5% of the entries, and a round can fall
/// short only when table memory that eviction does not free dominates.
const MAX_ROUNDS: usize = 4;

impl MemoryStore {
    /// Brings the store back under its limits (see the module docs).
    pub(crate) fn enforce_limits(&self, now: Timestamp) {
        if !self.over_limits() {
            return;
        }
        let Some(_evicting) = self.evicting.try_lock() else {
            return;
        };
        let mut at_rest = 0;
        for shard in self.shards.iter() {
            let mut shard = shard.write();
            let removed = shard.sweep(now);
            let bytes = shard.take_bytes_delta();
            drop(shard);
            self.keys.fetch_sub(removed, Ordering::Relaxed);
            self.account_bytes(bytes);
            at_rest += removed;
        }
        let mut informative = 0;
        for _ in 0..MAX_ROUNDS {
            let excess = self.excess_entries();
            if excess == 0 {
                break;
            }
            let (r, i) = self.evict_soonest(excess, now);
            at_rest += r;
            informative += i;
        }
        self.evicted_at_rest
            .fetch_add(at_rest as u64, Ordering::Relaxed);
        self.evicted_informative
            .fetch_add(informative as u64, Ordering::Relaxed);
    }

    /// How many entries to evict to get under 95% of each limit (0 when under both limits).
    fn excess_entries(&self) -> usize {
        if !self.over_limits() {
            return 0;
        }
        let len = self.len();
        let by_keys = self
            .max_keys
            .map_or(0, |max| len.saturating_sub(max - max / 20));
        let by_bytes = self.max_memory.map_or(0, |max| {
            let over = self.memory_bytes().saturating_sub(max - max / 20);
            // Each entry frees about the average: its slot's share of the table and its heap
            // (the summaries are not the entries').
            let entries = self.memory_bytes().saturating_sub(self.summary_bytes());
            over.div_ceil((entries / len.max(1)).max(1))
        });
        by_keys.max(by_bytes).max(len / 20).max(1).min(len)
    }

    /// Evicts `count` entries, those back at rest soonest first; `(at rest, informative)`.
    fn evict_soonest(&self, count: usize, now: Timestamp) -> (usize, usize) {
        let mut expiries: Vec<Timestamp> = Vec::with_capacity(self.len());
        for shard in self.shards.iter() {
            shard.read().expiries(&mut expiries);
        }
        let mut budget = count.min(expiries.len());
        if budget == 0 {
            return (0, 0);
        }
        let (_, &mut cutoff, _) = expiries.select_nth_unstable(budget - 1);
        drop(expiries);
        // First every entry back at rest before the cutoff (fewer than `count`), then entries
        // at the cutoff until enough are gone.
        let (mut at_rest, mut informative) = (0, 0);
        for strictly_before in [true, false] {
            for shard in self.shards.iter() {
                if budget == 0 {
                    break;
                }
                let mut shard = shard.write();
                let before = shard.len();
                let summary_before = shard.summary_bytes();
                let (r, i) = shard.evict(cutoff, strictly_before, &mut budget, now);
                let summary_after = shard.summary_bytes();
                shard.shrink_if_sparse();
                let removed = before - shard.len();
                let bytes = shard.take_bytes_delta();
                drop(shard);
                self.keys.fetch_sub(removed, Ordering::Relaxed);
                self.account_bytes(bytes);
                // Summaries only grow.
                self.summary_bytes
                    .fetch_add(summary_after - summary_before, Ordering::Relaxed);
                at_rest += r;
                informative += i;
            }
        }
        (at_rest, informative)
    }
}
