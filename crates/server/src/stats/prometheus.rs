//! The Prometheus side of the live statistics: latency histogram buckets and the heavy-hitter
//! gauges.
//!
//! Identities never become label values: their set is unbounded, and every distinct value is
//! a new series in Prometheus. The heavy hitters are exported by rank instead
//! (`sluice_top_identity_count{list, rank}` for rank 1 to [`TOP_RANKS`]), which says how
//! concentrated the traffic is; who they are is in `/v1/stats`, behind the admin token.

use super::Stats;

/// Ranks exported as gauges, per list.
pub const TOP_RANKS: usize = 10;

/// Buckets of the decision and store-call latency histograms, seconds.
pub const LATENCY_BUCKETS_S: &[f64] = &[
    0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0,
];

/// Sets the heavy-hitter gauges from `stats` (at scrape time, not on the decision path).
pub fn set_top_gauges(stats: &Stats) {
    let (decisions, decisions_total, denials, denials_total) = stats.top(TOP_RANKS);
    for (list, top, total) in [
        ("decisions", decisions, decisions_total),
        ("denials", denials, denials_total),
    ] {
        metrics::gauge!("sluice_top_identities_total", "list" => list).set(total as f64);
        for rank in 0..TOP_RANKS {
            let count = top.get(rank).map_or(0, |c| c.count);
            metrics::gauge!("sluice_top_identity_count", "list" => list, "rank" => (rank + 1).to_string())
                .set(count as f64);
        }
    }
}

/// Every outcome a decision is counted under (`sluice_decisions_total{outcome}`).
pub const OUTCOMES: &[&str] = &[
    "allowed",
    "denied",
    "shadow_denied",
    "failed_open",
    "failed_closed",
    "overloaded",
    "banned",
    "deny_listed",
];

/// Registers, at zero, the series that dashboards query, so that a fresh instance with no
/// traffic answers every panel with 0 rather than "No data": each configured policy's
/// decision counters and latency histograms, the store's error and failure counters, the
/// reload counters, the decision API's counters and the open-connection gauges. Registering an existing series changes
/// nothing, so this runs again after each reload for the policies it added.
pub fn zero_series<'a>(policies: impl Iterator<Item = &'a str>, store: &'static str) {
    for policy in policies {
        for outcome in OUTCOMES {
            metrics::counter!("sluice_decisions_total", "policy" => policy.to_string(), "outcome" => *outcome)
                .increment(0);
        }
        let _ =
            metrics::histogram!("sluice_decision_duration_seconds", "policy" => policy.to_string());
        let _ = metrics::histogram!("sluice_store_call_duration_seconds", "policy" => policy.to_string());
    }
    let _ = metrics::histogram!("sluice_store_duration_seconds", "store" => store);
    for kind in ["timeout", "unavailable", "backend", "circuit_open"] {
        metrics::counter!("sluice_store_errors_total", "kind" => kind).increment(0);
    }
    for mode in ["open", "closed"] {
        metrics::counter!("sluice_store_failures_total", "mode" => mode).increment(0);
    }
    for result in ["ok", "error", "refused"] {
        metrics::counter!("sluice_config_reloads_total", "result" => result).increment(0);
    }
    for endpoint in ["check", "release"] {
        metrics::counter!("sluice_api_requests_total", "endpoint" => endpoint, "status" => "200")
            .increment(0);
    }
    for listener in ["http", "grpc", "proxy", "admin"] {
        metrics::gauge!("sluice_connections_open", "listener" => listener).increment(0.0);
    }
    // Set by the control plane's reader (Redis) every 250 ms; 0 on the embedded store.
    metrics::gauge!("sluice_control_snapshot_age_seconds").increment(0.0);
}

/// Describes the metrics of this module.
pub fn describe() {
    metrics::describe_histogram!(
        "sluice_decision_duration_seconds",
        "Time to decide a check, store calls included, by policy"
    );
    metrics::describe_histogram!(
        "sluice_store_call_duration_seconds",
        "Store call latency by policy of the call"
    );
    metrics::describe_gauge!(
        "sluice_top_identity_count",
        "Estimated count of the heaviest identities over the last 5 to 10 minutes, by list (decisions, denials) and rank (1 = heaviest); never by identity"
    );
    metrics::describe_gauge!(
        "sluice_control_snapshot_age_seconds",
        "Age of the control snapshot (overrides, bans, lists) checks decide from: time since it was last brought up to date with the store"
    );
    metrics::describe_gauge!(
        "sluice_top_identities_total",
        "Decisions (or denials) the heavy-hitter ranks are drawn from, over the same window"
    );
}
