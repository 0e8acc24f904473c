//! The heaviest identities in fixed memory: the Space-Saving summary (Metwally, Agrawal and
//! El Abbadi, 2005), sharded by identity so each update takes one short lock.
//!
//! A summary of capacity `k` monitors at most `k` identities. A monitored identity's count
//! is incremented; an unmonitored one replaces the identity with the smallest count `m` and
//! starts at `m + w` with error `m`. So, for a stream of total weight `N`:
//! - every count is an overestimate by at most its recorded `error`: `count - error <= true
//!   <= count`;
//! - every `error` is at most `N / k`, and any identity whose true weight exceeds `N / k` is
//!   monitored.
//!
//! Identities are split over [`SHARDS`] summaries by a hash, so an identity always lands in
//! the same one; the bound holds per shard with that shard's weight, which is at most `N`.

use std::collections::HashMap;
use std::hash::{BuildHasher, Hasher};
use std::sync::Arc;

use parking_lot::Mutex;

/// One monitored identity.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Counted {
    /// The identity, as keyed.
    pub identity: String,
    /// The estimate: at least the true weight.
    pub count: u64,
    /// How much of `count` may be overestimate.
    pub error: u64,
}

/// Maps on the decision path: foldhash, as the control plane's tables use, instead of SipHash.
type FastMap<K, V> = HashMap<K, V, foldhash::fast::RandomState>;

/// A Space-Saving summary of at most `capacity` identities.
#[derive(Debug, Clone)]
pub struct SpaceSaving {
    capacity: usize,
    index: FastMap<Arc<str>, usize>,
    /// Identity (shared with `index`, one allocation), count, error.
    slots: Vec<(Arc<str>, u64, u64)>,
    total: u64,
}

impl SpaceSaving {
    /// An empty summary monitoring at most `capacity` (at least 1) identities.
    pub fn new(capacity: usize) -> Self {
        let capacity = capacity.max(1);
        SpaceSaving {
            capacity,
            index: FastMap::with_capacity_and_hasher(capacity, Default::default()),
            slots: Vec::with_capacity(capacity),
            total: 0,
        }
    }

    /// Adds `weight` to `identity`.
    pub fn add(&mut self, identity: &str, weight: u64) {
        self.total = self.total.saturating_add(weight);
        if let Some(&i) = self.index.get(identity) {
            self.slots[i].1 = self.slots[i].1.saturating_add(weight);
            return;
        }
        let key: Arc<str> = Arc::from(identity);
        if self.slots.len() < self.capacity {
            self.index.insert(Arc::clone(&key), self.slots.len());
            self.slots.push((key, weight, 0));
            return;
        }
        // Replace the smallest: a linear scan of `capacity` counts, paid only by identities
        // not already monitored.
        let (i, min) = self
            .slots
            .iter()
            .enumerate()
            .map(|(i, s)| (i, s.1))
            .min_by_key(|&(_, c)| c)
            .expect("capacity is at least 1");
        let old = std::mem::replace(
            &mut self.slots[i],
            (Arc::clone(&key), min.saturating_add(weight), min),
        );
        self.index.remove(&old.0);
        self.index.insert(key, i);
    }

    /// The total weight added.
    pub fn total(&self) -> u64 {
        self.total
    }

    /// The monitored identities, heaviest first.
    pub fn top(&self, n: usize) -> Vec<Counted> {
        let mut all: Vec<Counted> = self
            .slots
            .iter()
            .map(|(id, c, e)| Counted {
                identity: id.to_string(),
                count: *c,
                error: *e,
            })
            .collect();
        all.sort_by(|a, b| {
            b.count
                .cmp(&a.count)
                .then_with(|| a.identity.cmp(&b.identity))
        });
        all.truncate(n);
        all
    }

    /// The estimate of `identity`: `(count, error)` when monitored.
    pub fn get(&self, identity: &str) -> Option<(u64, u64)> {
        self.index
            .get(identity)
            .map(|&i| (self.slots[i].1, self.slots[i].2))
    }

    /// The smallest monitored count once full (an upper bound on any unmonitored identity's
    /// weight), else 0.
    pub fn floor(&self) -> u64 {
        if self.slots.len() < self.capacity {
            0
        } else {
            self.slots.iter().map(|s| s.1).min().unwrap_or(0)
        }
    }
}

/// How many summaries the identities are spread over.
pub const SHARDS: usize = 8;

/// Identities monitored per shard and per list.
pub const PER_SHARD: usize = 64;

/// Seconds each window of the summary covers; a report spans the current window and the one
/// before it, so between 5 and 10 minutes.
pub const WINDOW_SECS: u64 = 300;

#[derive(Debug)]
struct Windows {
    epoch: u64,
    current: SpaceSaving,
    previous: SpaceSaving,
}

impl Windows {
    fn rotate_to(&mut self, epoch: u64) {
        if epoch == self.epoch {
            return;
        }
        let fresh = SpaceSaving::new(PER_SHARD);
        self.previous = if epoch == self.epoch + 1 {
            std::mem::replace(&mut self.current, fresh)
        } else {
            self.current = fresh;
            SpaceSaving::new(PER_SHARD)
        };
        self.epoch = epoch;
    }
}

