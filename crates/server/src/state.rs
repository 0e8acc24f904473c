//! What every listener shares: the running configuration with its limiter, swapped whole on
//! reload, and the metrics recorder.
//!
//! A request takes one [`Runtime`] snapshot at its start and uses it to the end, so a reload
//! never mixes two configurations inside one decision. The limiter (and with it the embedded
//! store's state) is carried over to the new configuration unless the store settings changed.

use std::sync::Arc;
use std::sync::OnceLock;
use std::time::Duration;

use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use parking_lot::RwLock;
use sluice::core::store::CheckItem;
use sluice::{Algorithm, Limiter, StoreError};

use crate::config::Config;

/// One configuration generation and the limiter serving it.
#[derive(Debug)]
pub struct Runtime {
    /// The checked configuration.
    pub config: Arc<Config>,
    /// The limiter on the configured store.
    pub limiter: Limiter,
    /// Starts at 1; each successful reload adds 1.
    pub generation: u64,
}

#[derive(Debug)]
struct Inner {
    current: RwLock<Arc<Runtime>>,
    reload: tokio::sync::Mutex<()>,
    metrics: Option<PrometheusHandle>,
    stats: Arc<crate::stats::Stats>,
    telemetry: crate::telemetry::Telemetry,
}

/// The shared state of a running server. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Shared(Arc<Inner>);

impl Shared {
    /// State serving `config` with `limiter`.
    pub fn new(config: Config, limiter: Limiter) -> Self {
        limiter.control().configure(config.control.clone());
        let stats = Arc::new(crate::stats::Stats::new());
        limiter.set_observer(Arc::new(crate::telemetry::Recording(stats.clone())));
        let rt = Runtime {
            config: Arc::new(config),
            limiter,
            generation: 1,
        };
        // The recorder first, so the series below are recorded from the first second.
        let metrics = metrics_handle();
        metrics::gauge!("sluice_config_generation").set(1.0);
        zero_series(&rt);
        let telemetry = crate::telemetry::Telemetry::new(&rt.config.telemetry);
        Shared(Arc::new(Inner {
            current: RwLock::new(Arc::new(rt)),
            reload: tokio::sync::Mutex::new(()),
            metrics,
            stats,
            telemetry,
        }))
    }

    /// The current configuration and limiter.
    pub fn runtime(&self) -> Arc<Runtime> {
        Arc::clone(&self.0.current.read())
    }

    /// Replaces the running configuration; returns the new generation.
    pub fn install(&self, config: Config, limiter: Limiter) -> u64 {
        limiter.control().configure(config.control.clone());
        // A carried-over limiter keeps the observer it has.
        limiter.set_observer(Arc::new(crate::telemetry::Recording(self.0.stats.clone())));
        self.0.telemetry.configure(&config.telemetry);
        // A denial remembered under the old policies may not hold under the new ones.
        limiter.forget_denials();
        let mut cur = self.0.current.write();
        let generation = cur.generation + 1;
        *cur = Arc::new(Runtime {
            config: Arc::new(config),
            limiter,
            generation,
        });
        metrics::gauge!("sluice_config_generation").set(generation as f64);
        zero_series(&cur);
        generation
    }

    /// The live statistics (console, `/v1/stats`, `sluice top`), kept across reloads.
    pub fn stats(&self) -> &Arc<crate::stats::Stats> {
        &self.0.stats
    }

    /// Decision tracing (`[telemetry]`), reconfigured on reload.
    pub fn telemetry(&self) -> &crate::telemetry::Telemetry {
        &self.0.telemetry
    }

    /// Serializes reloads (SIGHUP, file change and `/admin/reload` may race).
    pub(crate) async fn reload_guard(&self) -> tokio::sync::MutexGuard<'_, ()> {
        self.0.reload.lock().await
    }

    /// The Prometheus text of every metric, if this process's recorder is ours.
    pub fn render_metrics(&self) -> Option<String> {
        // Store-side counters are read when scraped rather than pushed on every decision.
        for (kind, count) in self.runtime().limiter.store().evictions() {
            metrics::counter!("sluice_store_evictions_total", "kind" => kind).absolute(count);
        }
        crate::stats::prometheus::set_top_gauges(&self.0.stats);
        self.0.metrics.as_ref().map(PrometheusHandle::render)
    }
}

/// Builds the limiter a configuration asks for (connecting to its store), its control plane
/// in the same store ([`crate::config::connect_store_limiter`]: the one builder `sluice serve`
/// and the Python and Node packages share).
pub async fn build_limiter(config: &Config) -> Result<Limiter, StoreError> {
    crate::config::connect_store_limiter(config).await
}

