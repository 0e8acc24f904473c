//! A circuit breaker in front of the store.
//!
//! When the store is unreachable, every request would otherwise wait the full timeout before
//! its failure mode applies. After `threshold` consecutive failures the breaker opens: calls
//! fail at once for a back-off period (doubling up to a maximum), then one probe call is let
//! through; its success closes the breaker.

use parking_lot::Mutex;
use std::time::{Duration, Instant};

/// Circuit breaker settings.
#[derive(Debug, Clone, Copy)]
pub struct BreakerConfig {
    /// Consecutive failures that open the breaker.
    pub threshold: u32,
    /// First back-off.
    pub min_backoff: Duration,
    /// Longest back-off. It bounds how long enforcement stays off after the store is back, so
    /// the default is short (one probe call per 500 ms against a dead store costs nothing).
    pub max_backoff: Duration,
}

impl Default for BreakerConfig {
    fn default() -> Self {
        Self {
            threshold: 5,
            min_backoff: Duration::from_millis(250),
            max_backoff: Duration::from_millis(500),
        }
    }
}

#[derive(Debug)]
struct Inner {
    failures: u32,
    open_until: Option<Instant>,
    backoff: Duration,
    probing: bool,
}

/// The breaker's state, shared by every clone of a limiter.
#[derive(Debug)]
pub struct CircuitBreaker {
    config: BreakerConfig,
    inner: Mutex<Inner>,
}

/// Whether a call may go to the store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admission {
    /// The breaker is closed.
    Call,
    /// The breaker is half open and this call is the probe.
    Probe,
    /// The breaker is open: fail without calling.
    Reject,
}

impl CircuitBreaker {
    /// A closed breaker.
    pub fn new(config: BreakerConfig) -> Self {
        Self {
            config,
            inner: Mutex::new(Inner {
                failures: 0,
                open_until: None,
                backoff: config.min_backoff,
                probing: false,
            }),
        }
    }

    /// Asks whether a call may proceed at `now`.
    pub fn admit(&self, now: Instant) -> Admission {
        let mut g = self.inner.lock();
        match g.open_until {
            None => Admission::Call,
            Some(until) if now < until => Admission::Reject,
            Some(_) if g.probing => Admission::Reject,
            Some(_) => {
                g.probing = true;
                Admission::Probe
            }
        }
    }

    /// Records a successful call.
    pub fn success(&self) {
        let mut g = self.inner.lock();
        g.failures = 0;
        g.open_until = None;
        g.probing = false;
        g.backoff = self.config.min_backoff;
    }

    /// Records a failed call at `now`.
    pub fn failure(&self, now: Instant) {
        let mut g = self.inner.lock();
        g.failures = g.failures.saturating_add(1);
        if g.probing {
            g.probing = false;
            g.backoff = (g.backoff * 2).min(self.config.max_backoff);
            g.open_until = Some(now + g.backoff);
        } else if g.failures >= self.config.threshold && g.open_until.is_none() {
            g.backoff = self.config.min_backoff;
            g.open_until = Some(now + g.backoff);
        }
    }

    /// The probe call never reached the store (sluice itself was saturated): says nothing
    /// about the store, so the next call may probe.
    pub fn abandon_probe(&self) {
        self.inner.lock().probing = false;
    }

    /// True while calls are being rejected.
    pub fn is_open(&self) -> bool {
        self.inner.lock().open_until.is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn opens_after_threshold_and_probes_back() {
        let b = CircuitBreaker::new(BreakerConfig {
            threshold: 3,
            min_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_millis(400),
        });
        let t = Instant::now();
        for _ in 0..2 {
            assert_eq!(b.admit(t), Admission::Call);
            b.failure(t);
        }
        assert_eq!(b.admit(t), Admission::Call);
        b.failure(t);
        assert_eq!(b.admit(t), Admission::Reject);
        let t1 = t + Duration::from_millis(100);
        assert_eq!(b.admit(t1), Admission::Probe);
        assert_eq!(b.admit(t1), Admission::Reject, "only one probe at a time");
        b.failure(t1);
        // Back-off doubled to 200 ms.
        assert_eq!(b.admit(t1 + Duration::from_millis(150)), Admission::Reject);
        assert_eq!(b.admit(t1 + Duration::from_millis(200)), Admission::Probe);
        b.success();
        assert_eq!(b.admit(t1 + Duration::from_millis(200)), Admission::Call);
        assert!(!b.is_open());
    }
}
