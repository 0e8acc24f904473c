//! No cross-site writes: what a web page of another site can make a browser send, refused
//! before any handler reads it.
//!
//! A page can make a browser send a `POST` to any address (a form, `fetch` with
//! `mode: "no-cors"`), with a body whose content type is `text/plain`, a form encoding or
//! none at all, and without a preflight. It can also point a name it controls at `127.0.0.1`
//! (DNS rebinding), which makes its requests same-origin. Three rules take each of these
//! away, on every endpoint except the open ones ([`Class::Open`]):
//!
//! - a request that carries a body must say `Content-Type: application/json` (else `415`):
//!   a browser sends that type to another origin only after a CORS preflight, which sluice
//!   never grants;
//! - a write (any method but `GET`, `HEAD`, `OPTIONS`) whose `Origin` is not the address it
//!   was sent to (nor one of `server.allowed_hosts`) is refused (`403`): browsers send
//!   `Origin` on every cross-origin write, forms and `no-cors` included;
//! - where no token guards a control endpoint or `/metrics`, the request's `Host` must be a
//!   loopback name or address, an address of one of sluice's listeners, or one of
//!   `server.allowed_hosts` (else `421`): a rebound name arrives with the attacker's name
//!   in `Host`.
//!
//! Clients other than browsers send a JSON content type with a JSON body, no `Origin`, and
//! the address they dialled as `Host`, so these rules cost them nothing.

use std::net::{IpAddr, SocketAddr};

use axum::extract::Request;
use axum::response::Response;
use http::header::{CONTENT_LENGTH, CONTENT_TYPE, HOST, ORIGIN, TRANSFER_ENCODING};
use http::{Method, StatusCode, Version};
use http_body::Body as _;

use super::auth::Class;
use super::problem;
use crate::Config;

/// The refusal of `req`, or `None` when it may go on to the token check. `unguarded`: no
/// token is configured for `class`.
pub(super) fn refusal(
    config: &Config,
    class: Class,
    unguarded: bool,
    req: &Request,
) -> Option<Response> {
    if class == Class::Open {
        return None;
    }
    let host = request_host(req);
    let write = !matches!(*req.method(), Method::GET | Method::HEAD | Method::OPTIONS);
    if write && let Some(origin) = req.headers().get(ORIGIN) {
        let origin = origin.to_str().unwrap_or("null");
        if !same_site(origin, host.as_deref(), &config.server.allowed_hosts) {
            return Some(problem(
                StatusCode::FORBIDDEN,
                &format!(
                    "a request from the web page at {origin} may not change anything here \
                     (only requests without an Origin, or from this address or \
                     server.allowed_hosts, may)"
                ),
            ));
        }
    }
    if unguarded
        && matches!(class, Class::Control | Class::Metrics)
        && let Some(host) = &host
        && !host_allowed(host, config)
    {
        return Some(problem(
            StatusCode::MISDIRECTED_REQUEST,
            &format!(
                "Host {host:?} is not a loopback address, an address of this server or one of \
                 server.allowed_hosts; without a token this endpoint answers only to those \
                 (set admin_token, or add the name to server.allowed_hosts)"
            ),
        ));
    }
    if carries_body(req) {
        let ct = req
            .headers()
            .get(CONTENT_TYPE)
            .map(|v| v.to_str().unwrap_or("?"));
        if !ct.is_some_and(is_json) {
            let given = ct.map_or_else(|| "none".to_owned(), |c| format!("{c:?}"));
            return Some(problem(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                &format!(
                    "the body must be sent with Content-Type: application/json (given: {given})"
                ),
            ));
        }
    }
    None
}

/// The authority the request was sent to: `Host`, else the HTTP/2 `:authority`.
fn request_host(req: &Request) -> Option<String> {
    req.headers()
        .get(HOST)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned)
        .or_else(|| req.uri().authority().map(|a| a.as_str().to_owned()))
}

/// True unless the request says its body is empty: `Content-Length: 0`, or (HTTP/1) neither
/// a length nor a chunked encoding, or (HTTP/2) a stream already ended.
fn carries_body(req: &Request) -> bool {
    let h = req.headers();
    if let Some(len) = h.get(CONTENT_LENGTH) {
        return len.to_str().ok().and_then(|l| l.trim().parse::<u64>().ok()) != Some(0);
    }
    if h.contains_key(TRANSFER_ENCODING) {
        return true;
    }
    if req.version() <= Version::HTTP_11 {
        return false;
    }
    let body = req.body();
    !(body.is_end_stream() || body.size_hint().exact() == Some(0))
}

