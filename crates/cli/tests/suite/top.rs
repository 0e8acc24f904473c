//! `sluice top` against a real `sluice serve` (both the built binary), over loopback: a bounded
//! number of frames as plain text, with the numbers of the traffic sent.
#![forbid(unsafe_code)]

use crate::support;
use support::Serve;

use std::io::{Read, Write};
use std::process::Command;
use std::time::Duration;

const CONFIG: &str = r#"
admin_token = "t0p"

[policies.api]
algorithm = "fixed-window"
limit = 3
window = "1h"
"#;

fn serve() -> Serve {
    support::serve("top", CONFIG)
}

/// One `POST /v1/check` over a plain HTTP/1.1 connection; the status code.
fn check(s: &Serve, who: &str) -> u16 {
    let body = format!(r#"{{"policy":"api","identity":"{who}"}}"#);
    let mut c = std::net::TcpStream::connect(("127.0.0.1", s.port)).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(
        c,
        "POST /v1/check HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut answer = String::new();
    c.read_to_string(&mut answer).unwrap();
    answer.split(' ').nth(1).unwrap().parse().unwrap()
}

fn top(s: &Serve, token: Option<&str>) -> (i32, String, String) {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_sluice"));
    cmd.args(["top", "--iterations", "2", "--interval-ms", "200"])
        .env("SLUICE_URL", &s.url)
        .env_remove("SLUICE_ADMIN_TOKEN");
    if let Some(t) = token {
        cmd.env("SLUICE_ADMIN_TOKEN", t);
    }
    let out = cmd.output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn top_prints_frames_with_the_numbers_of_a_running_server() {
    let s = serve();
    // user:heavy: 5 checks of a limit of 3 (3 allowed, 2 denied); user:light: 1 allowed.
    for _ in 0..5 {
        assert_eq!(check(&s, "user:heavy"), 200);
    }
    assert_eq!(check(&s, "user:light"), 200);
    let (code, out, err) = top(&s, Some("t0p"));
    assert_eq!(code, 0, "{err}");
    assert_eq!(out.matches("sluice top").count(), 2, "two frames: {out}");
    let row = out
        .lines()
        .find(|l| l.starts_with("api "))
        .unwrap_or_else(|| panic!("no api row: {out}"));
    let cols: Vec<&str> = row.split_whitespace().collect();
    // POLICY DEC/S DECISIONS ALLOWED DENIED SHADOW F-OPEN F-CLOSE ...
    assert_eq!(&cols[2..8], ["6", "4", "2", "0", "0", "0"], "{row}");
    // The two lists side by side: by decisions, then by denials.
    let words = out.split_whitespace().collect::<Vec<_>>().join(" ");
    assert!(words.contains("user:heavy 5 ±0 user:heavy 2 ±0"), "{out}");
    assert!(out.contains("generation 1"), "{out}");
    assert!(out.contains("breaker closed"), "{out}");

    // Without the token: a clear error, exit 1.
    let (code, _, err) = top(&s, None);
    assert_eq!(code, 1);
    assert!(
        err.contains("401") && err.contains("SLUICE_ADMIN_TOKEN"),
        "{err}"
    );
}
