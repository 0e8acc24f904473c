//! The embedded store side by side with `governor` (issue 7, benchmark 1), in one run.
//!
//! Rows: ns per decision for
//! - `algorithm/*`: the pure functions of `sluice_core::algorithm` (no store, no clock);
//! - `hot/<threads>t/<path>/<impl>`: one key, 1 or 2 threads, allowed or denied path;
//! - `keys100k/<threads>t/<path>/<impl>`: 100 000 pre-built keys visited in a scrambled order.
//!
//! `<impl>`: `sluice_gcra` and `sluice_tb` are `MemoryStore::check_one` on a prepared key (what
//! `Store::check_one` runs, the store call the facade makes for a request of one policy; the
//! facade adds key building, see `facade/*`); `*_vec` is `MemoryStore::check_now` with one
//! item (what `Store::check`, the multi-limit call, costs for one limit: the same decision and
//! its one-element result `Vec`); `governor_gcra` is governor's keyed limiter
//! (`DefaultKeyedRateLimiter<String>`, DashMap + quanta clock).
//! With 2 threads each thread makes `iters` decisions and the row is the wall time divided by
//! `iters`: the per-thread cost when two cores decide at once.
//!
//! `cargo bench -p sluice-bench --bench embedded` (set `SLUICE_BENCH_QUICK=1` for short runs).
#![forbid(unsafe_code)]

use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion, criterion_group};
use governor::{Quota, RateLimiter};
use sluice_core::algorithm::{fixed_window, gcra, sliding_window_counter, token_bucket};
use sluice_core::{Algorithm, CheckItem, Rate};
use sluice_memory::MemoryStore;

const T0: u64 = 1_700_000_000_000_000;
const KEYS: usize = 100_000;

/// A decision maker under test: `decide(i)` decides for key number `i` (mod its key count).
trait Decider: Send + Sync {
    fn decide(&self, i: usize) -> bool;
}

struct Sluice {
    store: MemoryStore,
    algorithm: Algorithm,
    keys: Vec<String>,
}

impl Decider for Sluice {
    #[inline]
    fn decide(&self, i: usize) -> bool {
        let key = &self.keys[i % self.keys.len()];
        self.store
            .check_one(&CheckItem {
                key,
                algorithm: &self.algorithm,
                cost: 1,
            })
            .allowed
    }
}

/// The multi-limit call with one item: the same decision in a `MultiDecision`.
struct SluiceVec(Sluice);

impl Decider for SluiceVec {
    #[inline]
    fn decide(&self, i: usize) -> bool {
        let s = &self.0;
        let key = &s.keys[i % s.keys.len()];
        s.store
            .check_now(&[CheckItem {
                key,
                algorithm: &s.algorithm,
                cost: 1,
            }])
            .allowed
    }
}

struct Governor {
    limiter: governor::DefaultKeyedRateLimiter<String>,
    keys: Vec<String>,
}

impl Decider for Governor {
    #[inline]
    fn decide(&self, i: usize) -> bool {
        self.limiter
            .check_key(&self.keys[i % self.keys.len()])
            .is_ok()
    }
}

fn keys(n: usize) -> Vec<String> {
    (0..n).map(|i| format!("rl:{{user:{i}}}:bench")).collect()
}

#[derive(Clone, Copy, PartialEq)]
enum Path {
    Allowed,
    Denied,
}

fn sluice(algorithm: &str, path: Path, nkeys: usize) -> Sluice {
    let algorithm = match (algorithm, path) {
        // Never limited during a run, and the state never back to initial (so it stays held,
        // as governor keeps every key): 1/s with a burst of 1e9.
        ("gcra", Path::Allowed) => Algorithm::Gcra {
            rate: Rate::per_second(1),
            burst: 1_000_000_000,
        },
        ("tb", Path::Allowed) => Algorithm::TokenBucket {
            capacity: 1_000_000_000,
            rate: Rate::per_second(1),
        },
        // Limited after the first decision per key: 1 per hour.
        ("gcra", Path::Denied) => Algorithm::Gcra {
            rate: Rate::new(1, 3_600_000),
            burst: 0,
        },
        ("tb", Path::Denied) => Algorithm::TokenBucket {
            capacity: 1,
            rate: Rate::new(1, 3_600_000),
        },
        _ => unreachable!(),
    };
    algorithm.validate().unwrap();
    let s = Sluice {
        store: MemoryStore::new(),
        algorithm,
        keys: keys(nkeys),
    };
    prime(&s, path);
    s
}

