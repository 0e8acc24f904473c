//! No cross-site writes: what a web page of another site can make a browser send (a body
//! without a JSON content type, a foreign `Origin`, a rebound `Host`) changes nothing, on the
//! default configuration (loopback, no token). The last test opens such a page in a real
//! headless Chromium.

use crate::support;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::support::{client, start, temp_dir, which};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const POLICY: &str = "[policies.api]\nalgorithm = \"fixed-window\"\nlimit = 3\nwindow = \"1h\"\n";

/// The override of `user:1`, if there is one (the status of `GET /v1/overrides`).
async fn override_status(s: &support::TestServer) -> u16 {
    client()
        .get(s.url("/v1/overrides?policy=api&identity=user:1"))
        .send()
        .await
        .unwrap()
        .status()
        .as_u16()
}

fn set_override() -> Value {
    json!({"policy": "api", "identity": "user:1", "params": {"limit": 1000000}})
}

async fn problem(res: reqwest::Response) -> (u16, String) {
    let status = res.status().as_u16();
    assert_eq!(
        res.headers()["content-type"],
        "application/problem+json",
        "{status}"
    );
    let doc: Value = res.json().await.unwrap();
    (status, doc["detail"].as_str().unwrap_or("").to_owned())
}

#[tokio::test]
async fn a_body_without_a_json_content_type_is_refused() {
    let s = start(POLICY).await;
    let c = client();
    let body = set_override().to_string();
    for content_type in [
        None,
        Some("text/plain"),
        Some("text/plain;charset=UTF-8"),
        Some("application/x-www-form-urlencoded"),
        Some("multipart/form-data; boundary=x"),
    ] {
        let mut req = c.post(s.url("/v1/overrides")).body(body.clone());
        if let Some(ct) = content_type {
            req = req.header("content-type", ct);
        }
        let (status, detail) = problem(req.send().await.unwrap()).await;
        assert_eq!(status, 415, "{content_type:?}: {detail}");
        assert!(
            detail.contains("Content-Type: application/json"),
            "{detail}"
        );
    }
    // The same for a charge and the decision API.
    let charge = json!({"policy": "api", "identity": "user:2", "cost": 3}).to_string();
    for path in ["/v1/charge", "/v1/check"] {
        let res = c
            .post(s.url(path))
            .header("content-type", "text/plain")
            .body(charge.clone())
            .send()
            .await
            .unwrap();
        assert_eq!(res.status(), 415, "{path}");
    }
    assert_eq!(override_status(&s).await, 404, "nothing was stored");
    let state = json!({"policy": "api", "identity": "user:2"});
    let res = c
        .post(s.url("/v1/state"))
        .json(&state)
        .send()
        .await
        .unwrap();
    assert_eq!(res.json::<Value>().await.unwrap()["remaining"], 3);
    // JSON, with a charset, is accepted; a reload without a body needs no content type.
    let res = c
        .post(s.url("/v1/overrides"))
        .header("content-type", "application/json; charset=utf-8")
        .body(body)
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 200);
    assert_eq!(override_status(&s).await, 200);
    let res = c.post(s.url("/admin/reload")).send().await.unwrap();
    assert_eq!(res.status(), 200);
    s.stop().await;
}

#[tokio::test]
async fn a_write_from_another_origin_is_refused() {
    let s = start(POLICY).await;
    let c = client();
    for origin in ["http://evil.example", "null", "http://127.0.0.1:1"] {
        let res = c
            .post(s.url("/v1/overrides"))
            .header("origin", origin)
            .json(&set_override())
            .send()
            .await
            .unwrap();
        let (status, detail) = problem(res).await;
        assert_eq!(status, 403, "{origin}: {detail}");
    }
    assert_eq!(override_status(&s).await, 404);
    // The console's own page (same origin) may.
    let own = format!("http://{}", s.addrs.http);
    let res = c
        .post(s.url("/v1/overrides"))
        .header("origin", own)
        .json(&set_override())
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 200);
    s.stop().await;
}

