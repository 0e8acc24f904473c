//! What the tower layer adds to one request, in process: ns per `/hello` request through an
//! axum router with and without [`sluice_http::RateLimitLayer`] on the embedded store (allowed
//! path: a limit of 1e9, one API key). No sockets, so the difference between the two rows is
//! the layer and the limiter (identity, key, check, headers), which is the part of the HTTP
//! cost `docs/benchmarks.md` ("HTTP exact mode: the profile") profiles.
//!
//! `cargo bench -p sluice-http --bench layer` (set `SLUICE_BENCH_QUICK=1` for short runs).
#![forbid(unsafe_code)]

use std::net::SocketAddr;
use std::time::Duration;

use axum::Router;
use axum::extract::ConnectInfo;
use axum::routing::get;
use criterion::{Criterion, criterion_group};
use http::Request;
use http_body_util::BodyExt;
use sluice::{Algorithm, Limiter, Policy, Rate};
use sluice_http::{IdentitySource, RateLimitLayer};
use tower::ServiceExt;

fn routes() -> Router {
    Router::new().route("/hello", get(|| async { "{\"ok\":true}" }))
}

fn limited() -> Router {
    let policy = Policy::new(
        "burst",
        Algorithm::TokenBucket {
            capacity: 1_000_000_000,
            rate: Rate::per_second(1_000_000_000),
        },
    )
    .expect("valid policy");
    routes().layer(
        RateLimitLayer::builder(Limiter::memory())
            .policy(policy)
            .identity(IdentitySource::api_key("x-api-key"))
            .build(),
    )
}

fn request() -> Request<axum::body::Body> {
    let peer: SocketAddr = ([127, 0, 0, 1], 40_000).into();
    let mut req = Request::get("/hello")
        .header("x-api-key", "K")
        .body(axum::body::Body::empty())
        .expect("valid request");
    req.extensions_mut().insert(ConnectInfo(peer));
    req
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
}

fn one(rt: &tokio::runtime::Runtime, app: &Router) -> bytes::Bytes {
    rt.block_on(async {
        let res = app.clone().oneshot(request()).await.expect("infallible");
        assert!(res.status().is_success());
        res.into_body().collect().await.expect("body").to_bytes()
    })
}

fn apps() -> [(&'static str, Router); 2] {
    [("no_limiter", routes()), ("memory_allowed", limited())]
}

fn bench(c: &mut Criterion) {
    let rt = runtime();
    let mut group = c.benchmark_group("layer");
    for (name, app) in apps() {
        group.bench_function(name, |b| b.iter(|| one(&rt, &app)));
    }
    group.finish();
}

/// `SLUICE_LAYER_ITERS=N SLUICE_LAYER_APP=<row>`: only N requests through that row, no
/// criterion, for counting instructions under `valgrind --tool=callgrind` (two runs of
/// different N give instructions per request, free of the noise of a shared machine).
fn fixed_count() -> bool {
    let Some(n) = std::env::var("SLUICE_LAYER_ITERS")
        .ok()
        .and_then(|n| n.parse::<u64>().ok())
    else {
        return false;
    };
    let row = std::env::var("SLUICE_LAYER_APP").unwrap_or_else(|_| "memory_allowed".into());
    let rt = runtime();
    let (_, app) = apps()
        .into_iter()
        .find(|(name, _)| *name == row)
        .expect("SLUICE_LAYER_APP names a row");
    for _ in 0..n {
        std::hint::black_box(one(&rt, &app));
    }
    true
}

fn config() -> Criterion {
    let quick = std::env::var_os("SLUICE_BENCH_QUICK").is_some();
    Criterion::default()
        .warm_up_time(Duration::from_secs(if quick { 1 } else { 2 }))
        .measurement_time(Duration::from_secs(if quick { 2 } else { 5 }))
        .sample_size(if quick { 20 } else { 50 })
}

criterion_group! { name = benches; config = config(); targets = bench }

fn main() {
    if fixed_count() {
        return;
    }
    benches();
    Criterion::default().configure_from_args().final_summary();
}
