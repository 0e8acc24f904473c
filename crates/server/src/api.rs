//! The HTTP listener: the decision API for applications in any language, and the operator
//! endpoints (`/metrics`, `/healthz`, `/readyz`, `/admin/reload`).
//!
//! `POST /v1/check` answers with the decision *and* the exact headers the caller should put on
//! its own response, so a ten-line middleware in FastAPI or Express gives the same answers as
//! the tower layer. Every malformed request gets a `400 application/problem+json` naming what is
//! wrong; bodies are read up to `server.max_body_bytes` and no further (`413` beyond).
//! The request and response shapes are in [`openapi`], served at `/openapi.json`.

use std::fmt::Write as _;
use std::sync::Arc;

use axum::Router;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use http::header::{AUTHORIZATION, CONTENT_LENGTH, CONTENT_TYPE};
use http::{HeaderValue, StatusCode};
use http_body_util::BodyExt;
use serde_json::{Map, Value, json};
use sluice::core::LeaseId;
use sluice::core::key::MAX_IDENTITY_LEN;
use sluice::core::policy::MAX_EXACT;
use sluice::{Checked, Decision, Identity, Lease, Policy, Verdict};
use sluice_http::headers::{HeaderOptions, PROBLEM_JSON, problem_json, rate_limit_headers};

use crate::state::{Runtime, Shared, probe_store};

/// The router of the HTTP listener.
pub fn router(shared: Shared) -> Router {
    Router::new()
        .route("/v1/check", post(check))
        .route("/v1/release", post(release))
        .route("/openapi.json", get(openapi_json))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics_text))
        .route("/admin/reload", post(admin_reload))
        .fallback(not_found)
        .with_state(shared)
}

/// A problem+json response.
pub fn problem(status: StatusCode, detail: &str) -> Response {
    let mut res = Response::new(Body::from(problem_json(status, detail, None, None)));
    *res.status_mut() = status;
    res.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static(PROBLEM_JSON));
    res
}

fn json_response(status: StatusCode, v: &Value) -> Response {
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
async fn read_json(req: Request, max: usize) -> Result<Map<String, Value>, Response> {
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

fn count(endpoint: &'static str, status: StatusCode) {
    metrics::counter!("sluice_api_requests_total", "endpoint" => endpoint, "status" => status.as_str().to_string())
        .increment(1);
}

/// A parsed `/v1/check` body.
#[derive(Debug)]
struct CheckRequest {
    policies: Vec<Arc<Policy>>,
    identity: Identity,
    cost: u64,
}

fn parse_check(rt: &Runtime, mut m: Map<String, Value>) -> Result<CheckRequest, String> {
    let max = rt.config.server.max_policies_per_check;
    let names: Vec<String> = match (m.remove("policy"), m.remove("policies")) {
        (Some(_), Some(_)) => return Err("give either \"policy\" or \"policies\", not both".into()),
        (None, None) => {
            return Err(
                "missing \"policy\" (a policy name) or \"policies\" (a list of names)".into(),
            );
        }
        (Some(Value::String(p)), None) => vec![p],
        (Some(other), None) => {
            return Err(format!("\"policy\" must be a string, not {}", kind(&other)));
        }
        (None, Some(Value::Array(list))) => {
            if list.is_empty() {
                return Err("\"policies\" must not be empty".into());
            }
            if list.len() > max {
                return Err(format!(
                    "at most {max} policies per check, got {}",
                    list.len()
                ));
            }
            let mut names = Vec::with_capacity(list.len());
            for v in list {
                match v {
                    Value::String(s) if !names.contains(&s) => names.push(s),
                    Value::String(s) => return Err(format!("policy {s:?} is listed twice")),
                    other => {
                        return Err(format!(
                            "\"policies\" must hold strings, not {}",
                            kind(&other)
                        ));
                    }
                }
            }
            names
        }
        (None, Some(other)) => {
            return Err(format!(
                "\"policies\" must be a list of strings, not {}",
                kind(&other)
            ));
        }
    };
    let identity = match m.remove("identity") {
        Some(Value::String(s)) if s.is_empty() => {
            return Err("\"identity\" must not be empty".into());
        }
        Some(Value::String(s)) if s.len() > MAX_IDENTITY_LEN => {
            return Err(format!(
                "\"identity\" is {} bytes; the most is {MAX_IDENTITY_LEN}",
                s.len()
            ));
        }
        Some(Value::String(s)) => Identity::new(s),
        Some(other) => {
            return Err(format!(
                "\"identity\" must be a string, not {}",
                kind(&other)
            ));
        }
        None => return Err("missing \"identity\" (who is limited, e.g. \"user:42\")".into()),
    };
    let cost = match m.remove("cost") {
        None | Some(Value::Null) => 1,
        Some(Value::Number(n)) => match n.as_u64() {
            Some(c) if c <= MAX_EXACT => c,
            Some(_) => return Err(format!("\"cost\" must be at most {MAX_EXACT}")),
            None if n.as_i64().is_some() => return Err("\"cost\" must not be negative".into()),
            None => return Err("\"cost\" must be a whole number".into()),
        },
        Some(other) => {
            return Err(format!(
                "\"cost\" must be a non-negative integer, not {}",
                kind(&other)
            ));
        }
    };
    if let Some(k) = m.keys().next() {
        return Err(format!(
            "unknown field {k:?}: expected policy or policies, identity, cost"
        ));
    }
    let mut policies = Vec::with_capacity(names.len());
    for n in &names {
        match rt.config.policies.get(n) {
            Some(p) => policies.push(Arc::clone(&p.policy)),
            None => return Err(format!("unknown policy {n:?}")),
        }
    }
    Ok(CheckRequest {
        policies,
        identity,
        cost,
    })
}

fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "an object",
    }
}

