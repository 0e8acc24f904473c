//! The auth boundary and cross-site writes (issue 20, items 7 and 8), against the release
//! binary: what a client of the public listener, or a web page in a browser on the operator's
//! machine, can change.
//!
//! - `public-control`: `sluice serve --http 0.0.0.0:P --admin 127.0.0.1:Q` without a token
//!   (the set-up the start-up error suggests), then every control write of the original
//!   finding on the public listener: allow `0.0.0.0/0`, a 3,650-day ban, deny `::/0`, an
//!   override to a limit of 1e9, `DELETE /v1/state`, charge, refund; and whether
//!   `--http 0.0.0.0:P` alone (no token, no admin listener) starts at all.
//! - `cross-site`: the default configuration (loopback, no token) and the requests a page of
//!   another origin can make a browser send: a body without a content type (a `no-cors`
//!   `Blob`), `text/plain`, a form encoding, each with the page's `Origin`, and a
//!   DNS-rebound `Host`; then whether the allow list is still empty and checks still deny.
//!   The real browser runs in `crates/server/tests/suite/cross_site.rs`.

use std::net::SocketAddr;
use std::time::Duration;

use crate::harness::{self, Launch, Sluice};
use crate::{Args, Outcome};

const TIMEOUT: Duration = Duration::from_secs(3);

const POLICY: &str = "\n[store]\nurl = \"memory\"\n\n[policies.burst]\nalgorithm = \"token-bucket\"\ncapacity = 3\nrate = \"1/h\"\n";

/// The control writes of the finding: (name, method, path, JSON body).
const WRITES: [(&str, &str, &str, &str); 7] = [
    (
        "allow_all",
        "POST",
        "/v1/lists/allow",
        r#"{"entry":"0.0.0.0/0"}"#,
    ),
    (
        "ban_10y",
        "POST",
        "/v1/bans",
        r#"{"identity":"user:victim","duration":"3650d"}"#,
    ),
    (
        "deny_all_v6",
        "POST",
        "/v1/lists/deny",
        r#"{"entry":"::/0"}"#,
    ),
    (
        "override_1e9",
        "POST",
        "/v1/overrides",
        r#"{"policy":"burst","identity":"user:1","params":{"capacity":1000000000}}"#,
    ),
    (
        "reset_state",
        "DELETE",
        "/v1/state",
        r#"{"policy":"burst","identity":"user:1"}"#,
    ),
    (
        "charge",
        "POST",
        "/v1/charge",
        r#"{"policy":"burst","identity":"user:victim","cost":3}"#,
    ),
    (
        "refund",
        "POST",
        "/v1/refund",
        r#"{"policy":"burst","identity":"user:1","cost":3}"#,
    ),
];

/// A request with arbitrary head lines (`Host` included) and an optional body.
fn raw(method: &str, path: &str, head: &[(&str, &str)], body: Option<&str>) -> Vec<u8> {
    let mut r = format!("{method} {path} HTTP/1.1\r\n");
    for (k, v) in head {
        r.push_str(&format!("{k}: {v}\r\n"));
    }
    let body = body.unwrap_or("");
    r.push_str(&format!("content-length: {}\r\n\r\n{body}", body.len()));
    r.into_bytes()
}

async fn status(addr: SocketAddr, req: Vec<u8>) -> String {
    match harness::send(addr, req, TIMEOUT).await {
        Ok(r) => r.status.to_string(),
        Err(e) => format!("no answer ({})", e.kind()),
    }
}

