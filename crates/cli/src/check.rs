//! `sluice check`: N decisions on one key, from the command line, against any store — the
//! guide's `redis-cli --eval` loop as a tool.

use std::io::Write;
use std::sync::Arc;
use std::time::Duration;

use clap::Args;
use serde::Serialize;
use sluice::{Identity, Limiter, StoreOptions, Verdict};
use sluice_core::policy::parse_duration_ms;

use crate::policy_args::PolicyArgs;

/// Arguments of `sluice check`.
#[derive(Debug, Clone, Args)]
pub struct CheckArgs {
    /// The identity to check, e.g. user:42.
    pub identity: String,
    #[command(flatten)]
    pub policy: PolicyArgs,
    /// Policy name (part of the key: rl:{<identity>}:<policy>); default: the algorithm's name.
    #[arg(long)]
    pub name: Option<String>,
    /// Store URL: memory (default), redis://host:port, rediss://..., redis+cluster://h:p,h:p.
    #[arg(long, default_value = "memory", env = "SLUICE_STORE")]
    pub store: String,
    /// Store timeout, e.g. 50ms.
    #[arg(long, default_value = "500ms")]
    pub timeout: String,
    /// Number of decisions.
    #[arg(long, short = 'n', default_value_t = 1)]
    pub count: u64,
    /// Cost of each request.
    #[arg(long, default_value_t = 1)]
    pub cost: u64,
    /// Pause between decisions, e.g. 100ms.
    #[arg(long)]
    pub interval: Option<String>,
    /// One JSON object per decision.
    #[arg(long)]
    pub json: bool,
}

/// One line of `--json` output.
#[derive(Debug, Serialize)]
pub struct CheckLine {
    pub allowed: bool,
    pub limit: u64,
    pub remaining: u64,
    pub retry_after_ms: u64,
    pub reset_after_ms: u64,
    #[serde(skip_serializing_if = "is_zero")]
    pub delay_ms: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<sluice::DenyReason>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lease: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

fn is_zero(v: &u64) -> bool {
    *v == 0
}

/// Runs `sluice check`, writing to `out`. Returns an error message for bad arguments or an
/// unreachable store.
pub async fn run(args: &CheckArgs, out: &mut dyn Write) -> Result<(), String> {
    let name = match &args.name {
        Some(name) => name.clone(),
        None => args.policy.algorithm()?.kind().to_string(),
    };
    // The decision mode too (`--mode leased`), as a sluice.toml policy would have it.
    let policy = Arc::new(args.policy.policy(name)?);
    let timeout =
        Duration::from_millis(parse_duration_ms(&args.timeout).map_err(|e| e.to_string())?);
    let interval = match &args.interval {
        Some(i) => Some(Duration::from_millis(
            parse_duration_ms(i).map_err(|e| e.to_string())?,
        )),
        None => None,
    };
    let limiter = Limiter::connect(
        &args.store,
        StoreOptions {
            timeout,
            ..Default::default()
        },
    )
    .await
    .map_err(|e| format!("cannot use store {}: {e}", args.store))?;
    let identity = Identity::new(args.identity.clone());
    if !args.json {
        let key = limiter.key_scheme().key(&identity, &policy.name);
        writeln!(out, "key {key} on {} store", limiter.store().kind()).ok();
    }
    for i in 0..args.count {
        if i > 0
            && let Some(d) = interval
        {
            tokio::time::sleep(d).await;
        }
        let checked = limiter.check(&identity, &policy, args.cost).await;
        let line = match (&checked.verdict, checked.limits[0].decision.as_ref()) {
            (_, Some(d)) => CheckLine {
                allowed: d.allowed,
                limit: d.limit,
                remaining: d.remaining,
                retry_after_ms: d.retry_after_ms,
                reset_after_ms: d.reset_after_ms,
                delay_ms: d.delay_ms,
                reason: d.reason,
                lease: d.lease.as_ref().map(|l| l.0.clone()),
                error: None,
            },
            (Verdict::FailedOpen(e) | Verdict::FailedClosed(e), None) => {
                return Err(format!("store error: {e}"));
            }
            (Verdict::Decided, None) => return Err("store returned no decision".into()),
        };
        if args.json {
            writeln!(
                out,
                "{}",
                serde_json::to_string(&line).map_err(|e| e.to_string())?
            )
            .ok();
        } else {
            let verdict = if line.allowed { "allowed" } else { "denied " };
            write!(
                out,
                "{:>4}  {verdict}  remaining={:<4} retry_after={}ms reset_after={}ms",
                i + 1,
                line.remaining,
                line.retry_after_ms,
                line.reset_after_ms
            )
            .ok();
            if line.delay_ms > 0 {
                write!(out, " delay={}ms", line.delay_ms).ok();
            }
            if let Some(r) = line.reason
                && r != sluice::DenyReason::Limited
            {
                write!(
                    out,
                    " reason={}",
                    serde_json::to_string(&r)
                        .unwrap_or_default()
                        .trim_matches('"')
                )
                .ok();
            }
            writeln!(out).ok();
        }
    }
    Ok(())
}
