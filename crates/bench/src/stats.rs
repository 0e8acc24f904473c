//! Latency samples, percentiles and process CPU time for the drivers' JSON summaries.

use std::time::Duration;

/// Latencies of one run, in nanoseconds.
#[derive(Debug, Default, Clone)]
pub struct Samples(pub Vec<u64>);

impl Samples {
    /// Adds one latency.
    pub fn push(&mut self, d: Duration) {
        self.0.push(d.as_nanos() as u64);
    }
    /// Merges another run's samples.
    pub fn extend(&mut self, other: Samples) {
        self.0.extend(other.0);
    }
    /// Sorts (needed before [`Samples::pct_us`]).
    pub fn sort(&mut self) {
        self.0.sort_unstable();
    }
    /// The `p`-th percentile in µs (nearest rank, as the anchors' benchlib computes it).
    pub fn pct_us(&self, p: f64) -> Option<f64> {
        if self.0.is_empty() {
            return None;
        }
        let n = self.0.len();
        let i = (((p / 100.0) * n as f64).round() as usize)
            .saturating_sub(1)
            .min(n - 1);
        Some(self.0[i] as f64 / 1000.0)
    }
}

/// CPU time (user + system) this process has used, from `/proc/self/stat` (Linux; ticks of
/// 1/100 s, the kernel's USER_HZ). `None` elsewhere.
pub fn process_cpu() -> Option<Duration> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // Fields after the command name (which may contain spaces) start after the last ')'.
    let rest = stat.rsplit_once(')')?.1;
    let f: Vec<&str> = rest.split_whitespace().collect();
    // rest[0] is field 3 (state); utime is field 14, stime field 15.
    let utime: u64 = f.get(11)?.parse().ok()?;
    let stime: u64 = f.get(12)?.parse().ok()?;
    Some(Duration::from_millis((utime + stime) * 10))
}

/// Rounds to one decimal.
pub fn round1(x: f64) -> f64 {
    (x * 10.0).round() / 10.0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_percentiles() {
        let mut s = Samples((1..=100).map(|i| i * 1000).collect());
        s.sort();
        assert_eq!(s.pct_us(50.0), Some(50.0));
        assert_eq!(s.pct_us(99.0), Some(99.0));
        assert_eq!(Samples::default().pct_us(50.0), None);
    }

    #[test]
    fn cpu_time_is_readable() {
        assert!(process_cpu().is_some());
    }
}