/// Uses up `burst` for `who` and says what one more check gets.
async fn enforced(addr: SocketAddr, who: &str) -> String {
    let body = format!(r#"{{"policy":"burst","identity":"{who}"}}"#);
    for _ in 0..3 {
        let _ = harness::check(addr, &body, TIMEOUT).await;
    }
    let mut denied = 0;
    for _ in 0..10 {
        if let Ok(r) = harness::check(addr, &body, TIMEOUT).await
            && r.json()["allowed"] == false
        {
            denied += 1;
        }
    }
    format!("{denied}/10 denied")
}

/// Entries in force, as `GET /v1/stats` lists them (on `addr`, with a loopback `Host`).
async fn control_entries(addr: SocketAddr) -> String {
    match harness::get(addr, "/v1/stats", TIMEOUT).await {
        Ok(r) if r.status == 200 => {
            let c = &r.json()["control"];
            let n = |k: &str| c[k].as_array().map_or(0, Vec::len);
            format!(
                "{} overrides, {} bans, {} list entries",
                n("overrides"),
                n("bans"),
                n("lists")
            )
        }
        Ok(r) => format!("stats answered {}", r.status),
        Err(e) => format!("no answer ({})", e.kind()),
    }
}

/// The public listener without a token.
pub(crate) async fn public_control(a: &Args) -> Outcome {
    let mut out = Outcome::new(
        "public-control",
        "--http 0.0.0.0 --admin 127.0.0.1, no token",
    );
    let (public, admin) = (harness::free_port(), harness::free_port());
    let (server, _, grpc) = harness::server_section();
    let http: SocketAddr = ([127, 0, 0, 1], public).into();
    let launch = Launch {
        nofile: None,
        args: vec![
            "--http".into(),
            format!("0.0.0.0:{public}"),
            "--admin".into(),
            format!("127.0.0.1:{admin}"),
        ],
    };
    match Sluice::start(&a.bin, &format!("{server}{POLICY}"), http, grpc, &launch).await {
        Ok(s) => {
            let mut statuses = Vec::new();
            for (name, method, path, body) in WRITES {
                let head = [
                    ("host", "203.0.113.10"),
                    ("content-type", "application/json"),
                ];
                let st = status(s.http, raw(method, path, &head, Some(body))).await;
                statuses.push(format!("{name} {st}"));
            }
            out.set("public_listener_writes", statuses.join(", "));
            out.set("victim_after", enforced(s.http, "user:victim").await);
            let admin_addr: SocketAddr = ([127, 0, 0, 1], admin).into();
            out.set("entries_after", control_entries(admin_addr).await);
        }
        Err(e) => {
            out.set("starts", format!("refused: {}", tail(&e)));
        }
    }
    let (server, _, grpc) = harness::server_section();
    let alone = harness::free_port();
    let launch = Launch {
        nofile: None,
        args: vec!["--http".into(), format!("0.0.0.0:{alone}")],
    };
    let http: SocketAddr = ([127, 0, 0, 1], alone).into();
    match Sluice::start(&a.bin, &format!("{server}{POLICY}"), http, grpc, &launch).await {
        Ok(s) => {
            let (_, method, path, body) = WRITES[0];
            let head = [
                ("host", "203.0.113.10"),
                ("content-type", "application/json"),
            ];
            let st = status(s.http, raw(method, path, &head, Some(body))).await;
            out.set(
                "http_0_0_0_0_alone",
                format!("starts; allow 0.0.0.0/0 {st}"),
            );
        }
        Err(e) => {
            out.set("http_0_0_0_0_alone", format!("refused: {}", tail(&e)));
        }
    }
    out
}

/// What a page of another origin can make a browser send to the default configuration.
pub(crate) async fn cross_site(a: &Args) -> Outcome {
    let mut out = Outcome::new("cross-site", "default config (loopback, no token)");
    let (server, http, grpc) = harness::server_section();
    let s = match Sluice::start(
        &a.bin,
        &format!("{server}{POLICY}"),
        http,
        grpc,
        &Launch::default(),
    )
    .await
    {
        Ok(s) => s,
        Err(e) => {
            out.set("starts", format!("no: {}", tail(&e)));
            return out;
        }
    };
    let origin = "http://attacker.example:8000";
    let allow = r#"{"entry":"0.0.0.0/0"}"#;
    let ban = r#"{"identity":"user:victim","duration":"3650d"}"#;
    let loopback = "127.0.0.1";
    let cases: [(&str, &str, Vec<(&str, &str)>, &str); 6] = [
        // fetch(url, {mode: "no-cors", method: "POST", body: new Blob([json])})
        (
            "no_cors_blob",
            "/v1/lists/allow",
            vec![("host", loopback), ("origin", origin)],
            allow,
        ),
        (
            "text_plain",
            "/v1/lists/allow",
            vec![
                ("host", loopback),
                ("origin", origin),
                ("content-type", "text/plain;charset=UTF-8"),
            ],
            allow,
        ),
        (
            "form",
            "/v1/bans",
            vec![
                ("host", loopback),
                ("origin", origin),
                ("content-type", "application/x-www-form-urlencoded"),
            ],
            ban,
        ),
        // The same body without the page's Origin: the content type alone refuses it.
        (
            "blob_without_origin",
            "/v1/lists/allow",
            vec![("host", loopback)],
            allow,
        ),
        // A name of the attacker's, rebound to 127.0.0.1: the page is now same-origin.
        (
            "rebound_host",
            "/v1/lists/allow",
            vec![
                ("host", "attacker.example:8000"),
                ("origin", origin),
                ("content-type", "application/json"),
            ],
            allow,
        ),
        (
            "rebound_host_no_origin",
            "/v1/bans",
            vec![
                ("host", "attacker.example:8000"),
                ("content-type", "application/json"),
            ],
            ban,
        ),
    ];
    let mut statuses = Vec::new();
    for (name, path, head, body) in cases {
        let st = status(s.http, raw("POST", path, &head, Some(body))).await;
        statuses.push(format!("{name} {st}"));
    }
    out.set("writes", statuses.join(", "));
    let rebound_stats = status(
        s.http,
        raw(
            "GET",
            "/v1/stats",
            &[("host", "attacker.example:8000")],
            None,
        ),
    )
    .await;
    out.set("rebound_stats_read", rebound_stats);
    out.set("entries_after", control_entries(s.http).await);
    out.set("victim_after", enforced(s.http, "user:victim").await);
    out.set("other_after", enforced(s.http, "ip:198.51.100.4").await);
    // One duration ceiling: a ban longer than 36,500 days, in milliseconds and in days.
    let mut ceiling = Vec::new();
    for d in ["9223372036854775807ms", "1000000000000d"] {
        let body = format!(r#"{{"identity":"user:long","duration":"{d}"}}"#);
        let req = raw(
            "POST",
            "/v1/bans",
            &[("host", loopback), ("content-type", "application/json")],
            Some(&body),
        );
        ceiling.push(format!("{d} {}", status(s.http, req).await));
    }
    out.set("ban_duration_ceiling", ceiling.join(", "));
    out
}

fn tail(e: &str) -> String {
    e.rsplit("error: ")
        .next()
        .unwrap_or(e)
        .chars()
        .take(120)
        .collect()
}
