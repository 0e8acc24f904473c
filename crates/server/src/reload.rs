//! Reloading: on SIGHUP, when a watched file changes, or on `POST /admin/reload`.
//!
//! The new file is checked completely first; any error keeps the running configuration and is
//! logged line by line (`FILE:LINE: field: message`). The limiter, and with it the state of the
//! embedded store, carries over unless the store settings changed. Listener addresses cannot
//! change without a restart; a reload that changes them logs so.
//!
//! Changes are found by polling modification times and sizes (every `server.reload_poll`),
//! which also works on network file systems and with editors that replace files.

use std::path::PathBuf;
use std::time::{Duration, SystemTime};

use crate::config::Config;
use crate::state::{Shared, build_limiter};

/// Reloads the configuration from its file. Returns the new generation, or the errors (the
/// running configuration is kept).
pub async fn reload(shared: &Shared, trigger: &str) -> Result<u64, Vec<String>> {
    let _guard = shared.reload_guard().await;
    let current = shared.runtime();
    let Some(path) = current.config.path.clone() else {
        return Err(vec![
            "this server was started without a configuration file".into(),
        ]);
    };
    let fail = |errors: Vec<String>| {
        for e in &errors {
            tracing::error!(
                trigger,
                "config reload rejected, keeping the running configuration: {e}"
            );
        }
        metrics::counter!("sluice_config_reloads_total", "result" => "error").increment(1);
        Err(errors)
    };
    let config = match Config::load(&path) {
        Ok(c) => c,
        Err(e) => return fail(e.0.iter().map(ToString::to_string).collect()),
    };
    let limiter = if config.store_identity() == current.config.store_identity() {
        current.limiter.clone()
    } else {
        match build_limiter(&config).await {
            Ok(l) => l,
            Err(e) => return fail(vec![format!("{}: store: {e}", path.display())]),
        }
    };
    let old = &current.config.server;
    let new = &config.server;
    if (old.http, old.grpc, old.proxy) != (new.http, new.grpc, new.proxy) {
        tracing::warn!(
            "listener addresses changed in {}; they take effect at the next restart",
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
