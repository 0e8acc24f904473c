//! End-to-end tests of the `sluice` tools: the real binary against real servers.

use std::process::Command;
use std::sync::OnceLock;

use sluice_testkit::servers::{RedisCluster, RedisServer};

fn sluice(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(args)
        .output()
        .expect("run sluice");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn redis() -> &'static RedisServer {
    static S: OnceLock<RedisServer> = OnceLock::new();
    S.get_or_init(RedisServer::redis)
}

fn valkey() -> &'static RedisServer {
    static S: OnceLock<RedisServer> = OnceLock::new();
    S.get_or_init(RedisServer::valkey)
}

fn cluster() -> &'static RedisCluster {
    static S: OnceLock<RedisCluster> = OnceLock::new();
    S.get_or_init(RedisCluster::start)
}

fn unique(name: &str) -> String {
    format!("{name}:{}:{}", std::process::id(), rand_u32())
}

fn rand_u32() -> u32 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u8(0);
    h.finish() as u32
}

fn json_lines(stdout: &str) -> Vec<serde_json::Value> {
    stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{l}: {e}")))
        .collect()
}

/// The guide's step 3: capacity 5, 1/s -> 5 allowed with remaining 4..0, then denied with a
/// retry close to 1000 ms.
fn guide_token_bucket(store: &str) {
    let id = unique("user");
    let (code, out, err) = sluice(&[
        "check",
        "--store",
        store,
        "--algorithm",
        "token-bucket",
        "--capacity",
        "5",
        "--rate",
        "1/s",
        "--count",
        "7",
        "--json",
        &id,
    ]);
    assert_eq!(code, 0, "{err}");
    let lines = json_lines(&out);
    assert_eq!(lines.len(), 7);
    for (i, l) in lines.iter().take(5).enumerate() {
        assert_eq!(l["allowed"], true, "{l}");
        assert_eq!(l["remaining"], 4 - i as u64, "{l}");
        assert_eq!(l["limit"], 5);
        assert_eq!(l["retry_after_ms"], 0);
    }
    for l in &lines[5..] {
        assert_eq!(l["allowed"], false, "{l}");
        let retry = l["retry_after_ms"].as_u64().unwrap();
        assert!(
            (900..=1000).contains(&retry),
            "retry {retry} should be close to 1000 ms"
        );
    }
}

/// The guide's step 4: sliding log, limit 3 per 10 s -> 3 allowed, then denied with a retry
/// close to 10000 ms.
fn guide_sliding_log(store: &str) {
    let id = unique("user");
    let (code, out, err) = sluice(&[
        "check",
        "--store",
        store,
        "-a",
        "sliding-log",
        "--limit",
        "3",
        "--window",
        "10s",
        "-n",
        "5",
        "--json",
        &id,
    ]);
    assert_eq!(code, 0, "{err}");
    let lines = json_lines(&out);
    let allowed: Vec<bool> = lines
        .iter()
        .map(|l| l["allowed"].as_bool().unwrap())
        .collect();
    assert_eq!(allowed, [true, true, true, false, false]);
    assert_eq!(lines[0]["remaining"], 2);
    assert_eq!(lines[2]["remaining"], 0);
    for l in &lines[3..] {
        let retry = l["retry_after_ms"].as_u64().unwrap();
        assert!(
            (9000..=10_000).contains(&retry),
            "retry {retry} should be close to 10000 ms"
        );
    }
}

#[test]
fn check_reproduces_the_guide_on_the_embedded_store() {
    guide_token_bucket("memory");
    guide_sliding_log("memory");
}

#[test]
fn check_reproduces_the_guide_on_redis_valkey_and_cluster() {
    for url in [redis().url(), valkey().url(), cluster().url()] {
        guide_token_bucket(&url);
        guide_sliding_log(&url);
    }
}

#[test]
fn check_reports_bad_flags_and_unreachable_stores() {
    let (code, _, err) = sluice(&["check", "-a", "token-bucket", "--rate", "1/s", "u"]);
    assert_eq!(code, 2);
    assert!(err.contains("--capacity"), "{err}");
    let (code, _, err) = sluice(&[
        "check",
        "-a",
        "token-bucket",
        "--capacity",
        "5",
        "--rate",
        "5/x",
        "u",
    ]);
    assert_eq!(code, 2);
    assert!(err.contains("invalid rate"), "{err}");
    let (code, _, err) = sluice(&[
        "check",
        "--store",
        "redis://127.0.0.1:1",
        "-a",
        "gcra",
        "--rate",
        "1/s",
        "u",
    ]);
    assert_eq!(code, 2);
    assert!(err.contains("cannot use store"), "{err}");
}

fn race(store: &str, requests: u32, limit: u32) -> serde_json::Value {
    let (code, out, err) = sluice(&[
        "race",
        "--store",
        store,
        "--requests",
        &requests.to_string(),
        "--limit",
        &limit.to_string(),
        "--json",
    ]);
    assert_eq!(code, 0, "sluice race must exit 0 when exact: {out}{err}");
    serde_json::from_str(out.trim()).unwrap()
}