/// Header names as clients usually write them.
pub fn display_header_name(n: &str) -> String {
    match n {
        "ratelimit" => "RateLimit".into(),
        "ratelimit-policy" => "RateLimit-Policy".into(),
        "retry-after" => "Retry-After".into(),
        "x-ratelimit-limit" => "X-RateLimit-Limit".into(),
        "x-ratelimit-remaining" => "X-RateLimit-Remaining".into(),
        "x-ratelimit-reset" => "X-RateLimit-Reset".into(),
        other => other.to_string(),
    }
}

fn verdict_name(v: &Verdict) -> &'static str {
    match v {
        Verdict::Decided => "decided",
        Verdict::FailedOpen(_) => "failed_open",
        Verdict::FailedClosed(_) => "failed_closed",
    }
}

fn reason_name(d: &Decision) -> Value {
    match d.reason {
        None => Value::Null,
        Some(r) => serde_json::to_value(r).unwrap_or(Value::Null),
    }
}

/// The JSON answer to a check.
fn check_answer(checked: &Checked, opts: &HeaderOptions) -> Value {
    // The headline numbers: the denying policy, else the enforced one with the least left.
    let visible = || {
        checked
            .limits
            .iter()
            .filter(|l| !l.policy.shadow)
            .filter_map(|l| l.decision.as_ref())
    };
    let head = checked
        .denials()
        .filter_map(|l| l.decision.as_ref())
        .max_by_key(|d| d.retry_after_ms)
        .or_else(|| visible().min_by_key(|d| d.remaining));
    let (limit, remaining, reset) =
        head.map_or((0, 0, 0), |d| (d.limit, d.remaining, d.reset_after_ms));
    let retry_after_ms = match checked.verdict {
        Verdict::FailedClosed(_) => 1000,
        _ if checked.allowed => 0,
        _ => checked.retry_after_ms(),
    };
    let policies: Vec<Value> = checked
        .limits
        .iter()
        .map(|l| match &l.decision {
            Some(d) => json!({
                "policy": l.policy.name,
                "allowed": d.allowed,
                "shadow": l.policy.shadow,
                "limit": d.limit,
                "remaining": d.remaining,
                "retry_after_ms": d.retry_after_ms,
                "reset_after_ms": d.reset_after_ms,
                "delay_ms": d.delay_ms,
                "reason": reason_name(d),
            }),
            None => json!({
                "policy": l.policy.name,
                "allowed": checked.allowed,
                "shadow": l.policy.shadow,
                "limit": Value::Null,
                "remaining": Value::Null,
                "retry_after_ms": Value::Null,
                "reset_after_ms": Value::Null,
                "delay_ms": Value::Null,
                "reason": if matches!(checked.verdict, Verdict::FailedClosed(_)) { json!("store_unavailable") } else { Value::Null },
            }),
        })
        .collect();
    let mut headers = Map::new();
    for (n, v) in rate_limit_headers(checked, opts) {
        headers.insert(
            display_header_name(n.as_str()),
            Value::String(v.to_str().unwrap_or("").to_string()),
        );
    }
    let lease = if checked.leases.is_empty() {
        Value::Null
    } else {
        Value::String(encode_leases(checked))
    };
    json!({
        "allowed": checked.allowed,
        "limit": limit,
        "remaining": remaining,
        "retry_after_ms": retry_after_ms,
        "reset_after_ms": reset,
        "delay_ms": checked.delay_ms(),
        "verdict": verdict_name(&checked.verdict),
        "policies": policies,
        "headers": headers,
        "lease": lease,
    })
}

