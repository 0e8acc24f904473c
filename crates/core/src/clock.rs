//! The clock abstraction. Every decision takes `now` as an argument; this trait is where
//! the embedded store gets it from, so tests can drive time by hand.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

/// Microseconds since the Unix epoch. Integer time keeps every algorithm exact and lets the
/// Lua scripts (whose numbers are doubles, exact to 2^53) compute the very same values.
pub type Timestamp = u64;

/// A source of the current time in microseconds since the Unix epoch.
pub trait Clock: Send + Sync + std::fmt::Debug + 'static {
    /// The current time.
    fn now(&self) -> Timestamp;
}

/// The wall clock.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    #[allow(clippy::disallowed_methods)] // the one place that reads the wall clock
    fn now(&self) -> Timestamp {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_micros() as u64)
            .unwrap_or(0)
    }
}

/// A clock that only moves when told to; for tests and simulations.
#[derive(Debug, Clone, Default)]
pub struct ManualClock(Arc<AtomicU64>);

impl ManualClock {
    /// A clock standing at `now` microseconds.
    pub fn new(now: Timestamp) -> Self {
        Self(Arc::new(AtomicU64::new(now)))
    }
    /// Sets the time.
    pub fn set(&self, now: Timestamp) {
        self.0.store(now, Ordering::SeqCst);
    }
    /// Moves the time forward by `us` microseconds.
    pub fn advance_us(&self, us: u64) {
        self.0.fetch_add(us, Ordering::SeqCst);
    }
    /// Moves the time forward by `ms` milliseconds.
    pub fn advance_ms(&self, ms: u64) {
        self.advance_us(ms * 1000);
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Timestamp {
        self.0.load(Ordering::SeqCst)
    }
}
