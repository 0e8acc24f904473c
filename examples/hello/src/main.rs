//! `sluice-example-hello`: argument parsing only; the service is in the library.
//!
//! ```text
//! cargo run -p sluice-example-hello -- --listen 127.0.0.1:8011 [--store redis://127.0.0.1:6379]
//! ```
#![forbid(unsafe_code)]

use std::process::ExitCode;

use clap::Parser;
use sluice::{Limiter, StoreOptions};
use sluice_example_hello::{Limits, app, parse_rate, serve};
use sluice_http::TrustedProxies;

/// The guide's /hello service behind the sluice rate limiter.
#[derive(Debug, Parser)]
#[command(version)]
struct Args {
    /// Address to listen on.
    #[arg(long, env = "SLUICE_LISTEN", default_value = "127.0.0.1:8011")]
    listen: String,
    /// Store URL: `memory` (embedded), `redis://host:port`, `redis+cluster://h:p,h:p`.
    #[arg(long, env = "SLUICE_STORE", default_value = "memory")]
    store: String,
    /// Serve without the limiter (for benchmarks).
    #[arg(long)]
    no_limiter: bool,
    /// Bucket capacity.
    #[arg(long, default_value_t = 10)]
    capacity: u64,
    /// Refill rate: `5/s`, `300/min`, or requests per second.
    #[arg(long, default_value = "5/s")]
    rate: String,
    /// `exact` (one store call per request) or `leased` (slices spent in-process; see
    /// docs/leased-mode.md).
    #[arg(long, default_value = "exact", value_parser = ["exact", "leased"])]
    mode: String,
    /// Trusted proxy networks (CIDR, comma-separated); only they may set X-Forwarded-For.
    #[arg(long, env = "SLUICE_TRUSTED_PROXIES", value_delimiter = ',')]
    trusted_proxy: Vec<String>,
}

#[tokio::main]
async fn main() -> ExitCode {
    let args = Args::parse();
    match run(args).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("sluice-example-hello: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn run(args: Args) -> Result<(), Box<dyn std::error::Error>> {
    let limits = Limits {
        capacity: args.capacity,
        rate: parse_rate(&args.rate)?,
        mode: if args.mode == "leased" {
            sluice::DecisionMode::leased()
        } else {
            sluice::DecisionMode::Exact
        },
        trusted_proxies: if args.trusted_proxy.is_empty() {
            TrustedProxies::None
        } else {
            TrustedProxies::cidrs(&args.trusted_proxy)?
        },
    };
    let limiter = if args.no_limiter {
        None
    } else {
        Some(Limiter::connect(&args.store, StoreOptions::default()).await?)
    };
    let app = app(limiter.clone(), &limits)?;
    let listener = tokio::net::TcpListener::bind(&args.listen).await?;
    let store = if args.no_limiter {
        "off".to_string()
    } else {
        args.store.parse::<sluice::StoreUrl>()?.to_string()
    };
    println!(
        "listening on http://{} (limiter: {store})",
        listener.local_addr()?
    );
    serve(listener, app, async {
        let _ = tokio::signal::ctrl_c().await;
    })
    .await?;
    // Units held in leased slices go back to the store.
    if let Some(l) = limiter {
        l.shutdown().await;
    }
    Ok(())
}
