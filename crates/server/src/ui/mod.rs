//! `GET /ui`: the operator console, a single page whose assets are compiled into the binary
//! (no CDN, no external font), so it works on a closed network.
//!
//! The page itself carries no data and is served without a token; every call it makes
//! (`/v1/stats`, the control plane, `/v1/state`) takes the admin token, which the page keeps
//! in `sessionStorage` only. `/ui#token=...` logs in directly: a URL fragment never reaches
//! the server or its logs, and the page removes it from the address bar at once.

use axum::Router;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use http::header::{CACHE_CONTROL, CONTENT_TYPE, HeaderName};

use crate::state::Shared;

const INDEX_HTML: &str = include_str!("index.html");
const CONSOLE_JS: &str = include_str!("console.js");
const CONSOLE_CSS: &str = include_str!("console.css");

/// Scripts and styles from this origin only, no frames, no referrer.
const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; \
                   connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

fn asset(content_type: &'static str, body: &'static str) -> Response {
    (
        [
            (CONTENT_TYPE, content_type),
            (CACHE_CONTROL, "no-store"),
            (HeaderName::from_static("content-security-policy"), CSP),
            (HeaderName::from_static("x-content-type-options"), "nosniff"),
            (HeaderName::from_static("referrer-policy"), "no-referrer"),
        ],
        body,
    )
        .into_response()
}

/// The console's routes: the page and its two assets.
pub(crate) fn routes() -> Router<Shared> {
    Router::new()
        .route(
            "/ui",
            get(|| async { asset("text/html; charset=utf-8", INDEX_HTML) }),
        )
        .route(
            "/ui/console.js",
            get(|| async { asset("text/javascript; charset=utf-8", CONSOLE_JS) }),
        )
        .route(
            "/ui/console.css",
            get(|| async { asset("text/css; charset=utf-8", CONSOLE_CSS) }),
        )
}
