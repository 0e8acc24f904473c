//! The auth boundary: every endpoint that changes limits takes a token whenever the listener
//! serving it binds beyond loopback (`sluice serve` and reloads refuse otherwise), the control
//! endpoints move to `server.admin` when it is set, each class of endpoint takes its token,
//! and durations have one ceiling everywhere.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use crate::support::{client, start, temp_dir};
use reqwest::Method;
use serde_json::{Value, json};
use sluice_server::cli::{ServeArgs, load};
use sluice_server::{Config, Listeners};

const POLICY: &str = "[policies.api]\nalgorithm = \"fixed-window\"\nlimit = 3\nwindow = \"1h\"\n";

/// Every control endpoint with a body it accepts, in an order in which each succeeds.
fn control_calls() -> Vec<(Method, &'static str, Option<Value>)> {
    vec![
        (
            Method::POST,
            "/v1/overrides",
            Some(json!({"policy": "api", "identity": "user:1", "params": {"limit": 10}})),
        ),
        (
            Method::GET,
            "/v1/overrides?policy=api&identity=user:1",
            None,
        ),
        (
            Method::DELETE,
            "/v1/overrides",
            Some(json!({"policy": "api", "identity": "user:1"})),
        ),
        (
            Method::POST,
            "/v1/bans",
            Some(json!({"identity": "user:2", "duration": "10m"})),
        ),
        (
            Method::DELETE,
            "/v1/bans",
            Some(json!({"identity": "user:2"})),
        ),
        (
            Method::POST,
            "/v1/lists/allow",
            Some(json!({"entry": "user:3"})),
        ),
        (
            Method::DELETE,
            "/v1/lists/allow",
            Some(json!({"entry": "user:3"})),
        ),
        (
            Method::POST,
            "/v1/lists/deny",
            Some(json!({"entry": "user:4"})),
        ),
        (
            Method::DELETE,
            "/v1/lists/deny",
            Some(json!({"entry": "user:4"})),
        ),
        (
            Method::DELETE,
            "/v1/state",
            Some(json!({"policy": "api", "identity": "user:5"})),
        ),
        (
            Method::POST,
            "/v1/charge",
            Some(json!({"policy": "api", "identity": "user:5", "cost": 1})),
        ),
        (
            Method::POST,
            "/v1/refund",
            Some(json!({"policy": "api", "identity": "user:5", "cost": 1})),
        ),
        (Method::POST, "/admin/reload", None),
        (Method::GET, "/v1/stats", None),
    ]
}

async fn call(
    base: &str,
    method: Method,
    path: &str,
    body: Option<&Value>,
    token: Option<&str>,
) -> (u16, Value) {
    let mut req = client().request(method, format!("{base}{path}"));
    if let Some(b) = body {
        req = req.json(b);
    }
    if let Some(t) = token {
        req = req.bearer_auth(t);
    }
    let res = req.send().await.expect("request");
    let status = res.status().as_u16();
    let text = res.text().await.unwrap_or_default();
    (status, serde_json::from_str(&text).unwrap_or(Value::Null))
}

/// A `sluice serve` started as the command line starts it (`cli::load`, which applies the
/// auth boundary), its HTTP listener on `0.0.0.0` (reached over 127.0.0.1).
struct PublicServer {
    base: String,
    file: PathBuf,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<Result<(), sluice_server::ServeError>>,
}

fn args(file: &Path, http: &str) -> ServeArgs {
    let any: SocketAddr = "127.0.0.1:0".parse().unwrap();
    ServeArgs {
        config: Some(file.to_path_buf()),
        http: Some(http.parse().unwrap()),
        grpc: Some(any),
        proxy: Some(any),
        admin: None,
    }
}

impl PublicServer {
    async fn start(toml: &str) -> PublicServer {
        let file = temp_dir("public").join("sluice.toml");
        std::fs::write(&file, toml).unwrap();
        let config: Config = load(&args(&file, "0.0.0.0:0")).expect("a guarded public listener");
        let listeners = Listeners::bind(&config).await.expect("bind");
        let port = listeners.addrs().http.port();
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(sluice_server::run(config, listeners, async move {
            let _ = rx.await;
        }));
        PublicServer {
            base: format!("http://127.0.0.1:{port}"),
            file,
            stop: Some(tx),
            task,
        }
    }

