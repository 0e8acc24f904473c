//! The one-policy batch script (`lua/batch_step.lua`, every algorithm with a step): field by
//! field the same decisions and stored states as the generic `lua/batch.lua` (itself held to
//! the Rust algorithms by the differential tests), a key repeated in a batch decided exactly
//! as separate calls, and Cluster batches of keys in many slots: exact counts, never CROSSSLOT.

use crate::support;

use futures::future::join_all;
use rand::{Rng, SeedableRng, rngs::StdRng};
use sluice_core::{Algorithm, CheckItem, Rate, Store};
use sluice_redis::RedisStore;
use std::sync::Arc;
use std::time::Duration;
use support::{Kind, namespace, url};

/// A store on the server clock (so it batches); TTLs padded by 10 minutes, since the
/// explicit `now` of `batch_at` is not the server's clock that expires keys.
async fn store(kind: Kind, tag: &str) -> RedisStore {
    store_on(url(kind), tag).await
}

/// [`store`] on the server at `url`.
async fn store_on(url: String, tag: &str) -> RedisStore {
    RedisStore::builder(url)
        .timeout(Duration::from_secs(10))
        .ttl_pad_ms(600_000)
        .namespace(namespace(tag))
        .connect()
        .await
        .expect("connect")
}

/// The stored value and PTTL of `key` on a standalone server.
async fn stored(store: &RedisStore, key: &str) -> (Option<Vec<u8>>, i64) {
    let k = store.server_key(key);
    let mut get = sluice_redis::redis::cmd("GET");
    get.arg(&k);
    let v = store.command(&get).await.unwrap();
    let mut ttl = sluice_redis::redis::cmd("PTTL");
    ttl.arg(&k);
    let t = store.command(&ttl).await.unwrap();
    let v = match v {
        sluice_redis::redis::Value::BulkString(b) => Some(b),
        _ => None,
    };
    let t = match t {
        sluice_redis::redis::Value::Int(i) => i,
        other => panic!("PTTL {other:?}"),
    };
    (v, t)
}

fn policies() -> Vec<Algorithm> {
    vec![
        Algorithm::TokenBucket {
            capacity: 5,
            rate: Rate::per_second(1),
        },
        Algorithm::TokenBucket {
            capacity: 10,
            rate: Rate::new(6, 1400),
        },
        Algorithm::TokenBucket {
            capacity: 1_000,
            rate: Rate::new(1_000_000, 1000),
        },
        Algorithm::Gcra {
            rate: Rate::per_second(5),
            burst: 2,
        },
        Algorithm::Gcra {
            rate: Rate::new(3, 1000),
            burst: 0,
        },
        Algorithm::Gcra {
            rate: Rate::new(7, 3),
            burst: 40,
        },
        Algorithm::FixedWindow {
            limit: 5,
            window_ms: 1000,
        },
        Algorithm::FixedWindow {
            limit: 30,
            window_ms: 700,
        },
        Algorithm::CalendarWindow {
            limit: 6,
            period: sluice_core::algorithm::calendar::CalendarPeriod::Day,
        },
        Algorithm::LeakyBucket {
            capacity: 4,
            rate: Rate::per_second(2),
            mode: sluice_core::LeakyMode::Policing,
        },
        Algorithm::LeakyBucket {
            capacity: 3,
            rate: Rate::new(5, 300),
            mode: sluice_core::LeakyMode::Shaping,
        },
        Algorithm::SlidingWindowCounter {
            limit: 5,
            window_ms: 1000,
        },
        Algorithm::SlidingWindowCounter {
            limit: 12,
            window_ms: 700,
        },
    ]
}

/// The most a policy admits at once.
fn limit_of(algorithm: &Algorithm) -> u64 {
    algorithm.quota()
}