#[tokio::test]
async fn a_rebound_host_name_is_refused_without_a_token() {
    let s = start(&format!(
        "[server]\nallowed_hosts = [\"sluice.test\"]\n\n{POLICY}"
    ))
    .await;
    let c = client();
    let port = s.addrs.http.port();
    for host in [
        "evil.example",
        &format!("evil.example:{port}"),
        "127.0.0.1.evil.example",
    ] {
        let res = c
            .post(s.url("/v1/overrides"))
            .header("host", host)
            .json(&set_override())
            .send()
            .await
            .unwrap();
        let (status, detail) = problem(res).await;
        assert_eq!(status, 421, "{host}: {detail}");
        assert!(detail.contains("server.allowed_hosts"), "{detail}");
        let res = c
            .get(s.url("/v1/stats"))
            .header("host", host)
            .send()
            .await
            .unwrap();
        assert_eq!(res.status(), 421, "stats names identities");
    }
    assert_eq!(override_status(&s).await, 404);
    for host in [
        format!("localhost:{port}"),
        format!("sluice.test:{port}"),
        format!("127.0.0.1:{port}"),
    ] {
        let res = c
            .post(s.url("/v1/overrides"))
            .header("host", &host)
            .json(&set_override())
            .send()
            .await
            .unwrap();
        assert_eq!(res.status(), 200, "{host}");
    }
    s.stop().await;

    // Where a token guards the endpoint, a rebound page could not send it: any Host.
    let s = start(&format!("admin_token = \"adm\"\n\n{POLICY}")).await;
    let res = client()
        .post(s.url("/v1/overrides"))
        .header("host", "evil.example")
        .bearer_auth("adm")
        .json(&set_override())
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 200);
    s.stop().await;
}

/// A headless Chromium, killed (with its profile removed) on drop.
struct Browser {
    child: Child,
    profile: std::path::PathBuf,
}

impl Browser {
    fn open(url: &str) -> Browser {
        let profile = temp_dir("chromium-cross-site");
        let child = Command::new(which("chromium").expect("chromium"))
            .args([
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-quic",
                "--no-first-run",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                "--disable-dev-shm-usage",
            ])
            .arg(format!("--user-data-dir={}", profile.display()))
            .arg(url)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start chromium");
        Browser { child, profile }
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        // Its helper processes (renderer, zygote) outlive it for a moment and write to the
        // profile: they carry its unique folder on their command line, so they go first.
        let _ = Command::new("pkill")
            .args(["-KILL", "-f"])
            .arg(format!("user-data-dir={}", self.profile.display()))
            .status();
        std::fs::remove_dir_all(&self.profile).ok();
    }
}

/// The attacker's page: three ways a page of another origin can send a body to sluice
/// without a preflight. `SLUICE` is sluice's address.
const ATTACK_PAGE: &str = r#"<!doctype html>
<html><body>
<iframe name="sink"></iframe>
<form id="form" method="POST" action="SLUICE/v1/lists/allow" enctype="text/plain" target="sink">
<input name='{"entry":"0.0.0.0/0","x":"' value='"}'>
</form>
<script>
const allow = JSON.stringify({ entry: "0.0.0.0/0" });
const ban = JSON.stringify({ identity: "ip:203.0.113.9", duration: "3650d" });
async function attack() {
  const sent = [];
  const post = async (what, path, init) => {
    try { await fetch("SLUICE" + path, Object.assign({ method: "POST", mode: "no-cors" }, init)); sent.push(what); }
    catch (e) { sent.push(what + ":" + e); }
  };
  await post("blob", "/v1/lists/allow", { body: new Blob([allow]) });
  await post("text", "/v1/lists/allow", { headers: { "Content-Type": "text/plain" }, body: allow });
  await post("ban", "/v1/bans", { body: new Blob([ban]) });
  document.getElementById("form").submit();
  await new Promise(r => setTimeout(r, 1000));
  await fetch("/done?" + encodeURIComponent(sent.join(",")));
}
attack();
</script>
</body></html>"#;

