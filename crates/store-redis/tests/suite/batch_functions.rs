//! One-policy batches through the batch function library (`FCALL`, src/store/call.rs) and
//! their ways back: the library loaded again after `FUNCTION FLUSH` (or a restart without
//! persistence), and scripts (`EVALSHA`) for a client the server does not let run functions.
//! Every case must decide exactly as before; which command ran is read from
//! `INFO commandstats`.

use futures::future::join_all;
use sluice_core::{Algorithm, CheckItem, Rate, Store};
use sluice_redis::RedisStore;
use sluice_testkit::servers::{RedisCluster, RedisServer, redis_cli};
use std::sync::Arc;
use std::time::Duration;

/// `calls=` of `command` in `port`'s `INFO commandstats` (0 when it never ran).
fn calls_of(port: u16, command: &str) -> u64 {
    let prefix = format!("cmdstat_{command}:calls=");
    redis_cli(port, &["INFO", "commandstats"])
        .lines()
        .find_map(|l| l.strip_prefix(prefix.as_str()))
        .and_then(|rest| rest.split(',').next()?.parse().ok())
        .unwrap_or(0)
}

fn scripts_run(port: u16) -> u64 {
    calls_of(port, "evalsha") + calls_of(port, "eval")
}

/// The batch libraries `port` holds (`FUNCTION LIST`), as text.
fn libraries(port: u16) -> String {
    redis_cli(port, &["FUNCTION", "LIST", "LIBRARYNAME", "sluice_batch_*"])
}

async fn store(url: String) -> Arc<RedisStore> {
    Arc::new(
        RedisStore::builder(url)
            .timeout(Duration::from_secs(10))
            .connect()
            .await
            .unwrap(),
    )
}

fn limit_of_7() -> Algorithm {
    Algorithm::TokenBucket {
        capacity: 7,
        rate: Rate::new(1, 3_600_000),
    }
}

/// `per_key` concurrent checks on each of `keys` keys (each in a slot of its own): the number
/// admitted per key, with every error a failure of the test.
async fn flood(store: &Arc<RedisStore>, tag: &str, keys: usize, per_key: usize) -> Vec<usize> {
    let algorithm = limit_of_7();
    let calls = (0..keys * per_key).map(|i| {
        let (store, algorithm) = (Arc::clone(store), algorithm.clone());
        let key = format!("rl:{{{tag}{}}}:p", i % keys);
        async move {
            let d = store
                .check(&[CheckItem {
                    key: &key,
                    algorithm: &algorithm,
                    cost: 1,
                }])
                .await
                .unwrap_or_else(|e| panic!("{key}: {e}"));
            (i % keys, d.allowed)
        }
    });
    let mut admitted = vec![0; keys];
    for (k, ok) in join_all(calls).await {
        admitted[k] += usize::from(ok);
    }
    admitted
}

#[tokio::test]
async fn batches_call_the_function_library_and_load_it_again_after_a_flush() {
    for server in [RedisServer::redis(), RedisServer::valkey()] {
        let kind = server.kind();
        let port = server.port();
        let s = store(server.url()).await;
        server.cli(&["CONFIG", "RESETSTAT"]);
        let admitted = flood(&s, "a", 40, 20).await;
        assert!(admitted.iter().all(|&n| n == 7), "{kind:?}: {admitted:?}");
        let fcalls = calls_of(port, "fcall");
        assert!(
            fcalls > 0 && fcalls < 800,
            "{kind:?}: {fcalls} FCALLs for 800 checks"
        );
        assert_eq!(scripts_run(port), 0, "{kind:?}: a batch went to a script");
        assert!(libraries(port).contains("sluice_batch_tb_"), "{kind:?}");

        // Both caches emptied, as by a restart without persistence: the next batch loads the
        // library again and decides exactly.
        server.cli(&["FUNCTION", "FLUSH"]);
        server.cli(&["SCRIPT", "FLUSH"]);
        assert!(!libraries(port).contains("sluice_batch_tb_"), "{kind:?}");
        let admitted = flood(&s, "b", 40, 20).await;
        assert!(admitted.iter().all(|&n| n == 7), "{kind:?}: {admitted:?}");
        assert!(libraries(port).contains("sluice_batch_tb_"), "{kind:?}");
        assert!(calls_of(port, "fcall") > fcalls, "{kind:?}");
        assert_eq!(scripts_run(port), 0, "{kind:?}");
    }
}

#[tokio::test]
async fn a_client_without_function_rights_batches_with_scripts() {
    for server in [RedisServer::redis(), RedisServer::valkey()] {
        let kind = server.kind();
        let port = server.port();
        // Everything but functions: FCALL and FUNCTION LOAD answer NOPERM.
        server.cli(&[
            "ACL",
            "SETUSER",
            "nofn",
            "on",
            ">pw",
            "~*",
            "&*",
            "+@all",
            "-fcall",
            "-fcall_ro",
            "-function",
        ]);
        let s = store(format!("redis://nofn:pw@127.0.0.1:{port}")).await;
        server.cli(&["CONFIG", "RESETSTAT"]);
        let admitted = flood(&s, "n", 40, 20).await;
        assert!(admitted.iter().all(|&n| n == 7), "{kind:?}: {admitted:?}");
        assert_eq!(calls_of(port, "fcall"), 0, "{kind:?}");
        let scripts = scripts_run(port);
        assert!(
            scripts > 0 && scripts < 800,
            "{kind:?}: {scripts} script calls for 800 checks"
        );
        assert!(!libraries(port).contains("sluice_batch_"), "{kind:?}");
        // The scripts' own recovery: EVAL when the script cache was flushed.
        server.cli(&["SCRIPT", "FLUSH"]);
        let admitted = flood(&s, "m", 40, 20).await;
        assert!(admitted.iter().all(|&n| n == 7), "{kind:?}: {admitted:?}");
        assert!(
            calls_of(port, "eval") > 0,
            "{kind:?}: no EVAL after the flush"
        );
        assert_eq!(calls_of(port, "fcall"), 0, "{kind:?}");
    }
}

#[tokio::test]
async fn cluster_batches_call_the_library_on_every_master_and_after_a_flush() {
    // A Cluster of its own: the calls counted and the flush below are this test's alone.
    let cluster = RedisCluster::start();
    let ports: Vec<u16> = cluster.nodes().iter().map(|n| n.port()).collect();
    let masters: Vec<u16> = ports
        .iter()
        .copied()
        .filter(|&p| redis_cli(p, &["ROLE"]).starts_with("master"))
        .collect();
    assert!(masters.len() >= 3, "{masters:?}");
    let s = store(cluster.url()).await;
    let admitted = flood(&s, "c", 300, 10).await;
    assert!(admitted.iter().all(|&n| n == 7), "{admitted:?}");
    for &p in &masters {
        assert!(calls_of(p, "fcall") > 0, "master {p} ran no FCALL");
        assert_eq!(scripts_run(p), 0, "master {p} ran a batch as a script");
        assert!(libraries(p).contains("sluice_batch_tb_"), "master {p}");
    }
    for &p in &masters {
        redis_cli(p, &["FUNCTION", "FLUSH"]);
    }
    let admitted = flood(&s, "d", 300, 10).await;
    assert!(admitted.iter().all(|&n| n == 7), "{admitted:?}");
    for &p in &masters {
        assert!(libraries(p).contains("sluice_batch_tb_"), "master {p}");
        assert_eq!(scripts_run(p), 0, "master {p}");
    }
}
