//! Connection options against real servers: TLS (`rediss://` with a throwaway CA, a client
//! certificate, `#insecure`, and a plain connection to a TLS port failing fast), ACL user with
//! password and a database index (and a wrong password giving a clear error without the
//! password), and Sentinel (one master, one replica, one sentinel, with a forced failover).

use crate::support;

use sluice_core::{Algorithm, CheckItem, Rate, Store, StoreError};
use sluice_redis::RedisStore;
use sluice_testkit::conformance::{start_clock, token_bucket_guide_sequence};
use sluice_testkit::servers::{RedisServer, SentinelGroup, TlsFiles, TlsRedisServer};
use std::sync::Arc;
use std::time::{Duration, Instant};

fn bucket() -> Algorithm {
    Algorithm::TokenBucket {
        capacity: 3,
        rate: Rate::new(1, 3_600_000),
    }
}

/// Three checks at capacity 3: all admitted, and the fourth denied.
async fn three_then_denied(store: &RedisStore, key: &str) {
    let alg = bucket();
    for i in 0..4 {
        let d = store
            .check(&[CheckItem {
                key,
                algorithm: &alg,
                cost: 1,
            }])
            .await
            .expect("check");
        assert_eq!(d.allowed, i < 3, "check {i}");
    }
}

async fn connect(url: &str, ns: &str) -> Result<RedisStore, StoreError> {
    RedisStore::builder(url)
        .timeout(Duration::from_secs(5))
        .connect_timeout(Duration::from_secs(2))
        .namespace(ns)
        .connect()
        .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_with_a_custom_ca() {
    let files = TlsFiles::generate();
    let server = TlsRedisServer::start(&files, "no");
    let ca = files.ca();
    let url = format!("{}?ca={}", server.url(), ca.display());

    // The token bucket guide sequence over TLS, with the explicit clock.
    let clock = start_clock();
    let store = RedisStore::builder(url.as_str())
        .clock(Arc::new(clock.clone()))
        .timeout(Duration::from_secs(5))
        .namespace(support::namespace("tls"))
        .connect()
        .await
        .expect("connect over TLS with ?ca=");
    token_bucket_guide_sequence(Arc::new(store), clock).await;

    // The server clock, and the keys really are on that server.
    let ns = support::namespace("tls2");
    let store = connect(&url, &ns).await.expect("connect");
    three_then_denied(&store, "rl:{u}:p").await;
    let keys = server.cli(&files, &["--scan", "--pattern", &format!("{ns}*")]);
    assert_eq!(keys.trim(), format!("{ns}rl:{{u}}:p"));

    // valkeys:// is the same scheme; #insecure skips verification (no CA given).
    let insecure = format!("valkeys://127.0.0.1:{}/#insecure", server.port());
    let store = connect(&insecure, &support::namespace("tls3"))
        .await
        .expect("connect with #insecure");
    three_then_denied(&store, "rl:{u}:p").await;

    // Without the CA, the self-made certificate is not trusted: a clear, fast error.
    let start = Instant::now();
    let err = connect(&server.url(), "x:")
        .await
        .expect_err("untrusted CA");
    assert!(
        start.elapsed() < Duration::from_secs(3),
        "{:?}",
        start.elapsed()
    );
    assert!(
        matches!(err, StoreError::Unavailable(_) | StoreError::Timeout(_)),
        "{err:?}"
    );

    // A missing CA file is a configuration error.
    let err = connect(&format!("{}?ca=/nonexistent/ca.pem", server.url()), "x:")
        .await
        .expect_err("missing CA file");
    assert!(
        matches!(err, StoreError::Invalid(ref m) if m.contains("/nonexistent/ca.pem")),
        "{err:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plain_connection_to_a_tls_port_fails_fast() {
    let files = TlsFiles::generate();
    let server = TlsRedisServer::start(&files, "no");
    let url = format!("redis://127.0.0.1:{}", server.port());
    let start = Instant::now();
    let err = RedisStore::builder(url.as_str())
        .connect_timeout(Duration::from_millis(1000))
        .connect()
        .await
        .expect_err("plain text to a TLS port");
    let took = start.elapsed();
    eprintln!("plain text to a TLS port, after {took:?}: {err}");
    assert!(
        matches!(err, StoreError::Unavailable(_) | StoreError::Timeout(_)),
        "{err:?}"
    );
    assert!(took < Duration::from_millis(1500), "took {took:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_with_a_client_certificate() {
    let files = TlsFiles::generate();
    let server = TlsRedisServer::start(&files, "yes");
    let ca = files.ca();
    let base = format!("{}?ca={}", server.url(), ca.display());

    let err = connect(&base, "x:")
        .await
        .expect_err("no client certificate");
    assert!(
        matches!(err, StoreError::Unavailable(_) | StoreError::Timeout(_)),
        "{err:?}"
    );

    let url = format!(
        "{base}&cert={}&key={}",
        files.path("client.pem").display(),
        files.path("client.key").display()
    );
    let store = connect(&url, &support::namespace("mtls"))
        .await
        .expect("connect with a client certificate");
    three_then_denied(&store, "rl:{u}:p").await;

    // cert= without key= and TLS options on a plain URL are refused.
    let err = connect(&format!("{base}&cert=/x"), "x:")
        .await
        .expect_err("cert alone");
    assert!(matches!(err, StoreError::Invalid(_)), "{err:?}");
    let err = connect("redis://127.0.0.1:1?ca=/x", "x:")
        .await
        .expect_err("ca on redis://");
    assert!(matches!(err, StoreError::Invalid(_)), "{err:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acl_user_password_and_database_index() {
    let server = RedisServer::redis();
    let password = "s3cret-Pa55word";
    let out = server.cli(&[
        "ACL",
        "SETUSER",
        "sluice",
        "on",
        &format!(">{password}"),
        "~*",
        "+@all",
    ]);
    assert!(out.contains("OK"), "ACL SETUSER: {out}");
    let port = server.port();

    let ns = support::namespace("acl");
    let url = format!("redis://sluice:{password}@127.0.0.1:{port}/3");
    let store = connect(&url, &ns).await.expect("connect as an ACL user");
    three_then_denied(&store, "rl:{u}:p").await;
    let functions = format!("{url}?mode=functions");
    let store = connect(&functions, &ns)
        .await
        .expect("functions mode as an ACL user");
    three_then_denied(&store, "rl:{v}:p").await;
    // The keys are in database 3, not 0.
    let pattern = format!("{ns}*");
    let mut in_db3: Vec<String> = server
        .cli(&["-n", "3", "--scan", "--pattern", &pattern])
        .lines()
        .map(str::to_string)
        .collect();
    in_db3.sort();
    assert_eq!(
        in_db3,
        vec![format!("{ns}rl:{{u}}:p"), format!("{ns}rl:{{v}}:p")]
    );
    assert_eq!(
        server
            .cli(&["-n", "0", "--scan", "--pattern", &pattern])
            .trim(),
        ""
    );
    // Every key has a TTL.
    for k in &in_db3 {
        let ttl: i64 = server.cli(&["-n", "3", "PTTL", k]).trim().parse().unwrap();
        assert!(ttl > 0, "{k}: {ttl}");
    }

    // A wrong password: a clear error quickly, without the password in it.
    for wrong in ["Wr0ng-Passw0rd", "wr%40ng"] {
        let url = format!("redis://sluice:{wrong}@127.0.0.1:{port}/3");
        let start = Instant::now();
        let err = connect(&url, "x:").await.expect_err("wrong password");
        assert!(
            start.elapsed() < Duration::from_secs(2),
            "{:?}",
            start.elapsed()
        );
        let msg = err.to_string();
        eprintln!("wrong password: {msg}");
        assert!(matches!(err, StoreError::Invalid(_)), "{err:?}");
        assert!(msg.contains("authentication failed"), "{msg}");
        assert!(!msg.contains(wrong), "{msg}");
        assert!(!msg.contains("wr@ng"), "{msg}");
        assert!(!format!("{err:?}").contains(wrong), "{err:?}");
    }
    // A user that does not exist: the same.
    let err = connect(&format!("redis://nobody:{password}@127.0.0.1:{port}"), "x:")
        .await
        .expect_err("unknown user");
    assert!(matches!(err, StoreError::Invalid(_)), "{err:?}");
    assert!(!err.to_string().contains(password), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_finds_the_master_and_follows_a_failover() {
    let group = SentinelGroup::start();
    let ns = support::namespace("sentinel");
    let store = connect(&format!("{}/2", group.url()), &ns)
        .await
        .unwrap_or_else(|e| panic!("connect through sentinel: {e}\n{}", group.sentinel_log()));
    three_then_denied(&store, "rl:{a}:p").await;
    let pattern = format!("{ns}*");
    assert_eq!(
        group
            .master()
            .cli(&["-n", "2", "--scan", "--pattern", &pattern])
            .trim(),
        format!("{ns}rl:{{a}}:p")
    );

    // The replica is promoted; the store finds the new master by itself.
    group.failover(Duration::from_secs(30));
    assert_eq!(group.current_master_port(), Some(group.replica().port()));
    let alg = bucket();
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut errors = 0;
    let first_ok = loop {
        match store
            .check(&[CheckItem {
                key: "rl:{b}:p",
                algorithm: &alg,
                cost: 1,
            }])
            .await
        {
            Ok(d) => break d,
            Err(_) => errors += 1,
        }
        assert!(
            Instant::now() < deadline,
            "no decision after the failover ({errors} errors)\n{}",
            group.sentinel_log()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(first_ok.allowed);
    // The write went to the new master (the old one is now its replica).
    assert!(
        group
            .replica()
            .cli(&["-n", "2", "--scan", "--pattern", &pattern])
            .contains("rl:{b}:p")
    );
    // The state written before the failover was replicated: {a} stays exhausted.
    let d = store
        .check(&[CheckItem {
            key: "rl:{a}:p",
            algorithm: &alg,
            cost: 1,
        }])
        .await
        .expect("check after failover");
    assert!(!d.allowed);

    // A master name the sentinel does not know: a clear error.
    let url = format!(
        "redis+sentinel://127.0.0.1:{}/no-such-master",
        group.sentinel_port()
    );
    assert!(connect(&url, "x:").await.is_err());
}
