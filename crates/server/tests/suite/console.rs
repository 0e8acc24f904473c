//! The operator console end to end: `GET /v1/stats` over real HTTP on the embedded store and
//! on a real redis-server, the page and its embedded assets, and the page itself in a real
//! headless Chromium driven over WebDriver (chromedriver) while traffic flows.

use crate::support;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::support::{Redis, client, start, which};
use reqwest::Method;
use serde_json::{Value, json};

const TOKEN: &str = "c0nsole-t0ken";

fn config(store: &str) -> String {
    format!(
        r#"admin_token = "{TOKEN}"
identity_hash_key = "{key}"

[store]
url = "{store}"

[policies.api]
algorithm = "fixed-window"
limit = 3
window = "1h"

[policies.search]
algorithm = "fixed-window"
limit = 1000
window = "1h"
shadow = true
"#,
        key = "cd".repeat(32)
    )
}

async fn call(
    s: &support::TestServer,
    method: Method,
    path: &str,
    body: Option<Value>,
) -> (u16, Value) {
    let mut req = client().request(method, s.url(path)).bearer_auth(TOKEN);
    if let Some(b) = body {
        req = req.json(&b);
    }
    let res = req.send().await.unwrap();
    let status = res.status().as_u16();
    (status, res.json().await.unwrap_or(Value::Null))
}

async fn check(s: &support::TestServer, policy: &str, who: &str) -> Value {
    let (status, v) = call(
        s,
        Method::POST,
        "/v1/check",
        Some(json!({"policy": policy, "identity": who})),
    )
    .await;
    assert_eq!(status, 200, "{v}");
    v
}

fn policy<'a>(stats: &'a Value, name: &str) -> &'a Value {
    stats["policies"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["policy"] == name)
        .unwrap_or_else(|| panic!("no policy {name} in {stats}"))
}