#[test]
fn race_shows_the_naive_race_and_sluice_exactness() {
    for url in [
        "memory".to_string(),
        redis().url(),
        valkey().url(),
        cluster().url(),
    ] {
        // The naive path's race is a matter of scheduling: on a loaded machine one run can
        // happen to interleave safely, so it gets three runs to show it. sluice must be exact
        // in every run.
        let mut naive = Vec::new();
        for _ in 0..3 {
            let r = race(&url, 200, 10);
            assert_eq!(r["requests"], 200);
            assert_eq!(r["limit"], 10);
            assert_eq!(r["sluice_admitted"], 10, "{url}: {r}");
            naive.push(r["naive_admitted"].as_u64().unwrap());
            if naive.last() > Some(&10) {
                break;
            }
        }
        assert!(
            naive.iter().any(|&n| n > 10),
            "{url}: the naive GET+SET should admit more than the limit, got {naive:?}"
        );
    }
}

/// `sluice race` on the user's own Redis (a server of its own here, so nothing else writes)
/// leaves no keys behind.
#[test]
fn race_leaves_no_keys_behind() {
    let redis = RedisServer::redis();
    let url = redis.url();
    let out = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(["race", "--store", &url, "--requests", "50", "--limit", "5"])
        .output()
        .expect("run sluice race");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("sluice admitted 5 of 50"), "{stdout}");
    let keys = redis_cli(&url, &["--scan"]);
    assert!(keys.trim().is_empty(), "race left keys behind: {keys}");
}

fn redis_cli(url: &str, args: &[&str]) -> String {
    let out = Command::new("redis-cli")
        .arg("-u")
        .arg(url)
        .args(args)
        .output()
        .expect("run redis-cli");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn race_human_output_matches_the_guide() {
    let (code, out, _) = sluice(&["race", "--store", &redis().url()]);
    assert_eq!(code, 0);
    assert!(out.contains("sluice admitted 10 of 200"), "{out}");
    assert!(out.starts_with("naive admitted "), "{out}");
}

#[test]
fn keyslot_matches_cluster_keyslot_on_a_real_cluster() {
    let node = &cluster().nodes()[0];
    let mut keys: Vec<String> = (0..300).map(|i| format!("rl:{{user:{i}}}:tb")).collect();
    keys.extend((0..50).map(|i| format!("plain-key-{i}")));
    keys.extend([
        "{}x".to_string(),
        "a{}{b}".to_string(),
        "{a}{b}".to_string(),
        "x{y".to_string(),
    ]);
    let mut args = vec!["keyslot"];
    args.extend(keys.iter().map(String::as_str));
    let (code, out, err) = sluice(&args);
    assert_eq!(code, 0, "{err}");
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), keys.len());
    for (line, key) in lines.iter().zip(&keys) {
        let (slot, printed) = line.split_once(' ').unwrap();
        assert_eq!(printed, key);
        let want = node.cli(&["CLUSTER", "KEYSLOT", key]);
        assert_eq!(slot, want.trim(), "slot of {key}");
    }
}

#[test]
fn keyslot_builds_the_key_for_an_identity() {
    let (code, out, _) = sluice(&["keyslot", "--identity", "user:42", "--policy", "tb"]);
    assert_eq!(code, 0);
    assert_eq!(out.trim(), "15880 rl:{user:42}:tb");
    // A hostile identity is escaped: it cannot leave its hash tag.
    let (_, out, _) = sluice(&["keyslot", "--identity", "a}{b", "--policy", "tb"]);
    assert_eq!(out.split_whitespace().nth(1), Some("rl:{a%7D%7Bb}:tb"));
}

#[test]
fn scripts_prints_every_script_with_its_contract() {
    let (code, out, _) = sluice(&["scripts"]);
    assert_eq!(code, 0);
    for algorithm in [
        "token-bucket",
        "gcra",
        "leaky-bucket",
        "fixed-window",
        "sliding-counter",
        "sliding-log",
        "concurrency",
        "multi",
        "release",
    ] {
        assert!(
            out.contains(&format!("===== {algorithm} =====")),
            "missing {algorithm}"
        );
    }
    assert!(
        out.contains("KEYS[1]"),
        "scripts must document their KEYS contract"
    );
    assert!(
        out.contains("ARGV"),
        "scripts must document their ARGV contract"
    );
    let (code, out, _) = sluice(&["scripts", "--functions"]);
    assert_eq!(code, 0);
    assert!(
        out.starts_with("#!lua name="),
        "{}",
        &out[..out.len().min(80)]
    );
}

#[test]
fn version_names_the_release_and_the_commit() {
    let (code, out, _) = sluice(&["--version"]);
    assert_eq!(code, 0);
    let line = out.trim();
    let expected_commit = std::process::Command::new("git")
        .args(["rev-parse", "--short=12", "HEAD"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string());
    assert!(
        line.starts_with(&format!("sluice {} (", env!("CARGO_PKG_VERSION"))),
        "{line}"
    );
    if let Some(commit) = expected_commit {
        assert!(
            line.contains(&commit),
            "{line} does not name commit {commit}"
        );
    }
}
