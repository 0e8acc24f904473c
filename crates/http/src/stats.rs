//! [`RateLimitStats`]: counts of what the rate limiter of an HTTP front end did, kept by the
//! [`crate::decide::Decider`] so that the tower layer, the reverse proxy and the Python and
//! Node middleware (which all decide through it) count the same events under the same names.
//! Each event is also a `sluice_http_requests_total{outcome}` metric.

use std::sync::atomic::{AtomicU64, Ordering};

/// Counts of what the layer did, for tests, health pages and alerts (the same events are
/// also `sluice_http_requests_total{outcome}` metrics).
#[derive(Debug, Default)]
pub struct RateLimitStats {
    pub(crate) allowed: AtomicU64,
    pub(crate) denied: AtomicU64,
    pub(crate) failed_open: AtomicU64,
    pub(crate) failed_closed: AtomicU64,
    pub(crate) unlimited: AtomicU64,
    pub(crate) charged: AtomicU64,
    pub(crate) refunded: AtomicU64,
    pub(crate) refund_failed: AtomicU64,
    pub(crate) bad_path: AtomicU64,
}

/// A copy of [`RateLimitStats`] at one moment.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StatsSnapshot {
    /// Requests admitted by the limiter (shadow denials included).
    pub allowed: u64,
    /// Requests answered 429 because a limit was used up.
    pub denied: u64,
    /// Requests let through because the store failed and the policies fail open.
    pub failed_open: u64,
    /// Requests refused because the store failed and a policy fails closed.
    pub failed_closed: u64,
    /// Requests no rule applied to.
    pub unlimited: u64,
    /// Rules that count by outcome: responses whose reservation was kept (a counted status,
    /// or a stand-in for an upstream failure).
    pub charged: u64,
    /// Rules that count by outcome: responses with an uncounted status, whose reservation
    /// was given back.
    pub refunded: u64,
    /// Refunds the store failed (the request then stays counted).
    pub refund_failed: u64,
    /// Requests answered 400 because their path cannot be normalized safely.
    pub bad_path: u64,
}

impl RateLimitStats {
    /// The current counts.
    pub fn snapshot(&self) -> StatsSnapshot {
        StatsSnapshot {
            allowed: self.allowed.load(Ordering::Relaxed),
            denied: self.denied.load(Ordering::Relaxed),
            failed_open: self.failed_open.load(Ordering::Relaxed),
            failed_closed: self.failed_closed.load(Ordering::Relaxed),
            unlimited: self.unlimited.load(Ordering::Relaxed),
            charged: self.charged.load(Ordering::Relaxed),
            refunded: self.refunded.load(Ordering::Relaxed),
            refund_failed: self.refund_failed.load(Ordering::Relaxed),
            bad_path: self.bad_path.load(Ordering::Relaxed),
        }
    }

    pub(crate) fn count(&self, counter: &AtomicU64, outcome: &'static str) {
        counter.fetch_add(1, Ordering::Relaxed);
        requests_total(outcome);
    }
}

/// Writes [`requests_total`] with one literal arm per outcome, and the list of those
/// outcomes, from one list.
macro_rules! literal_outcomes {
    ($($name:literal),*) => {
        /// The outcomes [`requests_total`] has a literal label for.
        #[cfg(test)]
        const LITERAL_OUTCOMES: &[&str] = &[$($name),*];

        /// `sluice_http_requests_total{outcome}` + 1. A literal label makes the metric key a
        /// static one (no allocation per request), so each outcome the layer counts is
        /// spelled out here.
        fn requests_total(outcome: &'static str) {
            match outcome {
                $($name => metrics::counter!("sluice_http_requests_total", "outcome" => $name).increment(1),)*
                other => metrics::counter!("sluice_http_requests_total", "outcome" => other).increment(1),
            }
        }
    };
}

literal_outcomes!(
    "allowed",
    "denied",
    "control_refused",
    "failed_open",
    "failed_closed",
    "unlimited",
    "charged",
    "refunded",
    "refund_failed",
    "bad_path"
);

#[cfg(test)]
mod tests {
    use super::*;

    use crate::decide::Outcome;
    use sluice_testkit::metrics::KeyLog;

    #[test]
    fn every_outcome_is_counted_under_its_own_label() {
        let outcomes: Vec<&'static str> = LITERAL_OUTCOMES
            .iter()
            .copied()
            .chain(["some_new_outcome"])
            .collect();
        // Every outcome a decision can end in has its literal arm.
        for o in [
            Outcome::Unlimited,
            Outcome::Allowed,
            Outcome::FailedOpen,
            Outcome::Denied,
            Outcome::ControlRefused,
            Outcome::FailedClosed,
            Outcome::BadPath,
        ] {
            assert!(LITERAL_OUTCOMES.contains(&o.as_str()), "{o}");
        }
        let log = KeyLog::default();
        metrics::with_local_recorder(&log, || outcomes.iter().for_each(|o| requests_total(o)));
        let want: Vec<String> = outcomes
            .iter()
            .map(|o| format!("sluice_http_requests_total{{outcome={o}}}"))
            .collect();
        assert_eq!(log.keys(), want);
    }
}
