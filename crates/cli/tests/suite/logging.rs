//! The binary's logs, through `sluice serve`: they honour `RUST_LOG` and carry no colour codes
//! off a terminal.

use std::io::Read;
use std::net::{TcpListener, TcpStream};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

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
