//! `sluice loadtest` against `sluice serve` (reverse proxy in front of a real upstream): the
//! measured admitted count matches the arithmetic of the server's own RateLimit-Policy.

use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

struct Serve(Child);

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn wait_for_port(port: u16, timeout: Duration) {
    let deadline = Instant::now() + timeout;
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            Instant::now() < deadline,
            "port {port} did not open in {timeout:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A trivial upstream: `GET /hello` -> `{"ok":true}`.
fn start_upstream() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    listener.set_nonblocking(true).unwrap();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let app = axum::Router::new()
                .route("/hello", axum::routing::get(|| async { "{\"ok\":true}" }));
            let listener = tokio::net::TcpListener::from_std(listener).unwrap();
            axum::serve(listener, app).await.unwrap();
        });
    });
    port
}

fn start_serve(upstream: u16) -> (Serve, u16, tempdir::Dir) {
    let (http, grpc, proxy) = (free_port(), free_port(), free_port());
    let dir = tempdir::Dir::new();
    let config = dir.path.join("sluice.toml");
    std::fs::write(
        &config,
        format!(
            r#"
[server]
http = "127.0.0.1:{http}"
grpc = "127.0.0.1:{grpc}"
proxy = "127.0.0.1:{proxy}"

[policies.burst]
algorithm = "token-bucket"
capacity = 10
rate = "5/s"
identity = "api-key:x-api-key"

[[routes]]
prefix = "/"
policies = ["burst"]
upstream = "http://127.0.0.1:{upstream}"
"#
        ),
    )
    .unwrap();
    let child = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(["serve", "--config"])
        .arg(&config)
        .env("SLUICE_LOG", "warn")
        .stdout(Stdio::null())
        .spawn()
        .expect("start sluice serve");
    let serve = Serve(child);
    wait_for_port(proxy, Duration::from_secs(20));
    (serve, proxy, dir)
}

mod tempdir {
    pub(crate) struct Dir {
        pub(crate) path: std::path::PathBuf,
    }
    impl Dir {
        pub(crate) fn new() -> Self {
            let path = std::env::temp_dir().join(format!(
                "sluice-loadtest-{}-{:?}",
                std::process::id(),
                std::thread::current().id()
            ));
            std::fs::create_dir_all(&path).unwrap();
            Self { path }
        }
    }
    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.path);
        }
    }
}

#[test]
fn loadtest_against_sluice_serve_matches_the_arithmetic() {
    let upstream = start_upstream();
    let (_serve, proxy, dir) = start_serve(upstream);
    let plot = dir.path.join("plot.svg");
    // 20 req/s for 5 s at one key; the policy is read from the proxy's RateLimit-Policy.
    let out = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args([
            "loadtest",
            &format!("http://127.0.0.1:{proxy}/hello"),
            "--rate",
            "20/s",
            "--duration",
            "5s",
        ])
        .args(["-H", "x-api-key: loadtest", "--json", "--plot"])
        .arg(&plot)
        .output()
        .expect("run sluice loadtest");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["requests"], 100);
    assert_eq!(report["errors"], 0, "{report}");
    // A burst of 10 plus 5/s over the 4.95 s between the first and last request: 34.
    assert_eq!(report["predicted_admitted"], 34, "{report}");
    let admitted = report["admitted"].as_i64().unwrap();
    let limited = report["limited"].as_i64().unwrap();
    assert_eq!(
        admitted + limited,
        100,
        "only 200 and 429 expected: {report}"
    );
    // Real arrivals jitter by a few ms around the ideal times; a request that lands exactly on a
    // refill boundary may fall on either side, so allow one either way (the guide: 159-160).
    assert!(
        (admitted - 34).abs() <= 1,
        "admitted {admitted}, predicted 34: {report}"
    );
    let svg = std::fs::read_to_string(&plot).unwrap();
    assert!(svg.starts_with("<svg") && svg.contains("expected admitted"));
}

#[test]
fn loadtest_uses_expect_and_bounds_the_run() {
    let upstream = start_upstream();
    let (_serve, proxy, _dir) = start_serve(upstream);
    // --max-requests caps the run below rate x duration.
    let out = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args([
            "loadtest",
            &format!("http://127.0.0.1:{proxy}/hello"),
            "--rate",
            "50/s",
            "--duration",
            "10s",
        ])
        .args(["-H", "x-api-key: bounded", "--max-requests", "30", "--json"])
        .args(["--expect", "token-bucket:capacity=10,rate=5/s"])
        .output()
        .expect("run sluice loadtest");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["requests"], 30);
    assert!(report["elapsed_s"].as_f64().unwrap() < 5.0, "{report}");
    // 30 requests 20 ms apart: 10 from the burst + 5/s over 0.58 s = 12.
    assert_eq!(report["predicted_admitted"], 12);
    assert_eq!(report["policy"], "token-bucket capacity=10 rate=5/s");
    let admitted = report["admitted"].as_i64().unwrap();
    assert!((admitted - 12).abs() <= 1, "{report}");
    // A bad URL is a clear error.
    let out = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(["loadtest", "ftp://x", "--duration", "1s"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("only http://"));
}