fn governor(path: Path, nkeys: usize) -> Governor {
    let quota = match path {
        Path::Allowed => Quota::per_second(NonZeroU32::new(1).unwrap())
            .allow_burst(NonZeroU32::new(1_000_000_000).unwrap()),
        Path::Denied => Quota::per_hour(NonZeroU32::new(1).unwrap()),
    };
    let g = Governor {
        limiter: RateLimiter::keyed(quota),
        keys: keys(nkeys),
    };
    prime(&g, path);
    g
}

/// Touches every key once so the timed loop measures the steady state (keys present; on the
/// denied path every key already used up).
fn prime(d: &dyn Decider, path: Path) {
    let n = KEYS.max(1);
    for i in 0..n {
        let ok = d.decide(i);
        if path == Path::Allowed {
            assert!(ok, "allowed path was limited");
        }
    }
    if path == Path::Denied {
        assert!(!d.decide(0), "denied path admitted");
    }
}

/// Scrambles the visiting order over the keys (a multiplicative step coprime with KEYS).
#[inline]
fn index(i: u64, nkeys: usize) -> usize {
    if nkeys == 1 {
        0
    } else {
        (i.wrapping_mul(40_503) % nkeys as u64) as usize
    }
}

fn run(d: &Arc<dyn Decider>, iters: u64, threads: usize, nkeys: usize) -> Duration {
    if threads == 1 {
        let start = Instant::now();
        for i in 0..iters {
            std::hint::black_box(d.decide(index(i, nkeys)));
        }
        return start.elapsed();
    }
    let barrier = Arc::new(std::sync::Barrier::new(threads));
    let start = Instant::now();
    let handles: Vec<_> = (0..threads)
        .map(|t| {
            let (d, barrier) = (Arc::clone(d), Arc::clone(&barrier));
            std::thread::spawn(move || {
                barrier.wait();
                let offset = t as u64 * 7_919;
                for i in 0..iters {
                    std::hint::black_box(d.decide(index(i + offset, nkeys)));
                }
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    start.elapsed()
}

fn stores(c: &mut Criterion) {
    for (group, nkeys) in [("hot", 1usize), ("keys100k", KEYS)] {
        for threads in [1usize, 2] {
            for (path, pname) in [(Path::Allowed, "allowed"), (Path::Denied, "denied")] {
                let mut g = c.benchmark_group(format!("{group}/{threads}t/{pname}"));
                let impls: Vec<(&str, Arc<dyn Decider>)> = vec![
                    ("governor_gcra", Arc::new(governor(path, nkeys))),
                    ("sluice_gcra", Arc::new(sluice("gcra", path, nkeys))),
                    ("sluice_tb", Arc::new(sluice("tb", path, nkeys))),
                    (
                        "sluice_gcra_vec",
                        Arc::new(SluiceVec(sluice("gcra", path, nkeys))),
                    ),
                    (
                        "sluice_tb_vec",
                        Arc::new(SluiceVec(sluice("tb", path, nkeys))),
                    ),
                ];
                for (name, d) in &impls {
                    g.bench_function(BenchmarkId::from_parameter(name), |b| {
                        b.iter_custom(|iters| run(d, iters, threads, nkeys))
                    });
                }
                g.finish();
            }
        }
    }
}

fn algorithms(c: &mut Criterion) {
    let mut g = c.benchmark_group("algorithm");
    let rate = Rate::per_second(5);
    let tb_state = token_bucket::State {
        tokens: 5 * 200,
        last_ms: T0 / 1000,
    };
    g.bench_function("token_bucket", |b| {
        let mut now = T0;
        b.iter(|| {
            now += 1000;
            std::hint::black_box(token_bucket::decide(
                Some(std::hint::black_box(&tb_state)),
                10,
                rate,
                now,
                1,
            ))
        })
    });
    let gcra_state = gcra::State { tat: T0 };
    g.bench_function("gcra", |b| {
        let mut now = T0;
        b.iter(|| {
            now += 1000;
            std::hint::black_box(gcra::decide(
                Some(std::hint::black_box(&gcra_state)),
                rate,
                9,
                now,
                1,
            ))
        })
    });
    let fw_state = fixed_window::State {
        window_start: T0 / 1000,
        count: 3,
    };
    g.bench_function("fixed_window", |b| {
        let mut now = T0;
        b.iter(|| {
            now += 1;
            std::hint::black_box(fixed_window::decide(
                Some(std::hint::black_box(&fw_state)),
                10,
                1000,
                now,
                1,
            ))
        })
    });
    let swc_state = sliding_window_counter::State {
        window_start: T0 / 1000,
        curr: 3,
        prev: 4,
    };
    g.bench_function("sliding_window_counter", |b| {
        let mut now = T0;
        b.iter(|| {
            now += 1;
            std::hint::black_box(sliding_window_counter::decide(
                Some(std::hint::black_box(&swc_state)),
                10,
                1000,
                now,
                1,
            ))
        })
    });
    // What every embedded decision pays before any algorithm: the clock and the keyed hash.
    let clock = sluice_core::SystemClock;
    g.bench_function("system_clock_now", |b| {
        b.iter(|| sluice_core::Clock::now(&clock))
    });
    let fast = sluice_memory::FastClock::new();
    g.bench_function("fast_clock_now", |b| {
        b.iter(|| sluice_core::Clock::now(&fast))
    });
    let hasher = std::hash::RandomState::new();
    let key = "rl:{user:12345}:bench".to_string();
    g.bench_function("siphash_key", |b| {
        b.iter(|| std::hash::BuildHasher::hash_one(&hasher, std::hint::black_box(key.as_str())))
    });
    // governor's own per-check cost on one direct (unkeyed) limiter, for scale.
    let direct = RateLimiter::direct(
        Quota::per_second(NonZeroU32::new(1_000_000_000).unwrap())
            .allow_burst(NonZeroU32::new(1_000_000_000).unwrap()),
    );
    g.bench_function("governor_direct_check", |b| {
        b.iter(|| std::hint::black_box(direct.check().is_ok()))
    });
    g.finish();
}

fn facade(c: &mut Criterion) {
    // The whole `sluice::Limiter` on the memory store: key building, the breaker, metrics.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let limiter = sluice::Limiter::memory();
    let policy = Arc::new(
        sluice::Policy::new(
            "bench",
            Algorithm::Gcra {
                rate: Rate::per_second(1_000_000),
                burst: 1_000_000_000,
            },
        )
        .unwrap(),
    );
    let ids: Vec<sluice::Identity> = (0..1000)
        .map(|i| sluice::Identity::new(format!("user:{i}")))
        .collect();
    let mut g = c.benchmark_group("facade");
    g.bench_function("limiter_check_gcra_1k_ids", |b| {
        let mut i = 0usize;
        b.iter(|| {
            i = (i + 1) % ids.len();
            rt.block_on(limiter.check(&ids[i], &policy, 1)).allowed
        })
    });
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

criterion_group! { name = benches; config = config(); targets = algorithms, stores, facade }

/// `SLUICE_BENCH_LOOP=<group>/<path>/<impl>:<iterations>` (say
/// `keys100k/allowed/sluice_gcra:200000`): builds and primes that one decision maker, then
/// makes `iterations` decisions on one thread and exits, without criterion. For counting
/// tools that do not depend on the machine's load (`valgrind --tool=cachegrind`: instructions
/// and cache misses per decision, as the difference of two runs of different lengths).
fn bounded_loop(spec: &str) {
    let (row, iters) = spec
        .rsplit_once(':')
        .expect("SLUICE_BENCH_LOOP is <group>/<path>/<impl>:<iterations>");
    let iters: u64 = iters.parse().expect("iterations");
    let parts: Vec<&str> = row.split('/').collect();
    let [group, path, name] = parts[..] else {
        panic!("SLUICE_BENCH_LOOP row is <group>/<path>/<impl>, not {row}");
    };
    let nkeys = if group == "hot" { 1 } else { KEYS };
    let path = if path == "denied" {
        Path::Denied
    } else {
        Path::Allowed
    };
    let d: Arc<dyn Decider> = match name {
        "governor_gcra" => Arc::new(governor(path, nkeys)),
        "sluice_gcra" => Arc::new(sluice("gcra", path, nkeys)),
        "sluice_tb" => Arc::new(sluice("tb", path, nkeys)),
        "sluice_gcra_vec" => Arc::new(SluiceVec(sluice("gcra", path, nkeys))),
        "sluice_tb_vec" => Arc::new(SluiceVec(sluice("tb", path, nkeys))),
        other => panic!("no decision maker {other}"),
    };
    let took = run(&d, iters, 1, nkeys);
    eprintln!("{row}: {iters} decisions in {took:?}");
}

fn main() {
    if let Ok(spec) = std::env::var("SLUICE_BENCH_LOOP") {
        return bounded_loop(&spec);
    }
    benches();
    Criterion::default().configure_from_args().final_summary();
}
