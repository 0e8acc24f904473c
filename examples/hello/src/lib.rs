//! The guide's `/hello` service behind the sluice layer, as a library so tests and benchmarks
//! run exactly what the binary runs.
//!
//! Limits: a token bucket named `burst` of 10 refilled at 5/s (so `RateLimit-Policy:
//! "burst";q=10;w=2`), per API key (`x-api-key`, hashed) and per client IP for anonymous
//! clients. `--no-limiter` serves the same app without the layer, `--capacity` / `--rate`
//! change the bucket and `--mode leased` spends slices of it in-process, so a benchmark can
//! compare them.
#![forbid(unsafe_code)]

use std::future::Future;
use std::net::SocketAddr;

use axum::Router;
use axum::routing::get;
use sluice::core::PolicyError;
use sluice::{Algorithm, DecisionMode, Limiter, Policy, Rate};
use sluice_http::{IdentitySource, RateLimitLayer, TrustedProxies};

/// What the service limits, and how.
#[derive(Debug, Clone)]
pub struct Limits {
    /// Bucket capacity (default 10).
    pub capacity: u64,
    /// Refill rate (default 5/s).
    pub rate: Rate,
    /// Peers allowed to set forwarding headers (default none).
    pub trusted_proxies: TrustedProxies,
    /// Exact (default) or leased (`docs/leased-mode.md`).
    pub mode: DecisionMode,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            capacity: 10,
            rate: Rate::per_second(5),
            trusted_proxies: TrustedProxies::None,
            mode: DecisionMode::Exact,
        }
    }
}

/// Parses `5/s`, `300/min`, or a bare number of requests per second.
pub fn parse_rate(s: &str) -> Result<Rate, PolicyError> {
    match s.trim().parse::<u64>() {
        Ok(n) if n > 0 => Ok(Rate::per_second(n)),
        _ => s.parse(),
    }
}

/// `GET /hello` -> `{"ok": true}`.
pub fn routes() -> Router {
    Router::new().route(
        "/hello",
        get(|| async { axum::Json(serde_json::json!({ "ok": true })) }),
    )
}

/// The layer of the guide: policy `burst`, API key first, then the client IP.
pub fn layer(limiter: Limiter, limits: &Limits) -> Result<RateLimitLayer, PolicyError> {
    let mut burst = Policy::new(
        "burst",
        Algorithm::TokenBucket {
            capacity: limits.capacity,
            rate: limits.rate,
        },
    )?;
    burst.mode = limits.mode;
    burst.validate()?;
    Ok(RateLimitLayer::builder(limiter)
        .policy(burst)
        .identity(IdentitySource::api_key("x-api-key"))
        .trusted_proxies(limits.trusted_proxies.clone())
        .build())
}

/// The app: the routes behind the layer, or bare when `limiter` is `None`.
pub fn app(limiter: Option<Limiter>, limits: &Limits) -> Result<Router, PolicyError> {
    Ok(match limiter {
        Some(l) => routes().layer(layer(l, limits)?),
        None => routes(),
    })
}

/// Serves `app` on `listener` until `shutdown` completes, with socket peers visible to the
/// layer (the client IP fallback needs them).
pub async fn serve(
    listener: tokio::net::TcpListener,
    app: Router,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    axum::serve(
        listener,
        app.into_make_service_with_connect_info::<SocketAddr>(),
    )
    .with_graceful_shutdown(shutdown)
    .await
}
