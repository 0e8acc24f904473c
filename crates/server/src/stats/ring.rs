//! Counters per second over the last few minutes, in fixed memory and without locks.
//!
//! A [`SecondRing`] holds one slot per second; a slot remembers which second it holds and is
//! cleared by the first writer of a new second (a compare-and-swap on that second). An
//! increment racing with that clearing, in the same instant of another thread, can be lost:
//! the views built on this are live gauges, not accounts (`sluice_decisions_total` is exact).

use std::sync::atomic::{AtomicU64, Ordering};

#[derive(Debug)]
struct Slot<const N: usize> {
    /// The second held, plus one (0 = never written).
    second: AtomicU64,
    values: [AtomicU64; N],
}

/// `N` counters per second for the last `len` seconds.
#[derive(Debug)]
pub struct SecondRing<const N: usize> {
    slots: Box<[Slot<N>]>,
}

impl<const N: usize> SecondRing<N> {
    /// A ring of `len` (at least 1) seconds.
    pub fn new(len: usize) -> Self {
        SecondRing {
            slots: (0..len.max(1))
                .map(|_| Slot {
                    second: AtomicU64::new(0),
                    values: std::array::from_fn(|_| AtomicU64::new(0)),
                })
                .collect(),
        }
    }

    /// Adds `value` to counter `index` of second `now`.
    pub fn add(&self, now: u64, index: usize, value: u64) {
        let slot = &self.slots[(now % self.slots.len() as u64) as usize];
        let tag = now + 1;
        let held = slot.second.load(Ordering::Acquire);
        if held != tag {
            if held > tag {
                return;
            }
            if slot
                .second
                .compare_exchange(held, tag, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
            {
                for v in &slot.values {
                    v.store(0, Ordering::Relaxed);
                }
            }
        }
        slot.values[index].fetch_add(value, Ordering::Relaxed);
    }

    /// The counters of the last `len` seconds up to `now`, oldest first (zeros for seconds
    /// nothing was written in).
    pub fn series(&self, now: u64) -> Vec<[u64; N]> {
        let len = self.slots.len() as u64;
        (0..len)
            .map(|back| now.checked_sub(len - 1 - back))
            .map(|second| match second {
                Some(s) => self.at(s),
                None => [0; N],
            })
            .collect()
    }

    /// The counters of second `s`, zeros if the ring no longer (or never) held it.
    pub fn at(&self, s: u64) -> [u64; N] {
        let slot = &self.slots[(s % self.slots.len() as u64) as usize];
        if slot.second.load(Ordering::Acquire) != s + 1 {
            return [0; N];
        }
        std::array::from_fn(|i| slot.values[i].load(Ordering::Relaxed))
    }

    /// The sums of the counters over the last `len` seconds up to `now`.
    pub fn sum(&self, now: u64) -> [u64; N] {
        let mut out = [0; N];
        for row in self.series(now) {
            for (o, v) in out.iter_mut().zip(row) {
                *o += v;
            }
        }
        out
    }
}

/// Latency buckets: four per power of two of microseconds, from 1 µs to about a minute,
/// so a quantile read from them is at most 25% above the true value.
pub const LATENCY_BUCKETS: usize = 104;

/// The bucket of a latency of `us` microseconds.
pub fn latency_bucket(us: u64) -> usize {
    let v = us.max(1);
    let e = 63 - v.leading_zeros() as usize;
    let sub = if e >= 2 {
        ((v >> (e - 2)) & 3) as usize
    } else {
        (v << (2 - e)) as usize & 3
    };
    (e * 4 + sub).min(LATENCY_BUCKETS - 1)
}

/// The upper edge of bucket `b`, in microseconds.
pub fn bucket_upper_us(b: usize) -> f64 {
    let (e, sub) = (b / 4, b % 4);
    (1u64 << e) as f64 * (1.0 + (sub as f64 + 1.0) / 4.0)
}

/// The `q` quantile (0..1) of bucket counts, as the upper edge of its bucket, in ms; `None`
/// when there are no samples.
pub fn quantile_ms(counts: &[u64], q: f64) -> Option<f64> {
    let total: u64 = counts.iter().sum();
    if total == 0 {
        return None;
    }
    let rank = ((total as f64) * q).ceil().max(1.0) as u64;
    let mut seen = 0;
    for (b, c) in counts.iter().enumerate() {
        seen += c;
        if seen >= rank {
            return Some(bucket_upper_us(b) / 1000.0);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seconds_roll_over_and_old_ones_read_as_zero() {
        let r: SecondRing<2> = SecondRing::new(5);
        r.add(10, 0, 3);
        r.add(10, 1, 1);
        r.add(12, 0, 2);
        assert_eq!(r.series(12), vec![[0, 0], [0, 0], [3, 1], [0, 0], [2, 0]]);
        assert_eq!(r.sum(12), [5, 1]);
        // Second 15 reuses second 10's slot: cleared first.
        r.add(15, 0, 7);
        assert_eq!(r.at(10), [0, 0]);
        assert_eq!(r.sum(15), [9, 0]);
        // Long after, nothing is left.
        assert_eq!(r.sum(100), [0, 0]);
    }

    #[test]
    fn latency_buckets_bound_the_value() {
        for us in [1u64, 2, 3, 5, 7, 100, 1234, 99_999, 5_000_000] {
            let b = latency_bucket(us);
            let upper = bucket_upper_us(b);
            assert!(
                upper >= us as f64,
                "{us} µs above its bucket's edge {upper}"
            );
            assert!(
                upper <= us as f64 * 1.26 + 1.0,
                "{us} µs: edge {upper} too far"
            );
        }
        let mut counts = [0u64; LATENCY_BUCKETS];
        for us in 1..=100u64 {
            counts[latency_bucket(us * 100)] += 1;
        }
        let p50 = quantile_ms(&counts, 0.5).unwrap();
        let p99 = quantile_ms(&counts, 0.99).unwrap();
        assert!((5.0..=6.3).contains(&p50), "p50 {p50}");
        assert!((9.9..=12.5).contains(&p99), "p99 {p99}");
        assert_eq!(quantile_ms(&[0; 4], 0.5), None);
    }
}