    async fn stop(mut self) {
        let _ = self.stop.take().map(|s| s.send(()));
        let _ = self.task.await;
        if let Some(dir) = self.file.parent() {
            std::fs::remove_dir_all(dir).ok();
        }
    }
}

#[test]
fn a_public_listener_without_a_token_refuses_to_start() {
    let dir = temp_dir("refuse");
    let write = |name: &str, text: &str| {
        let p = dir.join(name);
        std::fs::write(&p, format!("{text}\n{POLICY}")).unwrap();
        p
    };
    let open = write("open.toml", "");
    let e = load(&args(&open, "0.0.0.0:8080")).unwrap_err().to_string();
    assert!(e.contains("server.http"), "{e}");
    for named in [
        "/v1/overrides",
        "/v1/bans",
        "/v1/lists/*",
        "DELETE /v1/state",
        "/v1/charge",
        "/v1/refund",
        "/admin/*",
        "0.0.0.0:8080",
        "admin_token",
        "public_admin_without_token",
    ] {
        assert!(e.contains(named), "{named}: {e}");
    }
    // An API token alone does not guard the control endpoints: every application holds it.
    let api_only = write("api.toml", "[server]\napi_token = \"api\"\n");
    let e = load(&args(&api_only, "0.0.0.0:8080"))
        .unwrap_err()
        .to_string();
    assert!(e.contains("admin_token"), "{e}");
    // Moving the control endpoints to a loopback admin listener leaves the public HTTP
    // listener with the decision API only: accepted.
    let split = write("split.toml", "[server]\nadmin = \"127.0.0.1:9090\"\n");
    assert!(load(&args(&split, "0.0.0.0:8080")).is_ok());
    let public_admin = write("public-admin.toml", "[server]\nadmin = \"0.0.0.0:9090\"\n");
    let e = load(&args(&public_admin, "127.0.0.1:8080"))
        .unwrap_err()
        .to_string();
    assert!(e.contains("server.admin"), "{e}");
    let token = write("token.toml", "admin_token = \"adm\"\n");
    assert!(load(&args(&token, "0.0.0.0:8080")).is_ok());
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn public_admin_without_token_is_warned_about_at_start() {
    let parse =
        |src: &str| Config::parse(&format!("{src}\n{POLICY}"), "sluice.toml", None).unwrap();
    let open = parse("[server]\nhttp = \"0.0.0.0:8080\"\npublic_admin_without_token = true\n");
    let warnings = sluice_server::startup_warnings(&open);
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    let w = &warnings[0];
    assert!(w.contains("public_admin_without_token"), "{w}");
    assert!(w.contains("0.0.0.0:8080"), "{w}");
    assert!(w.contains("no token guards them"), "{w}");
    let api = parse(
        "[server]\nhttp = \"0.0.0.0:8080\"\napi_token = \"api\"\npublic_admin_without_token = true\n",
    );
    assert!(sluice_server::startup_warnings(&api)[0].contains("only server.api_token"));
    // Nothing to warn about where a token guards them or they stay on loopback.
    let guarded = parse(
        "admin_token = \"adm\"\n[server]\nhttp = \"0.0.0.0:8080\"\npublic_admin_without_token = true\n",
    );
    assert!(sluice_server::startup_warnings(&guarded).is_empty());
    let local = parse("[server]\npublic_admin_without_token = true\n");
    assert!(sluice_server::startup_warnings(&local).is_empty());
}

#[tokio::test]
async fn on_a_public_listener_every_control_endpoint_needs_the_admin_token() {
    let s = PublicServer::start(&format!(
        "admin_token = \"adm\"\n[server]\nreload_poll = \"0s\"\n\n{POLICY}"
    ))
    .await;
    for (method, path, body) in control_calls() {
        for wrong in [None, Some("guess"), Some("ad")] {
            let (status, doc) = call(&s.base, method.clone(), path, body.as_ref(), wrong).await;
            assert_eq!(status, 401, "{method} {path} with {wrong:?}: {doc}");
            assert!(
                doc["detail"].as_str().unwrap_or("").contains("admin_token"),
                "{doc}"
            );
        }
        let (status, doc) = call(&s.base, method.clone(), path, body.as_ref(), Some("adm")).await;
        assert_eq!(status, 200, "{method} {path}: {doc}");
    }
    let (status, _) = call(&s.base, Method::GET, "/metrics", None, None).await;
    assert_eq!(status, 401);
    // The decision API stays open (no api_token), health too.
    let check = json!({"policy": "api", "identity": "user:9"});
    let (status, doc) = call(&s.base, Method::POST, "/v1/check", Some(&check), None).await;
    assert_eq!(status, 200, "{doc}");
    let (status, _) = call(&s.base, Method::GET, "/healthz", None, None).await;
    assert_eq!(status, 200);

    // A reload that would drop the token in front of the public listener is refused, and
    // the token stays in force.
    std::fs::write(
        &s.file,
        format!("[server]\nreload_poll = \"0s\"\n\n{POLICY}"),
    )
    .unwrap();
    let (status, doc) = call(&s.base, Method::POST, "/admin/reload", None, Some("adm")).await;
    assert_eq!(status, 422, "{doc}");
    assert!(
        doc["detail"].as_str().unwrap().contains("admin_token"),
        "{doc}"
    );
    let ban = json!({"identity": "user:7", "duration": "10m"});
    let (status, _) = call(&s.base, Method::POST, "/v1/bans", Some(&ban), None).await;
    assert_eq!(status, 401);
    s.stop().await;
}

#[tokio::test]
async fn with_server_admin_the_control_endpoints_are_on_the_admin_listener_only() {
    let s = start(&format!(
        "[server]\nadmin = \"127.0.0.1:9\"\nreload_poll = \"0s\"\n\n{POLICY}"
    ))
    .await;
    let http = s.url("");
    let admin = s.admin_url("");
    for (method, path, body) in control_calls() {
        let (status, doc) = call(&http, method.clone(), path, body.as_ref(), None).await;
        // Reading state stays on the HTTP listener, so resetting it there is 405, not 404.
        let expected = if path == "/v1/state" { 405 } else { 404 };
        assert_eq!(
            status, expected,
            "{method} {path} on the HTTP listener: {doc}"
        );
        let (status, doc) = call(&admin, method.clone(), path, body.as_ref(), None).await;
        assert_eq!(status, 200, "{method} {path} on the admin listener: {doc}");
    }
    for path in ["/metrics", "/ui"] {
        let (status, _) = call(&http, Method::GET, path, None, None).await;
        assert_eq!(status, 404, "{path}");
        let (status, _) = call(&admin, Method::GET, path, None, None).await;
        assert_eq!(status, 200, "{path}");
    }
    // The HTTP listener decides; reading state (the console's "Try a check") works on both.
    let who = json!({"policy": "api", "identity": "user:8"});
    let (status, _) = call(&http, Method::POST, "/v1/check", Some(&who), None).await;
    assert_eq!(status, 200);
    for base in [&http, &admin] {
        let (status, doc) = call(base, Method::POST, "/v1/state", Some(&who), None).await;
        assert_eq!(status, 200, "{base}: {doc}");
        assert_eq!(doc["remaining"], 2, "{doc}");
    }
    s.stop().await;
}

#[tokio::test]
async fn each_class_of_endpoint_takes_its_token() {
    let s = start(&format!(
        "admin_token = \"adm\"\n[server]\napi_token = \"api\"\nreload_poll = \"0s\"\n\n{POLICY}"
    ))
    .await;
    let base = s.url("");
    let who = json!({"policy": "api", "identity": "user:1"});
    // Decision: the API token, or the admin token (the console reads state with it).
    for path in ["/v1/check", "/v1/state"] {
        let (status, _) = call(&base, Method::POST, path, Some(&who), None).await;
        assert_eq!(status, 401, "{path}");
        for token in ["api", "adm"] {
            let (status, doc) = call(&base, Method::POST, path, Some(&who), Some(token)).await;
            assert_eq!(status, 200, "{path} with {token}: {doc}");
        }
    }
    // Control: the admin token only, once it is set.
    for (method, path, body) in control_calls() {
        let (status, doc) = call(&base, method.clone(), path, body.as_ref(), Some("api")).await;
        assert_eq!(status, 401, "{method} {path} with the API token: {doc}");
        let (status, doc) = call(&base, method.clone(), path, body.as_ref(), Some("adm")).await;
        assert_eq!(status, 200, "{method} {path}: {doc}");
    }
    let (status, _) = call(&base, Method::GET, "/metrics", None, Some("api")).await;
    assert_eq!(status, 401);
    let (status, _) = call(&base, Method::GET, "/metrics", None, Some("adm")).await;
    assert_eq!(status, 200);
    s.stop().await;

    // With the API token alone, it opens the control endpoints too.
    let s = start(&format!(
        "[server]\napi_token = \"api\"\nreload_poll = \"0s\"\n\n{POLICY}"
    ))
    .await;
    let base = s.url("");
    for (method, path, body) in control_calls() {
        let (status, _) = call(&base, method.clone(), path, body.as_ref(), None).await;
        assert_eq!(status, 401, "{method} {path}");
        let (status, doc) = call(&base, method.clone(), path, body.as_ref(), Some("api")).await;
        assert_eq!(status, 200, "{method} {path}: {doc}");
    }
    s.stop().await;
}

#[tokio::test]
async fn durations_have_one_ceiling_everywhere() {
    let s = start(POLICY).await;
    let base = s.url("");
    let mut details = Vec::new();
    for duration in ["9223372036854775807ms", "1000000000000d", "36501d"] {
        let ban = json!({"identity": "user:1", "duration": duration});
        let (status, doc) = call(&base, Method::POST, "/v1/bans", Some(&ban), None).await;
        assert_eq!(status, 400, "{duration}: {doc}");
        let detail = doc["detail"].as_str().unwrap().to_owned();
        assert!(detail.contains("longest accepted, 36500d"), "{detail}");
        details.push(detail);
    }
    // Whole seconds too: 9223372036854775 s is 9223372036854775000 ms, far beyond 100 years.
    for seconds in [9_223_372_036_854_775u64, 36_501 * 86_400, u64::MAX] {
        let ban = json!({"identity": "user:1", "duration": seconds});
        let (status, doc) = call(&base, Method::POST, "/v1/bans", Some(&ban), None).await;
        assert_eq!(status, 400, "{seconds} s: {doc}");
        let detail = doc["detail"].as_str().unwrap();
        assert!(detail.contains("\"duration\""), "{detail}");
        assert!(detail.contains("longest accepted, 36500d"), "{detail}");
    }
    let ban = json!({"identity": "user:1", "duration": 36_500u64 * 86_400});
    let (status, doc) = call(&base, Method::POST, "/v1/bans", Some(&ban), None).await;
    assert_eq!(status, 200, "{doc}");
    let ban = json!({"identity": "user:1", "duration": "36500d"});
    let (status, doc) = call(&base, Method::POST, "/v1/bans", Some(&ban), None).await;
    assert_eq!(status, 200, "{doc}");
    let allow = json!({"entry": "user:2", "ttl": "9223372036854775807ms"});
    let (status, _) = call(&base, Method::POST, "/v1/lists/allow", Some(&allow), None).await;
    assert_eq!(status, 400);
    s.stop().await;

    // The configuration reads durations with the same ceiling.
    for text in [
        "[policies.api]\nalgorithm = \"fixed-window\"\nlimit = 3\nwindow = \"9223372036854775807ms\"\n",
        "[policies.api]\nalgorithm = \"fixed-window\"\nlimit = 3\nwindow = \"1h\"\nban = { after = 1, within = \"1m\", duration = \"9223372036854775807ms\" }\n",
        "[server]\nshutdown_grace = \"1000000000000d\"\n",
    ] {
        let e = Config::parse(text, "sluice.toml", None)
            .unwrap_err()
            .to_string();
        assert!(e.contains("longest accepted, 36500d"), "{text}: {e}");
    }
}
