//! Security of `sluice serve` on a real Redis: credentials (API keys, bearer tokens, the admin
//! token, the Redis password) never appear in Redis key names, in the process's log output
//! (captured at TRACE) or in metric labels; `X-Forwarded-For` cannot be spoofed to get a fresh
//! bucket; hostile identities cannot inject a hash tag; admin endpoints bind loopback by default and require the
//! token when one is set.

use std::collections::BTreeSet;
use std::time::Duration;

use serde_json::json;
use sluice_core::key::{hash_tag, key_slot};
use sluice_reliability::logs;
use sluice_reliability::serve::{client, start_with};
use sluice_server::Config;
use sluice_testkit::servers::{RedisServer, keys_with_ttl};

use crate::secured_server::{
    ADMIN, REDIS_PASSWORD, config, metrics, redis_with_password, upstream,
};

fn all_keys(r: &RedisServer) -> Vec<String> {
    let out = std::process::Command::new("redis-cli")
        .args([
            "-h",
            "127.0.0.1",
            "-p",
            &r.port().to_string(),
            "-a",
            REDIS_PASSWORD,
            "--no-auth-warning",
            "--scan",
        ])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_string)
        .filter(|l| !l.is_empty())
        .collect()
}

#[test]
fn credentials_never_reach_keys_logs_or_metrics() {
    // Everything this test's runtime logs, at TRACE (the process's other tests log elsewhere).
    let capture = logs::Capture::new();
    capture.block_on(2, credentials_scan(&capture));
}

