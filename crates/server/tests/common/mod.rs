//! Starts a real `sluice serve` on loopback ports chosen by the OS, from a configuration file
//! written to a fresh directory, and stops it.
#![allow(dead_code, unreachable_pub)]

use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, Ordering};

use sluice_server::{BoundAddrs, Config, Listeners, ServeError};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

pub struct TestServer {
    pub addrs: BoundAddrs,
    pub dir: PathBuf,
    pub file: PathBuf,
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<Result<(), ServeError>>>,
}

/// A fresh directory under the system temp dir.
pub fn temp_dir(tag: &str) -> PathBuf {
    static N: AtomicU32 = AtomicU32::new(0);
    let dir = std::env::temp_dir().join(format!(
        "sluice-server-{tag}-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Writes `toml` to `sluice.toml` in a fresh directory (plus `extra` files) and serves it with
/// every listener on 127.0.0.1:0.
pub async fn start_with(toml: &str, extra: &[(&str, &str)]) -> TestServer {
    let dir = temp_dir("srv");
    for (name, text) in extra {
        std::fs::write(dir.join(name), text).unwrap();
    }
    let file = dir.join("sluice.toml");
    std::fs::write(&file, toml).unwrap();
    let mut config = Config::load(&file).unwrap_or_else(|e| panic!("test config invalid:\n{e}"));
    let any: std::net::SocketAddr = "127.0.0.1:0".parse().unwrap();
    config.server.http = any;
    config.server.grpc = any;
    config.server.proxy = any;
    let listeners = Listeners::bind(&config).await.unwrap();
    let addrs = listeners.addrs();
    let (tx, rx) = oneshot::channel::<()>();
    let task = tokio::spawn(sluice_server::run(config, listeners, async move {
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

pub async fn start(toml: &str) -> TestServer {
    start_with(toml, &[]).await
}

impl TestServer {
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{}", self.addrs.http, path)
    }
    pub fn proxy_url(&self, path: &str) -> String {
        format!(
            "http://{}{}",
            self.addrs.proxy.expect("proxy listener"),
            path
        )
    }
    pub fn grpc_url(&self) -> String {
        format!("http://{}", self.addrs.grpc)
    }
    pub async fn stop(mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        if let Some(task) = self.task.take() {
            let r = tokio::time::timeout(std::time::Duration::from_secs(15), task).await;
            r.expect("server stops within 15 s").unwrap().unwrap();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
    }
}

pub fn client() -> reqwest::Client {
    reqwest::Client::builder().no_proxy().build().unwrap()
}

/// A redis-server on a free port, killed on drop.
pub struct Redis {
    pub port: u16,
    child: std::process::Child,
    dir: PathBuf,
}

impl Redis {
    pub fn start() -> Option<Redis> {
        let bin = which("redis-server")?;
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .ok()?
            .local_addr()
            .ok()?
            .port();
        let dir = temp_dir("redis");
        let child = std::process::Command::new(bin)
            .args([
                "--port",
                &port.to_string(),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
            ])
            .arg("--dir")
            .arg(&dir)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .ok()?;
        for _ in 0..100 {
            if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
                return Some(Redis { port, child, dir });
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        None
    }
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Redis {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

pub fn which(name: &str) -> Option<PathBuf> {
    std::env::var_os("PATH")?
        .to_str()?
        .split(':')
        .map(|d| PathBuf::from(d).join(name))
        .find(|p| p.is_file())
}
