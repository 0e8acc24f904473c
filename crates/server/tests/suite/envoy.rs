//! End to end with a real Envoy: the documented `examples/envoy/envoy.yaml` (ports changed)
//! in front of a small upstream, asking sluice over gRPC.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::support::{Redis, client, start_with, temp_dir};

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn envoy_bin() -> PathBuf {
    let p = std::env::var_os("SLUICE_ENVOY")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo().join(".tools/venv/bin/envoy"));
    assert!(
        p.is_file(),
        "Envoy not found at {}: run scripts/install-test-deps (or set SLUICE_ENVOY)",
        p.display()
    );
    p
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

struct Envoy {
    child: Child,
    port: u16,
    dir: PathBuf,
}

impl Drop for Envoy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl Envoy {
    async fn start(grpc: SocketAddr, upstream: SocketAddr, deny_on_failure: bool) -> Envoy {
        let template = std::fs::read_to_string(repo().join("examples/envoy/envoy.yaml")).unwrap();
        let (port, admin) = (free_port(), free_port());
        let yaml = template
            .replace("port_value: 10000", &format!("port_value: {port}"))
            .replace("port_value: 9901", &format!("port_value: {admin}"))
            .replace(
                "port_value: 8000",
                &format!("port_value: {}", upstream.port()),
            )
            .replace("port_value: 8081", &format!("port_value: {}", grpc.port()))
            .replace(
                "failure_mode_deny: false",
                &format!("failure_mode_deny: {deny_on_failure}"),
            );
        let dir = temp_dir("envoy");
        let cfg = dir.join("envoy.yaml");
        std::fs::write(&cfg, yaml).unwrap();
        let child = Command::new(envoy_bin())
            .arg("-c")
            .arg(&cfg)
            .args(["--disable-hot-restart", "--concurrency", "1", "-l", "error"])
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start envoy");
        let mut envoy = Envoy { child, port, dir };
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Ok(Some(status)) = envoy.child.try_wait() {
                panic!("envoy exited: {status}");
            }
            let ready = client()
                .get(format!("http://127.0.0.1:{admin}/ready"))
                .send()
                .await;
            if ready.is_ok_and(|r| r.status() == 200) {
                break;
            }
            assert!(Instant::now() < deadline, "envoy not ready within 30 s");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        envoy.port = port;
        envoy
    }

    fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{}", self.port, path)
    }
}

/// A small upstream answering 200 "hello" on every path.
async fn upstream() -> SocketAddr {
    let app = axum::Router::new().fallback(|| async { "hello" });
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(l, app).await });
    addr
}

fn example_files() -> Vec<(&'static str, String)> {
    vec![(
        "ratelimit.yaml",
        std::fs::read_to_string(repo().join("examples/envoy/ratelimit.yaml")).unwrap(),
    )]
}

#[tokio::test]
async fn envoy_enforces_sluice_limits_and_passes_headers() {
    let files = example_files();
    let extra: Vec<(&str, &str)> = files.iter().map(|(n, t)| (*n, t.as_str())).collect();
    let s = start_with("[envoy]\nfiles = [\"ratelimit.yaml\"]\n", &extra).await;
    let up = upstream().await;
    let envoy = Envoy::start(s.addrs.grpc, up, false).await;
    let c = client();
    // examples/envoy/ratelimit.yaml: 3 per minute per x-user.
    for left in [2, 1, 0] {
        let res = c
            .get(envoy.url("/hello"))
            .header("x-user", "alice")
            .send()
            .await
            .unwrap();
        assert_eq!(res.status(), 200);
        let h = res.headers();
        let policy = h
            .get("ratelimit-policy")
            .expect("RateLimit-Policy reaches the client")
            .to_str()
            .unwrap();
        assert!(policy.contains(";q=3;w=60"), "{policy}");
        let rl = h
            .get("ratelimit")
            .expect("RateLimit reaches the client")
            .to_str()
            .unwrap();
        assert!(rl.contains(&format!(";r={left};")), "{rl}");
        // Envoy's own headers, from the statuses sluice filled in.
        assert_eq!(
            h.get("x-ratelimit-limit")
                .map(|v| v
                    .to_str()
                    .unwrap()
                    .split(',')
                    .next()
                    .unwrap()
                    .trim()
                    .to_string())
                .as_deref(),
            Some("3")
        );
        assert_eq!(res.text().await.unwrap(), "hello");
    }
    let res = c
        .get(envoy.url("/hello"))
        .header("x-user", "alice")
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 429);
    let retry: u64 = res.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!((1..=60).contains(&retry), "{retry}");
    assert!(res.headers().contains_key("ratelimit"));
    assert_eq!(res.headers()["x-ratelimit-remaining"], "0");
    // Someone else is not affected; the unlimited value never is.
    assert_eq!(
        c.get(envoy.url("/hello"))
            .header("x-user", "bob")
            .send()
            .await
            .unwrap()
            .status(),
        200
    );
    for _ in 0..5 {
        assert_eq!(
            c.get(envoy.url("/hello"))
                .header("x-user", "loadtest")
                .send()
                .await
                .unwrap()
                .status(),
            200
        );
    }
    drop(envoy);
    s.stop().await;
}

#[tokio::test]
async fn store_down_follows_envoy_failure_mode_deny() {
    let mut redis = Redis::start().expect("redis-server is needed: run scripts/install-test-deps");
    let files = example_files();
    let extra: Vec<(&str, &str)> = files.iter().map(|(n, t)| (*n, t.as_str())).collect();
    let toml = format!(
        "[store]\nurl = \"{}\"\ntimeout = \"50ms\"\n[envoy]\nfiles = [\"ratelimit.yaml\"]\n",
        redis.url()
    );
    let s = start_with(&toml, &extra).await;
    let up = upstream().await;
    let open = Envoy::start(s.addrs.grpc, up, false).await;
    let closed = Envoy::start(s.addrs.grpc, up, true).await;
    let c = client();
    assert_eq!(
        c.get(open.url("/"))
            .header("x-user", "u1")
            .send()
            .await
            .unwrap()
            .status(),
        200
    );
    assert_eq!(
        c.get(closed.url("/"))
            .header("x-user", "u2")
            .send()
            .await
            .unwrap()
            .status(),
        200
    );
    redis.kill();
    for i in 0..3 {
        let res = c
            .get(open.url("/"))
            .header("x-user", format!("o{i}"))
            .send()
            .await
            .unwrap();
        assert_eq!(
            res.status(),
            200,
            "failure_mode_deny: false lets traffic through"
        );
        let res = c
            .get(closed.url("/"))
            .header("x-user", format!("c{i}"))
            .send()
            .await
            .unwrap();
        assert_eq!(
            res.status(),
            503,
            "failure_mode_deny: true denies (status_on_error 503)"
        );
    }
    drop(open);
    drop(closed);
    s.stop().await;
}
