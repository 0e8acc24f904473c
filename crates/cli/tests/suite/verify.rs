//! `sluice verify` against real `sluice serve` processes: two instances sharing one real Redis
//! pass; two instances each on its own embedded store admit about twice the policy and fail
//! with exit code 1 and a report that says so; one instance behind its reverse proxy passes.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use sluice_testkit::servers::RedisServer;

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

/// A fresh directory, removed on drop.
struct Dir(PathBuf);

impl Dir {
    fn new(tag: &str) -> Self {
        let path = std::env::temp_dir().join(format!(
            "sluice-verify-{tag}-{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        std::fs::create_dir_all(&path).unwrap();
        Self(path)
    }
}

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The policy every instance enforces: a bucket of 10 refilled 5 per second.
const POLICY: &str = r#"
[policies.api]
algorithm = "token-bucket"
capacity = 10
rate = "5/s"
"#;

/// One `sluice serve` with `store` (a URL) and `extra` configuration; returns it with its
/// decision API port and proxy port.
fn serve(dir: &Path, name: &str, store: &str, extra: &str) -> (Serve, u16, u16) {
    let (http, grpc, proxy) = (free_port(), free_port(), free_port());
    let config = dir.join(format!("{name}.toml"));
    std::fs::write(
        &config,
        format!(
            "[server]\nhttp = \"127.0.0.1:{http}\"\ngrpc = \"127.0.0.1:{grpc}\"\n\
             proxy = \"127.0.0.1:{proxy}\"\n\n[store]\nurl = \"{store}\"\n{POLICY}{extra}"
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
    let s = Serve(child);
    wait_for_port(http, Duration::from_secs(20));
    // The proxy listens only when there are routes.
    if extra.contains("[[routes]]") {
        wait_for_port(proxy, Duration::from_secs(20));
    }
    (s, http, proxy)
}

/// The gRPC port written into the configuration `name` in `dir`.
fn grpc_of(dir: &Path, name: &str) -> u16 {
    let text = std::fs::read_to_string(dir.join(format!("{name}.toml"))).unwrap();
    let line = text.lines().find(|l| l.starts_with("grpc = ")).unwrap();
    line.trim_end_matches('"')
        .rsplit(':')
        .next()
        .unwrap()
        .parse()
        .unwrap()
}

/// Runs `sluice verify` with `args` and the expected policy as flags, 3 s of arrivals.
fn verify(args: &[String], svg: &Path) -> (Output, serde_json::Value, String) {
    let base = [
        "verify",
        "--algorithm",
        "token-bucket",
        "--capacity",
        "10",
        "--rate",
        "5/s",
        "--duration",
        "3s",
        "--json",
    ];
    let out = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(base)
        .args(args)
        .arg("--svg")
        .arg(svg)
        .output()
        .expect("run sluice verify");
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "{e}: {}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    });
    let svg = std::fs::read_to_string(svg).unwrap_or_default();
    (out, report, svg)
}

#[test]
fn two_instances_on_one_redis_pass_and_two_on_separate_stores_fail_with_twice_the_admits() {
    let redis = RedisServer::redis();
    let dir = Dir::new("two");
    let (_a, a_http, _) = serve(&dir.0, "a", &redis.url(), "");
    let (_b, b_http, _) = serve(&dir.0, "b", &redis.url(), "");
    let targets = |x: u16, y: u16| {
        vec![
            "--api".to_string(),
            format!("http://127.0.0.1:{x}"),
            "--api".to_string(),
            format!("http://127.0.0.1:{y}"),
            "--policy".to_string(),
            "api".to_string(),
        ]
    };
    let (out, report, svg) = verify(&targets(a_http, b_http), &dir.0.join("shared.svg"));
    assert_eq!(out.status.code(), Some(0), "{report}");
    assert_eq!(report["verdict"], "pass", "{report}");
    assert_eq!(report["failed"], 0, "{report}");
    let (admitted, expected) = (
        report["admitted"].as_u64().unwrap(),
        report["expected"].as_u64().unwrap(),
    );
    // 20 at once, then 15/s for 3 s: the bucket of 10 plus 5/s over 3 s.
    assert!((23..=27).contains(&expected), "{report}");
    assert!(admitted.abs_diff(expected) <= 2, "{report}");
    // Both instances answered part of it.
    assert!(
        report["targets"][0]["admitted"].as_u64().unwrap() > 0,
        "{report}"
    );
    assert!(
        report["targets"][1]["admitted"].as_u64().unwrap() > 0,
        "{report}"
    );
    assert!(svg.starts_with("<svg") && svg.contains("expected admitted"));

    // The same two instances' policy, each on its own embedded store: each admits the whole
    // policy, together about twice it.
    let (_c, c_http, _) = serve(&dir.0, "c", "memory", "");
    let (_d, d_http, _) = serve(&dir.0, "d", "memory", "");
    let (out, report, _) = verify(&targets(c_http, d_http), &dir.0.join("split.svg"));
    assert_eq!(out.status.code(), Some(1), "{report}");
    assert_eq!(report["verdict"], "over-admits", "{report}");
    let (admitted, expected, ceiling, unshared) = (
        report["admitted"].as_u64().unwrap(),
        report["expected"].as_u64().unwrap(),
        report["ceiling"].as_u64().unwrap(),
        report["expected_if_unshared"].as_u64().unwrap(),
    );
    assert!(admitted > ceiling, "{report}");
    assert!(
        admitted as f64 >= 1.7 * expected as f64,
        "about twice: {report}"
    );
    assert!(admitted.abs_diff(unshared) <= 3, "{report}");
    // The human report names the failure and its likely cause.
    let out = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args([
            "verify",
            "--capacity",
            "10",
            "--rate",
            "5/s",
            "--duration",
            "2s",
        ])
        .args(targets(c_http, d_http))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("FAIL: over-admits"), "{text}");
    assert!(text.contains("do not share state"), "{text}");
}

/// A trivial upstream for the proxy: `GET /hello` -> 200.
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
            let app = axum::Router::new().route("/hello", axum::routing::get(|| async { "ok" }));
            let listener = tokio::net::TcpListener::from_std(listener).unwrap();
            axum::serve(listener, app).await.unwrap();
        });
    });
    port
}

