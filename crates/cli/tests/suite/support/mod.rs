//! A `sluice serve` child process (the built binary) on a free loopback port, for the tests
//! of the commands that drive a running server (`sluice admin`, `sluice top`).
// Each test binary uses part of it.
#![allow(dead_code, unreachable_pub)]

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A `sluice serve` child on a free loopback port, killed on drop.
pub struct Serve {
    child: Child,
    /// The HTTP listener's port.
    pub port: u16,
    /// `http://127.0.0.1:<port>`.
    pub url: String,
    dir: std::path::PathBuf,
}

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A port free on 127.0.0.1 at the moment of asking.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Starts `sluice serve` with `config` (in a fresh directory named after `tag`) and waits
/// (at most 20 s) until its HTTP listener accepts connections.
pub fn serve(tag: &str, config: &str) -> Serve {
    let dir = std::env::temp_dir().join(format!(
        "sluice-{tag}-cli-{}-{}",
        std::process::id(),
        free_port()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("sluice.toml");
    std::fs::write(&file, config).unwrap();
    let port = free_port();
    let child = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .arg("serve")
        .arg("--config")
        .arg(&file)
        .args([
            "--http",
            &format!("127.0.0.1:{port}"),
            "--grpc",
            "127.0.0.1:0",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let s = Serve {
        child,
        port,
        url: format!("http://127.0.0.1:{port}"),
        dir,
    };
    let start = Instant::now();
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "sluice serve did not start"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    s
}
