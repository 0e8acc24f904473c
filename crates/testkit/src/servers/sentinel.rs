//! A Sentinel-monitored group (master, replica, one sentinel) for failover tests.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::{RedisServer, ServerKind, TempDir, free_port, raw_command, redis_cli, watchdog};

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
                    sentinel_watchdog: watchdog(child.id(), &dir.0),
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