/// Serves [`ATTACK_PAGE`] on a loopback port of its own (another origin than sluice) and
/// reports the query of `/done` once the page has run.
async fn serve_attack_page(sluice: String) -> (u16, tokio::sync::mpsc::Receiver<String>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let page = ATTACK_PAGE.replace("SLUICE", &sluice);
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    tokio::spawn(async move {
        loop {
            let Ok((mut conn, _)) = listener.accept().await else {
                return;
            };
            let (page, tx) = (page.clone(), tx.clone());
            tokio::spawn(async move {
                let mut buf = vec![0u8; 8192];
                let n = conn.read(&mut buf).await.unwrap_or(0);
                let head = String::from_utf8_lossy(&buf[..n]).to_string();
                let target = head.split_whitespace().nth(1).unwrap_or("/").to_owned();
                let (ctype, body) = if let Some(q) = target.strip_prefix("/done?") {
                    let _ = tx.send(q.to_owned()).await;
                    ("text/plain", String::new())
                } else if target == "/" {
                    ("text/html; charset=utf-8", page)
                } else {
                    ("text/plain", String::new())
                };
                let res = format!(
                    "HTTP/1.1 200 OK\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = conn.write_all(res.as_bytes()).await;
            });
        }
    });
    (port, rx)
}

async fn check(s: &support::TestServer, identity: &str) -> bool {
    let res = client()
        .post(s.url("/v1/check"))
        .json(&json!({"policy": "api", "identity": identity}))
        .send()
        .await
        .unwrap();
    res.json::<Value>().await.unwrap()["allowed"] == true
}

fn counter(metrics: &str, endpoint: &str, status: &str) -> u64 {
    metrics
        .lines()
        .filter(|l| l.starts_with("sluice_api_requests_total{"))
        .filter(|l| {
            l.contains(&format!("endpoint=\"{endpoint}\""))
                && l.contains(&format!("status=\"{status}\""))
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .map(|v| v as u64)
        .sum()
}

#[tokio::test]
async fn a_page_of_another_origin_in_a_real_browser_changes_nothing() {
    if which("chromium").is_none() {
        eprintln!("chromium not found; skipping (run scripts/install-test-deps)");
        return;
    }
    let s = start(POLICY).await;
    let victim = "ip:203.0.113.7";
    for _ in 0..3 {
        assert!(check(&s, victim).await);
    }
    assert!(!check(&s, victim).await, "the limit is used up");
    let metrics = |s: &support::TestServer| {
        let url = s.url("/metrics");
        async move {
            client()
                .get(url)
                .send()
                .await
                .unwrap()
                .text()
                .await
                .unwrap()
        }
    };
    let before = metrics(&s).await;

    let (port, mut done) = serve_attack_page(format!("http://{}", s.addrs.http)).await;
    let browser = Browser::open(&format!("http://127.0.0.1:{port}/"));
    let sent = tokio::time::timeout(Duration::from_secs(45), done.recv())
        .await
        .expect("the attack page ran within 45 s")
        .unwrap();
    assert_eq!(sent, "blob%2Ctext%2Cban", "every fetch was sent");
    // The form post leaves no trace the page can see; give it time to arrive.
    tokio::time::sleep(Duration::from_millis(500)).await;
    drop(browser);

    // Every attempt reached sluice and was refused there...
    let after = metrics(&s).await;
    let refused =
        |endpoint: &str| counter(&after, endpoint, "403") - counter(&before, endpoint, "403");
    assert!(refused("lists") >= 3, "blob, text and form posts:\n{after}");
    assert!(refused("bans") >= 1, "the ban:\n{after}");
    // ...and nothing changed: no allow entry, no ban, the victim still denied.
    let stats: Value = client()
        .get(s.url("/v1/stats"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let control = stats["control"].to_string();
    assert!(!control.contains("0.0.0.0/0"), "{control}");
    assert!(!control.contains("203.0.113.9"), "{control}");
    for _ in 0..5 {
        assert!(!check(&s, victim).await, "checks still deny");
    }
    assert!(check(&s, "ip:203.0.113.9").await, "not banned");
    s.stop().await;
}