/// The heavy hitters of one list (decisions, or denials): sharded Space-Saving summaries
/// over two tumbling windows of [`WINDOW_SECS`].
#[derive(Debug)]
pub struct HeavyHitters {
    shards: Vec<Mutex<Windows>>,
    hasher: foldhash::fast::RandomState,
}

impl Default for HeavyHitters {
    fn default() -> Self {
        Self::new()
    }
}

impl HeavyHitters {
    /// Empty summaries.
    pub fn new() -> Self {
        HeavyHitters {
            shards: (0..SHARDS)
                .map(|_| {
                    Mutex::new(Windows {
                        epoch: 0,
                        current: SpaceSaving::new(PER_SHARD),
                        previous: SpaceSaving::new(PER_SHARD),
                    })
                })
                .collect(),
            hasher: Default::default(),
        }
    }

    fn shard(&self, identity: &str) -> &Mutex<Windows> {
        let mut h = self.hasher.build_hasher();
        h.write(identity.as_bytes());
        &self.shards[(h.finish() as usize) % SHARDS]
    }

    /// Adds one to `identity` at `now_secs` (seconds on a monotonic clock).
    pub fn add(&self, identity: &str, now_secs: u64) {
        let mut w = self.shard(identity).lock();
        w.rotate_to(now_secs / WINDOW_SECS);
        w.current.add(identity, 1);
    }

    /// The `n` heaviest identities of the current and previous windows, with the total weight
    /// they were drawn from. An identity monitored in one window only counts the other
    /// window's floor as possible error.
    pub fn top(&self, n: usize, now_secs: u64) -> (Vec<Counted>, u64) {
        let mut all = Vec::new();
        let mut total = 0;
        for shard in &self.shards {
            let mut w = shard.lock();
            w.rotate_to(now_secs / WINDOW_SECS);
            total += w.current.total() + w.previous.total();
            let mut merged: HashMap<String, Counted> = HashMap::new();
            for (this, other) in [(&w.current, &w.previous), (&w.previous, &w.current)] {
                for c in this.top(PER_SHARD) {
                    if merged.contains_key(&c.identity) {
                        continue;
                    }
                    let (oc, oe) = other
                        .get(&c.identity)
                        .unwrap_or((other.floor(), other.floor()));
                    merged.insert(
                        c.identity.clone(),
                        Counted {
                            identity: c.identity,
                            count: c.count + oc,
                            error: c.error + oe,
                        },
                    );
                }
            }
            all.extend(merged.into_values());
        }
        all.sort_by(|a, b| {
            b.count
                .cmp(&a.count)
                .then_with(|| a.identity.cmp(&b.identity))
        });
        all.truncate(n);
        (all, total)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// The Space-Saving guarantees, against exact counts of a skewed random stream.
        #[test]
        fn counts_stay_within_the_error_bound(
            capacity in 1usize..24,
            stream in proptest::collection::vec(
                // Skewed: a few heavy identities and a long tail.
                prop_oneof![3 => 0u32..4, 1 => 0u32..200],
                0..2000,
            ),
        ) {
            let mut s = SpaceSaving::new(capacity);
            let mut exact: HashMap<String, u64> = HashMap::new();
            for id in &stream {
                let id = format!("user:{id}");
                s.add(&id, 1);
                *exact.entry(id).or_default() += 1;
            }
            let n = stream.len() as u64;
            prop_assert_eq!(s.total(), n);
            let bound = n / capacity as u64;
            for c in s.top(capacity) {
                let t = exact[&c.identity];
                prop_assert!(c.count >= t, "{} counted {} < true {}", c.identity, c.count, t);
                prop_assert!(c.count - c.error <= t, "{}: lower bound {} > true {}", c.identity, c.count - c.error, t);
                prop_assert!(c.error <= bound, "error {} > N/k = {}", c.error, bound);
            }
            for (id, t) in &exact {
                if *t > bound {
                    prop_assert!(s.get(id).is_some(), "{id} with {t} > N/k = {bound} is not monitored");
                }
                if s.get(id).is_none() {
                    prop_assert!(*t <= s.floor(), "{id}: {t} above the floor {}", s.floor());
                }
            }
        }
    }

    #[test]
    fn heavy_identities_lead_and_windows_roll() {
        let h = HeavyHitters::new();
        for i in 0..1000u64 {
            h.add("user:heavy", 10);
            if i % 2 == 0 {
                h.add("user:medium", 10);
            }
            h.add(&format!("user:tail{i}"), 10);
        }
        let (top, total) = h.top(2, 10);
        assert_eq!(total, 2500);
        assert_eq!(top[0].identity, "user:heavy");
        assert!(top[0].count >= 1000 && top[0].count - top[0].error <= 1000);
        assert_eq!(top[1].identity, "user:medium");
        // One window later the counts are still reported (previous window)...
        let (top, _) = h.top(1, 10 + WINDOW_SECS);
        assert_eq!(top[0].identity, "user:heavy");
        // ...two windows later they are gone.
        let (top, total) = h.top(1, 10 + 2 * WINDOW_SECS);
        assert!(top.is_empty());
        assert_eq!(total, 0);
    }
}