/// Random batches over 4 keys (so keys repeat within a batch), random costs (0, 1, a few,
/// beyond the limit) and random clock steps: the one-policy script and the generic one agree
/// on every field of every decision and on every stored value and TTL.
async fn one_policy_matches_generic(kind: Kind) {
    let special = store(kind, "special").await;
    let generic = store(kind, "generic").await;
    let mut rng = StdRng::seed_from_u64(14);
    let keys: Vec<String> = (0..4).map(|k| format!("rl:{{bs{k}}}:p")).collect();
    for algorithm in policies() {
        let limit = limit_of(&algorithm);
        let mut now: u64 = 1_700_000_000_000_000 + rng.random_range(0..1_000_000);
        for round in 0..60 {
            now += match rng.random_range(0..4) {
                0 => 0,
                1 => rng.random_range(1..2_000),
                2 => rng.random_range(1..400_000),
                _ => rng.random_range(1..5_000_000),
            };
            // Every third batch names each key once (the script's distinct-keys path).
            let distinct = round % 3 == 0;
            let n = if distinct {
                rng.random_range(1..=keys.len())
            } else {
                rng.random_range(1..24)
            };
            let picks: Vec<(usize, u64)> = (0..n)
                .map(|j| {
                    let cost = match rng.random_range(0..10) {
                        0 => 0,
                        1 => limit + 1,
                        2 => rng.random_range(1..=limit.max(1)),
                        _ => 1,
                    };
                    let k = if distinct {
                        j
                    } else {
                        rng.random_range(0..keys.len())
                    };
                    (k, cost)
                })
                .collect();
            let items: Vec<CheckItem<'_>> = picks
                .iter()
                .map(|&(k, cost)| CheckItem {
                    key: &keys[k],
                    algorithm: &algorithm,
                    cost,
                })
                .collect();
            let a = special.batch_at(&items, now, false).await.unwrap();
            let b = generic.batch_at(&items, now, true).await.unwrap();
            assert_eq!(a, b, "{kind:?} {algorithm:?} round {round}: {picks:?}");
            for key in &keys {
                let (va, ta) = stored(&special, key).await;
                let (vb, tb) = stored(&generic, key).await;
                assert_eq!(va, vb, "{kind:?} {algorithm:?} round {round} {key}");
                // Written microseconds apart with the same TTL (the test pad included).
                assert!(
                    (ta - tb).abs() < 2_000,
                    "{kind:?} {algorithm:?}: {ta} vs {tb}"
                );
            }
        }
    }
}

#[tokio::test]
async fn one_policy_scripts_match_the_generic_batch_field_by_field() {
    for kind in [Kind::Redis, Kind::Valkey] {
        one_policy_matches_generic(kind).await;
    }
}

/// One key 100 times in one batch at a limit of 10: 10 admitted, each decision the one a
/// separate call at the same instant makes.
#[tokio::test]
async fn a_key_repeated_in_a_batch_decides_as_separate_calls() {
    for kind in [Kind::Redis, Kind::Valkey] {
        let batched = store(kind, "rep-b").await;
        let separate = store(kind, "rep-s").await;
        let now = 1_700_000_000_000_000u64;
        for algorithm in [
            Algorithm::TokenBucket {
                capacity: 10,
                rate: Rate::new(1, 3_600_000),
            },
            Algorithm::Gcra {
                rate: Rate::new(1, 3_600_000),
                burst: 9,
            },
            Algorithm::FixedWindow {
                limit: 10,
                window_ms: 3_600_000,
            },
            Algorithm::LeakyBucket {
                capacity: 10,
                rate: Rate::new(1, 3_600_000),
                mode: sluice_core::LeakyMode::Shaping,
            },
            Algorithm::SlidingWindowCounter {
                limit: 10,
                window_ms: 3_600_000,
            },
        ] {
            let key = format!("rl:{{rep}}:{}", algorithm.algorithm_kind().lua_code());
            let items: Vec<CheckItem<'_>> = (0..100)
                .map(|_| CheckItem {
                    key: &key,
                    algorithm: &algorithm,
                    cost: 1,
                })
                .collect();
            let all = batched.batch_at(&items, now, false).await.unwrap();
            assert_eq!(all.iter().filter(|d| d.allowed).count(), 10, "{kind:?}");
            assert!(all[..10].iter().all(|d| d.allowed), "{kind:?}");
            for (i, d) in all.iter().enumerate() {
                let alone = separate.batch_at(&items[i..=i], now, true).await.unwrap();
                assert_eq!(&alone[0], d, "{kind:?} {algorithm:?} item {i}");
            }
            assert_eq!(
                stored(&batched, &key).await.0,
                stored(&separate, &key).await.0
            );
        }
    }
}

