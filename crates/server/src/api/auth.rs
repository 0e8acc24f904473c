//! Bearer tokens: `admin_token` for the operator endpoints, `server.api_token` for the
//! decision API (`/v1/*`). Each is optional; when set, a request must carry
//! `Authorization: Bearer <token>`, compared in constant time so the answer's timing says
//! nothing about how much of a guess was right. A refusal is `401` problem+json with
//! `WWW-Authenticate: Bearer`.

use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::Response;
use http::header::{AUTHORIZATION, WWW_AUTHENTICATE};
use http::{HeaderMap, HeaderValue, StatusCode};

use super::{count, problem};
use crate::state::Shared;

/// True when no token is required, or `headers` carry `Authorization: Bearer <token>`.
pub(super) fn bearer_allows(headers: &HeaderMap, token: Option<&str>) -> bool {
    let Some(token) = token else {
        return true;
    };
    let given = headers
        .get(AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    given.is_some_and(|g| constant_time_eq(g.trim().as_bytes(), token.as_bytes()))
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

/// Middleware of the decision API: refuses requests without `server.api_token` when one is
/// configured (read per request, so a reload that sets or changes it applies at once).
pub(super) async fn require_api_token(
    State(shared): State<Shared>,
    req: Request,
    next: Next,
) -> Response {
    let rt = shared.runtime();
    if bearer_allows(req.headers(), rt.config.server.api_token.as_deref()) {
        return next.run(req).await;
    }
    let endpoint = match req.uri().path() {
        "/v1/release" => "release",
        _ => "check",
    };
    count(endpoint, StatusCode::UNAUTHORIZED);
    unauthorized("api_token")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_exact_token_is_accepted() {
        let with = |v: &str| {
            let mut h = HeaderMap::new();
            h.insert(AUTHORIZATION, HeaderValue::from_str(v).unwrap());
            h
        };
        assert!(bearer_allows(&HeaderMap::new(), None));
        assert!(!bearer_allows(&HeaderMap::new(), Some("t0k")));
        assert!(bearer_allows(&with("Bearer t0k"), Some("t0k")));
        assert!(!bearer_allows(&with("Bearer t0j"), Some("t0k")));
        assert!(!bearer_allows(&with("Bearer t0k0"), Some("t0k")));
        assert!(!bearer_allows(&with("Basic t0k"), Some("t0k")));
    }
}
