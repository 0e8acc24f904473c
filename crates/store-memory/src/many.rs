//! The general path of a check: any number of items, all-or-nothing. Every shard involved is
//! write-locked once, in ascending order (so two checks never wait on each other in a
//! cycle), every item is decided, and the changes are applied only when all admit. Apart
//! from the one-limit paths in the crate root, which most checks take.

use std::collections::HashMap;
use std::sync::atomic::Ordering;

use crossbeam_utils::sync::ShardedLockWriteGuard;
use sluice_core::algorithm::{self, State, Update};
use sluice_core::{Algorithm, CheckItem, Decision, DenyReason, MultiDecision, Timestamp};

use crate::shard::{Entry, Lookup, Shard};
use crate::{MemoryStore, random_lease_id};

/// A staged change to one key during a check.
#[derive(Debug)]
enum Staged {
    Put(State, Timestamp),
    Delete,
}

impl MemoryStore {
    /// The general path: any number of items, all-or-nothing.
    pub(crate) fn check_many_now(&self, items: &[CheckItem<'_>]) -> MultiDecision {
        let now = self.now();
        let lease = items
            .iter()
            .any(|i| i.algorithm.takes_lease(i.cost))
            .then(random_lease_id);

        // Lock every shard involved, once each, in ascending order.
        let hashes: Vec<u64> = items.iter().map(|i| self.hash(i.key)).collect();
        let mut idx: Vec<usize> = hashes.iter().map(|&h| self.shard_index(h)).collect();
        let mut order = idx.clone();
        order.sort_unstable();
        order.dedup();
        let mut guards: Vec<(usize, ShardedLockWriteGuard<'_, Shard>)> =
            order.iter().map(|&s| (s, self.shards[s].write())).collect();
        let slot = |s: usize| order.binary_search(&s).unwrap_or(0);
        for s in &mut idx {
            *s = slot(*s);
        }
        // Evaluate in order; a key appearing twice sees the change staged by the first.
        let mut staged: HashMap<&str, (u64, Staged, &Algorithm)> = HashMap::new();
        let mut decisions = Vec::with_capacity(items.len());
        let mut summarized = 0u64;
        // Items whose stored state is back at rest: dropped once evaluated.
        let mut stale = Vec::new();
        for ((item, &g), &h) in items.iter().zip(&idx).zip(&hashes) {
            let outcome = match staged.get(item.key) {
                Some((_, change, _)) => {
                    let state = match change {
                        Staged::Put(s, _) => Some(s),
                        Staged::Delete => None,
                    };
                    algorithm::decide(item.algorithm, state, now, item.cost, lease.as_ref())
                }
                None => {
                    let found =
                        guards[g]
                            .1
                            .lookup(h, item.key, now, item.algorithm, &self.evicted_lease);
                    summarized += u64::from(matches!(found, Lookup::Summarized(_)));
                    if matches!(found, Lookup::Stale) {
                        stale.push((g, h, item.key));
                    }
                    algorithm::decide(
                        item.algorithm,
                        found.state(),
                        now,
                        item.cost,
                        lease.as_ref(),
                    )
                }
            };
            match outcome.update {
                Update::Keep => {}
                Update::Put { state, expires_at } => {
                    let change = Staged::Put(state, expires_at);
                    staged.insert(item.key, (h, change, item.algorithm));
                }
                Update::Delete => {
                    staged.insert(item.key, (h, Staged::Delete, item.algorithm));
                }
            }
            decisions.push(outcome.decision);
        }
        if summarized > 0 {
            self.summarized_checks
                .fetch_add(summarized, Ordering::Relaxed);
        }

        let allowed = decisions.iter().all(|d| d.allowed);
        let (mut added, mut removed) = (0usize, 0usize);
        if !allowed {
            // Denied: nothing is written. Items that would have admitted report their
            // unconsumed state, as a cost-0 peek sees it.
            for (i, ((item, &g), &h)) in items.iter().zip(&idx).zip(&hashes).enumerate() {
                if decisions[i].allowed {
                    let found =
                        guards[g]
                            .1
                            .lookup(h, item.key, now, item.algorithm, &self.evicted_lease);
                    let peek =
                        algorithm::decide(item.algorithm, found.state(), now, 0, None).decision;
                    decisions[i] = Decision {
                        allowed: false,
                        retry_after_ms: 0,
                        delay_ms: 0,
                        reason: Some(DenyReason::OtherLimitDenied),
                        lease: None,
                        ..peek
                    };
                }
            }
        }
        for (g, h, key) in stale {
            removed += usize::from(guards[g].1.remove(h, key));
        }
        if allowed {
            for (key, (h, change, algorithm)) in staged {
                let g = slot(self.shard_index(h));
                let shard = &mut guards[g].1;
                match change {
                    Staged::Put(state, expires_at) => {
                        let entry = Entry { state, expires_at };
                        added += usize::from(shard.put(h, key, entry, algorithm));
                    }
                    Staged::Delete => removed += usize::from(shard.remove(h, key)),
                }
            }
        }
        removed += self.sweep_some(&mut guards, now);
        let bytes: isize = guards.iter_mut().map(|(_, s)| s.take_bytes_delta()).sum();
        drop(guards);
        self.keys.fetch_add(added, Ordering::Relaxed);
        self.keys.fetch_sub(removed, Ordering::Relaxed);
        self.account_bytes(bytes);
        if added > 0 || bytes > 0 {
            self.enforce_limits(now);
        }
        MultiDecision { allowed, decisions }
    }

    /// Counts a check against each locked shard and sweeps those that have seen as many checks
    /// as they hold entries (at least 64), so sweeping costs O(1) per check amortised.
    fn sweep_some(
        &self,
        guards: &mut [(usize, ShardedLockWriteGuard<'_, Shard>)],
        now: Timestamp,
    ) -> usize {
        let mut removed = 0;
        for (_, shard) in guards.iter_mut() {
            shard.ops_since_sweep += 1;
            if shard.ops_since_sweep >= shard.len().max(64) {
                removed += shard.sweep(now);
            }
        }
        removed
    }
}
