//! The embedded store's default clock: the wall clock read once, advanced by a cheap
//! monotonic counter, since reading the time is a large share of an embedded decision.

use sluice_core::{Clock, SystemClock, Timestamp};

/// The wall clock as of the store's creation, advanced by the CPU's time-stamp counter
/// (through `quanta`; the OS monotonic clock where there is none). Reading it costs a few ns
/// instead of the ~25-50 ns of `SystemTime::now` on a VM, which is a large share of an embedded
/// decision; and it never jumps when NTP steps the wall clock. The default clock of
/// [`crate::MemoryStore`] (only this process compares its timestamps).
#[derive(Debug, Clone)]
pub struct FastClock {
    base_us: Timestamp,
    clock: quanta::Clock,
    start_raw: u64,
}

impl FastClock {
    /// A clock anchored at the wall clock now.
    pub fn new() -> Self {
        let clock = quanta::Clock::new();
        Self {
            base_us: SystemClock.now(),
            start_raw: clock.raw(),
            clock,
        }
    }

    /// Now, in µs since the epoch: the raw counter scaled to ns since creation (no
    /// `Duration` on the way).
    #[inline]
    pub fn now_us(&self) -> Timestamp {
        self.base_us + self.clock.delta_as_nanos(self.start_raw, self.clock.raw()) / 1000
    }
}

impl Default for FastClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for FastClock {
    fn now(&self) -> Timestamp {
        self.now_us()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fast_clock_follows_the_wall_clock() {
        let fast = FastClock::new();
        let (a, wall, b) = (fast.now(), SystemClock.now(), fast.now());
        assert!(a <= b);
        // Close to the wall clock right after creation. The bound leaves room for the
        // calibration and for a busy machine descheduling this thread between the reads (50 ms
        // was seen exceeded under a parallel build); a wrong epoch or unit is off by far more.
        assert!(wall.abs_diff(a) < 1_000_000, "fast {a} wall {wall}");
    }
}
