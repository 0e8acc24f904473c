//! The operator endpoints: `/healthz`, `/readyz`, `/metrics` and `/admin/reload`.
//!
//! `/metrics` and `/admin/reload` need `Authorization: Bearer <admin_token>` when the
//! configuration sets one; the token is compared in constant time.

use axum::extract::{Request, State};
use axum::response::{IntoResponse, Response};
use http::header::{AUTHORIZATION, CONTENT_TYPE};
use http::{HeaderValue, StatusCode};
use serde_json::json;

use super::{json_response, problem};
use crate::state::{Runtime, Shared, probe_store};

pub(super) async fn healthz() -> Response {
    json_response(StatusCode::OK, &json!({ "status": "ok" }))
}

pub(super) async fn readyz(State(shared): State<Shared>) -> Response {
    let rt = shared.runtime();
    let store = rt.limiter.store().kind();
    match probe_store(
        &rt.limiter,
        rt.config
            .store
            .timeout
            .max(std::time::Duration::from_millis(250)),
    )
    .await
    {
        Ok(()) => json_response(
            StatusCode::OK,
            &json!({ "ready": true, "store": store, "generation": rt.generation }),
        ),
        Err(e) => json_response(
            StatusCode::SERVICE_UNAVAILABLE,
            &json!({ "ready": false, "store": store, "generation": rt.generation, "error": e.to_string() }),
        ),
    }
}

/// Checks `Authorization: Bearer <admin_token>` when a token is configured.
fn authorized(rt: &Runtime, req: &Request) -> bool {
    let Some(token) = &rt.config.admin_token else {
        return true;
    };
    let given = req
        .headers()
        .get(AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    given.is_some_and(|g| constant_time_eq(g.trim().as_bytes(), token.as_bytes()))
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

fn unauthorized() -> Response {
    let mut res = problem(
        StatusCode::UNAUTHORIZED,
        "this endpoint needs Authorization: Bearer <admin_token>",
    );
    res.headers_mut().insert(
        http::header::WWW_AUTHENTICATE,
        HeaderValue::from_static("Bearer"),
    );
    res
}

pub(super) async fn metrics_text(State(shared): State<Shared>, req: Request) -> Response {
    if !authorized(&shared.runtime(), &req) {
        return unauthorized();
    }
    match shared.render_metrics() {
        Some(text) => ([(CONTENT_TYPE, "text/plain; version=0.0.4")], text).into_response(),
        None => problem(
            StatusCode::NOT_FOUND,
            "another metrics recorder is installed in this process",
        ),
    }
}

pub(super) async fn admin_reload(State(shared): State<Shared>, req: Request) -> Response {
    if !authorized(&shared.runtime(), &req) {
        return unauthorized();
    }
    match crate::reload::reload(&shared, "admin").await {
        Ok(generation) => json_response(
            StatusCode::OK,
            &json!({ "reloaded": true, "generation": generation }),
        ),
        Err(errors) => json_response(
            StatusCode::UNPROCESSABLE_ENTITY,
            &json!({ "reloaded": false, "generation": shared.runtime().generation, "errors": errors }),
        ),
    }
}