fn script_calls_on(port: u16) -> u64 {
    let info = sluice_testkit::servers::redis_cli(port, &["INFO", "commandstats"]);
    info.lines()
        .filter(|l| {
            ["cmdstat_evalsha:", "cmdstat_eval:", "cmdstat_fcall:"]
                .iter()
                .any(|c| l.starts_with(c))
        })
        .filter_map(|l| {
            l.split("calls=")
                .nth(1)?
                .split(',')
                .next()?
                .parse::<u64>()
                .ok()
        })
        .sum()
}

/// Concurrent checks of 300 keys in as many slots (over every master) on a Cluster, 12 per
/// key at a limit of 5: exactly 5 admitted per key, no error (a CROSSSLOT refusal would be
/// one), and fewer script calls than checks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_batches_span_slots_and_admit_exactly() {
    // A Cluster of its own: the script calls counted below must be this test's alone.
    let cluster = sluice_testkit::servers::RedisCluster::start();
    let s = Arc::new(store_on(cluster.url(), "cb").await);
    let ports: Vec<u16> = cluster.nodes().iter().map(|n| n.port()).collect();
    for algorithm in [
        Algorithm::TokenBucket {
            capacity: 5,
            rate: Rate::new(1, 3_600_000),
        },
        Algorithm::Gcra {
            rate: Rate::new(1, 3_600_000),
            burst: 4,
        },
        Algorithm::FixedWindow {
            limit: 5,
            window_ms: 3_600_000,
        },
        Algorithm::LeakyBucket {
            capacity: 5,
            rate: Rate::new(1, 3_600_000),
            mode: sluice_core::LeakyMode::Policing,
        },
        Algorithm::SlidingWindowCounter {
            limit: 5,
            window_ms: 3_600_000,
        },
    ] {
        let before: u64 = ports.iter().map(|&p| script_calls_on(p)).sum();
        let keys = 300;
        let calls = (0..keys * 12).map(|i| {
            let s = Arc::clone(&s);
            let (key, algorithm) = (format!("rl:{{c{}}}:p", i % keys), algorithm.clone());
            async move {
                let d = s
                    .check(&[CheckItem {
                        key: &key,
                        algorithm: &algorithm,
                        cost: 1,
                    }])
                    .await;
                (i % keys, d)
            }
        });
        let mut admitted = vec![0; keys];
        for (k, d) in join_all(calls).await {
            let d = d.unwrap_or_else(|e| panic!("{algorithm:?}: {e}"));
            admitted[k] += usize::from(d.allowed);
        }
        assert!(
            admitted.iter().all(|&n| n == 5),
            "{algorithm:?}: {admitted:?}"
        );
        let calls: u64 = ports.iter().map(|&p| script_calls_on(p)).sum::<u64>() - before;
        assert!(
            calls < (keys * 12) as u64 / 2,
            "{algorithm:?}: {calls} script calls for {} checks",
            keys * 12
        );
    }
}