// Lease tokens: `policy~key~id` per lease, `,` between leases, each part escaped so neither
// separator appears inside it. The server finds the algorithm again from the policy name.

fn escape_token_part(out: &mut String, s: &str) {
    for b in s.bytes() {
        if b.is_ascii_alphanumeric()
            || matches!(
                b,
                b'-' | b'_' | b'.' | b':' | b'{' | b'}' | b'#' | b'@' | b'/' | b'+' | b'='
            )
        {
            out.push(b as char);
        } else {
            let _ = write!(out, "%{b:02X}");
        }
    }
}

fn unescape_token_part(s: &str) -> Option<String> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let hex = s.get(i + 1..i + 3)?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

fn encode_leases(checked: &Checked) -> String {
    let mut out = String::new();
    for lease in &checked.leases {
        let Some(l) = checked.limits.iter().find(|l| l.key == lease.key) else {
            continue;
        };
        if !out.is_empty() {
            out.push(',');
        }
        escape_token_part(&mut out, &l.policy.name);
        out.push('~');
        escape_token_part(&mut out, &lease.key);
        out.push('~');
        escape_token_part(&mut out, &lease.id.0);
    }
    out
}

fn decode_leases(rt: &Runtime, token: &str) -> Result<Vec<Lease>, String> {
    let bad = || "malformed lease token".to_string();
    let prefix = format!("{}:{{", rt.limiter.key_scheme().prefix());
    let mut leases = Vec::new();
    for part in token.split(',') {
        let mut it = part.split('~');
        let (Some(p), Some(k), Some(i), None) = (it.next(), it.next(), it.next(), it.next()) else {
            return Err(bad());
        };
        let (policy, key, id) = (
            unescape_token_part(p).ok_or_else(bad)?,
            unescape_token_part(k).ok_or_else(bad)?,
            unescape_token_part(i).ok_or_else(bad)?,
        );
        let pc = rt
            .config
            .policies
            .get(&policy)
            .ok_or_else(|| format!("unknown policy {policy:?}"))?;
        // The key must be one of this policy's keys: a token cannot touch other state.
        if !key.starts_with(&prefix) || !key.ends_with(&format!("}}:{policy}")) {
            return Err(bad());
        }
        let p = &pc.policy;
        let algorithm = if p.shards > 1 {
            p.algorithm.per_shard(p.shards)
        } else {
            p.algorithm.clone()
        };
        if !matches!(algorithm, sluice::Algorithm::Concurrency { .. }) {
            return Err(format!("policy {policy:?} is not a concurrency policy"));
        }
        leases.push(Lease {
            key,
            algorithm,
            id: LeaseId(id),
        });
    }
    Ok(leases)
}

async fn check(State(shared): State<Shared>, req: Request) -> Response {
    let rt = shared.runtime();
    let body = match read_json(req, rt.config.server.max_body_bytes).await {
        Ok(b) => b,
        Err(res) => {
            count("check", res.status());
            return res;
        }
    };
    let parsed = match parse_check(&rt, body) {
        Ok(p) => p,
        Err(msg) => {
            count("check", StatusCode::BAD_REQUEST);
            return problem(StatusCode::BAD_REQUEST, &msg);
        }
    };
    let items: Vec<_> = parsed
        .policies
        .iter()
        .map(|p| (&parsed.identity, p, parsed.cost))
        .collect();
    let checked = rt.limiter.check_many(&items).await;
    let opts = HeaderOptions {
        ratelimit: true,
        legacy: rt.config.legacy_headers,
    };
    count("check", StatusCode::OK);
    json_response(StatusCode::OK, &check_answer(&checked, &opts))
}

