//! The limiter's calls to the store: the bound each is awaited under, the circuit breaker,
//! and the accounting of failures.
//!
//! A store that bounds its own calls (its queue wait and its round trip, each under its own
//! bound: [`Store::call_bound`]) reports its own timeouts, so the limiter only guards against
//! waiting past that bound, which means this process is saturated, not that the store failed.
//! Such an overload is denied by the caller and never counts against the breaker.

use std::sync::atomic::Ordering;
use std::time::Instant;

use sluice_core::store::CheckItem;
use sluice_core::{Decision, MultiDecision, Store, StoreError};

use super::Limiter;
use crate::breaker::Admission;

impl Limiter {
    /// Awaits a store call under the right bound. A store that bounds its own calls (queue
    /// wait and round trip, [`Store::call_bound`]) reports its own timeouts; outliving its
    /// bound means this process is saturated, which is not a store failure. Otherwise the
    /// per-call timeout bounds the whole call.
    pub(super) async fn bounded<T>(
        &self,
        call: impl std::future::Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        let inner = &*self.inner;
        match inner.store.call_bound() {
            Some(bound) => tokio::time::timeout(bound, call).await.unwrap_or_else(|_| {
                Err(StoreError::Overloaded(format!(
                    "no answer within the store's call bound of {} ms",
                    bound.as_millis()
                )))
            }),
            None => tokio::time::timeout(inner.timeout, call)
                .await
                .unwrap_or_else(|_| Err(StoreError::Timeout(inner.timeout.as_millis() as u64))),
        }
    }

    /// Checks `items` in one store call ([`Store::check`]) under the breaker and the bound.
    pub(super) async fn call_store(
        &self,
        items: &[CheckItem<'_>],
    ) -> Result<MultiDecision, StoreError> {
        self.check_call(self.inner.store.check(items)).await
    }

    /// Checks one limit ([`Store::check_one`]: no result `Vec`, and the embedded store's
    /// in-place path) under the breaker and the bound.
    pub(super) async fn call_store_one(
        &self,
        item: &CheckItem<'_>,
    ) -> Result<Decision, StoreError> {
        self.check_call(self.inner.store.check_one(item)).await
    }

    /// A check call to the store: the breaker's admission, the bound, the duration metric and
    /// the accounting of its failure.
    async fn check_call<T>(
        &self,
        call: impl std::future::Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        let inner = &*self.inner;
        let start = Instant::now();
        let admission = inner.breaker.admit(start);
        if admission == Admission::Reject {
            metrics::counter!("sluice_store_errors_total", "kind" => "circuit_open").increment(1);
            return Err(StoreError::Unavailable("circuit breaker open".into()));
        }
        let result = self.bounded(call).await;
        store_duration(inner.store.kind(), start.elapsed().as_secs_f64());
        match &result {
            Ok(_) => inner.breaker.success(),
            // An invalid request says nothing about the store's health.
            Err(StoreError::Invalid(_)) => {}
            // Neither does sluice's own saturation: the call never reached the store.
            Err(StoreError::Overloaded(_)) => {
                metrics::counter!("sluice_store_queue_overloaded_total").increment(1);
                if admission == Admission::Probe {
                    // The probe never reached the store: let the next call probe.
                    inner.breaker.abandon_probe();
                }
            }
            Err(e) => {
                let kind = match e {
                    StoreError::Timeout(_) => "timeout",
                    StoreError::Unavailable(_) => "unavailable",
                    _ => "backend",
                };
                metrics::counter!("sluice_store_errors_total", "kind" => kind).increment(1);
                inner.breaker.failure(Instant::now());
            }
        }
        result
    }

    /// Counts and (at most once per interval) logs a store failure answered by `mode`
    /// (`open`, `closed` or `local`).
    pub(super) fn note_failure(&self, e: &StoreError, mode: &'static str) {
        let inner = &*self.inner;
        metrics::counter!("sluice_store_failures_total", "mode" => mode).increment(1);
        let now = inner.started.elapsed().as_millis() as u64 + 1;
        let last = inner.last_log_ms.load(Ordering::Relaxed);
        if (last == 0 || now.saturating_sub(last) >= inner.log_interval_ms)
            && inner
                .last_log_ms
                .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            if mode == "local" {
                tracing::warn!(error = %e, store = inner.store.kind(), "rate limit store failed; deciding locally");
            } else {
                tracing::warn!(error = %e, store = inner.store.kind(), "rate limit store failed; failing {mode}");
            }
        }
    }
}

/// What one store call answered, in the call's order: a call of one limit holds its decision
/// without a `Vec`.
pub(super) enum Answer {
    One(Decision),
    Many(MultiDecision),
}

impl Answer {
    /// Whether every limit of the call admitted.
    pub(super) fn allowed(&self) -> bool {
        match self {
            Answer::One(d) => d.allowed,
            Answer::Many(m) => m.allowed,
        }
    }
}

impl IntoIterator for Answer {
    type Item = Decision;
    type IntoIter = std::iter::Chain<std::option::IntoIter<Decision>, std::vec::IntoIter<Decision>>;
    fn into_iter(self) -> Self::IntoIter {
        let (one, many) = match self {
            Answer::One(d) => (Some(d), Vec::new()),
            Answer::Many(m) => (None, m.decisions),
        };
        one.into_iter().chain(many)
    }
}

/// `sluice_store_duration_seconds{store}`: a literal label per known store kind makes the
/// metric key static (no allocation per call on the check path).
fn store_duration(kind: &'static str, secs: f64) {
    match kind {
        "memory" => {
            metrics::histogram!("sluice_store_duration_seconds", "store" => "memory").record(secs)
        }
        "redis" => {
            metrics::histogram!("sluice_store_duration_seconds", "store" => "redis").record(secs)
        }
        "redis-cluster" => {
            metrics::histogram!("sluice_store_duration_seconds", "store" => "redis-cluster")
                .record(secs)
        }
        other => {
            metrics::histogram!("sluice_store_duration_seconds", "store" => other).record(secs)
        }
    }
}

#[cfg(test)]
mod tests {
    use sluice_testkit::metrics::KeyLog;

    #[test]
    fn store_duration_is_labelled_with_the_store_kind() {
        let kinds = ["memory", "redis", "redis-cluster", "another-store"];
        let log = KeyLog::default();
        metrics::with_local_recorder(&log, || {
            kinds.iter().for_each(|k| super::store_duration(k, 0.001))
        });
        let want: Vec<String> = kinds
            .iter()
            .map(|k| format!("sluice_store_duration_seconds{{store={k}}}"))
            .collect();
        assert_eq!(log.keys(), want);
    }
}