#[test]
fn one_instance_behind_its_proxy_passes_and_bad_arguments_are_clear() {
    let upstream = start_upstream();
    let dir = Dir::new("one");
    let route = format!(
        "identity = \"api-key:x-client\"\n\n[[routes]]\nprefix = \"/\"\npolicies = [\"api\"]\nupstream = \"http://127.0.0.1:{upstream}\"\n"
    );
    // The Envoy rate limit service of the same instance: 5 per second per client.
    std::fs::write(
        dir.0.join("edge.yaml"),
        "domain: edge\ndescriptors:\n  - key: client\n    rate_limit:\n      unit: second\n      requests_per_unit: 5\n",
    )
    .unwrap();
    let route = format!("{route}\n[envoy]\nfiles = [\"edge.yaml\"]\n");
    let (_s, http, proxy) = serve(&dir.0, "one", "memory", &route);
    let args = vec![
        "--proxy".to_string(),
        format!("http://127.0.0.1:{proxy}/hello"),
        "-H".to_string(),
        "x-client: verify-{run}".to_string(),
    ];
    let (out, report, _) = verify(&args, &dir.0.join("one.svg"));
    assert_eq!(out.status.code(), Some(0), "{report}");
    assert_eq!(report["verdict"], "pass", "{report}");
    assert!(report["limited"].as_u64().unwrap() > 0, "{report}");

    // Through Envoy's protocol, with the fixed window the domain file gives.
    let out = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args([
            "verify",
            "--algorithm",
            "fixed-window",
            "--limit",
            "5",
            "--window",
            "1s",
        ])
        .args([
            "--rls",
            &format!("http://127.0.0.1:{}", grpc_of(&dir.0, "one")),
        ])
        .args(["--domain", "edge", "--descriptor", "client=verify-{run}"])
        .args(["--duration", "3s", "--json"])
        .output()
        .unwrap();
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(out.status.code(), Some(0), "{report}");
    assert!(report["limited"].as_u64().unwrap() > 0, "{report}");

    // The expected policy read from the deployment's own file.
    let out = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(["verify", "--config"])
        .arg(dir.0.join("one.toml"))
        .args([
            "--policy",
            "api",
            "--api",
            &format!("http://127.0.0.1:{http}"),
        ])
        .args(["--duration", "1s", "--json"])
        .output()
        .unwrap();
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(out.status.code(), Some(0), "{report}");
    assert_eq!(report["policy"], "token-bucket capacity=10 rate=5/s");

    // No target, or a duration past the cap: exit 2 with a message.
    let out = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(["verify", "--capacity", "10", "--rate", "5/s"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("nothing to verify"));
    let out = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(["verify", "--capacity", "10", "--rate", "5/s"])
        .args(["--proxy", "http://127.0.0.1:1/", "--duration", "2m"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("at most 60s"));
}
