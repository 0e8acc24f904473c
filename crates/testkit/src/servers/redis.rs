//! One standalone Redis or Valkey server, restartable, with extra arguments.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::{ServerKind, TempDir, free_port, raw_command, redis_cli, watchdog};

/// One running server process.
#[derive(Debug)]
pub struct RedisServer {
    pub(crate) kind: ServerKind,
    pub(crate) port: u16,
    pub(crate) extra: Vec<String>,
    pub(crate) child: Option<Child>,
    pub(crate) watchdog: Option<Child>,
    pub(crate) dir: TempDir,
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

    pub(crate) fn start_with(kind: ServerKind, extra: &[&str], bus: bool) -> Self {
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
        self.watchdog = watchdog(child.id(), &self.dir.0);
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

    /// Keeps the server busy the way other clients' expensive work does: `scripts` Lua
    /// scripts, one after another from another client (`redis-cli`), each spinning on the
    /// server's only thread for `each`. Between two scripts the server answers everyone
    /// else, so it stays responsive but slow. Join the handle to wait for the last one.
    pub fn keep_busy(&self, scripts: u32, each: Duration) -> std::thread::JoinHandle<()> {
        const SPIN: &str = "local t = redis.call('TIME') local start = t[1] * 1000000 + t[2] \
            repeat local n = redis.call('TIME') until n[1] * 1000000 + n[2] - start >= tonumber(ARGV[1]) \
            return 1";
        let port = self.port;
        let micros = each.as_micros().to_string();
        std::thread::spawn(move || {
            for _ in 0..scripts {
                let out = redis_cli(port, &["EVAL", SPIN, "0", &micros]);
                assert!(out.trim() == "1", "busy script: {out}");
            }
        })
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
