//! Key hygiene on every server kind: credentials never appear in key names, hostile
//! identities keep their own slot and state, and every key written has a TTL no longer than
//! the time until its state is back to initial.

use crate::support;

use sluice_core::key::{default_hash_key, hash_tag, key_slot};
use sluice_core::{Algorithm, CheckItem, Identity, KeyScheme, Rate, Store};
use sluice_testkit::servers::keys_with_ttl;
use support::{KINDS, Kind, server_clock_store};

/// The ports to SCAN for `kind` (every node of the Cluster).
fn ports(kind: Kind) -> Vec<u16> {
    match kind {
        Kind::Redis => vec![support::redis().port()],
        Kind::Valkey => vec![support::valkey().port()],
        Kind::Cluster => support::cluster()
            .nodes()
            .iter()
            .map(|n| n.port())
            .collect(),
    }
}

fn all_keys(kind: Kind, ns: &str) -> Vec<(String, i64)> {
    let mut v: Vec<(String, i64)> = ports(kind)
        .into_iter()
        .flat_map(|p| keys_with_ttl(p, &format!("{ns}*")))
        .collect();
    v.sort();
    v.dedup_by(|a, b| a.0 == b.0);
    v
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn credentials_never_appear_in_key_names() {
    let scheme = KeyScheme::default();
    let hash_key = default_hash_key();
    // A slow refill: each key lives an hour, so a busy machine cannot expire keys before
    // the scan (at 5/s a spent token came back, and its key expired, within 200 ms).
    let alg = Algorithm::TokenBucket {
        capacity: 10,
        rate: Rate::new(1, 3_600_000),
    };
    for kind in KINDS {
        let store = server_clock_store(kind, "cred").await;
        let ns = store.server_key("");
        let secrets: Vec<String> = (0..20)
            .map(|i| format!("sk_live_{i:04}_{:016x}", rand::random::<u64>()))
            .collect();
        for s in &secrets {
            let id = Identity::credential("key", s.as_bytes(), &hash_key);
            let key = scheme.key(&id, "api");
            assert!(
                store
                    .check(&[CheckItem {
                        key: &key,
                        algorithm: &alg,
                        cost: 1
                    }])
                    .await
                    .unwrap()
                    .allowed
            );
        }
        let keys = all_keys(kind, &ns);
        assert!(keys.len() >= 20, "{kind:?}: found {} keys", keys.len());
        for (k, _) in &keys {
            for s in &secrets {
                assert!(
                    !k.contains(s.as_str()),
                    "{kind:?}: key {k:?} contains a raw credential"
                );
            }
            assert!(k.contains(":{key:h"), "{kind:?}: {k}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hash_tag_injection_keeps_its_own_slot_and_state() {
    let scheme = KeyScheme::default();
    let hostile = [
        "user:42",
        "user:42}",
        "{user:42}",
        "}{user:42",
        "user:42 ",
        " user:42",
        "user:42\n",
        "a}{b",
        "}{",
        "{",
        "}",
        "%7D",
        "user:42%7D",
        "\u{0}",
        "é",
    ];
    let alg = Algorithm::FixedWindow {
        limit: 1,
        window_ms: 60_000,
    };
    let keys: Vec<String> = hostile
        .iter()
        .map(|h| scheme.key(&Identity::new(*h), "p"))
        .collect();
    // Distinct identities, distinct keys; each key's hash tag is its own escaped identity.
    let mut unique = keys.clone();
    unique.sort();
    unique.dedup();
    assert_eq!(unique.len(), keys.len());
    for k in &keys {
        let tag = hash_tag(k.as_bytes());
        assert!(!tag.contains(&b'{') && !tag.contains(&b'}'), "{k}");
        assert!(k.starts_with("rl:{") && k.ends_with("}:p"), "{k}");
    }
    // The empty identity keeps a non-empty tag (`rl:{%}:p`), so all its keys share one slot and
    // a multi-limit check for it is one Cluster call like any other.
    let empty = Identity::new("");
    let (e1, e2) = (scheme.key(&empty, "minute"), scheme.key(&empty, "day"));
    assert_eq!(key_slot(e1.as_bytes()), key_slot(e2.as_bytes()));
    let cluster_store = server_clock_store(Kind::Cluster, "empty").await;
    let items = [
        CheckItem {
            key: &e1,
            algorithm: &alg,
            cost: 1,
        },
        CheckItem {
            key: &e2,
            algorithm: &alg,
            cost: 1,
        },
    ];
    let d = cluster_store
        .check(&items)
        .await
        .expect("one-slot check on the cluster");
    assert!(d.allowed);

    for kind in KINDS {
        let store = server_clock_store(kind, "inject").await;
        if kind == Kind::Cluster {
            // The server computes the same slot as sluice for every hostile key.
            let node = &support::cluster().nodes()[0];
            for k in &keys {
                let server_slot: u16 = node
                    .cli(&["CLUSTER", "KEYSLOT", &store.server_key(k)])
                    .trim()
                    .parse()
                    .unwrap();
                assert_eq!(server_slot, key_slot(k.as_bytes()), "{k:?}");
            }
        }
        // Each identity has its own state: the first check of each admits (limit 1), the
        // second denies; no identity consumed another's.
        for k in &keys {
            assert!(
                store
                    .check(&[CheckItem {
                        key: k,
                        algorithm: &alg,
                        cost: 1
                    }])
                    .await
                    .unwrap()
                    .allowed,
                "{kind:?} {k}"
            );
        }
        for k in &keys {
            assert!(
                !store
                    .check(&[CheckItem {
                        key: k,
                        algorithm: &alg,
                        cost: 1
                    }])
                    .await
                    .unwrap()
                    .allowed,
                "{kind:?} {k}"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_key_has_a_ttl_no_longer_than_its_reset() {
    let scheme = KeyScheme::default();
    for kind in KINDS {
        let store = server_clock_store(kind, "ttl").await;
        let ns = store.server_key("");
        let algs = support::algorithms();
        let mut longest = 0;
        for (i, alg) in algs.iter().enumerate() {
            let id = Identity::new(format!("ttl:{i}"));
            let key = scheme.key(&id, "p");
            longest = longest.max(alg.window_ms());
            for cost in [1, 1, 2, 0, 1] {
                let _ = store
                    .check(&[CheckItem {
                        key: &key,
                        algorithm: alg,
                        cost,
                    }])
                    .await
                    .unwrap();
            }
            // A multi-limit check over the same identity writes both keys or neither.
            let other = scheme.key(&id, "q");
            let items = [
                CheckItem {
                    key: &key,
                    algorithm: alg,
                    cost: 1,
                },
                CheckItem {
                    key: &other,
                    algorithm: alg,
                    cost: 1,
                },
            ];
            let _ = store.check(&items).await.unwrap();
        }
        let keys = all_keys(kind, &ns);
        assert!(keys.len() >= algs.len(), "{kind:?}: {keys:?}");
        for (k, ttl) in &keys {
            // Redis answers -1 for a key without a TTL, -2 for a vanished key.
            assert!(*ttl != -1, "{kind:?}: key {k} has no TTL");
            assert!(
                *ttl <= 2 * longest as i64,
                "{kind:?}: key {k} TTL {ttl} ms is too long"
            );
        }
    }
}
