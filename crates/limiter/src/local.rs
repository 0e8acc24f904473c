//! Local fallback: `failure_mode = "local"` decides from an embedded store while the shared
//! store is unreachable.
//!
//! Failing open lets everything through during an outage; failing closed refuses everything.
//! A policy in local mode keeps enforcing its limit instead, per instance: each sluice
//! process answers from its own in-memory store ([`sluice_memory::MemoryStore`]) at the
//! policy's limit scaled by the limiter's local share (at least 1 of every quantity). With N
//! instances behind a balancer, a share of 1/N keeps the cluster-wide total near the limit;
//! a share of 1 lets each instance admit the whole limit. The local state starts empty at
//! the first failure and is never merged back: once the store answers again (the circuit
//! breaker's probe succeeds), decisions come from it, with its own state as it was.

use sluice_core::{Algorithm, CheckItem, LeaseId, MultiDecision};

/// The share of a policy's limit one instance may admit on its own in local mode.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LocalShare(f64);

/// A local share outside `0 < share <= 1`.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("local_share must be greater than 0 and at most 1, got {0}")]
pub struct InvalidLocalShare(pub f64);

impl LocalShare {
    /// The whole limit on every instance.
    pub const WHOLE: LocalShare = LocalShare(1.0);

    /// A share in `0 < share <= 1`.
    pub fn new(share: f64) -> Result<Self, InvalidLocalShare> {
        if share.is_finite() && share > 0.0 && share <= 1.0 {
            Ok(Self(share))
        } else {
            Err(InvalidLocalShare(share))
        }
    }

    /// The share as a number.
    pub fn get(self) -> f64 {
        self.0
    }

    /// `v` scaled by the share, rounded down, at least 1.
    fn scale(self, v: u64) -> u64 {
        if self.0 >= 1.0 {
            return v;
        }
        ((v as f64 * self.0).floor() as u64).clamp(1, v.max(1))
    }

    /// `algorithm` with its limit (capacity, burst + 1, limit, rate) scaled by the share
    /// ([`Algorithm::scaled`], the scaling sharding uses too).
    pub fn apply(self, algorithm: &Algorithm) -> Algorithm {
        algorithm.scaled(|v| self.scale(v))
    }
}

impl Default for LocalShare {
    fn default() -> Self {
        Self::WHOLE
    }
}

/// The embedded store local-mode policies fall back to (created at the first local
/// decision), with the share it scales limits by. Without the `memory` feature there is none:
/// local-mode policies then fail closed.
#[derive(Debug)]
pub(crate) struct LocalFallback {
    #[cfg(feature = "memory")]
    store: std::sync::OnceLock<sluice_memory::MemoryStore>,
    share: LocalShare,
}

impl LocalFallback {
    pub(crate) fn new(share: LocalShare) -> Self {
        Self {
            #[cfg(feature = "memory")]
            store: std::sync::OnceLock::new(),
            share,
        }
    }

    /// Decides `items` (all-or-nothing) locally, each at its scaled limit; `None` when this
    /// build has no embedded store.
    pub(crate) fn check(&self, items: &[CheckItem<'_>]) -> Option<MultiDecision> {
        #[cfg(feature = "memory")]
        {
            let scaled: Vec<Algorithm> = items
                .iter()
                .map(|i| self.share.apply(i.algorithm))
                .collect();
            let local: Vec<CheckItem<'_>> = items
                .iter()
                .zip(&scaled)
                .map(|(i, algorithm)| CheckItem {
                    key: i.key,
                    algorithm,
                    cost: i.cost,
                })
                .collect();
            let store = self
                .store
                .get_or_init(|| sluice_memory::MemoryStore::builder().build());
            Some(store.check_now(&local))
        }
        #[cfg(not(feature = "memory"))]
        {
            let _ = (items, self.share);
            None
        }
    }

    /// Releases `lease` if the local store holds it (a lease taken in local mode).
    pub(crate) fn release(&self, key: &str, lease: &LeaseId) -> bool {
        #[cfg(feature = "memory")]
        {
            self.store
                .get()
                .is_some_and(|store| store.release_now(key, lease))
        }
        #[cfg(not(feature = "memory"))]
        {
            let _ = (key, lease);
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_core::Rate;

    #[test]
    fn shares_scale_limits_down_to_at_least_one() {
        let half = LocalShare::new(0.5).unwrap();
        let fw = Algorithm::FixedWindow {
            limit: 10,
            window_ms: 1000,
        };
        assert_eq!(
            half.apply(&fw),
            Algorithm::FixedWindow {
                limit: 5,
                window_ms: 1000
            }
        );
        let tiny = LocalShare::new(0.01).unwrap();
        assert_eq!(
            tiny.apply(&fw),
            Algorithm::FixedWindow {
                limit: 1,
                window_ms: 1000
            }
        );
        assert_eq!(LocalShare::WHOLE.apply(&fw), fw);
        let gcra = Algorithm::Gcra {
            rate: Rate::per_second(10),
            burst: 9,
        };
        assert_eq!(
            half.apply(&gcra),
            Algorithm::Gcra {
                rate: Rate::per_second(5),
                burst: 4
            }
        );
    }

    #[test]
    fn shares_outside_zero_to_one_are_refused() {
        for bad in [0.0, -0.5, 1.5, f64::NAN, f64::INFINITY] {
            assert!(LocalShare::new(bad).is_err(), "{bad}");
        }
        assert!(LocalShare::new(1.0).is_ok());
    }
}
