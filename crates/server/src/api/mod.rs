//! The HTTP listener: the decision API for applications in any language, and the operator
//! endpoints (`/metrics`, `/healthz`, `/readyz`, `/admin/reload`).
//!
//! `POST /v1/check` answers with the decision *and* the exact headers the caller should put on
//! its own response, so a ten-line middleware in FastAPI or Express gives the same answers as
//! the tower layer. Every malformed request gets a `400 application/problem+json` naming what is
//! wrong; bodies are read up to `server.max_body_bytes` and no further (`413` beyond). Every
//! other client error of the listener (`404`, `405`, `401`...) is problem+json too.
//!
//! # Layout
//! - this module: the router and what every endpoint shares (reading a JSON body, answering
//!   JSON and problem+json, counting requests);
//! - [`check`]: `/v1/check` and `/v1/release`, the decision API;
//! - [`reserve`]: `/v1/reserve` and `/v1/settle`, reservations settled with the real cost;
//! - [`state`]: `/v1/state` (read, reset), `/v1/charge` and `/v1/refund`;
//! - [`admin`]: `/healthz`, `/readyz`, `/metrics` and `/admin/reload`;
//! - [`control`]: `/v1/overrides`, `/v1/bans`, `/v1/lists/*`, runtime exceptions to the
//!   policies (admin token);
//! - [`auth`]: the auth boundary: every endpoint's class (open, decision, control, metrics)
//!   and the bearer token each class takes, enforced by one route layer on every listener;
//! - `site`: no cross-site writes (JSON bodies only, no foreign `Origin`, and a `Host` that
//!   cannot be a rebound name where no token guards an endpoint);
//! - [`stats`]: `/v1/stats`, the live statistics of the console and `sluice top` (admin
//!   token);
//! - [`openapi`]: the request and response shapes, served at `/openapi.json`.

mod admin;
pub mod auth;
mod check;
mod control;
mod openapi;
mod reserve;
mod site;
mod state;
mod stats;

use axum::Router;
use axum::body::Body;
use axum::extract::Request;
use axum::response::Response;
use axum::routing::{get, post};
use http::header::{CONTENT_LENGTH, CONTENT_TYPE};
use http::{HeaderValue, StatusCode};
use http_body_util::BodyExt;
use serde_json::{Map, Value};

pub use openapi::openapi;
pub use sluice_http::headers::display_header_name;

use crate::state::Shared;

/// The router of the HTTP listener when it is the only one: every endpoint.
pub fn router(shared: Shared) -> Router {
    finish(
        decision_routes(true)
            .merge(control_routes())
            .merge(operator_routes()),
        shared,
    )
}

/// The HTTP listener's router when `server.admin` is set: the decision API (`/v1/check`,
/// `/v1/release`, reading `/v1/state`), health and the OpenAPI document; every control
/// endpoint is on the admin listener only.
pub fn decision_router(shared: Shared) -> Router {
    finish(decision_routes(false), shared)
}

/// The admin listener's router: the control endpoints, `/v1/stats`, the console,
/// `/metrics`, `/admin/*`, health and state (read and reset), but not the decision API.
pub fn admin_router(shared: Shared) -> Router {
    finish(
        Router::new()
            .merge(control_routes())
            .merge(state::routes(true))
            .merge(operator_routes())
            .merge(open_routes()),
        shared,
    )
}

/// The auth boundary in front of every route of `routes` ([`auth::guard`]), then the
/// answers shared by every listener.
fn finish(routes: Router<Shared>, shared: Shared) -> Router {
    routes
        .route_layer(axum::middleware::from_fn_with_state(
            shared.clone(),
            auth::guard,
        ))
        .fallback(not_found)
        .layer(axum::middleware::from_fn(problem_for_bare_errors))
        .with_state(shared)
}

/// The decision API, with `/v1/state`'s reset, `/v1/charge` and `/v1/refund` when
/// `with_changes`.
fn decision_routes(with_changes: bool) -> Router<Shared> {
    Router::new()
        .route("/v1/check", post(check::check))
        .route("/v1/release", post(check::release))
        .route("/v1/reserve", post(reserve::reserve))
        .route("/v1/settle", post(reserve::settle))
        .merge(state::routes(with_changes))
        .merge(open_routes())
}

/// Health and the OpenAPI document: served on every listener, to anyone.
fn open_routes() -> Router<Shared> {
    Router::new()
        .route("/healthz", get(admin::healthz))
        .route("/readyz", get(admin::readyz))
        .route("/openapi.json", get(openapi::openapi_json))
}