/// [`crate::stats::prometheus::zero_series`] for the policies of `rt`.
fn zero_series(rt: &Runtime) {
    crate::stats::prometheus::zero_series(
        rt.config.policies.keys().map(String::as_str),
        rt.limiter.store().kind(),
    );
}

/// Asks the store a question that writes nothing (a cost-0 peek on a probe key) to learn
/// whether it answers within its timeout.
pub async fn probe_store(limiter: &Limiter, timeout: Duration) -> Result<(), StoreError> {
    let key = format!("{}:{{sluice:readyz}}:probe", limiter.key_scheme().prefix());
    let algorithm = Algorithm::FixedWindow {
        limit: 1,
        window_ms: 1000,
    };
    let item = CheckItem {
        key: &key,
        algorithm: &algorithm,
        cost: 0,
    };
    match tokio::time::timeout(timeout, limiter.store().check(&[item])).await {
        Ok(r) => r.map(|_| ()),
        Err(_) => Err(StoreError::Timeout(timeout.as_millis() as u64)),
    }
}

/// The process-wide Prometheus recorder, installed on first use. `None` when another
/// recorder was installed first (an embedding application's own).
pub fn metrics_handle() -> Option<PrometheusHandle> {
    static HANDLE: OnceLock<Option<PrometheusHandle>> = OnceLock::new();
    HANDLE
        .get_or_init(|| {
            let builder = PrometheusBuilder::new()
                .set_buckets_for_metric(
                    Matcher::Full("sluice_store_duration_seconds".into()),
                    &[
                        0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
                    ],
                )
                .ok()?
                .set_buckets_for_metric(
                    Matcher::Full("sluice_decision_duration_seconds".into()),
                    crate::stats::prometheus::LATENCY_BUCKETS_S,
                )
                .ok()?
                .set_buckets_for_metric(
                    Matcher::Full("sluice_store_call_duration_seconds".into()),
                    crate::stats::prometheus::LATENCY_BUCKETS_S,
                )
                .ok()?;
            let recorder = builder.build_recorder();
            let handle = recorder.handle();
            metrics::set_global_recorder(recorder).ok()?;
            describe_metrics();
            crate::stats::prometheus::describe();
            Some(handle)
        })
        .clone()
}

fn describe_metrics() {
    metrics::describe_counter!(
        "sluice_store_evictions_total",
        "Embedded store entries dropped before they expired: at_rest (no information lost) or informative (kept in the policy's conservative summary)"
    );
    metrics::describe_counter!(
        "sluice_decisions_total",
        "Rate limit decisions by policy and outcome (allowed, denied, shadow_denied, failed_open, failed_closed, overloaded, banned, deny_listed)"
    );
    metrics::describe_counter!(
        "sluice_list_bypass_total",
        "Checks of an allow-listed identity, which bypass the policy's limit (also counted as allowed)"
    );
    metrics::describe_counter!(
        "sluice_bans_total",
        "Automatic bans after repeated denials, by policy"
    );
    metrics::describe_counter!(
        "sluice_near_limit_total",
        "Admitted decisions with less than 10% of the quota left"
    );
    metrics::describe_counter!(
        "sluice_store_failures_total",
        "Checks the store could not answer, by failure mode applied (open, closed)"
    );
    metrics::describe_counter!(
        "sluice_store_errors_total",
        "Store errors by kind (timeout, unavailable, backend, circuit_open)"
    );
    metrics::describe_histogram!("sluice_store_duration_seconds", "Store call latency");
    metrics::describe_counter!(
        "sluice_config_reloads_total",
        "Configuration reloads by result (ok, error, refused)"
    );
    metrics::describe_gauge!(
        "sluice_config_generation",
        "The configuration generation being served"
    );
    metrics::describe_counter!(
        "sluice_rls_requests_total",
        "Envoy ShouldRateLimit calls by domain and overall code"
    );
    metrics::describe_counter!(
        "sluice_api_requests_total",
        "Decision API calls by endpoint and status"
    );
    metrics::describe_counter!(
        "sluice_proxy_requests_total",
        "Proxied requests by route and status class"
    );
    metrics::describe_counter!(
        "sluice_connections_rejected_total",
        "Connections refused or closed by the connection limits, by listener and reason (global, per_ip, bodies_per_ip, body_too_slow, write_stall, reserve_only, accept_error, header_timeout, body_timeout, idle, displaced)"
    );
    metrics::describe_gauge!(
        "sluice_connections_open",
        "Client connections open now, by listener"
    );
}
