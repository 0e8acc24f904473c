//! The reverse proxy's edges, against real upstream frameworks (FastAPI and Express from
//! `sluice_testkit::upstream`, which count what reached their handlers):
//!
//! - `proxy-paths`: spellings of `/login` that the frameworks route to their `/login` handler
//!   (`/%6cogin`, `//login`, `/./login`; `/LOGIN` on Express), and ambiguous encodings;
//! - `count-outcome`: a route counting successes whose clients abandon slow requests, and a
//!   route counting 401s hit by concurrent wrong passwords;
//! - `client-identities`: cookie, query and API-key identities rotated by the client, with and
//!   without a per-IP ceiling, and what `sluice validate` says about them.

use std::net::SocketAddr;
use std::time::Duration;

use sluice_testkit::upstream::Upstream;
use tokio::io::AsyncWriteExt;

use crate::harness::{self, Launch, Sluice};
use crate::{Args, Outcome};

const TIMEOUT: Duration = Duration::from_secs(5);

/// `[server]` on fresh loopback ports, with the proxy's address too.
fn server_section() -> (String, SocketAddr, SocketAddr, SocketAddr) {
    let port = |_| SocketAddr::from(([127, 0, 0, 1], harness::free_port()));
    let (http, grpc, proxy) = (port(0), port(1), port(2));
    (
        format!("[server]\nhttp = \"{http}\"\ngrpc = \"{grpc}\"\nproxy = \"{proxy}\"\n"),
        http,
        grpc,
        proxy,
    )
}

/// Starts `sluice serve` with `body` after a fresh `[server]` section; the server and its
/// proxy address.
async fn start(a: &Args, body: &str) -> Result<(Sluice, SocketAddr), String> {
    let (server, http, grpc, proxy) = server_section();
    let toml = format!("{server}\n[store]\nurl = \"memory\"\n\n{body}");
    let s = Sluice::start(&a.bin, &toml, http, grpc, &Launch::default()).await?;
    Ok((s, proxy))
}

/// The status of `POST target` sent as written (no client-side clean-up of the path); 0 when
/// there was no answer.
async fn post(proxy: SocketAddr, target: &str, headers: &[(&str, &str)]) -> u16 {
    let req = harness::request("POST", target, None, headers);
    harness::send(proxy, req, TIMEOUT)
        .await
        .map_or(0, |r| r.status)
}

fn count(statuses: &[u16], status: u16) -> usize {
    statuses.iter().filter(|&&s| s == status).count()
}

fn paths_config(upstream: &str, case_insensitive: bool) -> String {
    format!(
        r#"
[policies.login]
algorithm = "fixed-window"
limit = 3
window = "15m"
identity = "ip"

[policies.generous]
algorithm = "fixed-window"
limit = 100000
window = "15m"
identity = "ip"

[[routes]]
prefix = "/login"
policies = ["login"]
upstream = "{upstream}"
case_insensitive = {case_insensitive}

[[routes]]
prefix = "/"
policies = ["generous"]
upstream = "{upstream}"
"#
    )
}

/// `/login` limited to 3 per 15 min: how many of the spellings reach the handler.
pub(crate) async fn paths(a: &Args) -> Outcome {
    let per_spelling = if a.quick { 3 } else { 10 };
    let mut out = Outcome::new(
        "proxy-paths",
        format!("limit 3; {per_spelling} requests per spelling"),
    );
    let fastapi = Upstream::fastapi();
    let (s, proxy) = match start(a, &paths_config(&fastapi.url(), false)).await {
        Ok(s) => s,
        Err(e) => {
            out.set("error", e);
            return out;
        }
    };
    for target in ["/%6cogin", "//login", "/./login"] {
        for _ in 0..per_spelling {
            post(proxy, &format!("{target}?password=wrong"), &[]).await;
        }
    }
    let login_hits = fastapi.hits("login");
    out.set("fastapi_login_checks_of_encoded_spellings", login_hits);
    let before = login_hits + fastapi.hits("other");
    let ambiguous = [
        "/login%2F",
        "/x%2F..%2Flogin",
        "/login%5C",
        "/x\\..\\login",
        "/login%00",
        "/%6",
        "/%2e%2e/login",
    ];
    let mut refused = 0;
    for target in ambiguous {
        for _ in 0..per_spelling {
            refused += usize::from(post(proxy, target, &[]).await == 400);
        }
    }
    out.set(
        "ambiguous_refused_400",
        format!("{refused} of {}", ambiguous.len() * per_spelling),
    );
    out.set(
        "fastapi_requests_from_ambiguous",
        fastapi.hits("other") + fastapi.hits("login") - before,
    );
    drop(s);

    let express = Upstream::express();
    let (s, proxy) = match start(a, &paths_config(&express.url(), true)).await {
        Ok(s) => s,
        Err(e) => {
            out.set("error", e);
            return out;
        }
    };
    for target in ["/LOGIN", "/Login"] {
        for _ in 0..per_spelling {
            post(proxy, &format!("{target}?password=wrong"), &[]).await;
        }
    }
    out.set(
        "express_login_checks_of_cased_spellings",
        express.hits("login"),
    );
    drop(s);
    out
}

