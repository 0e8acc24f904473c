//! `sluice admin`: drives a running `sluice serve` over its HTTP API, one subcommand per row
//! of the runtime-control table in `docs/admin.md`: read and reset an identity's state,
//! charge and refund, overrides, bans and the allow and deny lists.
//!
//! `allow add --file` and `deny add --file` import a block list: one entry per line (`#`
//! starts a comment), sent in calls of 10,000 entries, each call all or nothing on the server;
//! a refused call names the file's lines at fault and stops the import (earlier calls stay).
//!
//! Every call is one HTTP request with a JSON body to `--url` (`SLUICE_URL`), carrying
//! `Authorization: Bearer` with `--token` (`SLUICE_ADMIN_TOKEN`) when given. The JSON answer is
//! printed as it came; a 4xx or 5xx answer prints its problem detail on stderr and exits 1 (2
//! when the server could not be reached or the arguments are wrong), so scripts can rely on
//! the exit code.
//!
//! Layout: this file holds the subcommands and the call each one makes; `client` sends a
//! call; `import` reads and sends a block-list file.

mod client;
mod import;

use std::io::Write;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Subcommand};
use http::Method;
use serde_json::{Map, Value, json};

pub use client::Call;
use client::call;
pub(crate) use client::send;
use import::run_import;
pub use import::{IMPORT_CHUNK, ImportCall, plan_import, read_entries};

/// `sluice admin`.
#[derive(Debug, Args)]
pub struct AdminArgs {
    /// Base URL of the `sluice serve` HTTP listener.
    #[arg(long, env = "SLUICE_URL", default_value = "http://127.0.0.1:8080")]
    pub url: String,
    /// Bearer token: the server's admin_token (reading state also accepts server.api_token).
    #[arg(long, env = "SLUICE_ADMIN_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// Seconds to wait for the answer.
    #[arg(long, default_value_t = 10)]
    pub timeout: u64,
    #[command(subcommand)]
    pub command: AdminCommand,
}

/// Who a call is about: an identity as the limits key it, or a credential the server hashes.
#[derive(Debug, Clone, Args)]
#[group(required = true, multiple = false)]
pub struct Who {
    /// The identity, e.g. user:42 or ip:203.0.113.7.
    #[arg(long)]
    pub identity: Option<String>,
    /// Instead of --identity: a secret (API key) the server hashes as /v1/check does.
    #[arg(long)]
    pub credential: Option<String>,
}

impl Who {
    fn put(&self, body: &mut Map<String, Value>) {
        if let Some(i) = &self.identity {
            body.insert("identity".into(), json!(i));
        }
        if let Some(c) = &self.credential {
            body.insert("credential".into(), json!(c));
        }
    }
}

/// A policy and who.
#[derive(Debug, Clone, Args)]
pub struct Target {
    /// The policy name.
    #[arg(long)]
    pub policy: String,
    #[command(flatten)]
    pub who: Who,
}

