//! Reset, charge and refund on the embedded store: the operator's and the settle pattern's
//! changes to one key outside of a check (`docs/admin.md`). The arithmetic is
//! [`sluice_core::algorithm::adjust`]; this module applies it under the key's shard lock, so
//! it is atomic with respect to checks of the same key.

use std::sync::atomic::Ordering;

use sluice_core::algorithm::{self, AdjustError, Adjustment, Update};
use sluice_core::{Algorithm, Decision};

use crate::MemoryStore;
use crate::shard::{Entry, Lookup};

impl MemoryStore {
    /// Deletes `key`'s state; whether it held a live one.
    pub fn reset_now(&self, key: &str) -> bool {
        let now = self.now();
        let hash = self.hash(key);
        let mut shard = self.shards[self.shard_index(hash)].write();
        let live = shard.get(hash, key).is_some_and(|e| e.expires_at > now);
        let removed = shard.remove(hash, key);
        let bytes = shard.take_bytes_delta();
        drop(shard);
        if removed {
            self.keys.fetch_sub(1, Ordering::Relaxed);
        }
        self.account_bytes(bytes);
        live
    }

    /// Charges or refunds `key` (see [`sluice_core::algorithm::adjust`]); the state afterwards
    /// as a check of cost 0 sees it.
    pub fn adjust_now(
        &self,
        key: &str,
        algorithm: &Algorithm,
        adjustment: Adjustment,
    ) -> Result<Decision, AdjustError> {
        let now = self.now();
        let hash = self.hash(key);
        let mut shard = self.shards[self.shard_index(hash)].write();
        let found = shard.lookup(hash, key, now, algorithm, &self.evicted_lease);
        let stale = matches!(found, Lookup::Stale);
        let outcome = algorithm::adjust(algorithm, found.state(), now, adjustment)?;
        let (mut added, mut removed) = (false, false);
        match outcome.update {
            Update::Put { state, expires_at } => {
                added = shard.put(hash, key, Entry { state, expires_at }, algorithm);
            }
            Update::Delete => removed = shard.remove(hash, key),
            Update::Keep if stale => removed = shard.remove(hash, key),
            Update::Keep => {}
        }
        let bytes = shard.take_bytes_delta();
        drop(shard);
        if removed {
            self.keys.fetch_sub(1, Ordering::Relaxed);
        }
        self.account_bytes(bytes);
        if added {
            self.keys.fetch_add(1, Ordering::Relaxed);
            self.enforce_limits(now);
        }
        Ok(outcome.decision)
    }
}