/// Drives checks with known outcomes and reads them back from `/v1/stats`.
async fn stats_count_what_was_decided(store: &str) {
    let s = start(&config(store)).await;
    // Without the token: refused, and nothing is said.
    let res = client().get(s.url("/v1/stats")).send().await.unwrap();
    assert_eq!(res.status(), 401);
    let body = res.text().await.unwrap();
    assert!(!body.contains("policies"), "{body}");

    // user:heavy: 7 checks of a limit of 3 (3 allowed, 4 denied); user:light: 1 allowed.
    for _ in 0..7 {
        check(&s, "api", "user:heavy").await;
    }
    check(&s, "api", "user:light").await;
    // A shadow policy over its limit would deny: counted as shadow-denied, not denied.
    for _ in 0..2 {
        let (st, v) = call(
            &s,
            Method::POST,
            "/v1/check",
            Some(json!({"policy": "search", "credential": "sk-secret"})),
        )
        .await;
        assert_eq!(st, 200, "{v}");
    }
    // A credential shows only as its keyed hash.
    let (st, stats) = call(&s, Method::GET, "/v1/stats", None).await;
    assert_eq!(st, 200, "{stats}");
    let api = policy(&stats, "api");
    assert_eq!(api["totals"]["decisions"], 8, "{api}");
    assert_eq!(api["totals"]["allowed"], 4, "{api}");
    assert_eq!(api["totals"]["denied"], 4, "{api}");
    assert_eq!(api["totals"]["failed_open"], 0, "{api}");
    let series: u64 = api["series"]["decisions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap())
        .sum();
    assert_eq!(series, 8);
    assert!(api["latency_ms"]["p99"].as_f64().unwrap() > 0.0);
    let search = policy(&stats, "search");
    assert_eq!(search["totals"]["decisions"], 2);
    assert_eq!(search["totals"]["shadow_denied"], 0);

    let top = &stats["top"];
    assert_eq!(top["decisions"][0]["identity"], "user:heavy", "{top}");
    assert_eq!(top["decisions"][0]["count"], 7);
    assert_eq!(top["decisions"][0]["error"], 0);
    assert_eq!(top["denials"][0]["identity"], "user:heavy");
    assert_eq!(top["denials"][0]["count"], 4);
    assert_eq!(top["decisions_total"], 10);
    let text = stats.to_string();
    assert!(
        !text.contains("sk-secret"),
        "a raw credential in the stats: {text}"
    );
    assert!(
        text.contains("\"key:"),
        "the hashed credential is listed: {text}"
    );

    assert_eq!(stats["generation"], 1);
    assert_eq!(stats["store"]["breaker"], "closed");
    assert_eq!(stats["store"]["errors"], 0);
    // Every admitted check asked the store (denials may come from the deny cache).
    assert!(stats["store"]["calls"].as_u64().unwrap() >= 6, "{stats}");
    assert!(stats["last_reload"].is_null());

    // Control entries made through the admin API are listed (on Redis, after the poll).
    let (st, v) = call(
        &s,
        Method::POST,
        "/v1/bans",
        Some(json!({"identity": "user:bad", "duration": "10m"})),
    )
    .await;
    assert_eq!(st, 200, "{v}");
    let (st, v) = call(
        &s,
        Method::POST,
        "/v1/lists/deny",
        Some(json!({"entry": "203.0.113.0/24"})),
    )
    .await;
    assert_eq!(st, 200, "{v}");
    let (st, v) = call(
        &s,
        Method::POST,
        "/v1/overrides",
        Some(json!({"policy": "api", "identity": "user:vip", "params": {"limit": 100}})),
    )
    .await;
    assert_eq!(st, 200, "{v}");
    let deadline = Instant::now() + Duration::from_secs(5);
    let control = loop {
        let (_, stats) = call(&s, Method::GET, "/v1/stats", None).await;
        let c = stats["control"].clone();
        let full = |k: &str| c[k].as_array().is_some_and(|a| !a.is_empty());
        if (full("bans") && full("lists") && full("overrides")) || Instant::now() > deadline {
            break c;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(control["bans"][0]["identity"], "user:bad", "{control}");
    assert!(control["bans"][0]["policies"].is_null());
    assert_eq!(control["lists"][0]["list"], "deny", "{control}");
    assert_eq!(control["lists"][0]["entry"], "203.0.113.0/24");
    assert_eq!(control["lists"][0]["from_config"], false);
    assert_eq!(control["overrides"][0]["identity"], "user:vip", "{control}");

    // A reload's outcome is reported, with its errors when it fails.
    let (st, v) = call(&s, Method::POST, "/admin/reload", None).await;
    assert_eq!(st, 200, "{v}");
    let (_, stats) = call(&s, Method::GET, "/v1/stats", None).await;
    assert_eq!(stats["generation"], 2);
    assert_eq!(stats["last_reload"]["ok"], true, "{stats}");
    assert_eq!(stats["last_reload"]["trigger"], "admin");
    std::fs::write(&s.file, config(store).replace("limit = 3", "limit = -3")).unwrap();
    let (st, _) = call(&s, Method::POST, "/admin/reload", None).await;
    assert_eq!(st, 422);
    let (_, stats) = call(&s, Method::GET, "/v1/stats", None).await;
    assert_eq!(stats["generation"], 2);
    assert_eq!(stats["last_reload"]["ok"], false);
    let errors = stats["last_reload"]["errors"].as_array().unwrap();
    assert!(
        errors.iter().any(|e| e.as_str().unwrap().contains("limit")),
        "{errors:?}"
    );
    // The counts survive reloads.
    assert_eq!(policy(&stats, "api")["totals"]["decisions"], 8);
    s.stop().await;
}

#[tokio::test]
async fn stats_on_the_embedded_store() {
    stats_count_what_was_decided("memory").await;
}

#[tokio::test]
async fn stats_on_redis() {
    let Some(redis) = Redis::start() else {
        eprintln!("redis-server not found; skipping (run scripts/install-test-deps)");
        return;
    };
    stats_count_what_was_decided(&redis.url()).await;
}

#[tokio::test]
async fn the_page_is_served_without_a_token_and_carries_no_data() {
    let s = start(&config("memory")).await;
    check(&s, "api", "user:seen").await;
    let res = client().get(s.url("/ui")).send().await.unwrap();
    assert_eq!(res.status(), 200);
    let csp = res.headers()["content-security-policy"]
        .to_str()
        .unwrap()
        .to_string();
    assert!(
        csp.contains("default-src 'none'") && csp.contains("script-src 'self'"),
        "{csp}"
    );
    let html = res.text().await.unwrap();
    assert!(html.contains("/ui/console.js") && html.contains("id=\"login\""));
    assert!(!html.contains("user:seen"));
    // Nothing is loaded from elsewhere.
    for asset in ["/ui", "/ui/console.js", "/ui/console.css"] {
        let text = client()
            .get(s.url(asset))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        // The SVG namespace is a name, not a place anything is loaded from.
        let text = text.replace("\"http://www.w3.org/2000/svg\"", "");
        assert!(
            !text.contains("https://") && !text.contains("http://"),
            "{asset} loads from elsewhere"
        );
    }
    let js = client().get(s.url("/ui/console.js")).send().await.unwrap();
    assert!(
        js.headers()["content-type"]
            .to_str()
            .unwrap()
            .starts_with("text/javascript")
    );
    assert!(!js.text().await.unwrap().contains("innerHTML"));
    s.stop().await;
}

// ---- the browser ------------------------------------------------------------------------

/// chromedriver on a free loopback port, killed (with the browser it started) on drop.
struct Driver {
    child: Child,
    /// The browser's profile folder, unique to this driver: every process started with it
    /// (the browser and its helpers) is killed on drop, also when the session was not closed.
    profile: std::path::PathBuf,
    url: String,
    session: Option<String>,
    http: reqwest::Client,
}

impl Drop for Driver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = Command::new("pkill")
            .args(["-KILL", "-f"])
            .arg(format!("user-data-dir={}", self.profile.display()))
            .status();
    }
}

const ELEMENT: &str = "element-6066-11e4-a52e-4f735466cecf";

impl Driver {
    async fn start(profile: &std::path::Path) -> Driver {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let child = Command::new("chromedriver")
            .args([format!("--port={port}"), "--allowed-ips=127.0.0.1".into()])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start chromedriver");
        let mut d = Driver {
            child,
            profile: profile.to_path_buf(),
            url: format!("http://127.0.0.1:{port}"),
            session: None,
            http: client(),
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Ok(r) = d.http.get(format!("{}/status", d.url)).send().await
                && let Ok(v) = r.json::<Value>().await
                && v["value"]["ready"] == true
            {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "chromedriver did not start within 30 s"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let caps = json!({"capabilities": {"alwaysMatch": {
            "browserName": "chrome",
            "goog:chromeOptions": {
                "binary": which("chromium").expect("chromium").to_string_lossy(),
                "args": [
                    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                    "--no-first-run", "--disable-background-networking",
                    "--disable-component-update", "--disable-sync",
                    "--disable-dev-shm-usage", "--window-size=1280,1400",
                    format!("--user-data-dir={}", profile.display()),
                ],
            },
        }}});
        let v = d.send(Method::POST, "/session", caps).await;
        d.session = Some(
            v["sessionId"]
                .as_str()
                .unwrap_or_else(|| panic!("no session: {v}"))
                .to_string(),
        );
        d
    }

    async fn send(&self, method: Method, path: &str, body: Value) -> Value {
        let url = match &self.session {
            Some(id) if path != "/session" => format!("{}/session/{id}{path}", self.url),
            _ => format!("{}{path}", self.url),
        };
        let mut req = self
            .http
            .request(method.clone(), url)
            .timeout(Duration::from_secs(60));
        if method != Method::GET {
            req = req.json(&body);
        }
        let v: Value = req
            .send()
            .await
            .expect("webdriver call")
            .json()
            .await
            .expect("webdriver json");
        v["value"].clone()
    }

    async fn goto(&self, url: &str) {
        self.send(Method::POST, "/url", json!({"url": url})).await;
    }

    async fn js(&self, script: &str) -> Value {
        self.send(
            Method::POST,
            "/execute/sync",
            json!({"script": script, "args": []}),
        )
        .await
    }

    /// Evaluates `script` until it returns a truthy value, for at most `secs`.
    async fn wait_for(&self, what: &str, secs: u64, script: &str) -> Value {
        let deadline = Instant::now() + Duration::from_secs(secs);
        loop {
            let v = self.js(script).await;
            if !(v.is_null() || v == false || v == 0 || v == "") {
                return v;
            }
            assert!(
                Instant::now() < deadline,
                "{what}: not within {secs} s (last {v})"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    async fn element(&self, css: &str) -> String {
        let v = self
            .send(
                Method::POST,
                "/element",
                json!({"using": "css selector", "value": css}),
            )
            .await;
        v[ELEMENT]
            .as_str()
            .unwrap_or_else(|| panic!("no element {css}: {v}"))
            .to_string()
    }

    async fn type_into(&self, css: &str, text: &str) {
        let e = self.element(css).await;
        self.send(Method::POST, &format!("/element/{e}/clear"), json!({}))
            .await;
        self.send(
            Method::POST,
            &format!("/element/{e}/value"),
            json!({"text": text}),
        )
        .await;
    }

    async fn click(&self, css: &str) {
        let e = self.element(css).await;
        let v = self
            .send(Method::POST, &format!("/element/{e}/click"), json!({}))
            .await;
        assert!(v.is_null(), "clicking {css}: {v}");
    }

    async fn screenshot(&self, path: &std::path::Path) {
        let v = self.send(Method::GET, "/screenshot", Value::Null).await;
        let png = base64_decode(v.as_str().expect("screenshot base64"));
        assert!(png.starts_with(b"\x89PNG"), "not a PNG");
        std::fs::write(path, png).expect("write screenshot");
    }

    async fn resize(&self, width: u32, height: u32) {
        self.send(
            Method::POST,
            "/window/rect",
            json!({"width": width, "height": height}),
        )
        .await;
    }

    async fn quit(mut self) {
        if self.session.is_some() {
            self.send(Method::DELETE, "", Value::Null).await;
            self.session = None;
        }
    }
}

fn base64_decode(text: &str) -> Vec<u8> {
    let value = |c: u8| match c {
        b'A'..=b'Z' => c - b'A',
        b'a'..=b'z' => c - b'a' + 26,
        b'0'..=b'9' => c - b'0' + 52,
        b'+' => 62,
        b'/' => 63,
        _ => panic!("not base64: {c}"),
    };
    let bytes: Vec<u8> = text
        .bytes()
        .filter(|c| !c.is_ascii_whitespace() && *c != b'=')
        .collect();
    let mut out = Vec::with_capacity(bytes.len() * 3 / 4);
    for chunk in bytes.chunks(4) {
        let mut n = 0u32;
        for (i, &c) in chunk.iter().enumerate() {
            n |= u32::from(value(c)) << (18 - 6 * i);
        }
        let take = chunk.len() * 6 / 8;
        out.extend_from_slice(&n.to_be_bytes()[1..1 + take]);
    }
    out
}

fn target_dir() -> std::path::PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target"))
}

#[tokio::test]
async fn the_console_in_a_real_browser() {
    if which("chromium").is_none() || which("chromedriver").is_none() {
        eprintln!("chromium or chromedriver not found; skipping (run scripts/install-test-deps)");
        return;
    }
    let s = start(&config("memory")).await;
    let profile = support::temp_dir("chromium");
    let driver = Driver::start(&profile).await;

    // Traffic while the page is open: bounded in count and time.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let traffic = {
        let (url, stop) = (s.url("/v1/check"), stop.clone());
        tokio::spawn(async move {
            let c = client();
            for i in 0..1500u32 {
                if stop.load(std::sync::atomic::Ordering::Relaxed) {
                    break;
                }
                let who = if i % 3 == 0 {
                    "user:heavy".to_string()
                } else {
                    format!("user:{}", i % 7)
                };
                let _ = c
                    .post(&url)
                    .json(&json!({"policy": "api", "identity": who}))
                    .send()
                    .await;
                let _ = c
                    .post(&url)
                    .json(&json!({"policy": "search", "identity": who}))
                    .send()
                    .await;
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
    };

    // Without the token: the login form, and no data at all.
    driver.goto(&s.url("/ui")).await;
    driver
        .wait_for(
            "the login form",
            20,
            "return !document.getElementById('login').hidden",
        )
        .await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let shown = driver
        .js("return [document.getElementById('console').hidden, document.querySelectorAll('#policies *').length, document.body.innerText]")
        .await;
    assert_eq!(shown[0], true, "the console is shown without a token");
    assert_eq!(shown[1], 0, "policies rendered without a token");
    assert!(
        !shown[2].as_str().unwrap().contains("user:heavy"),
        "data shown without a token"
    );

    // A token link logs in directly and leaves the address bar.
    driver.goto("about:blank").await;
    driver.goto(&s.url(&format!("/ui#token={TOKEN}"))).await;
    let first = driver
        .wait_for(
            "decisions shown",
            20,
            "const e = document.querySelector('.policy[data-policy=api] .total-decisions'); \
             return e && Number(e.textContent.replace(/,/g, '')) > 0 ? Number(e.textContent.replace(/,/g, '')) : 0",
        )
        .await
        .as_u64()
        .unwrap();
    assert_eq!(
        driver.js("return location.hash").await,
        "",
        "the token stays in the address bar"
    );
    let points = "return document.querySelector('.policy[data-policy=api] polyline.decisions').getAttribute('points')";
    let chart_before = driver.js(points).await;
    // The numbers and the chart move while traffic flows.
    driver
        .wait_for(
            "the decision count to grow",
            20,
            &format!(
                "const e = document.querySelector('.policy[data-policy=api] .total-decisions'); \
                 return Number(e.textContent.replace(/,/g, '')) > {first}"
            ),
        )
        .await;
    // The chart is redrawn on its own tick, after the numbers: wait for that redraw.
    driver
        .wait_for(
            "the chart to change",
            20,
            &format!(
                "const c = document.querySelector('.policy[data-policy=api] polyline.decisions'); \
                 return c.getAttribute('points') !== {}",
                chart_before
            ),
        )
        .await;
    let chart_after = driver.js(points).await;
    assert_ne!(chart_before, chart_after, "the chart did not change");
    let heights: Vec<f64> = chart_after
        .as_str()
        .unwrap()
        .split(' ')
        .map(|p| p.split(',').nth(1).unwrap().parse().unwrap())
        .collect();
    assert!(
        heights.iter().any(|&y| y < 60.0),
        "the chart shows no traffic: {heights:?}"
    );
    driver
        .wait_for(
            "the heavy identity on top",
            10,
            "const c = document.querySelector('#top-decisions tbody td.identity'); return c && c.textContent === 'user:heavy'",
        )
        .await;
    driver
        .wait_for(
            "denials shown",
            10,
            "return document.querySelector('#top-denials tbody td.identity') !== null",
        )
        .await;

    // A ban made in the page takes effect on /v1/check.
    assert_eq!(check(&s, "api", "user:banned-in-ui").await["allowed"], true);
    driver.type_into("#ban-identity", "user:banned-in-ui").await;
    driver.type_into("#ban-duration", "10m").await;
    driver.click("#ban-form button[type=submit]").await;
    driver
        .wait_for(
            "the ban listed",
            10,
            "return Array.from(document.querySelectorAll('#bans td.identity')).some(e => e.textContent === 'user:banned-in-ui')",
        )
        .await;
    let v = check(&s, "api", "user:banned-in-ui").await;
    assert_eq!(v["allowed"], false, "{v}");
    assert_eq!(v["policies"][0]["reason"], "banned", "{v}");

    // Try a check: reads the state without consuming.
    driver.type_into("#try-identity", "user:fresh").await;
    driver.click("#try-form button[type=submit]").await;
    let verdict = driver
        .wait_for(
            "the try-a-check answer",
            10,
            "const v = document.getElementById('try-verdict'); return v.textContent",
        )
        .await;
    assert!(
        verdict.as_str().unwrap().contains("3 of 3 left"),
        "{verdict}"
    );
    let (_, state) = call(
        &s,
        Method::POST,
        "/v1/state",
        Some(json!({"policy": "api", "identity": "user:fresh"})),
    )
    .await;
    assert_eq!(state["remaining"], 3, "the try consumed: {state}");

    // The whole page, with the ban in force, for review.
    let dir = target_dir();
    std::fs::create_dir_all(&dir).unwrap();
    driver.resize(1280, 2000).await;
    tokio::time::sleep(Duration::from_millis(1200)).await;
    driver.js("window.scrollTo(0, 0)").await;
    driver.screenshot(&dir.join("console.png")).await;
    driver.resize(1280, 1400).await;

    // Lifting the ban from the page.
    driver.click("#bans td.act button").await;
    driver
        .wait_for(
            "the ban lifted",
            10,
            "return document.querySelector('#bans td.empty') !== null",
        )
        .await;
    assert_eq!(check(&s, "api", "user:banned-in-ui").await["allowed"], true);

    // A phone-sized screen: nothing wider than the screen.
    driver.resize(390, 1600).await;
    tokio::time::sleep(Duration::from_millis(1200)).await;
    let overflow = driver
        .js("return document.documentElement.scrollWidth - document.documentElement.clientWidth")
        .await;
    assert!(
        overflow.as_i64().unwrap() <= 1,
        "wider than a phone screen by {overflow} px"
    );
    driver.screenshot(&dir.join("console-phone.png")).await;

    // Logging out leaves no data on the page.
    driver.resize(1280, 1400).await;
    driver.click("#logout").await;
    driver
        .wait_for(
            "the login form again",
            10,
            "return !document.getElementById('login').hidden",
        )
        .await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(
        driver
            .js("return document.querySelectorAll('#policies *').length")
            .await,
        0
    );

    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    traffic.await.unwrap();
    driver.quit().await;
    let _ = std::fs::remove_dir_all(&profile);
    s.stop().await;
}

/// The proxy (whose checks run inside the `sluice-http` layer) and the Envoy service are
/// counted too, with credentials only as their keyed hash.
#[tokio::test]
async fn the_proxy_and_the_envoy_service_are_counted() {
    use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
    use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
    use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
    use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;

    let upstream = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let up = upstream.local_addr().unwrap();
    tokio::spawn(async move {
        let app = axum::Router::new().fallback(|| async { "ok" });
        axum::serve(upstream, app).await.unwrap();
    });
    let domain = "domain: edge\ndescriptors:\n  - key: remote_address\n    rate_limit:\n      unit: minute\n      requests_per_unit: 2\n";
    let toml = format!(
        "admin_token = \"{TOKEN}\"\nidentity_hash_key = \"{}\"\n[envoy]\nfiles = [\"edge.yaml\"]\n\
         [policies.per-key]\nalgorithm = \"fixed-window\"\nlimit = 2\nwindow = \"1h\"\nidentity = \"api-key:x-api-key\"\n\
         [[routes]]\nprefix = \"/api\"\npolicies = [\"per-key\"]\nupstream = \"http://{up}\"\n",
        "cd".repeat(32)
    );
    let s = support::start_with(&toml, &[("edge.yaml", domain)]).await;
    // Proxy: 3 requests with one API key (2 admitted, 1 denied).
    let mut codes = Vec::new();
    for _ in 0..3 {
        let r = client()
            .get(s.proxy_url("/api/x"))
            .header("x-api-key", "sk-proxy-secret")
            .send()
            .await
            .unwrap();
        codes.push(r.status().as_u16());
    }
    assert_eq!(codes, [200, 200, 429]);
    // Envoy: 3 calls for one address (2 OK, 1 over the limit).
    let mut rls = RateLimitServiceClient::connect(s.grpc_url()).await.unwrap();
    for _ in 0..3 {
        let req = RateLimitRequest {
            domain: "edge".into(),
            descriptors: vec![RateLimitDescriptor {
                entries: vec![Entry {
                    key: "remote_address".into(),
                    value: "10.0.0.9".into(),
                }],
                ..Default::default()
            }],
            hits_addend: 0,
        };
        rls.should_rate_limit(req).await.unwrap();
    }
    let (st, stats) = call(&s, Method::GET, "/v1/stats", None).await;
    assert_eq!(st, 200);
    let per_key = policy(&stats, "per-key");
    assert_eq!(per_key["totals"]["decisions"], 3, "{per_key}");
    assert_eq!(per_key["totals"]["denied"], 1, "{per_key}");
    let others: Vec<&Value> = stats["policies"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["policy"] != "per-key")
        .collect();
    let envoy_decisions: u64 = others
        .iter()
        .map(|p| p["totals"]["decisions"].as_u64().unwrap())
        .sum();
    let envoy_denied: u64 = others
        .iter()
        .map(|p| p["totals"]["denied"].as_u64().unwrap())
        .sum();
    assert_eq!((envoy_decisions, envoy_denied), (3, 1), "{others:?}");
    let text = stats["top"].to_string();
    assert!(
        !text.contains("sk-proxy-secret"),
        "a raw API key in the stats: {text}"
    );
    assert!(text.contains("10.0.0.9"), "{text}");
    let heavy: Vec<&str> = stats["top"]["denials"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["identity"].as_str().unwrap())
        .collect();
    assert_eq!(heavy.len(), 2, "{heavy:?}");
    s.stop().await;
}
