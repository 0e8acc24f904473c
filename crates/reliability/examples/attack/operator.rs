//! Findings 4, 6 and 8: what an operator's mistake or an exposed listener lets through. A
//! truncated file on reload, a raw secret sent as an identity, and a server reachable from the
//! network without tokens.

use std::time::Duration;

use sluice_testkit::servers::RedisServer;

use crate::harness::{self, Launch, Sluice};
use crate::{Args, Outcome};

const TIMEOUT: Duration = Duration::from_secs(3);

const POLICIES: &str = r#"
[policies.burst]
algorithm = "token-bucket"
capacity = 3
rate = "1/h"

[policies.minute]
algorithm = "sliding-log"
limit = 100
window = "1m"

[policies.exports]
algorithm = "concurrency"
limit = 2
lease = "10m"
"#;

async fn status(s: &Sluice, req: Vec<u8>) -> String {
    match harness::send(s.http, req, TIMEOUT).await {
        Ok(r) => r.status.to_string(),
        Err(e) => format!("no answer ({})", e.kind()),
    }
}

/// Exhausts `burst` for `user:1` and says what a further check gets: `denied`, `admitted` or
/// the status of a non-decision.
async fn enforcement(s: &Sluice) -> String {
    let body = r#"{"policy":"burst","identity":"user:1"}"#;
    for _ in 0..3 {
        let _ = harness::check(s.http, body, TIMEOUT).await;
    }
    match harness::check(s.http, body, TIMEOUT).await {
        Ok(r) if r.status == 200 => match r.json()["allowed"].as_bool() {
            Some(false) => "denied".into(),
            _ => "admitted".into(),
        },
        Ok(r) => format!("{} {}", r.status, r.json()["detail"].as_str().unwrap_or("")),
        Err(e) => format!("no answer ({})", e.kind()),
    }
}

