//! A harness for tests: the real `sluice serve` ([`crate::run`]) from configuration text, on
//! loopback ports chosen by the OS, and a clean stop. Used by this crate's integration tests
//! and by the fault, hostile-input and security suites of `sluice-reliability`.
//!
//! Behind the `testing` feature, so the `sluice` binary does not carry it.
#![cfg(any(test, feature = "testing"))]

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, Ordering};

use crate::{BoundAddrs, Config, Listeners, ServeError};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

/// A running server; stopped by [`TestServer::stop`] (or, less tidily, on drop).
#[derive(Debug)]
pub struct TestServer {
    /// The bound listeners.
    pub addrs: BoundAddrs,
    /// The directory holding the configuration file.
    pub dir: PathBuf,
    /// The configuration file.
    pub file: PathBuf,
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<Result<(), ServeError>>>,
}

/// A fresh directory under the system temp dir.
pub fn temp_dir(tag: &str) -> PathBuf {
    static N: AtomicU32 = AtomicU32::new(0);
    let dir = std::env::temp_dir().join(format!(
        "sluice-test-{tag}-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("create temp dir");
    dir
}

/// Writes `toml` to a fresh `sluice.toml` and serves it, every listener on 127.0.0.1:0.
pub async fn start(toml: &str) -> TestServer {
    start_with(toml, &[]).await
}

/// [`start`], with `extra` files (name, text) written next to the configuration first
/// (Envoy domain YAML files).
pub async fn start_with(toml: &str, extra: &[(&str, &str)]) -> TestServer {
    let dir = temp_dir("srv");
    for (name, text) in extra {
        std::fs::write(dir.join(name), text).expect("write extra file");
    }
    let file = dir.join("sluice.toml");
    std::fs::write(&file, toml).expect("write config");
    let mut config = Config::load(&file).unwrap_or_else(|e| panic!("test config invalid:\n{e}"));
    let any: SocketAddr = "127.0.0.1:0".parse().expect("addr");
    // As `sluice serve --http ... --grpc ...` would: reloads then keep these addresses.
    config.override_listeners(crate::config::ListenerOverrides {
        http: Some(any),
        grpc: Some(any),
        proxy: Some(any),
        admin: config.server.admin.map(|_| any),
    });
    let listeners = Listeners::bind(&config).await.expect("bind listeners");
    let addrs = listeners.addrs();
    let (tx, rx) = oneshot::channel::<()>();
    let task = tokio::spawn(crate::run(config, listeners, async move {
        let _ = rx.await;
    }));
    TestServer {
        addrs,
        dir,
        file,
        stop: Some(tx),
        task: Some(task),
    }
}

impl TestServer {
    /// `http://<http listener><path>`.
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{}", self.addrs.http, path)
    }
    /// `http://<proxy listener><path>`.
    pub fn proxy_url(&self, path: &str) -> String {
        format!(
            "http://{}{}",
            self.addrs.proxy.expect("proxy listener"),
            path
        )
    }
    /// `http://<admin listener><path>` (only when the configuration sets `server.admin`).
    pub fn admin_url(&self, path: &str) -> String {
        let admin = self.addrs.admin.expect("server.admin is not set");
        format!("http://{admin}{path}")
    }
    /// `http://<gRPC listener>`.
    pub fn grpc_url(&self) -> String {
        format!("http://{}", self.addrs.grpc)
    }
    /// True while the server task runs (it ends only on an error or after `stop`).
    pub fn is_running(&self) -> bool {
        self.task.as_ref().is_some_and(|t| !t.is_finished())
    }
    /// Stops the server and waits (at most 15 s) for it to finish cleanly.
    pub async fn stop(mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        if let Some(task) = self.task.take() {
            let r = tokio::time::timeout(std::time::Duration::from_secs(15), task).await;
            r.expect("server stops within 15 s")
                .expect("server task did not panic")
                .expect("server ran cleanly");
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        // A test that ends without `stop` (or panics) leaves no directory behind either.
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
