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
    for (name, limiter) in [
        ("check_without_stats", &plain),
        ("check_with_stats", &observed),
    ] {
        g.bench_function(name, |b| {
            let mut i = 0usize;
            b.iter(|| {
                i = (i + 1) % ids.len();
                rt.block_on(limiter.check(&ids[i], &policy, 1)).allowed
            })
        });
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