fn outcome_config(upstream: &str, limit: u32, count: &str) -> String {
    format!(
        r#"
[policies.outcome]
algorithm = "fixed-window"
limit = {limit}
window = "1h"
identity = "ip"

[[routes]]
prefix = "/"
policies = ["outcome"]
upstream = "{upstream}"
count = {count}
"#
    )
}

/// Sends `POST target` and closes the connection after `after`, before the answer.
async fn abandon(proxy: SocketAddr, target: &str, after: Duration) {
    let Ok(mut s) = tokio::net::TcpStream::connect(proxy).await else {
        return;
    };
    let head = format!("POST {target} HTTP/1.1\r\nhost: sluice\r\ncontent-length: 0\r\n\r\n");
    let _ = s.write_all(head.as_bytes()).await;
    tokio::time::sleep(after).await;
}

/// Upstream actions past a limit when clients abandon slow requests, and password checks
/// reached by concurrent wrong passwords.
pub(crate) async fn count_outcome(a: &Args) -> Outcome {
    let (abandoners, concurrent) = if a.quick { (20, 100) } else { (20, 250) };
    let mut out = Outcome::new(
        "count-outcome",
        format!(
            "successes limit 3, 300 ms upstream, {abandoners} clients leaving at 100 ms; \
             [401] limit 5, {concurrent} concurrent wrong passwords"
        ),
    );
    let fastapi = Upstream::fastapi();
    match start(a, &outcome_config(&fastapi.url(), 3, "\"successes\"")).await {
        Ok((s, proxy)) => {
            for _ in 0..abandoners {
                abandon(proxy, "/slow?ms=300", Duration::from_millis(100)).await;
            }
            out.set("upstream_actions_of_abandoned", fastapi.hits("slow"));
            out.set("next_request", post(proxy, "/slow?ms=0", &[]).await);
            drop(s);
        }
        Err(e) => {
            out.set("error", e);
            return out;
        }
    }
    let express = Upstream::express();
    match start(a, &outcome_config(&express.url(), 5, "[401]")).await {
        Ok((s, proxy)) => {
            let statuses = futures::future::join_all(
                (0..concurrent).map(|_| post(proxy, "/login?password=wrong", &[])),
            )
            .await;
            out.set("password_checks_reached", express.hits("login"));
            out.set("answered_401", count(&statuses, 401));
            out.set("answered_429", count(&statuses, 429));
            out.set("unanswered", count(&statuses, 0));
            drop(s);
        }
        Err(e) => {
            out.set("error", e);
        }
    }
    out
}

fn identity_config(upstream: &str, identity: &str, ceiling: bool) -> String {
    let (ip, list) = if ceiling {
        (
            "[policies.per-ip]\nalgorithm = \"fixed-window\"\nlimit = 3\nwindow = \"1h\"\nidentity = \"ip\"\n",
            "\"per-ip\", \"per-value\"",
        )
    } else {
        ("", "\"per-value\"")
    };
    format!(
        r#"
{ip}
[policies.per-value]
algorithm = "fixed-window"
limit = 3
window = "1h"
identity = "{identity}"

[[routes]]
prefix = "/"
policies = [{list}]
upstream = "{upstream}"
"#
    )
}

/// Identities the client rotates, limit 3: admitted without and with a per-IP ceiling, and
/// the warnings `sluice validate` prints.
pub(crate) async fn client_identities(a: &Args) -> Outcome {
    let mut out = Outcome::new(
        "client-identities",
        "30 requests, a new value each, limit 3",
    );
    let up = Upstream::fastapi();
    for (identity, name) in [
        ("cookie:session", "cookie"),
        ("query:user", "query"),
        ("api-key:x-api-key", "api_key"),
    ] {
        for ceiling in [false, true] {
            let toml = identity_config(&up.url(), identity, ceiling);
            let (s, proxy) = match start(a, &toml).await {
                Ok(s) => s,
                Err(e) => {
                    out.set("error", e);
                    return out;
                }
            };
            let mut admitted = 0;
            for i in 0..30 {
                let cookie = format!("session=v{i}");
                let (target, headers): (String, Vec<(&str, &str)>) = match name {
                    "cookie" => ("/x".into(), vec![("cookie", cookie.as_str())]),
                    "query" => (format!("/x?user=v{i}"), vec![]),
                    _ => ("/x".into(), vec![("x-api-key", &cookie[8..])]),
                };
                admitted += usize::from(post(proxy, &target, &headers).await == 200);
            }
            let key = if ceiling {
                format!("{name}_admitted_with_per_ip")
            } else {
                format!("{name}_admitted")
            };
            out.set(&key, admitted);
            if !ceiling {
                let validate = std::process::Command::new(&a.bin)
                    .arg("validate")
                    .arg("--config")
                    .arg(s.config_file())
                    .output();
                let warned = validate.is_ok_and(|o| {
                    String::from_utf8_lossy(&o.stderr).contains("warning: route")
                        && o.status.success()
                });
                out.set(&format!("{name}_validate_warns"), warned);
            }
            drop(s);
        }
    }
    out
}
