//! `sluice check --mode leased`: the decision mode of a `sluice.toml` policy from the command
//! line. Two `sluice check` processes are two limiters spending slices of one key's quota on
//! one real Redis; together they never admit more than the limit.

use std::process::Command;

use sluice_testkit::servers::RedisServer;

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

/// Decisions a `sluice check --json` run admitted.
fn admitted(stdout: &str) -> usize {
    stdout
        .lines()
        .map(|l| {
            serde_json::from_str::<serde_json::Value>(l).unwrap_or_else(|e| panic!("{l}: {e}"))
        })
        .filter(|v| v["allowed"] == true)
        .count()
}

#[test]
fn leased_check_in_two_processes_never_admits_more_than_the_limit() {
    let redis = RedisServer::redis();
    let url = redis.url();
    let identity = format!("leased:{}", std::process::id());
    // A bucket of 20 refilled once an hour: no refill during the test, so the limit is 20.
    // Each process asks 30 times; slices of 1 s lifetime stay with the process that took them.
    let args: Vec<String> = [
        "check",
        "--store",
        &url,
        "-a",
        "token-bucket",
        "--capacity",
        "20",
        "--rate",
        "1/h",
        "--mode",
        "leased",
        "--lease-ttl",
        "1s",
        "--name",
        "leased",
        "-n",
        "30",
        "--json",
        &identity,
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let runs: Vec<_> = (0..2)
        .map(|_| {
            let args = args.clone();
            std::thread::spawn(move || {
                let refs: Vec<&str> = args.iter().map(String::as_str).collect();
                sluice(&refs)
            })
        })
        .collect();
    let mut total = 0;
    for run in runs {
        let (code, out, err) = run.join().unwrap();
        assert_eq!(code, 0, "{err}");
        assert_eq!(out.lines().count(), 30, "{out}");
        total += admitted(&out);
    }
    assert!(
        total <= 20,
        "two leased limiters admitted {total} of a limit of 20"
    );
    assert!(total > 0, "leased mode admitted nothing");
}

#[test]
fn bad_decision_modes_are_refused_with_their_reason() {
    let tb = [
        "check",
        "-a",
        "token-bucket",
        "--capacity",
        "5",
        "--rate",
        "1/s",
    ];
    let run = |extra: &[&str]| {
        let mut args = tb.to_vec();
        args.extend_from_slice(extra);
        args.push("u");
        sluice(&args)
    };
    let (code, _, err) = run(&["--mode", "fast"]);
    assert_eq!(code, 2);
    assert!(
        err.contains("--mode must be exact or leased, not \"fast\""),
        "{err}"
    );
    let (code, _, err) = run(&["--lease-ttl", "2s"]);
    assert_eq!(code, 2);
    assert!(
        err.contains("--lease-ttl is only for --mode leased"),
        "{err}"
    );
    let (code, _, err) = run(&["--mode", "leased", "--lease-ttl", "2m"]);
    assert_eq!(code, 2);
    assert!(err.contains("lease_ttl must be between 1ms and"), "{err}");
    let (code, _, err) = sluice(&[
        "check",
        "-a",
        "sliding-log",
        "--limit",
        "5",
        "--window",
        "10s",
        "--mode",
        "leased",
        "u",
    ]);
    assert_eq!(code, 2);
    assert!(
        err.contains("mode = \"leased\" supports token-bucket"),
        "{err}"
    );
    // Exact is the default and may be said.
    let (code, out, err) = run(&["--mode", "exact", "-n", "2"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("allowed"), "{out}");
}