/// `application/json`, with parameters (`; charset=utf-8`) or not.
fn is_json(content_type: &str) -> bool {
    content_type
        .split(';')
        .next()
        .is_some_and(|m| m.trim().eq_ignore_ascii_case("application/json"))
}

/// Splits `host[:port]` (`[v6]:port` too) into the host, lowercased and without brackets.
fn host_name(authority: &str) -> String {
    let a = authority.trim();
    let name = if let Some(rest) = a.strip_prefix('[') {
        rest.split(']').next().unwrap_or(rest)
    } else {
        match a.rsplit_once(':') {
            Some((h, port)) if !h.contains(':') && port.bytes().all(|b| b.is_ascii_digit()) => h,
            _ => a,
        }
    };
    name.trim_end_matches('.').to_ascii_lowercase()
}

/// True when `origin` (`scheme://host[:port]`) names the address the request was sent to,
/// or a host of `allowed`.
fn same_site(origin: &str, host: Option<&str>, allowed: &[String]) -> bool {
    let Some((_, authority)) = origin.split_once("://") else {
        return false; // "null" (a sandboxed frame, a file) or garbage
    };
    if host.is_some_and(|h| h.eq_ignore_ascii_case(authority)) {
        return true;
    }
    listed(authority, allowed)
}

/// True when `authority` is one of `allowed` (a name alone matches any port).
fn listed(authority: &str, allowed: &[String]) -> bool {
    let name = host_name(authority);
    let full = authority.to_ascii_lowercase();
    allowed.iter().any(|a| *a == name || *a == full)
}

/// True when `host` (a `Host` header) cannot be a name rebound by another site.
fn host_allowed(host: &str, config: &Config) -> bool {
    let name = host_name(host);
    if name == "localhost" || name.ends_with(".localhost") {
        return true;
    }
    if listed(host, &config.server.allowed_hosts) {
        return true;
    }
    let Ok(ip) = name.parse::<IpAddr>() else {
        return false;
    };
    let s = &config.server;
    let listeners: Vec<SocketAddr> = [Some(s.http), s.admin, Some(s.proxy), Some(s.grpc)]
        .into_iter()
        .flatten()
        .collect();
    ip.is_loopback()
        || listeners
            .iter()
            .any(|l| l.ip() == ip || l.ip().is_unspecified())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_names_without_ports_and_brackets() {
        assert_eq!(host_name("127.0.0.1:8080"), "127.0.0.1");
        assert_eq!(host_name("[::1]:8080"), "::1");
        assert_eq!(host_name("LocalHost"), "localhost");
        assert_eq!(host_name("evil.example.:80"), "evil.example");
        assert_eq!(host_name("::1"), "::1");
    }

    #[test]
    fn only_loopback_listeners_and_listed_hosts_are_allowed() {
        let c = Config::parse(
            "[server]\nhttp = \"10.0.0.5:8080\"\nadmin = \"127.0.0.1:9090\"\nallowed_hosts = [\"sluice.internal\"]\n",
            "sluice.toml",
            None,
        )
        .unwrap();
        for ok in [
            "127.0.0.1:9090",
            "localhost:9090",
            "app.localhost",
            "[::1]:9090",
            "10.0.0.5:8080",
            "sluice.internal:9090",
            "SLUICE.internal",
        ] {
            assert!(host_allowed(ok, &c), "{ok}");
        }
        for bad in [
            "evil.example",
            "evil.example:9090",
            "10.0.0.6",
            "localhost.evil.example",
        ] {
            assert!(!host_allowed(bad, &c), "{bad}");
        }
    }

    #[test]
    fn an_origin_is_same_site_only_for_the_address_dialled() {
        let none: &[String] = &[];
        assert!(same_site(
            "http://127.0.0.1:8080",
            Some("127.0.0.1:8080"),
            none
        ));
        assert!(!same_site(
            "http://127.0.0.1:8081",
            Some("127.0.0.1:8080"),
            none
        ));
        assert!(!same_site(
            "http://evil.example",
            Some("127.0.0.1:8080"),
            none
        ));
        assert!(!same_site("null", Some("127.0.0.1:8080"), none));
        let listed = ["console.internal".to_owned()];
        assert!(same_site(
            "https://console.internal",
            Some("127.0.0.1:8080"),
            &listed
        ));
    }

    #[test]
    fn json_content_types() {
        assert!(is_json("application/json"));
        assert!(is_json("Application/JSON; charset=utf-8"));
        assert!(!is_json("text/plain"));
        assert!(!is_json("application/x-www-form-urlencoded"));
        assert!(!is_json("application/jsonp"));
    }
}