/// States written in the earlier text encoding (`t<units>:<last_ms>`, `g<tat_us>`) are read
/// by every path, so a deployment upgrades in place; the next write packs them.
#[tokio::test]
async fn states_in_the_earlier_text_encoding_are_read() {
    for kind in [Kind::Redis, Kind::Valkey] {
        let s = store(kind, "text").await;
        let now_us = 1_700_000_000_000_000u64;
        let hour = 3_600_000u64;
        let tb = Algorithm::TokenBucket {
            capacity: 10,
            rate: Rate::new(1, hour),
        };
        let gcra = Algorithm::Gcra {
            rate: Rate::new(1, hour),
            burst: 9,
        };
        let t_us = hour * 1000;
        for generic in [false, true] {
            // 3 tokens left (one token = 3,600,000 units); 5 of 10 GCRA slots used.
            let text = [
                (
                    "rl:{old}:tb",
                    format!("t{}:{}", 3 * hour, now_us / 1000),
                    &tb,
                    2,
                ),
                ("rl:{old}:g", format!("g{}", now_us + 5 * t_us), &gcra, 4),
            ];
            for (key, value, algorithm, remaining) in text {
                let mut set = sluice_redis::redis::cmd("SET");
                set.arg(s.server_key(key))
                    .arg(&value)
                    .arg("PX")
                    .arg(600_000);
                s.command(&set).await.unwrap();
                let item = [CheckItem {
                    key,
                    algorithm,
                    cost: 1,
                }];
                let d = s.batch_at(&item, now_us, generic).await.unwrap();
                assert!(d[0].allowed, "{kind:?} {value}");
                assert_eq!(
                    d[0].remaining, remaining,
                    "{kind:?} {value} generic={generic}"
                );
                let (packed, _) = stored(&s, key).await;
                assert_ne!(packed.as_deref(), Some(value.as_bytes()), "{kind:?}");
                let again = s.batch_at(&item, now_us, !generic).await.unwrap();
                assert_eq!(again[0].remaining, remaining - 1, "{kind:?} {value}");
            }
        }
    }
}

/// A slot moved to another master after the store read the Cluster's node map: batches
/// grouped by the stale map reach a node that refuses the moved keys; those parts are
/// decided again one item per call (which follow MOVED), and every key still admits exactly
/// its limit, with no error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slot_moved_after_connect_is_decided_exactly() {
    use sluice_core::key::key_slot;
    let cluster = sluice_testkit::servers::RedisCluster::start();
    let s = Arc::new(
        RedisStore::builder(cluster.url())
            .timeout(Duration::from_secs(10))
            .namespace(namespace("moved"))
            .connect()
            .await
            .expect("connect"),
    );
    let moved = key_slot(b"{m0}");
    let from = cluster.master_of_slot(moved).expect("an owner");
    let to = [0u16, 8_000, 16_000]
        .into_iter()
        .filter_map(|slot| cluster.master_of_slot(slot))
        .find(|&m| m != from)
        .expect("another master");
    let masters: Vec<usize> = [0u16, 6_000, 12_000]
        .into_iter()
        .filter_map(|slot| cluster.master_of_slot(slot))
        .collect();
    let to_id = cluster.nodes()[to]
        .cli(&["CLUSTER", "MYID"])
        .trim()
        .to_string();
    let slot = moved.to_string();
    cluster.nodes()[to].cli(&["CLUSTER", "SETSLOT", &slot, "NODE", &to_id]);
    cluster.nodes()[to].cli(&["CLUSTER", "BUMPEPOCH"]);
    for &m in &masters {
        cluster.nodes()[m].cli(&["CLUSTER", "SETSLOT", &slot, "NODE", &to_id]);
    }
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while cluster.master_of_slot(moved) != Some(to) {
        assert!(
            std::time::Instant::now() < deadline,
            "the slot did not move"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    cluster.wait_ok(Duration::from_secs(20));
    let algorithm = Algorithm::TokenBucket {
        capacity: 5,
        rate: Rate::new(1, 3_600_000),
    };
    // {m0} (moved) among 120 keys, most of them on the masters the stale map still knows.
    let keys = 120;
    let calls = (0..keys * 12).map(|i| {
        let s = Arc::clone(&s);
        let (key, algorithm) = (format!("rl:{{m{}}}:p", i % keys), algorithm.clone());
        async move {
            let d = s
                .check(&[CheckItem {
                    key: &key,
                    algorithm: &algorithm,
                    cost: 1,
                }])
                .await;
            (i % keys, d)
        }
    });
    let mut admitted = vec![0; keys];
    for (k, d) in join_all(calls).await {
        let d = d.unwrap_or_else(|e| panic!("key {k}: {e}"));
        admitted[k] += usize::from(d.allowed);
    }
    assert!(admitted.iter().all(|&n| n == 5), "{admitted:?}");
}
