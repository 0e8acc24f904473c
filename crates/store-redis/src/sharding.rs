//! Hot-key sharding: one identity's state split over `n` sub-keys.
//!
//! A very hot identity (one huge tenant) pins one Redis Cluster slot. With `Policy::shards =
//! n`, its state is split over `n` keys built by [`sluice_core::KeyScheme::shard_key`]
//! (`rl:{<identity>#<k>}:<policy>`, so the shards spread over slots), each holding the
//! algorithm returned by [`shard_algorithm`], and every request picks one shard.
//!
//! Rounding: quota and rate amount are divided by `n` **rounded up** (at least 1), so the
//! shards together never admit less than the configured limit and admit at most `n - 1` more
//! per window (or per burst). For GCRA the burst is divided as `ceil((burst + 1) / n) - 1`. The
//! period and windows are unchanged. The split is exact when `n` divides the quota and rate.
//! Because each request sees only its own shard, a client can be denied by one shard while
//! another still has room; with random picking this evens out over many requests.

use sluice_core::Algorithm;

/// The algorithm each of `n` shards runs (see the module docs for the rounding); for a whole
/// policy, [`sluice_core::Policy::shard_algorithm`] gives the same from its `shards`.
pub fn shard_algorithm(algorithm: &Algorithm, n: u32) -> Algorithm {
    algorithm.per_shard(n)
}

/// A shard index in `0..n` for one request, picked uniformly at random (`None` when `n <= 1`:
/// the policy is not sharded).
pub fn pick_shard(n: u32) -> Option<u32> {
    if n <= 1 {
        None
    } else {
        Some(rand::random_range(0..n))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_core::Rate;

    #[test]
    fn divides_quota_and_rate_rounding_up() {
        let a = Algorithm::TokenBucket {
            capacity: 100,
            rate: Rate::per_second(10),
        };
        assert_eq!(
            shard_algorithm(&a, 4),
            Algorithm::TokenBucket {
                capacity: 25,
                rate: Rate::per_second(3)
            }
        );
        let g = Algorithm::Gcra {
            rate: Rate::per_second(10),
            burst: 9,
        };
        assert_eq!(
            shard_algorithm(&g, 3),
            Algorithm::Gcra {
                rate: Rate::per_second(4),
                burst: 3
            }
        );
        let w = Algorithm::FixedWindow {
            limit: 10,
            window_ms: 1000,
        };
        assert_eq!(shard_algorithm(&w, 1), w);
        assert_eq!(pick_shard(1), None);
        assert!(pick_shard(8).unwrap() < 8);
    }
}
