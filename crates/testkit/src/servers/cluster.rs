//! A local Redis Cluster of three masters and three replicas, with failover helpers.

use std::process::Command;
use std::time::{Duration, Instant};

use super::{RedisServer, ServerKind};

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
