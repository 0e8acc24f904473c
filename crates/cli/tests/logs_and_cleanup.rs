//! The binary's logs honour `RUST_LOG` and carry no colour codes off a terminal; `sluice race`
//! leaves no keys behind in the user's Redis.

use std::io::{BufRead, BufReader, Read};
use std::net::{TcpListener, TcpStream};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use sluice_testkit::servers::RedisServer;

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Starts `sluice serve` with the given log environment, waits until its HTTP port accepts,
/// stops it and returns what it wrote on stderr.
fn serve_stderr(env: &[(&str, &str)]) -> String {
    let http = free_port();
    let grpc = free_port();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_sluice"));
    cmd.args([
        "serve",
        "--http",
        &format!("127.0.0.1:{http}"),
        "--grpc",
        &format!("127.0.0.1:{grpc}"),
    ])
    .env_remove("SLUICE_LOG")
    .env_remove("RUST_LOG")
    .env_remove("SLUICE_CONFIG")
    .stdout(Stdio::null())
    .stderr(Stdio::piped());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut child = cmd.spawn().expect("start sluice serve");
    let deadline = Instant::now() + Duration::from_secs(20);
    while TcpStream::connect(("127.0.0.1", http)).is_err() {
        assert!(Instant::now() < deadline, "sluice serve did not start");
        std::thread::sleep(Duration::from_millis(50));
    }
    // The startup line is written just before the listeners serve; give it a moment.
    std::thread::sleep(Duration::from_millis(200));
    child.kill().unwrap();
    let mut err = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    let _ = child.wait();
    err
}

#[test]
fn rust_log_is_honoured_and_piped_logs_have_no_colour() {
    let info = serve_stderr(&[("RUST_LOG", "info")]);
    assert!(info.contains("sluice serving"), "no startup line: {info}");
    assert!(
        !info.contains('\u{1b}'),
        "ANSI escapes in piped logs: {info:?}"
    );

    let quiet = serve_stderr(&[("RUST_LOG", "warn")]);
    assert!(
        !quiet.contains("sluice serving"),
        "RUST_LOG=warn ignored: {quiet}"
    );

    // SLUICE_LOG wins over RUST_LOG.
    let both = serve_stderr(&[("RUST_LOG", "warn"), ("SLUICE_LOG", "info")]);
    assert!(
        both.contains("sluice serving"),
        "SLUICE_LOG ignored: {both}"
    );
}

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
        .stderr(Stdio::inherit())
        .output()
        .expect("run redis-cli");
    let mut s = String::new();
    for line in BufReader::new(&out.stdout[..]).lines() {
        s.push_str(&line.unwrap());
        s.push('\n');
    }
    s
}