impl Target {
    fn body(&self) -> Map<String, Value> {
        let mut m = Map::new();
        m.insert("policy".into(), json!(self.policy));
        self.who.put(&mut m);
        m
    }
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum AdminCommand {
    /// Read or reset an identity's state for a policy (POST / DELETE /v1/state).
    #[command(subcommand)]
    State(StateCommand),
    /// Consume cost without a check (POST /v1/charge).
    Charge(Adjust),
    /// Give cost back, never beyond the policy's capacity (POST /v1/refund).
    Refund(Adjust),
    /// Per-identity overrides of a policy's parameters or plan (/v1/overrides).
    #[command(subcommand)]
    Override(OverrideCommand),
    /// Ban an identity or lift a ban (/v1/bans).
    #[command(subcommand)]
    Ban(BanCommand),
    /// The allow list (/v1/lists/allow).
    #[command(subcommand)]
    Allow(ListCommand),
    /// The deny list (/v1/lists/deny).
    #[command(subcommand)]
    Deny(ListCommand),
}

/// `state get` / `state reset`.
#[derive(Debug, Subcommand)]
pub enum StateCommand {
    /// Remaining, limit and reset without consuming.
    Get(Target),
    /// Delete the state (every shard): the identity starts afresh.
    Reset(Target),
}

/// `charge` / `refund`.
#[derive(Debug, Args)]
pub struct Adjust {
    #[command(flatten)]
    pub target: Target,
    /// Units to charge or refund.
    #[arg(long)]
    pub cost: u64,
}

/// `override set|get|delete`.
#[derive(Debug, Subcommand)]
pub enum OverrideCommand {
    /// Bind the identity to a plan or to parameters, optionally for a time.
    Set {
        #[command(flatten)]
        target: Target,
        /// A plan from [plans.NAME] of the configuration.
        #[arg(long, conflicts_with = "param", required_unless_present = "param")]
        plan: Option<String>,
        /// A parameter as NAME=VALUE (limit=100, window=1h, rate=10/s...); repeatable.
        #[arg(long = "param", value_name = "NAME=VALUE")]
        param: Vec<String>,
        /// How long the override lasts, e.g. 1h (default: until removed).
        #[arg(long)]
        ttl: Option<String>,
    },
    /// Show the override (exits 1 when there is none).
    Get(Target),
    /// Remove the override.
    Delete(Target),
}

/// `ban add|lift`.
#[derive(Debug, Subcommand)]
pub enum BanCommand {
    /// Ban an identity for a time.
    Add {
        #[command(flatten)]
        who: Who,
        /// How long, e.g. 10m.
        #[arg(long)]
        duration: String,
        /// Only these policies (comma-separated; default: every policy).
        #[arg(long, value_delimiter = ',')]
        policies: Vec<String>,
    },
    /// Lift a ban.
    Lift(Who),
}

/// `allow|deny add|remove`.
#[derive(Debug, Subcommand)]
pub enum ListCommand {
    /// Add an identity or a CIDR, or every line of a file.
    Add {
        /// An identity or a CIDR such as 203.0.113.0/24.
        #[arg(long, conflicts_with = "file", required_unless_present = "file")]
        entry: Option<String>,
        /// A file with one entry per line (`#` starts a comment; blank lines are skipped),
        /// sent in calls of 10,000 entries.
        #[arg(long, value_name = "PATH")]
        file: Option<std::path::PathBuf>,
        /// How long the entry lasts, e.g. 1h (default: until removed).
        #[arg(long)]
        ttl: Option<String>,
    },
    /// Remove an entry.
    Remove {
        /// The entry as added.
        #[arg(long)]
        entry: String,
    },
}

/// A `NAME=VALUE` parameter: integers as numbers, anything else as text.
fn param(s: &str) -> Result<(String, Value), String> {
    let (k, v) = s
        .split_once('=')
        .ok_or_else(|| format!("--param {s:?}: expected NAME=VALUE such as limit=100"))?;
    let v = v.trim();
    let value = match v.parse::<u64>() {
        Ok(n) => json!(n),
        Err(_) => json!(v),
    };
    Ok((k.trim().to_string(), value))
}

/// Percent-encodes a query value (everything but unreserved characters).
fn encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                out.push(b as char)
            }
            _ => out.push_str(&format!("%{b:02X}")),
        }
    }
    out
}

/// The HTTP call a subcommand makes.
pub fn plan(command: &AdminCommand) -> Result<Call, String> {
    let ttl = |m: &mut Map<String, Value>, ttl: &Option<String>| {
        if let Some(t) = ttl {
            m.insert("ttl".into(), json!(t));
        }
    };
    Ok(match command {
        AdminCommand::State(StateCommand::Get(t)) => call(Method::POST, "/v1/state", t.body()),
        AdminCommand::State(StateCommand::Reset(t)) => call(Method::DELETE, "/v1/state", t.body()),
        AdminCommand::Charge(a) | AdminCommand::Refund(a) => {
            let mut m = a.target.body();
            m.insert("cost".into(), json!(a.cost));
            let path = match command {
                AdminCommand::Charge(_) => "/v1/charge",
                _ => "/v1/refund",
            };
            call(Method::POST, path, m)
        }
        AdminCommand::Override(OverrideCommand::Set {
            target,
            plan,
            param: params,
            ttl: t,
        }) => {
            let mut m = target.body();
            match plan {
                Some(p) => {
                    m.insert("plan".into(), json!(p));
                }
                None => {
                    let mut ps = Map::new();
                    for p in params {
                        let (k, v) = param(p)?;
                        ps.insert(k, v);
                    }
                    m.insert("params".into(), Value::Object(ps));
                }
            }
            ttl(&mut m, t);
            call(Method::POST, "/v1/overrides", m)
        }
        AdminCommand::Override(OverrideCommand::Get(t)) => {
            let (key, who) = match (&t.who.identity, &t.who.credential) {
                (Some(i), _) => ("identity", i),
                (None, Some(c)) => ("credential", c),
                (None, None) => return Err("give --identity or --credential".into()),
            };
            Call {
                method: Method::GET,
                path: format!(
                    "/v1/overrides?policy={}&{key}={}",
                    encode(&t.policy),
                    encode(who)
                ),
                body: None,
            }
        }
        AdminCommand::Override(OverrideCommand::Delete(t)) => {
            call(Method::DELETE, "/v1/overrides", t.body())
        }
        AdminCommand::Ban(BanCommand::Add {
            who,
            duration,
            policies,
        }) => {
            let mut m = Map::new();
            who.put(&mut m);
            m.insert("duration".into(), json!(duration));
            if !policies.is_empty() {
                m.insert("policies".into(), json!(policies));
            }
            call(Method::POST, "/v1/bans", m)
        }
        AdminCommand::Ban(BanCommand::Lift(who)) => {
            let mut m = Map::new();
            who.put(&mut m);
            call(Method::DELETE, "/v1/bans", m)
        }
        AdminCommand::Allow(l) | AdminCommand::Deny(l) => {
            let path = match command {
                AdminCommand::Allow(_) => "/v1/lists/allow",
                _ => "/v1/lists/deny",
            };
            let mut m = Map::new();
            match l {
                ListCommand::Add {
                    entry: Some(entry),
                    ttl: t,
                    ..
                } => {
                    m.insert("entry".into(), json!(entry));
                    ttl(&mut m, t);
                    call(Method::POST, path, m)
                }
                ListCommand::Add { entry: None, .. } => {
                    return Err("give --entry or --file".into());
                }
                ListCommand::Remove { entry } => {
                    m.insert("entry".into(), json!(entry));
                    call(Method::DELETE, path, m)
                }
            }
        }
    })
}

