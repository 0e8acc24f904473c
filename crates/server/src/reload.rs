//! Reloading: on SIGHUP, when a watched file changes, or on `POST /admin/reload`.
//!
//! The new file is checked completely first; any error keeps the running configuration and is
//! logged line by line (`FILE:LINE: field: message`). A file that checks but looks like an
//! accident is refused too, because installing it would silently switch limiting off: an
//! empty file (an editor or deploy tool caught mid-write), or one with no policies and no
//! Envoy domains while the running configuration has some (a truncated file). Both outcomes
//! are logged, counted in `sluice_config_reloads_total{result="error"|"refused"}` and answered
//! as an error by `POST /admin/reload`.
//!
//! The limiter, and with it the state of the embedded store, carries over unless the store
//! settings changed. Listener addresses cannot change without a restart; a reload that changes
//! them logs so, comparing against the addresses in use (flag overrides included).
//!
//! Changes are found by polling modification times and sizes (every `server.reload_poll`),
//! which also works on network file systems and with editors that replace files.

use std::path::PathBuf;
use std::time::{Duration, SystemTime};

use crate::cli::plural;
use crate::config::{self, CheckOptions, Config};
use crate::state::{Shared, build_limiter};

/// Reloads the configuration from its file. Returns the new generation, or the errors (the
/// running configuration is kept).
pub async fn reload(shared: &Shared, trigger: &str) -> Result<u64, Vec<String>> {
    let result = reload_file(shared, trigger).await;
    shared.stats().reload_done(trigger, &result);
    result
}

async fn reload_file(shared: &Shared, trigger: &str) -> Result<u64, Vec<String>> {
    let _guard = shared.reload_guard().await;
    let current = shared.runtime();
    let Some(path) = current.config.path.clone() else {
        return Err(vec![
            "this server was started without a configuration file".into(),
        ]);
    };
    let fail = |result: &'static str, errors: Vec<String>| {
        for e in &errors {
            tracing::warn!(
                trigger,
                result,
                "config reload rejected, keeping the running configuration: {e}"
            );
        }
        metrics::counter!("sluice_config_reloads_total", "result" => result).increment(1);
        Err(errors)
    };
    let src = match config::read(&path) {
        Ok(s) => s,
        Err(e) => return fail("error", e.0.iter().map(ToString::to_string).collect()),
    };
    let mut config = match Config::from_file_text(&path, &src, CheckOptions::default()) {
        Ok(c) => c,
        Err(e) => return fail("error", e.0.iter().map(ToString::to_string).collect()),
    };
    if let Some(reason) = refusal(&src, &current.config, &config) {
        return fail(
            "refused",
            vec![format!(
                "{}: {reason}; write the new file next to it and rename it into place",
                path.display()
            )],
        );
    }
    config.override_listeners(current.config.listener_overrides);
    // The auth boundary holds for the listeners running now and for those the file names
    // (used at the next restart): a reload cannot drop the token that guards a public one.
    let running = &current.config.server;
    if let Err(e) = config
        .check_exposure_at(running.http, running.admin)
        .and_then(|()| config.check_exposure())
    {
        return fail("refused", e.0.iter().map(ToString::to_string).collect());
    }
    for warning in config.exposure_warnings() {
        tracing::warn!("{}: {warning}", path.display());
    }
    let limiter = if config.store_identity() == current.config.store_identity() {
        current.limiter.clone()
    } else {
        match build_limiter(&config).await {
            Ok(l) => l,
            Err(e) => return fail("error", vec![format!("{}: store: {e}", path.display())]),
        }
    };
    for change in listener_changes(&current.config, &config) {
        tracing::warn!(
            "{}: {change} changed; it takes effect at the next restart",
            path.display()
        );
    }
    let policies = config.policies.len();
    let routes = config.routes.len();
    let generation = shared.install(config, limiter);
    metrics::counter!("sluice_config_reloads_total", "result" => "ok").increment(1);
    tracing::info!(
        trigger,
        generation,
        policies,
        routes,
        "configuration reloaded"
    );
    Ok(generation)
}

/// Why a file that checks must still not replace the running configuration, if it must not.
pub fn refusal(src: &str, running: &Config, new: &Config) -> Option<String> {
    let blank = src
        .lines()
        .map(str::trim)
        .all(|l| l.is_empty() || l.starts_with('#'));
    if blank {
        return Some("the file is empty (no settings at all), refusing it".into());
    }
    let limits = |c: &Config| c.policies.len() + c.domains.names().count();
    if limits(new) == 0 && limits(running) > 0 {
        return Some(format!(
            "the file has no policies and no Envoy domains while the running configuration has {} \
             and {} (a truncated or half-written file?), refusing it",
            plural(running.policies.len(), "policy", "policies"),
            plural(running.domains.names().count(), "domain", "domains"),
        ));
    }
    // Checking already refuses a route naming a policy the file lacks; kept here so that a
    // change to checking cannot let a route lose its limits silently.
    for route in &new.routes {
        if let Some(p) = route
            .policies
            .iter()
            .find(|p| !new.policies.contains_key(*p))
        {
            return Some(format!(
                "route {} uses policy {p:?}, which the file no longer defines, refusing it",
                route.prefix
            ));
        }
    }
    None
}

/// The listeners whose address differs between the running and the new configuration (both
/// with the command line's overrides applied).
pub fn listener_changes(running: &Config, new: &Config) -> Vec<String> {
    let (a, b) = (&running.server, &new.server);
    let mut changes = Vec::new();
    if a.http != b.http {
        changes.push(format!("server.http ({} -> {})", a.http, b.http));
    }
    if a.grpc != b.grpc {
        changes.push(format!("server.grpc ({} -> {})", a.grpc, b.grpc));
    }
    if a.proxy != b.proxy {
        changes.push(format!("server.proxy ({} -> {})", a.proxy, b.proxy));
    }
    if a.admin != b.admin {
        changes.push(format!("server.admin ({:?} -> {:?})", a.admin, b.admin));
    }
    changes
}

fn stamp(paths: &[PathBuf]) -> Vec<Option<(SystemTime, u64)>> {
    paths
        .iter()
        .map(|p| {
            std::fs::metadata(p)
                .ok()
                .and_then(|m| Some((m.modified().ok()?, m.len())))
        })
        .collect()
}

/// Watches the configuration files and SIGHUP until `shutdown` resolves.
pub async fn watch(shared: Shared, shutdown: impl std::future::Future<Output = ()>) {
    tokio::pin!(shutdown);
    #[cfg(unix)]
    let mut hup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()).ok();
    let mut last = stamp(&shared.runtime().config.watched);
    loop {
        let rt = shared.runtime();
        let poll = rt.config.server.reload_poll;
        let tick = async {
            if poll.is_zero() {
                std::future::pending::<()>().await
            } else {
                tokio::time::sleep(poll).await
            }
        };
        #[cfg(unix)]
        let sighup = async {
            match hup.as_mut() {
                Some(s) => {
                    s.recv().await;
                }
                None => std::future::pending::<()>().await,
            }
        };
        #[cfg(not(unix))]
        let sighup = std::future::pending::<()>();
        tokio::select! {
            _ = &mut shutdown => return,
            _ = sighup => {
                let _ = reload(&shared, "sighup").await;
                last = stamp(&shared.runtime().config.watched);
            }
            _ = tick => {
                let now = stamp(&rt.config.watched);
                if now != last {
                    // Let an editor finish writing before reading.
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    let _ = reload(&shared, "file change").await;
                    // Whatever the result, wait for the next change rather than retrying.
                    last = stamp(&shared.runtime().config.watched);
                }
            }
        }
    }
}
