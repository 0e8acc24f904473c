//! `sluice admin` against a real `sluice serve` (both the built binary), over loopback.
#![forbid(unsafe_code)]

use crate::support;
use support::Serve;

use std::process::Command;

use serde_json::Value;

const CONFIG: &str = r#"
admin_token = "adm1n"

[policies.burst]
algorithm = "token-bucket"
capacity = 5
rate = "1/h"

[policies.monthly]
algorithm = "fixed-window"
limit = 10000
window = "1 month"
"#;

fn serve() -> Serve {
    support::serve("admin", CONFIG)
}

/// Runs `sluice admin ARGS` against `s` with `token`: exit code, parsed stdout, stderr.
fn admin(s: &Serve, token: &str, args: &[&str]) -> (i32, Value, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .arg("admin")
        .args(args)
        .env("SLUICE_URL", &s.url)
        .env("SLUICE_ADMIN_TOKEN", token)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let v = serde_json::from_str(&stdout).unwrap_or(Value::Null);
    (
        out.status.code().unwrap_or(-1),
        v,
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn state_charge_refund_and_reset_through_a_running_server() {
    let s = serve();
    let who = ["--policy", "burst", "--identity", "user:1"];
    let (code, v, err) = admin(&s, "adm1n", &[&["state", "get"][..], &who].concat());
    assert_eq!(code, 0, "{err}");
    assert_eq!(
        (v["limit"].as_u64(), v["remaining"].as_u64()),
        (Some(5), Some(5)),
        "{v}"
    );
    let (code, v, _) = admin(
        &s,
        "adm1n",
        &[&["charge"][..], &who, &["--cost", "4"]].concat(),
    );
    assert_eq!((code, v["remaining"].as_u64()), (0, Some(1)), "{v}");
    let (code, v, _) = admin(
        &s,
        "adm1n",
        &[&["refund"][..], &who, &["--cost", "2"]].concat(),
    );
    assert_eq!((code, v["remaining"].as_u64()), (0, Some(3)), "{v}");
    let (code, v, _) = admin(&s, "adm1n", &[&["state", "reset"][..], &who].concat());
    assert_eq!((code, v["existed"].as_bool()), (0, Some(true)), "{v}");
    let (_, v, _) = admin(&s, "adm1n", &[&["state", "get"][..], &who].concat());
    assert_eq!(v["remaining"], 5);
    // A calendar window through the CLI: the whole month's quota, charged and read back.
    let month = ["--policy", "monthly", "--credential", "sk_test_1"];
    let (_, v, _) = admin(
        &s,
        "adm1n",
        &[&["charge"][..], &month, &["--cost", "2500"]].concat(),
    );
    assert_eq!(
        (v["limit"].as_u64(), v["remaining"].as_u64()),
        (Some(10_000), Some(7500)),
        "{v}"
    );
}

#[test]
fn refusals_exit_non_zero_with_the_problem_detail() {
    let s = serve();
    let who = ["--policy", "burst", "--identity", "user:2"];
    let (code, v, err) = admin(
        &s,
        "wrong",
        &[&["refund"][..], &who, &["--cost", "1"]].concat(),
    );
    assert_eq!((code, v), (1, Value::Null));
    assert!(err.contains("401") && err.contains("admin_token"), "{err}");
    let (code, _, err) = admin(
        &s,
        "adm1n",
        &["state", "get", "--policy", "nope", "--identity", "u"],
    );
    assert_eq!(code, 1);
    assert!(
        err.contains("400") && err.contains("unknown policy \"nope\""),
        "{err}"
    );
    // Nothing listening: exit 2, saying which URL.
    let out = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args([
            "admin",
            "--url",
            &format!("http://127.0.0.1:{}", support::free_port()),
            "state",
            "get",
        ])
        .args(who)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot reach"));
}

#[test]
fn check_takes_a_calendar_window() {
    let out = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args([
            "check",
            "--algorithm",
            "fixed-window",
            "--limit",
            "2",
            "--window",
            "1 week",
            "--count",
            "3",
            "--json",
            "user:cal",
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let lines: Vec<Value> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let allowed: Vec<bool> = lines
        .iter()
        .map(|l| l["allowed"].as_bool().unwrap())
        .collect();
    assert_eq!(allowed, [true, true, false]);
    // The denial waits for Monday 00:00 UTC: at most a week, and as long as the reset.
    let (retry, reset) = (
        lines[2]["retry_after_ms"].as_u64().unwrap(),
        lines[2]["reset_after_ms"].as_u64().unwrap(),
    );
    assert!(
        retry > 0 && retry <= 7 * 86_400_000 && retry == reset,
        "{}",
        lines[2]
    );
    let now_ms = sluice_core::Clock::now(&sluice_core::SystemClock) / 1000;
    let monday = sluice_core::policy::CalendarPeriod::Week.bounds(now_ms).1;
    assert!(
        monday.abs_diff(now_ms + retry) < 5_000,
        "retry {retry} vs next Monday"
    );
}

#[test]
fn overrides_bans_and_lists_through_a_running_server() {
    let s = serve();
    let who = ["--policy", "burst", "--identity", "vip"];
    let (code, v, err) = admin(
        &s,
        "adm1n",
        &[
            &["override", "set"][..],
            &who,
            &["--param", "capacity=50", "--ttl", "1h"],
        ]
        .concat(),
    );
    assert_eq!(code, 0, "{err}");
    assert!(v.is_object(), "{v}");
    let (code, v, err) = admin(&s, "adm1n", &[&["override", "get"][..], &who].concat());
    assert_eq!(code, 0, "{err}");
    assert!(v.to_string().contains("50"), "{v}");
    // The override's capacity is the one the state shows.
    let (_, v, _) = admin(
        &s,
        "adm1n",
        &[&["charge"][..], &who, &["--cost", "10"]].concat(),
    );
    assert_eq!(
        (v["limit"].as_u64(), v["remaining"].as_u64()),
        (Some(50), Some(40)),
        "{v}"
    );
    let (code, _, _) = admin(&s, "adm1n", &[&["override", "delete"][..], &who].concat());
    assert_eq!(code, 0);
    let (code, _, err) = admin(&s, "adm1n", &[&["override", "get"][..], &who].concat());
    assert_eq!(code, 1, "no override left: {err}");
    assert!(err.contains("404"), "{err}");
    for args in [
        &["ban", "add", "--identity", "mallory", "--duration", "10m"][..],
        &["ban", "lift", "--identity", "mallory"],
        &["allow", "add", "--entry", "10.0.0.0/8", "--ttl", "1h"],
        &["allow", "remove", "--entry", "10.0.0.0/8"],
        &["deny", "add", "--entry", "user:bad"],
        &["deny", "remove", "--entry", "user:bad"],
    ] {
        let (code, v, err) = admin(&s, "adm1n", args);
        assert_eq!(code, 0, "{args:?}: {err}");
        assert!(v.is_object(), "{args:?}: {v}");
    }
}
