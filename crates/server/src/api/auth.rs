//! The auth boundary: one classification of every endpoint, and the bearer tokens each class
//! takes. Handlers never decide who may call them; [`guard`] does, in front of every route.
//!
//! - [`Class::Open`]: `/healthz`, `/readyz`, `/openapi.json`, the console's page and assets
//!   (they carry no data). No token.
//! - [`Class::Decision`]: `/v1/check`, `/v1/release` and the read of `POST /v1/state`: what an
//!   application calls. `server.api_token` when one is set; `admin_token` is accepted too,
//!   so the console (which holds the admin token) can read state.
//! - [`Class::Control`]: every endpoint that changes state outside of a check
//!   (`/v1/overrides`, `/v1/bans`, `/v1/lists/*`, `DELETE /v1/state`, `/v1/charge`,
//!   `/v1/refund`, `/admin/*`) and `/v1/stats` (which names identities). `admin_token`, else
//!   `server.api_token` when only that is set.
//! - [`Class::Metrics`]: `/metrics`. `admin_token` when set (a scraper holds no API token).
//!
//! Tokens travel as `Authorization: Bearer <token>`, compared in constant time so the
//! answer's timing says nothing about how much of a guess was right. A refusal is `401`
//! problem+json with `WWW-Authenticate: Bearer`. Tokens are read per request, so a reload
//! that sets or changes one applies at once. Where no token guards a class, the listener it
//! is served on must be loopback (checked at start and on reload, `config::server`), and
//! [`super::site`] refuses what a browser could send from another site.

use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::Response;
use http::header::{AUTHORIZATION, WWW_AUTHENTICATE};
use http::{HeaderMap, HeaderValue, Method, StatusCode};

use super::{count, problem};
use crate::Config;
use crate::state::Shared;

/// Who may call an endpoint: the configuration's own [`sluice_config::Access`], whose
/// [`Config::accepted_tokens`] is the one rule of which token admits it.
pub use sluice_config::Access as Class;

/// The class of `method path`. Paths the router does not serve are [`Class::Open`]: they
/// answer `404` whoever asks.
pub fn classify(method: &Method, path: &str) -> Class {
    match path {
        "/healthz" | "/readyz" | "/openapi.json" | "/ui" => Class::Open,
        p if p.starts_with("/ui/") => Class::Open,
        "/v1/check" | "/v1/release" | "/v1/reserve" | "/v1/settle" => Class::Decision,
        "/v1/state" if method != Method::DELETE => Class::Decision,
        "/metrics" => Class::Metrics,
        "/v1/state" | "/v1/charge" | "/v1/refund" | "/v1/overrides" | "/v1/bans" | "/v1/stats" => {
            Class::Control
        }
        p if p.starts_with("/v1/lists/") || p.starts_with("/admin/") => Class::Control,
        _ => Class::Open,
    }
}

/// The tokens that admit a request of `class` under `config` and the setting named in a
/// refusal; no tokens means the class is open (on a loopback listener, or by
/// `server.public_admin_without_token`).
pub fn accepted_tokens(config: &Config, class: Class) -> (Vec<&str>, &'static str) {
    config.accepted_tokens(class)
}

/// True when no token is required, or `headers` carry `Authorization: Bearer <token>`.
#[cfg(test)]
pub(super) fn bearer_allows(headers: &HeaderMap, token: Option<&str>) -> bool {
    match token {
        None => true,
        Some(t) => bearer_matches(headers, &[t]),
    }
}

