//! The operator endpoints: `/healthz`, `/readyz`, `/metrics` and `/admin/reload`.
//!
//! `/metrics` needs `Authorization: Bearer <admin_token>` when the configuration sets one;
//! `/admin/reload` is a control endpoint (`admin_token`, else `server.api_token`). Both are
//! checked in front of the route by [`super::auth::guard`].

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use http::StatusCode;
use http::header::CONTENT_TYPE;
use serde_json::json;

use super::{json_response, problem};
use crate::state::{Shared, probe_store};

pub(super) async fn healthz() -> Response {
    json_response(StatusCode::OK, &json!({ "status": "ok" }))
}

pub(super) async fn readyz(State(shared): State<Shared>) -> Response {
    let rt = shared.runtime();
    let store = rt.limiter.store().kind();
    // Informational: checks decide from this snapshot whatever its age, so an old one does
    // not make the instance unready.
    let control_age = rt.limiter.control().snapshot_age().map(|a| a.as_secs_f64());
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
            &json!({ "ready": true, "store": store, "generation": rt.generation, "control_snapshot_age_seconds": control_age }),
        ),
        Err(e) => json_response(
            StatusCode::SERVICE_UNAVAILABLE,
            &json!({ "ready": false, "store": store, "generation": rt.generation, "control_snapshot_age_seconds": control_age, "error": e.to_string() }),
        ),
    }
}

pub(super) async fn metrics_text(State(shared): State<Shared>) -> Response {
    match shared.render_metrics() {
        Some(text) => ([(CONTENT_TYPE, "text/plain; version=0.0.4")], text).into_response(),
        None => problem(
            StatusCode::NOT_FOUND,
            "another metrics recorder is installed in this process",
        ),
    }
}

pub(super) async fn admin_reload(State(shared): State<Shared>) -> Response {
    match crate::reload::reload(&shared, "admin").await {
        Ok(generation) => json_response(
            StatusCode::OK,
            &json!({ "reloaded": true, "generation": generation }),
        ),
        Err(errors) => {
            // A problem document like every other error of this listener, with the file's
            // errors and the generation still running as extension members.
            let detail = format!(
                "the configuration was not reloaded; the running one stays in force: {}",
                errors.join("; ")
            );
            let body = json!({
                "type": "about:blank",
                "title": "Unprocessable Content",
                "status": 422,
                "detail": detail,
                "reloaded": false,
                "generation": shared.runtime().generation,
                "errors": errors,
            });
            (
                StatusCode::UNPROCESSABLE_ENTITY,
                [(CONTENT_TYPE, "application/problem+json")],
                body.to_string(),
            )
                .into_response()
        }
    }
}