/// The control plane's endpoints, the report that names identities and the console.
fn control_routes() -> Router<Shared> {
    Router::new()
        .route(
            "/v1/overrides",
            post(control::set_override)
                .get(control::get_override)
                .delete(control::remove_override),
        )
        .route("/v1/bans", post(control::ban).delete(control::unban))
        .route(
            "/v1/lists/allow",
            post(control::allow_add).delete(control::allow_remove),
        )
        .route(
            "/v1/lists/deny",
            post(control::deny_add).delete(control::deny_remove),
        )
        .route("/v1/stats", get(stats::stats))
        .merge(crate::ui::routes())
}

fn operator_routes() -> Router<Shared> {
    Router::new()
        .route("/metrics", get(admin::metrics_text))
        .route("/admin/reload", post(admin::admin_reload))
}

/// Gives a problem+json body to every client error that was answered without a body of its
/// own: axum's `405 Method Not Allowed` (its `Allow` header kept) and any other rejection
/// made below the handlers, so that every 4xx of this listener reads the same way.
async fn problem_for_bare_errors(req: Request, next: axum::middleware::Next) -> Response {
    let (method, path) = (req.method().clone(), req.uri().path().to_string());
    let res = next.run(req).await;
    if !res.status().is_client_error() || res.headers().contains_key(CONTENT_TYPE) {
        return res;
    }
    let status = res.status();
    let detail = match res
        .headers()
        .get(http::header::ALLOW)
        .and_then(|v| v.to_str().ok())
    {
        Some(allow) if status == StatusCode::METHOD_NOT_ALLOWED => {
            format!("{method} is not allowed on {path}; use {allow}")
        }
        _ => format!(
            "{} ({method} {path})",
            status.canonical_reason().unwrap_or("client error")
        ),
    };
    let (mut parts, _) = res.into_parts();
    let answer = problem(status, &detail);
    for (name, value) in answer.headers() {
        parts.headers.insert(name, value.clone());
    }
    parts.headers.remove(CONTENT_LENGTH);
    Response::from_parts(parts, answer.into_body())
}

/// A problem+json response ([`sluice_http::headers::problem`] as an axum response).
pub fn problem(status: StatusCode, detail: &str) -> Response {
    sluice_http::headers::problem(status, detail).map(Body::from)
}

pub(crate) fn json_response(status: StatusCode, v: &Value) -> Response {
    let mut res = Response::new(Body::from(v.to_string()));
    *res.status_mut() = status;
    res.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    res
}

async fn not_found(req: Request) -> Response {
    problem(
        StatusCode::NOT_FOUND,
        &format!("no endpoint {} {}", req.method(), req.uri().path()),
    )
}

/// Reads a JSON object body of at most `max` bytes.
pub(crate) async fn read_json(req: Request, max: usize) -> Result<Map<String, Value>, Response> {
    let ct = req
        .headers()
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    if !ct.is_empty() && !ct.starts_with("application/json") {
        return Err(problem(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            &format!("content type must be application/json, not {ct}"),
        ));
    }
    let too_large = || {
        problem(
            StatusCode::PAYLOAD_TOO_LARGE,
            &format!("request body larger than {max} bytes"),
        )
    };
    if let Some(len) = req
        .headers()
        .get(CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok()?.parse::<u64>().ok())
        && len > max as u64
    {
        return Err(too_large());
    }
    let body = http_body_util::Limited::new(req.into_body(), max);
    let bytes = match body.collect().await {
        Ok(c) => c.to_bytes(),
        Err(e)
            if e.downcast_ref::<http_body_util::LengthLimitError>()
                .is_some() =>
        {
            return Err(too_large());
        }
        Err(e) => {
            return Err(problem(
                StatusCode::BAD_REQUEST,
                &format!("could not read the body: {e}"),
            ));
        }
    };
    match serde_json::from_slice::<Value>(&bytes) {
        Ok(Value::Object(m)) => Ok(m),
        Ok(_) => Err(problem(
            StatusCode::BAD_REQUEST,
            "the body must be a JSON object",
        )),
        Err(e) => Err(problem(
            StatusCode::BAD_REQUEST,
            &format!("invalid JSON: {e}"),
        )),
    }
}

pub(crate) fn count(endpoint: &'static str, status: StatusCode) {
    metrics::counter!("sluice_api_requests_total", "endpoint" => endpoint, "status" => status.as_str().to_string())
        .increment(1);
}

pub(crate) fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "an object",
    }
}

/// The policy named `name`: a `[policies.*]` one, else the policy of an Envoy limit (the
/// admin calls reach every policy a decision can use).
pub(crate) fn named_policy(
    rt: &crate::state::Runtime,
    name: &str,
) -> Option<std::sync::Arc<sluice::Policy>> {
    match rt.config.policies.get(name) {
        Some(pc) => Some(std::sync::Arc::clone(&pc.policy)),
        None => rt.config.domains.policy(name),
    }
}