/// True when `headers` carry `Authorization: Bearer <one of tokens>`.
fn bearer_matches(headers: &HeaderMap, tokens: &[&str]) -> bool {
    let given = headers
        .get(AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    given.is_some_and(|g| {
        // Every token is compared, so the time taken does not say which one was close.
        tokens.iter().fold(false, |ok, t| {
            ok | constant_time_eq(g.trim().as_bytes(), t.as_bytes())
        })
    })
}

/// Equality whose time depends on the lengths only, not on where the bytes differ.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// The refusal of a request without the right token; `token_name` names the setting.
pub(super) fn unauthorized(token_name: &str) -> Response {
    let mut res = problem(
        StatusCode::UNAUTHORIZED,
        &format!("this endpoint needs Authorization: Bearer <{token_name}>"),
    );
    res.headers_mut()
        .insert(WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
    res
}

/// The name an endpoint is counted under in `sluice_api_requests_total`.
fn endpoint_name(method: &Method, path: &str) -> &'static str {
    match path {
        "/v1/check" => "check",
        "/v1/release" => "release",
        "/v1/reserve" => "reserve",
        "/v1/settle" => "settle",
        "/v1/state" if method == Method::DELETE => "reset",
        "/v1/state" => "state",
        "/v1/charge" => "charge",
        "/v1/refund" => "refund",
        "/v1/overrides" => "overrides",
        "/v1/bans" => "bans",
        "/v1/stats" => "stats",
        "/metrics" => "metrics",
        p if p.starts_with("/v1/lists/") => "lists",
        p if p.starts_with("/admin/") => "admin",
        _ => "other",
    }
}

/// The route layer of every listener: the cross-site rules of [`super::site`], then the
/// token of the endpoint's class.
pub(super) async fn guard(State(shared): State<Shared>, req: Request, next: Next) -> Response {
    let rt = shared.runtime();
    let (method, path) = (req.method().clone(), req.uri().path().to_owned());
    let class = classify(&method, &path);
    let (tokens, name) = accepted_tokens(&rt.config, class);
    if let Some(refused) = super::site::refusal(&rt.config, class, tokens.is_empty(), &req) {
        count(endpoint_name(&method, &path), refused.status());
        return refused;
    }
    if tokens.is_empty() || bearer_matches(req.headers(), &tokens) {
        return next.run(req).await;
    }
    count(endpoint_name(&method, &path), StatusCode::UNAUTHORIZED);
    unauthorized(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with(v: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(AUTHORIZATION, HeaderValue::from_str(v).unwrap());
        h
    }

    #[test]
    fn only_the_exact_token_is_accepted() {
        assert!(bearer_allows(&HeaderMap::new(), None));
        assert!(!bearer_allows(&HeaderMap::new(), Some("t0k")));
        assert!(bearer_allows(&with("Bearer t0k"), Some("t0k")));
        assert!(!bearer_allows(&with("Bearer t0j"), Some("t0k")));
        assert!(!bearer_allows(&with("Bearer t0k0"), Some("t0k")));
        assert!(!bearer_allows(&with("Basic t0k"), Some("t0k")));
        assert!(bearer_matches(&with("Bearer b"), &["a", "b"]));
        assert!(!bearer_matches(&with("Bearer c"), &["a", "b"]));
        assert!(!bearer_matches(&with("Bearer "), &[]));
    }

    #[test]
    fn every_endpoint_that_changes_state_is_a_control_endpoint() {
        let post = Method::POST;
        let delete = Method::DELETE;
        for (m, p) in [
            (&post, "/v1/overrides"),
            (&delete, "/v1/overrides"),
            (&Method::GET, "/v1/overrides"),
            (&post, "/v1/bans"),
            (&delete, "/v1/bans"),
            (&post, "/v1/lists/allow"),
            (&delete, "/v1/lists/deny"),
            (&delete, "/v1/state"),
            (&post, "/v1/charge"),
            (&post, "/v1/refund"),
            (&post, "/admin/reload"),
            (&Method::GET, "/v1/stats"),
        ] {
            assert_eq!(classify(m, p), Class::Control, "{m} {p}");
        }
        assert_eq!(classify(&post, "/v1/check"), Class::Decision);
        assert_eq!(classify(&post, "/v1/release"), Class::Decision);
        assert_eq!(classify(&post, "/v1/state"), Class::Decision);
        assert_eq!(classify(&Method::GET, "/metrics"), Class::Metrics);
        for p in [
            "/healthz",
            "/readyz",
            "/openapi.json",
            "/ui",
            "/ui/console.js",
        ] {
            assert_eq!(classify(&Method::GET, p), Class::Open, "{p}");
        }
    }

    #[test]
    fn the_token_matrix() {
        let config = |extra: &str| Config::parse(extra, "sluice.toml", None).unwrap();
        let both = config("admin_token = \"adm\"\n[server]\napi_token = \"api\"\n");
        assert_eq!(
            accepted_tokens(&both, Class::Decision),
            (vec!["api", "adm"], "api_token")
        );
        assert_eq!(
            accepted_tokens(&both, Class::Control),
            (vec!["adm"], "admin_token")
        );
        assert_eq!(
            accepted_tokens(&both, Class::Metrics),
            (vec!["adm"], "admin_token")
        );
        let api = config("[server]\napi_token = \"api\"\n");
        assert_eq!(accepted_tokens(&api, Class::Control).0, vec!["api"]);
        assert!(accepted_tokens(&api, Class::Metrics).0.is_empty());
        let admin = config("admin_token = \"adm\"\n");
        assert!(accepted_tokens(&admin, Class::Decision).0.is_empty());
        assert_eq!(accepted_tokens(&admin, Class::Control).0, vec!["adm"]);
        let none = config("");
        for class in [Class::Open, Class::Decision, Class::Control, Class::Metrics] {
            assert!(accepted_tokens(&none, class).0.is_empty());
        }
    }
}