/// How many of the three configured policies a check still finds.
async fn policies_answering(s: &Sluice) -> u64 {
    let mut n = 0;
    for p in ["burst", "minute", "exports"] {
        let body = format!(r#"{{"policy":"{p}","identity":"probe","cost":0}}"#);
        if harness::check(s.http, &body, TIMEOUT)
            .await
            .is_ok_and(|r| r.status == 200)
        {
            n += 1;
        }
    }
    n
}

/// Hot reload of an empty file, of a file cut before its policies and of one cut mid-line.
pub(crate) async fn reload(a: &Args) -> Outcome {
    let mut out = Outcome::new("reload", "empty, cut before policies, cut mid-line");
    let (server, http, grpc) = harness::server_section();
    let head = format!("{server}reload_poll = \"0s\"\n\n[store]\nurl = \"memory\"\n");
    let full = format!("{head}{POLICIES}");
    let s = match Sluice::start(&a.bin, &full, http, grpc, &Launch::default()).await {
        Ok(s) => s,
        Err(e) => {
            out.set("error", e);
            return out;
        }
    };
    let reload = || harness::request("POST", "/admin/reload", None, &[]);
    let variants = [
        ("empty", String::new()),
        ("cut_before_policies", head.clone()),
        ("cut_mid_line", full[..full.len() / 2].to_string()),
    ];
    for (name, text) in variants {
        std::fs::write(s.config_file(), &text).expect("write config");
        let answer = status(&s, reload()).await;
        let policies = policies_answering(&s).await;
        let ready = status(&s, harness::request("GET", "/readyz", None, &[])).await;
        let enforced = enforcement(&s).await;
        out.set(
            name,
            format!("reload {answer}, policies {policies}/3, readyz {ready}, exhausted check: {enforced}"),
        );
        std::fs::write(s.config_file(), &full).expect("restore config");
        let _ = harness::send(s.http, reload(), TIMEOUT).await;
    }
    out
}

/// Redis keys that contain `needle` (SCAN).
fn keys_containing(redis: &RedisServer, needle: &str) -> Vec<String> {
    redis
        .cli(&["--scan"])
        .lines()
        .filter(|k| k.contains(needle))
        .map(str::to_string)
        .collect()
}

/// `/v1/check` with `"credential": "sk_live_abc"`, and with the documented middleware's
/// `key:<raw key>` identity: does any Redis key contain the secret?
pub(crate) async fn credentials(a: &Args) -> Outcome {
    let mut out = Outcome::new("credentials", "one secret, Redis store");
    let redis = tokio::task::spawn_blocking(RedisServer::redis)
        .await
        .expect("start redis");
    let (server, http, grpc) = harness::server_section();
    let toml = format!("{server}\n[store]\nurl = \"{}\"\n{POLICIES}", redis.url());
    let s = match Sluice::start(&a.bin, &toml, http, grpc, &Launch::default()).await {
        Ok(s) => s,
        Err(e) => {
            out.set("error", e);
            return out;
        }
    };
    let secret = "sk_live_abc";
    let body = format!(r#"{{"policy":"burst","credential":"{secret}"}}"#);
    let answer = match harness::check(s.http, &body, TIMEOUT).await {
        Ok(r) if r.status == 200 => "200".to_string(),
        Ok(r) => format!("{} (not supported)", r.status),
        Err(e) => format!("no answer ({})", e.kind()),
    };
    out.set("credential_field", answer);
    out.set(
        "raw_secret_keys_after_credential",
        keys_containing(&redis, secret).len() as u64,
    );
    let body = format!(r#"{{"policy":"burst","identity":"key:{secret}"}}"#);
    let _ = harness::check(s.http, &body, TIMEOUT).await;
    let keys = keys_containing(&redis, secret);
    out.set(
        "documented_middleware_key",
        keys.first()
            .cloned()
            .unwrap_or_else(|| "no raw secret in any key".into()),
    );
    out
}

/// `sluice serve --http 0.0.0.0:PORT` with no admin token; and `api_token` for `/v1/*`.
/// Only loopback is ever connected to.
pub(crate) async fn exposure(a: &Args) -> Outcome {
    let mut out = Outcome::new("exposure", "--http 0.0.0.0, no admin_token; api_token");
    let port = harness::free_port();
    let (server, _, grpc) = harness::server_section();
    let loopback = ([127, 0, 0, 1], port).into();
    let launch = Launch {
        nofile: None,
        args: vec!["--http".into(), format!("0.0.0.0:{port}")],
    };
    let toml = format!("{server}\n[store]\nurl = \"memory\"\n{POLICIES}");
    match Sluice::start(&a.bin, &toml, loopback, grpc, &launch).await {
        Ok(s) => {
            out.set("starts_on_0_0_0_0", "yes");
            let reload = status(&s, harness::request("POST", "/admin/reload", None, &[])).await;
            let metrics = status(&s, harness::request("GET", "/metrics", None, &[])).await;
            out.set("admin_reload_without_token", reload);
            out.set("metrics_without_token", metrics);
        }
        Err(e) => {
            out.set("starts_on_0_0_0_0", format!("refused: {e}"));
        }
    }
    // Where the field lives is not settled in the old code: try the top level, then [server].
    let token = "attack-api-token";
    let body = r#"{"policy":"burst","identity":"user:exposure"}"#;
    let mut last_error = String::new();
    for placement in ["top", "server"] {
        let (server, http, grpc) = harness::server_section();
        let toml = if placement == "top" {
            format!("api_token = \"{token}\"\n{server}\n[store]\nurl = \"memory\"\n{POLICIES}")
        } else {
            format!("{server}api_token = \"{token}\"\n\n[store]\nurl = \"memory\"\n{POLICIES}")
        };
        match Sluice::start(&a.bin, &toml, http, grpc, &Launch::default()).await {
            Ok(s) => {
                let without =
                    status(&s, harness::request("POST", "/v1/check", Some(body), &[])).await;
                let bearer = format!("Bearer {token}");
                let with = status(
                    &s,
                    harness::request(
                        "POST",
                        "/v1/check",
                        Some(body),
                        &[("authorization", &bearer)],
                    ),
                )
                .await;
                out.set("api_token_placement", placement);
                out.set("check_without_api_token", without);
                out.set("check_with_api_token", with);
                return out;
            }
            Err(e) => last_error = e,
        }
    }
    let reason: String = last_error
        .rsplit("error: ")
        .next()
        .unwrap_or(&last_error)
        .chars()
        .take(90)
        .collect();
    out.set(
        "api_token",
        format!("not supported, start refused: {reason}"),
    );
    out
}
