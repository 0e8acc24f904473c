//! The container image: `scripts/image` builds it with buildah from this build's binary, its
//! settings are the Containerfile's final stage, and the image runs. Containers cannot be
//! started here, so the image is mounted (`buildah mount`) and `sluice serve` runs from it
//! under `chroot` as the image's unprivileged user, against a real redis-server: `/healthz`,
//! the image's own health check (`sluice probe`), a decision and a reload are tried.
//!
//! Needs root and buildah (scripts/install-test-deps installs it); skipped with a message
//! where either is missing.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;
use sluice_testkit::servers::RedisServer;

const TAG: &str = "localhost/sluice-image-test:ci";

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn run(cmd: &mut Command) -> String {
    let out = cmd.output().expect("run");
    assert!(
        out.status.success(),
        "{cmd:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

fn buildah() -> Command {
    let mut c = Command::new("buildah");
    c.args(["--storage-driver", "vfs"]);
    c
}

/// The final stage's directives of the Containerfile, by keyword.
fn containerfile() -> Vec<(String, String)> {
    let text = std::fs::read_to_string(repo().join("Containerfile")).unwrap();
    let mut stage = Vec::new();
    let mut joined = String::new();
    for line in text.lines() {
        if line.starts_with('#') || line.trim().is_empty() {
            continue;
        }
        joined.push_str(line.trim_end_matches('\\'));
        if line.ends_with('\\') {
            continue;
        }
        let l = std::mem::take(&mut joined);
        let (kw, rest) = l.split_once(' ').unwrap();
        if kw == "FROM" {
            stage.clear();
        }
        stage.push((kw.to_string(), rest.trim().to_string()));
    }
    stage
}

fn directive(stage: &[(String, String)], kw: &str) -> String {
    stage
        .iter()
        .find(|(k, _)| k == kw)
        .map(|(_, v)| v.clone())
        .unwrap_or_else(|| panic!("no {kw} in the Containerfile's final stage"))
}

/// Removes what the test made, whatever happens.
struct Cleanup {
    container: Option<String>,
    serve: Option<Child>,
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        if let Some(mut c) = self.serve.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        if let Some(ctr) = self.container.take() {
            let _ = buildah().args(["umount", &ctr]).output();
            let _ = buildah().args(["rm", &ctr]).output();
        }
        let _ = buildah().args(["rmi", "-f", TAG]).output();
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn http(method: &str, port: u16, path: &str, body: Option<&str>) -> (u16, String) {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let body = body.unwrap_or("");
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nAuthorization: Bearer image-test\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    let status = out[9..12].parse().unwrap();
    let body = out
        .split_once("\r\n\r\n")
        .map(|x| x.1)
        .unwrap_or("")
        .to_string();
    (status, body)
}

fn config(http_port: u16, grpc_port: u16, redis: &str, capacity: u32) -> String {
    format!(
        "admin_token = \"env:SLUICE_ADMIN_TOKEN\"\nidentity_hash_key = \"env:SLUICE_HASH_KEY\"\n\
         [server]\nhttp = \"127.0.0.1:{http_port}\"\ngrpc = \"127.0.0.1:{grpc_port}\"\n\
         api_token = \"env:SLUICE_API_TOKEN\"\nreload_poll = \"0s\"\n\
         [store]\nurl = \"{redis}\"\n\
         [policies.api]\nalgorithm = \"fixed-window\"\nlimit = {capacity}\nwindow = \"1h\"\n"
    )
}

#[test]
fn the_image_builds_from_the_containerfile_settings_and_serves_from_its_own_root() {
    let is_root = Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0");
    if !is_root || Command::new("buildah").arg("--version").output().is_err() {
        eprintln!("buildah or root missing; skipping (run scripts/install-test-deps as root)");
        return;
    }
    let mut cleanup = Cleanup {
        container: None,
        serve: None,
    };
    run(Command::new("bash")
        .arg(repo().join("scripts/image"))
        .args(["--binary", env!("CARGO_BIN_EXE_sluice"), "--tag", TAG])
        .current_dir(repo()));

    // The image's settings are the Containerfile's.
    let stage = containerfile();
    let inspect: Value =
        serde_json::from_str(&run(buildah().args(["inspect", "--type", "image", TAG]))).unwrap();
    let cfg = &inspect["Docker"]["config"];
    assert_eq!(cfg["User"], directive(&stage, "USER"));
    let as_json = |kw: &str| serde_json::from_str::<Value>(&directive(&stage, kw)).unwrap();
    assert_eq!(cfg["Entrypoint"], as_json("ENTRYPOINT"));
    assert_eq!(cfg["Cmd"], as_json("CMD"));
    for port in directive(&stage, "EXPOSE").split_whitespace() {
        assert!(
            cfg["ExposedPorts"].get(format!("{port}/tcp")).is_some()
                || cfg["ExposedPorts"].get(port).is_some(),
            "port {port} not exposed: {cfg}"
        );
    }
    let health = directive(&stage, "HEALTHCHECK");
    let test: Vec<String> = serde_json::from_value(cfg["Healthcheck"]["Test"].clone()).unwrap();
    let probe_cmd: Vec<String> =
        serde_json::from_str(health.split_once("CMD ").unwrap().1).unwrap();
    assert_eq!(test[1..], probe_cmd[..], "{test:?}");
    assert!(cfg["Env"].to_string().contains(&directive(&stage, "ENV")));
    assert_eq!(
        cfg["Labels"]["org.opencontainers.image.title"], "sluice",
        "{cfg}"
    );

    // Mount it and run sluice serve from its root as its user.
    let ctr = run(buildah().args(["from", TAG]));
    cleanup.container = Some(ctr.clone());
    let root = PathBuf::from(run(buildah().args(["mount", &ctr])));
    assert!(root.join("etc/sluice/sluice.toml").is_file());
    let redis = RedisServer::redis();
    let (http_port, grpc_port) = (free_port(), free_port());
    let conf = root.join("etc/sluice/test.toml");
    std::fs::write(&conf, config(http_port, grpc_port, &redis.url(), 3)).unwrap();
    let user = directive(&stage, "USER");
    let serve = Command::new("/usr/sbin/chroot")
        .arg(format!("--userspec={user}"))
        .arg(&root)
        .args([
            "/usr/local/bin/sluice",
            "serve",
            "--config",
            "/etc/sluice/test.toml",
        ])
        .env_clear()
        .env("SLUICE_ADMIN_TOKEN", "image-test")
        .env("SLUICE_API_TOKEN", "image-test")
        .env("SLUICE_HASH_KEY", "ab".repeat(32))
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(root.join("tmp/serve.log")).unwrap())
        .spawn()
        .expect("chroot");
    cleanup.serve = Some(serve);
    let started = Instant::now();
    while std::net::TcpStream::connect(("127.0.0.1", http_port)).is_err() {
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "sluice serve did not start from the image: {}",
            std::fs::read_to_string(root.join("tmp/serve.log")).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(http("GET", http_port, "/healthz", None).0, 200);
    // The image's own health check, run inside the image.
    let mut probe: Vec<String> = probe_cmd.clone();
    if let Some(url) = probe.last_mut() {
        *url = format!("http://127.0.0.1:{http_port}/healthz");
    }
    run(Command::new("/usr/sbin/chroot")
        .arg(format!("--userspec={user}"))
        .arg(&root)
        .args(&probe));

    let check = r#"{"policy":"api","identity":"user:image"}"#;
    let allowed: Vec<bool> = (0..4)
        .map(|_| {
            let (status, body) = http("POST", http_port, "/v1/check", Some(check));
            assert_eq!(status, 200, "{body}");
            serde_json::from_str::<Value>(&body).unwrap()["allowed"] == true
        })
        .collect();
    assert_eq!(allowed, [true, true, true, false]);

    // A reload picks up a larger limit from the mounted file.
    std::fs::write(&conf, config(http_port, grpc_port, &redis.url(), 5)).unwrap();
    let (status, body) = http("POST", http_port, "/admin/reload", Some("{}"));
    assert_eq!(status, 200, "{body}");
    let (_, body) = http("POST", http_port, "/v1/check", Some(check));
    assert_eq!(
        serde_json::from_str::<Value>(&body).unwrap()["allowed"],
        true,
        "{body}"
    );
}
