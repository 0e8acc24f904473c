//! What the console's live statistics add to one decision: the whole `sluice::Limiter` on the
//! embedded store deciding for 1,000 identities, without an observer and with the server's
//! [`sluice_server::stats::Stats`] (per-policy rings, latency buckets, heavy hitters,
//! Prometheus histograms) set on it. Side by side in one run, so only the ratio matters.
//!
//! `cargo bench -p sluice-server --bench stats` (`SLUICE_BENCH_QUICK=1` for a short run).

use std::sync::Arc;
use std::time::Duration;

use criterion::{Criterion, criterion_group, criterion_main};
use sluice::{Algorithm, Identity, Limiter, Policy, Rate};

fn decisions(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    // The Prometheus recorder the server installs, so the histograms are really recorded.
    let _ = sluice_server::state::metrics_handle();
    let policy = Arc::new(
        Policy::new(
            "bench",
            Algorithm::Gcra {
                rate: Rate::per_second(1_000_000),
                burst: 1_000_000_000,
            },
        )
        .unwrap(),
    );
    let ids: Vec<Identity> = (0..1000)
        .map(|i| Identity::new(format!("user:{i}")))
        .collect();
    let plain = Limiter::memory();
    let observed = Limiter::memory();
    observed.set_observer(Arc::new(sluice_server::stats::Stats::new()));
    let mut g = c.benchmark_group("console_stats");
    // `round_robin`: every identity in turn, more than the heavy-hitter summary monitors, so
    // every decision replaces an entry (its worst case). `skewed`: 90% of decisions from 10
    // identities, the rest spread over 990 (a usual shape of API traffic).
    let pick = |i: usize, skewed: bool| {
        if !skewed {
            i % ids.len()
        } else if !i.is_multiple_of(10) {
            i % 10
        } else {
            10 + (i / 10) % (ids.len() - 10)
        }
    };
    for (shape, skewed) in [("round_robin", false), ("skewed", true)] {
        for (name, limiter) in [("without_stats", &plain), ("with_stats", &observed)] {
            g.bench_function(format!("{shape}/{name}"), |b| {
                let mut i = 0usize;
                b.iter(|| {
                    i = i.wrapping_add(1);
                    rt.block_on(limiter.check(&ids[pick(i, skewed)], &policy, 1))
                        .allowed
                })
            });
        }
    }
    g.finish();
}

fn config() -> Criterion {
    let quick = std::env::var_os("SLUICE_BENCH_QUICK").is_some();
    let (warm, measure, samples) = if quick {
        (300, 1000, 10)
    } else {
        (1000, 3000, 30)
    };
    Criterion::default()
        .warm_up_time(Duration::from_millis(warm))
        .measurement_time(Duration::from_millis(measure))
        .sample_size(samples)
        .without_plots()
}

criterion_group! { name = benches; config = config(); targets = decisions }
criterion_main!(benches);
