//! Starts a real `sluice serve` on loopback ports chosen by the OS, from a configuration file
//! written to a fresh directory, and stops it.
#![allow(dead_code, unreachable_pub, unused_imports)]

pub mod listener;

use std::path::PathBuf;

pub use sluice_server::testing::{TestServer, start, start_with, temp_dir};

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