async fn credentials_scan(capture: &logs::Capture) {
    let mut redis = redis_with_password();
    let up = upstream().await;
    let s = start_with(&config(redis.port(), up, ""), &[]).await;
    let c = client();
    let secrets: Vec<String> = (0..10)
        .map(|i| format!("sk_live_{i}_{:016x}", rand::random::<u64>()))
        .collect();
    for secret in &secrets {
        for expect in [200, 200, 429] {
            let res = c
                .get(s.proxy_url("/key/x"))
                .header("x-api-key", secret)
                .send()
                .await
                .unwrap();
            assert_eq!(res.status(), expect, "per API key bucket of 2");
            let res = c
                .get(s.proxy_url("/bearer/x"))
                .bearer_auth(secret)
                .send()
                .await
                .unwrap();
            assert_eq!(res.status(), expect, "per bearer token window of 2");
        }
    }
    // Admin calls with a wrong token (logged or counted anywhere?) and the right one.
    for token in [ADMIN, "wrong-admin-guess"] {
        let _ = c
            .get(s.url("/metrics"))
            .bearer_auth(token)
            .send()
            .await
            .unwrap();
        let _ = c
            .post(s.url("/admin/reload"))
            .bearer_auth(token)
            .send()
            .await
            .unwrap();
    }
    // Failures log: kill Redis so the store errors (with the URL's password at hand) are logged.
    redis.stop();
    for secret in &secrets {
        let _ = c
            .get(s.proxy_url("/key/x"))
            .header("x-api-key", secret)
            .send()
            .await
            .unwrap();
    }
    let _ = c
        .post(s.url("/v1/check"))
        .json(&json!({"policy": "api", "identity": "u"}))
        .send()
        .await
        .unwrap();
    let _ = c.get(s.url("/readyz")).send().await.unwrap();
    redis.restart();
    // Wait (at most 10 s) for the store to answer again, then write keys for every credential.
    let mut recovered = false;
    for _ in 0..500 {
        let r = c
            .post(s.url("/v1/check"))
            .json(&json!({"policy": "api", "identity": "after"}))
            .send()
            .await
            .unwrap();
        if r.text().await.unwrap().contains("\"decided\"") {
            recovered = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        recovered,
        "the store did not answer within 10 s of the restart"
    );
    // Fresh credentials (the limiter's local deny cache still answers for the denied ones).
    let fresh: Vec<String> = (0..10)
        .map(|i| format!("sk_test_{i}_{:016x}", rand::random::<u64>()))
        .collect();
    for secret in &fresh {
        let r = c
            .get(s.proxy_url("/key/x"))
            .header("x-api-key", secret)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        let r = c
            .get(s.proxy_url("/bearer/x"))
            .bearer_auth(secret)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
    }

    let keys = all_keys(&redis);
    assert!(
        keys.iter().any(|k| k.contains("key:h")),
        "hashed API-key identities are stored: {keys:?}"
    );
    let text = metrics(&s).await;
    let log = capture.text();
    assert!(
        log.contains("rate limit store failed"),
        "the failure was logged (the scan below is meaningful)"
    );
    assert!(
        keys.iter()
            .filter(|k| k.contains("key:h") || k.contains("bearer:h"))
            .count()
            >= 20,
        "{keys:?}"
    );
    for secret in secrets.iter().chain(&fresh).map(String::as_str).chain([
        ADMIN,
        REDIS_PASSWORD,
        "wrong-admin-guess",
    ]) {
        assert!(
            !keys.iter().any(|k| k.contains(secret)),
            "{secret} in a key name"
        );
        assert!(!text.contains(secret), "{secret} in /metrics");
        assert!(!log.contains(secret), "{secret} in the log output");
    }
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forwarded_for_cannot_be_spoofed() {
    let up = upstream().await;
    let c = client();
    // No trusted proxies: the socket peer is the client whatever the headers say.
    let redis = redis_with_password();
    let s = start_with(&config(redis.port(), up, ""), &[]).await;
    let mut statuses = Vec::new();
    for i in 0..6 {
        let spoof = format!("198.51.100.{i}, 203.0.113.{i}");
        let res = c
            .get(s.proxy_url("/ip/x"))
            .header("x-forwarded-for", spoof)
            .header("x-real-ip", format!("192.0.2.{i}"))
            .header("forwarded", format!("for=192.0.2.{i}"))
            .send()
            .await
            .unwrap();
        statuses.push(res.status().as_u16());
    }
    assert_eq!(
        statuses,
        [200, 200, 200, 429, 429, 429],
        "spoofed headers do not give new buckets"
    );
    s.stop().await;

    // 127.0.0.1 trusted: the right-most untrusted hop is the client; what the client wrote to
    // its left changes nothing.
    let s = start_with(&config(redis.port(), up, "\"127.0.0.1\""), &[]).await;
    let mut statuses = Vec::new();
    for i in 0..6 {
        let spoof = format!("10.9.8.{i}, 1.1.1.{i}, 203.0.113.77");
        let res = c
            .get(s.proxy_url("/ip/x"))
            .header("x-forwarded-for", spoof)
            .send()
            .await
            .unwrap();
        statuses.push(res.status().as_u16());
    }
    assert_eq!(
        statuses,
        [200, 200, 200, 429, 429, 429],
        "one client, one bucket"
    );
    // A different real client (as our proxy reports it) has its own bucket.
    let res = c
        .get(s.proxy_url("/ip/x"))
        .header("x-forwarded-for", "203.0.113.78")
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 200);
    // Hops of the client's own making that claim to be our proxy do not move the client left.
    let res = c
        .get(s.proxy_url("/ip/x"))
        .header("x-forwarded-for", "203.0.113.77, 127.0.0.1")
        .send()
        .await
        .unwrap();
    assert_eq!(
        res.status(),
        429,
        "a trusted-looking hop on the right is skipped, the client found"
    );
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_identities_cannot_inject_a_hash_tag() {
    let redis = redis_with_password();
    let up = upstream().await;
    let s = start_with(&config(redis.port(), up, ""), &[]).await;
    let hostile = [
        "}",
        "{",
        "a}b{c",
        "{user:1}",
        "}{}",
        "x}:api",
        "%7D",
        "\u{0}}",
        "{}",
        "user:1}\r\nFLUSHALL\r\n",
    ];
    for id in hostile {
        for _ in 0..2 {
            let res = client()
                .post(s.url("/v1/check"))
                .json(&json!({"policies": ["api", "other"], "identity": id}))
                .send()
                .await
                .unwrap();
            assert_eq!(res.status(), 200, "{id:?}");
        }
    }
    let keys = all_keys(&redis);
    assert_eq!(
        keys.len(),
        hostile.len() * 2,
        "two keys per identity, no collision, nothing flushed: {keys:?}"
    );
    let mut tags = BTreeSet::new();
    for k in &keys {
        assert_eq!(k.matches('{').count(), 1, "{k}");
        assert_eq!(k.matches('}').count(), 1, "{k}");
        assert!(k.ends_with("}:api") || k.ends_with("}:other"), "{k}");
        tags.insert(String::from_utf8_lossy(hash_tag(k.as_bytes())).into_owned());
    }
    assert_eq!(tags.len(), hostile.len(), "one hash tag per identity");
    // Both policies of one identity share a slot (one script call on a Cluster).
    for t in &tags {
        let slots: BTreeSet<u16> = keys
            .iter()
            .filter(|k| hash_tag(k.as_bytes()) == t.as_bytes())
            .map(|k| key_slot(k.as_bytes()))
            .collect();
        assert_eq!(slots.len(), 1, "{t}");
    }
    // Every key has a TTL.
    let _ = keys_with_ttl; // (the password-protected server needs -a; checked with PTTL below)
    for k in &keys {
        let out = std::process::Command::new("redis-cli")
            .args([
                "-h",
                "127.0.0.1",
                "-p",
                &redis.port().to_string(),
                "-a",
                REDIS_PASSWORD,
                "--no-auth-warning",
                "PTTL",
                k,
            ])
            .output()
            .unwrap();
        let ttl: i64 = String::from_utf8_lossy(&out.stdout).trim().parse().unwrap();
        assert!(ttl > 0, "{k} has no TTL ({ttl})");
    }
    s.stop().await;
}

#[tokio::test]
async fn admin_endpoints_bind_loopback_and_require_the_token() {
    // Defaults: every listener on loopback.
    let c = Config::parse("", "defaults.toml", None).unwrap();
    assert!(c.server.http.ip().is_loopback(), "{}", c.server.http);
    assert!(c.server.grpc.ip().is_loopback(), "{}", c.server.grpc);
    assert!(c.server.proxy.ip().is_loopback(), "{}", c.server.proxy);
    assert!(c.admin_token.is_none());

    let redis = redis_with_password();
    let up = upstream().await;
    let s = start_with(&config(redis.port(), up, ""), &[]).await;
    let cl = client();
    for (path, post) in [("/metrics", false), ("/admin/reload", true)] {
        let req = |token: Option<&str>| {
            let r = if post {
                cl.post(s.url(path))
            } else {
                cl.get(s.url(path))
            };
            match token {
                Some(t) => r.header("authorization", t),
                None => r,
            }
        };
        for bad in [
            None,
            Some("Bearer"),
            Some("Bearer "),
            Some("Bearer wrong"),
            Some(ADMIN),
            Some("Basic YWRtaW46YWRtaW4="),
            Some(&format!("Bearer {ADMIN}x")),
            Some(&format!("bearer{ADMIN}")),
        ] {
            let res = req(bad).send().await.unwrap();
            assert_eq!(res.status(), 401, "{path} with {bad:?}");
            assert_eq!(res.headers().get("www-authenticate").unwrap(), "Bearer");
        }
        let res = req(Some(&format!("Bearer {ADMIN}"))).send().await.unwrap();
        assert!(res.status().is_success(), "{path}: {}", res.status());
    }
    // The decision API and health stay open.
    assert_eq!(
        cl.get(s.url("/healthz")).send().await.unwrap().status(),
        200
    );
    s.stop().await;
}