/// Runs `sluice admin`: prints the JSON answer to `out`; a refusal's detail goes to stderr.
pub async fn run(args: &AdminArgs, out: &mut impl Write) -> ExitCode {
    let mut err = std::io::stderr();
    if let AdminCommand::Allow(ListCommand::Add {
        file: Some(file),
        ttl,
        ..
    })
    | AdminCommand::Deny(ListCommand::Add {
        file: Some(file),
        ttl,
        ..
    }) = &args.command
    {
        let kind = match args.command {
            AdminCommand::Allow(_) => "allow",
            _ => "deny",
        };
        return run_import(args, kind, file, ttl.as_deref(), out).await;
    }
    let c = match plan(&args.command) {
        Ok(c) => c,
        Err(e) => {
            let _ = writeln!(err, "error: {e}");
            return ExitCode::from(2);
        }
    };
    let timeout = Duration::from_secs(args.timeout.max(1));
    let (status, body) = match send(&args.url, args.token.as_deref(), &c, timeout).await {
        Ok(r) => r,
        Err(e) => {
            let _ = writeln!(err, "error: {e}");
            return ExitCode::from(2);
        }
    };
    let text = String::from_utf8_lossy(&body);
    let parsed: Option<Value> = serde_json::from_slice(&body).ok();
    if (200..300).contains(&status) {
        let shown = parsed
            .as_ref()
            .and_then(|v| serde_json::to_string_pretty(v).ok())
            .unwrap_or_else(|| text.to_string());
        let _ = writeln!(out, "{shown}");
        return ExitCode::SUCCESS;
    }
    let detail = parsed
        .as_ref()
        .and_then(|v| v.get("detail").and_then(Value::as_str).map(str::to_string))
        .unwrap_or_else(|| text.trim().to_string());
    let _ = writeln!(
        err,
        "error: {} {} answered {status}: {detail}",
        c.method, c.path
    );
    ExitCode::FAILURE
}

#[cfg(test)]
mod tests {
    use super::*;

    fn target(identity: &str) -> Target {
        Target {
            policy: "api".into(),
            who: Who {
                identity: Some(identity.into()),
                credential: None,
            },
        }
    }

    #[test]
    fn each_subcommand_is_the_issue_table_row() {
        let c = plan(&AdminCommand::State(StateCommand::Reset(target("user:1")))).unwrap();
        assert_eq!((c.method, c.path.as_str()), (Method::DELETE, "/v1/state"));
        assert_eq!(c.body, Some(json!({"policy": "api", "identity": "user:1"})));
        let c = plan(&AdminCommand::Refund(Adjust {
            target: target("u"),
            cost: 7,
        }))
        .unwrap();
        assert_eq!(c.path, "/v1/refund");
        assert_eq!(c.body.unwrap()["cost"], 7);
        let c = plan(&AdminCommand::Override(OverrideCommand::Set {
            target: target("u"),
            plan: None,
            param: vec!["limit=100".into(), "window=1 month".into()],
            ttl: Some("1h".into()),
        }))
        .unwrap();
        assert_eq!(
            c.body,
            Some(
                json!({"policy": "api", "identity": "u", "params": {"limit": 100, "window": "1 month"}, "ttl": "1h"})
            )
        );
        let c = plan(&AdminCommand::Override(OverrideCommand::Get(target(
            "user 1/é",
        ))))
        .unwrap();
        assert_eq!(
            (c.method, c.path.as_str(), c.body),
            (
                Method::GET,
                "/v1/overrides?policy=api&identity=user%201%2F%C3%A9",
                None
            )
        );
        let c = plan(&AdminCommand::Deny(ListCommand::Remove {
            entry: "10.0.0.0/8".into(),
        }))
        .unwrap();
        assert_eq!(
            (c.method, c.path.as_str()),
            (Method::DELETE, "/v1/lists/deny")
        );
        let c = plan(&AdminCommand::Allow(ListCommand::Add {
            entry: Some("user:vip".into()),
            file: None,
            ttl: None,
        }))
        .unwrap();
        assert_eq!(c.body, Some(json!({"entry": "user:vip"})));
        assert!(
            plan(&AdminCommand::Override(OverrideCommand::Set {
                target: target("u"),
                plan: None,
                param: vec!["limit".into()],
                ttl: None,
            }))
            .unwrap_err()
            .contains("NAME=VALUE")
        );
    }
}
