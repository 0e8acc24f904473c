//! The `sluice` binary: argument parsing only; the work happens in the library crates.
#![forbid(unsafe_code)]

use std::io::Write;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use sluice_cli::{admin, check, keyslot, loadtest, probe, race, top, verify};

/// The version and the commit the binary was built from (see `build.rs`).
/// mimalloc instead of the system allocator: the gRPC/HTTP stacks allocate and free per call
/// across worker threads, where glibc's malloc spends most (docs/benchmarks.md, Envoy RLS).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

const VERSION: &str = concat!(env!("CARGO_PKG_VERSION"), " (", env!("SLUICE_COMMIT"), ")");

/// sluice: a distributed API rate limiter.
#[derive(Debug, Parser)]
#[command(name = "sluice", version = VERSION, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the rate limit service (HTTP decision API, Envoy RLS, reverse proxy, metrics).
    Serve(sluice_server::cli::ServeArgs),
    /// Check a config file; prints FILE:LINE: field: message for each error.
    Validate(sluice_server::cli::ValidateArgs),
    /// Make N decisions on one key against any store.
    Check(check::CheckArgs),
    /// Prove atomicity: concurrent requests through a naive GET+SET and through sluice.
    Race(race::RaceArgs),
    /// Constant-arrival-rate HTTP load with the admitted count the policy predicts.
    Loadtest(loadtest::LoadtestArgs),
    /// Drive a running deployment with a planned arrival pattern; exit 1 when it admits more
    /// than its policy allows (0 pass, 2 error or no decision, 3 under-admits).
    Verify(verify::VerifyArgs),
    /// The Redis Cluster slot of keys, or of the key sluice builds for an identity.
    Keyslot(keyslot::KeyslotArgs),
    /// Drive a running `sluice serve`: state, reset, charge, refund, overrides, bans, lists.
    Admin(admin::AdminArgs),
    /// The live view of a running `sluice serve` in the terminal (q or Ctrl-C quits).
    Top(top::TopArgs),
    /// GET a URL and exit 0 on a 2xx answer (the container image's health check).
    Probe(probe::ProbeArgs),
    /// Print the Lua scripts (and the Function library) with their KEYS/ARGV contracts.
    Scripts {
        /// Print only these scripts (token-bucket, gcra, leaky-bucket, fixed-window,
        /// sliding-counter, sliding-log, concurrency, multi, release).
        names: Vec<String>,
        /// Print the Redis Function library instead of the scripts.
        #[arg(long)]
        functions: bool,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    sluice_cli::logging::init();
    match cli.command {
        Command::Validate(args) => sluice_server::cli::validate(args),
        Command::Probe(args) => match probe::run(&args) {
            Ok(_) => ExitCode::SUCCESS,
            Err(e) => fail(&e),
        },
        Command::Keyslot(args) => match keyslot::run(&args) {
            Ok(lines) => {
                let mut out = std::io::stdout().lock();
                for l in lines {
                    // A closed pipe (`| head`) just ends the output.
                    if writeln!(out, "{l}").is_err() {
                        break;
                    }
                }
                ExitCode::SUCCESS
            }
            Err(e) => fail(&e),
        },
        Command::Scripts { names, functions } => {
            let mut out = std::io::stdout().lock();
            if functions {
                let _ = writeln!(out, "{}", sluice_redis::function_library());
                return ExitCode::SUCCESS;
            }
            let all = sluice_redis::scripts();
            if let Some(unknown) = names
                .iter()
                .find(|n| !all.iter().any(|(name, _)| name == n))
            {
                let known: Vec<&str> = all.iter().map(|(n, _)| *n).collect();
                return fail(&format!(
                    "no script named {unknown:?}; scripts: {}",
                    known.join(", ")
                ));
            }
            for (name, source) in all {
                if (names.is_empty() || names.iter().any(|n| n == name))
                    && writeln!(out, "-- ===== {name} =====\n{source}\n").is_err()
                {
                    break;
                }
            }
            ExitCode::SUCCESS
        }
        other => {
            let rt = match tokio::runtime::Runtime::new() {
                Ok(rt) => rt,
                Err(e) => return fail(&format!("cannot start the runtime: {e}")),
            };
            rt.block_on(run_async(other))
        }
    }
}

async fn run_async(command: Command) -> ExitCode {
    let mut out = std::io::stdout().lock();
    match command {
        Command::Serve(args) => match sluice_server::cli::serve(args).await {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => fail(&e.to_string()),
        },
        Command::Admin(args) => admin::run(&args, &mut out).await,
        Command::Top(args) => top::run(&args, &mut out).await,
        Command::Check(args) => match check::run(&args, &mut out).await {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => fail(&e),
        },
        Command::Race(args) => match race::run(&args).await {
            Ok(r) => {
                if args.json {
                    let _ = writeln!(out, "{}", serde_json::to_string(&r).unwrap_or_default());
                } else {
                    let _ = writeln!(
                        out,
                        "naive admitted {} of {}; sluice admitted {} of {}{}",
                        r.naive_admitted,
                        r.requests,
                        r.sluice_admitted,
                        r.requests,
                        if r.sluice_errors > 0 {
                            format!(" ({} store errors)", r.sluice_errors)
                        } else {
                            String::new()
                        }
                    );
                }
                if r.exact() {
                    ExitCode::SUCCESS
                } else {
                    let _ = writeln!(
                        std::io::stderr(),
                        "sluice admitted {} but the limit is {}",
                        r.sluice_admitted,
                        r.limit
                    );
                    ExitCode::FAILURE
                }
            }
            Err(e) => fail(&e),
        },
        Command::Loadtest(args) => match loadtest::run(&args).await {
            Ok(r) => {
                if args.json {
                    let _ = writeln!(out, "{}", serde_json::to_string(&r).unwrap_or_default());
                } else {
                    loadtest::render(&r, &mut out);
                }
                ExitCode::SUCCESS
            }
            Err(e) => fail(&e),
        },
        Command::Verify(args) => match verify::run(&args).await {
            Ok(r) => {
                if args.json {
                    let _ = writeln!(out, "{}", serde_json::to_string(&r).unwrap_or_default());
                } else {
                    verify::render(&r, &mut out);
                }
                ExitCode::from(r.verdict.exit_code())
            }
            Err(e) => fail(&e),
        },
        Command::Validate(_)
        | Command::Keyslot(_)
        | Command::Scripts { .. }
        | Command::Probe(_) => ExitCode::SUCCESS,
    }
}

fn fail(msg: &str) -> ExitCode {
    let _ = writeln!(std::io::stderr(), "error: {msg}");
    ExitCode::from(2)
}
