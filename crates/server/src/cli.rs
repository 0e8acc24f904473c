//! `sluice serve` and `sluice validate`: arguments and entry points, so the binary only parses
//! flags and calls these.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;

use crate::config::{CheckOptions, Config, ListenerOverrides};
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
    /// Separate admin listener (`/metrics`, `/admin/*`); overrides server.admin.
    #[arg(long, value_name = "ADDR")]
    pub admin: Option<SocketAddr>,
}

/// `sluice validate`.
#[derive(Debug, Clone, Args)]
pub struct ValidateArgs {
    /// The configuration file to check.
    #[arg(long, short = 'c')]
    pub config: PathBuf,
    /// Check the file without its secrets: an `env:NAME` whose variable is unset is not an
    /// error (for CI or a workstation without the production environment).
    #[arg(long)]
    pub no_secrets: bool,
}

/// Loads the configuration `args` name, with the listener flags applied; refuses admin
/// endpoints exposed beyond loopback without a token.
pub fn load(args: &ServeArgs) -> Result<Config, ServeError> {
    let mut config = match &args.config {
        Some(path) => Config::load(path)?,
        None => Config::parse("", "<defaults>", None)?,
    };
    config.override_listeners(ListenerOverrides {
        http: args.http,
        grpc: args.grpc,
        proxy: args.proxy,
        admin: args.admin,
    });
    config.check_exposure()?;
    Ok(config)
}

/// Runs `sluice serve` until SIGTERM or ctrl-c.
pub async fn serve(args: ServeArgs) -> Result<(), ServeError> {
    let config = load(&args)?;
    for warning in config.warnings() {
        tracing::warn!("{warning}");
    }
    let listeners = Listeners::bind(&config).await?;
    crate::run(config, listeners, crate::shutdown_signal()).await
}

/// `1 policy`, `2 policies`.
pub fn plural(n: usize, one: &str, many: &str) -> String {
    format!("{n} {}", if n == 1 { one } else { many })
}

/// The line `sluice validate` prints for a valid file.
pub fn summary(file: &std::path::Path, c: &Config) -> String {
    format!(
        "{}: ok ({}, {}, {}, store {})",
        file.display(),
        plural(c.policies.len(), "policy", "policies"),
        plural(c.routes.len(), "route", "routes"),
        plural(c.domains.names().count(), "Envoy domain", "Envoy domains"),
        sluice::url::redact(&c.store.url)
    )
}

/// Runs `sluice validate`: prints each error as `FILE:LINE: field: message` on stderr and
/// exits 1, or prints any warnings (`FILE: warning: ...`, on stderr) and a summary and exits 0.
pub fn validate(args: ValidateArgs) -> ExitCode {
    let options = CheckOptions {
        skip_env_secrets: args.no_secrets,
    };
    match Config::load_with(&args.config, options) {
        Ok(c) => {
            // Advice, not errors: the file is valid and the exit status stays 0.
            for warning in c.warnings() {
                eprintln!("{}: warning: {warning}", args.config.display());
            }
            println!("{}", summary(&args.config, &c));
            ExitCode::SUCCESS
        }
        Err(errors) => {
            for e in &errors.0 {
                eprintln!("{e}");
            }
            eprintln!(
                "{}: {}",
                args.config.display(),
                plural(errors.0.len(), "error", "errors")
            );
            ExitCode::from(1)
        }
    }
}