async fn release(State(shared): State<Shared>, req: Request) -> Response {
    let rt = shared.runtime();
    let mut body = match read_json(req, rt.config.server.max_body_bytes).await {
        Ok(b) => b,
        Err(res) => {
            count("release", res.status());
            return res;
        }
    };
    let token = match body.remove("lease") {
        Some(Value::String(s)) if !s.is_empty() => s,
        Some(other) => {
            count("release", StatusCode::BAD_REQUEST);
            return problem(
                StatusCode::BAD_REQUEST,
                &format!(
                    "\"lease\" must be the token /v1/check returned, not {}",
                    kind(&other)
                ),
            );
        }
        None => {
            count("release", StatusCode::BAD_REQUEST);
            return problem(
                StatusCode::BAD_REQUEST,
                "missing \"lease\" (the token /v1/check returned)",
            );
        }
    };
    if let Some(k) = body.keys().next() {
        count("release", StatusCode::BAD_REQUEST);
        return problem(
            StatusCode::BAD_REQUEST,
            &format!("unknown field {k:?}: expected lease"),
        );
    }
    let leases = match decode_leases(&rt, &token) {
        Ok(l) => l,
        Err(msg) => {
            count("release", StatusCode::BAD_REQUEST);
            return problem(StatusCode::BAD_REQUEST, &msg);
        }
    };
    let mut released = true;
    for lease in &leases {
        match rt.limiter.release(lease).await {
            Ok(held) => released &= held,
            Err(e) => {
                count("release", StatusCode::SERVICE_UNAVAILABLE);
                return problem(
                    StatusCode::SERVICE_UNAVAILABLE,
                    &format!("could not release the lease: {e}; it expires by itself"),
                );
            }
        }
    }
    count("release", StatusCode::OK);
    json_response(StatusCode::OK, &json!({ "released": released }))
}

async fn healthz() -> Response {
    json_response(StatusCode::OK, &json!({ "status": "ok" }))
}

