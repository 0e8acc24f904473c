//! `sluice serve` and `sluice validate`: arguments and entry points, so the binary only parses
//! flags and calls these.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;

use crate::config::Config;
use crate::{Listeners, ServeError};

/// `sluice serve`.
#[derive(Debug, Clone, Args)]
pub struct ServeArgs {
    /// The configuration file (TOML; see docs/configuration.md). Without it: the embedded
    /// store, no policies, default listeners.
    #[arg(long, short = 'c', env = "SLUICE_CONFIG")]
    pub config: Option<PathBuf>,
    /// HTTP listener (decision API, metrics, health); overrides server.http.
    #[arg(long, value_name = "ADDR")]
    pub http: Option<SocketAddr>,
    /// gRPC listener (Envoy rate limit service); overrides server.grpc.
    #[arg(long, value_name = "ADDR")]
    pub grpc: Option<SocketAddr>,
    /// Reverse proxy listener (used when routes are configured); overrides server.proxy.
    #[arg(long, value_name = "ADDR")]
    pub proxy: Option<SocketAddr>,
}

/// `sluice validate`.
#[derive(Debug, Clone, Args)]
pub struct ValidateArgs {
    /// The configuration file to check.
    #[arg(long, short = 'c')]
    pub config: PathBuf,
}

/// Loads the configuration `args` name, with the listener flags applied.
pub fn load(args: &ServeArgs) -> Result<Config, ServeError> {
    let mut config = match &args.config {
        Some(path) => Config::load(path)?,
        None => Config::parse("", "<defaults>", None)?,
    };
    if let Some(a) = args.http {
        config.server.http = a;
    }
    if let Some(a) = args.grpc {
        config.server.grpc = a;
    }
    if let Some(a) = args.proxy {
        config.server.proxy = a;
    }
    Ok(config)
}

/// Runs `sluice serve` until SIGTERM or ctrl-c.
pub async fn serve(args: ServeArgs) -> Result<(), ServeError> {
    let config = load(&args)?;
    let listeners = Listeners::bind(&config).await?;
    crate::run(config, listeners, crate::shutdown_signal()).await
}

/// Runs `sluice validate`: prints each error as `FILE:LINE: field: message` on stderr and
/// exits 1, or prints a summary and exits 0.
pub fn validate(args: ValidateArgs) -> ExitCode {
    match Config::load(&args.config) {
        Ok(c) => {
            let domains = c.domains.names().count();
            println!(
                "{}: ok ({} policies, {} routes, {} Envoy domains, store {})",
                args.config.display(),
                c.policies.len(),
                c.routes.len(),
                domains,
                sluice::url::redact(&c.store.url)
            );
            ExitCode::SUCCESS
        }
        Err(errors) => {
            for e in &errors.0 {
                eprintln!("{e}");
            }
            eprintln!(
                "{}: {} error{}",
                args.config.display(),
                errors.0.len(),
                if errors.0.len() == 1 { "" } else { "s" }
            );
            ExitCode::from(1)
        }
    }
}