async fn readyz(State(shared): State<Shared>) -> Response {
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

async fn metrics_text(State(shared): State<Shared>, req: Request) -> Response {
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

async fn admin_reload(State(shared): State<Shared>, req: Request) -> Response {
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

async fn openapi_json() -> Response {
    json_response(StatusCode::OK, &openapi())
}

/// The OpenAPI 3.1 description of the HTTP listener.
pub fn openapi() -> Value {
    let problem = json!({ "description": "Malformed request", "content": { "application/problem+json": { "schema": { "$ref": "#/components/schemas/Problem" } } } });
    json!({
        "openapi": "3.1.0",
        "info": {
            "title": "sluice decision API",
            "version": env!("CARGO_PKG_VERSION"),
            "description": "Ask sluice whether a request may proceed, and get the headers to send back."
        },
        "paths": {
            "/v1/check": { "post": {
                "summary": "Check (and consume) one or several policies for an identity",
                "description": "Several policies are all-or-nothing: either every one admits and all are consumed, or none is. The answer is 200 whatever the decision; `allowed` says it.",
                "requestBody": { "required": true, "content": { "application/json": { "schema": { "$ref": "#/components/schemas/CheckRequest" },
                    "examples": {
                        "one": { "value": { "policy": "per-user", "identity": "user:42", "cost": 1 } },
                        "several": { "value": { "policies": ["burst", "daily"], "identity": "key:abc" } }
                    } } } },
                "responses": {
                    "200": { "description": "The decision", "content": { "application/json": { "schema": { "$ref": "#/components/schemas/CheckResponse" } } } },
                    "400": problem.clone(),
                    "413": { "description": "Body larger than server.max_body_bytes", "content": { "application/problem+json": { "schema": { "$ref": "#/components/schemas/Problem" } } } },
                    "415": { "description": "Body is not application/json" }
                }
            } },
            "/v1/release": { "post": {
                "summary": "Release the concurrency leases a check took",
                "requestBody": { "required": true, "content": { "application/json": { "schema": { "$ref": "#/components/schemas/ReleaseRequest" } } } },
                "responses": {
                    "200": { "description": "Released (false when the lease had already expired)", "content": { "application/json": { "schema": {
                        "type": "object", "required": ["released"], "properties": { "released": { "type": "boolean" } } } } } },
                    "400": problem,
                    "503": { "description": "The store did not answer; the lease expires after the policy's lease timeout" }
                }
            } },
            "/healthz": { "get": { "summary": "The process is up", "responses": { "200": { "description": "Up" } } } },
            "/readyz": { "get": { "summary": "Configuration loaded and store reachable", "responses": { "200": { "description": "Ready" }, "503": { "description": "Store unreachable" } } } },
            "/metrics": { "get": { "summary": "Prometheus metrics (needs the admin token when one is set)", "responses": { "200": { "description": "Prometheus text format" }, "401": { "description": "Missing or wrong admin token" } } } },
            "/admin/reload": { "post": { "summary": "Reload the configuration file (needs the admin token when one is set)", "responses": { "200": { "description": "Reloaded" }, "422": { "description": "The file has errors; the running configuration is kept" } } } }
        },
        "components": { "schemas": {
            "CheckRequest": {
                "type": "object", "additionalProperties": false, "required": ["identity"],
                "properties": {
                    "policy": { "type": "string", "description": "A policy name from the configuration" },
                    "policies": { "type": "array", "items": { "type": "string" }, "minItems": 1, "description": "Several policies, all-or-nothing" },
                    "identity": { "type": "string", "minLength": 1, "maxLength": MAX_IDENTITY_LEN, "description": "Who is limited, e.g. user:42 or ip:203.0.113.7" },
                    "cost": { "type": "integer", "minimum": 0, "maximum": MAX_EXACT, "default": 1, "description": "Units to consume; 0 only looks" }
                },
                "oneOf": [ { "required": ["policy"] }, { "required": ["policies"] } ]
            },
            "CheckResponse": {
                "type": "object",
                "required": ["allowed", "limit", "remaining", "retry_after_ms", "reset_after_ms", "policies", "headers", "lease"],
                "properties": {
                    "allowed": { "type": "boolean", "description": "Let the request through" },
                    "limit": { "type": "integer", "description": "Quota of the deciding policy (the denying one, else the one with the least left)" },
                    "remaining": { "type": "integer" },
                    "retry_after_ms": { "type": "integer", "description": "0 when allowed; otherwise when to retry" },
                    "reset_after_ms": { "type": "integer", "description": "Time until the deciding policy is back to full" },
                    "delay_ms": { "type": "integer", "description": "Shaping policies: hold the request this long" },
                    "verdict": { "enum": ["decided", "failed_open", "failed_closed"], "description": "failed_* when the store did not answer" },
                    "policies": { "type": "array", "items": { "$ref": "#/components/schemas/PolicyDecision" } },
                    "headers": { "type": "object", "additionalProperties": { "type": "string" }, "description": "Headers to send on your response: RateLimit-Policy, RateLimit, Retry-After on a denial" },
                    "lease": { "type": ["string", "null"], "description": "Concurrency policies: pass to /v1/release when the work is done" }
                }
            },
            "PolicyDecision": {
                "type": "object",
                "properties": {
                    "policy": { "type": "string" }, "allowed": { "type": "boolean" }, "shadow": { "type": "boolean" },
                    "limit": { "type": ["integer", "null"] }, "remaining": { "type": ["integer", "null"] },
                    "retry_after_ms": { "type": ["integer", "null"] }, "reset_after_ms": { "type": ["integer", "null"] },
                    "delay_ms": { "type": ["integer", "null"] },
                    "reason": { "enum": [null, "limited", "cost_exceeds_limit", "other_limit_denied", "store_unavailable"] }
                }
            },
            "ReleaseRequest": { "type": "object", "additionalProperties": false, "required": ["lease"], "properties": { "lease": { "type": "string" } } },
            "Problem": { "type": "object", "properties": {
                "type": { "type": "string" }, "title": { "type": "string" }, "status": { "type": "integer" }, "detail": { "type": "string" } } }
        } }
    })
}

/// Serves the router until `shutdown` resolves, then lets requests in flight finish.
pub async fn serve_http(
    listener: tokio::net::TcpListener,
    router: Router,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    axum::serve(
        listener,
        router.into_make_service_with_connect_info::<std::net::SocketAddr>(),
    )
    .with_graceful_shutdown(shutdown)
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lease_token_parts_round_trip() {
        for s in ["rl:{user:42}:uploads", "a~b,c%d", "é ", ""] {
            let mut out = String::new();
            escape_token_part(&mut out, s);
            assert!(!out.contains('~') && !out.contains(','));
            assert_eq!(unescape_token_part(&out).as_deref(), Some(s));
        }
    }

    #[test]
    fn openapi_is_complete() {
        let doc = openapi();
        for p in [
            "/v1/check",
            "/v1/release",
            "/healthz",
            "/readyz",
            "/metrics",
        ] {
            assert!(doc["paths"][p].is_object(), "{p}");
        }
        assert!(
            doc["components"]["schemas"]["CheckResponse"]["required"]
                .as_array()
                .unwrap()
                .len()
                >= 7
        );
    }
}
