//! `/v1/state`, `/v1/charge` and `/v1/refund`: one identity's state for one policy, read
//! without consuming (`POST /v1/state`), reset (`DELETE /v1/state`), charged without a check
//! or refunded (`docs/admin.md`, "State, charge and refund").
//!
//! Reading is a decision-API call: `server.api_token` or `admin_token` (the console's) is
//! accepted. Reset, charge and refund change limits outside of a check, so they are control
//! calls ([`super::auth`]): they need `admin_token` when one is set (else `server.api_token`
//! when that is set), are served on the admin listener when `server.admin` is set, and each
//! is logged with the peer address that made it. Bodies name `policy` and `identity`, or `credential` instead of `identity`,
//! hashed exactly as `/v1/check` hashes it, so the same caller's bucket is the one changed.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;
use axum::extract::{ConnectInfo, Request, State};
use axum::response::Response;
use axum::routing::post;
use http::StatusCode;
use serde_json::{Map, Value, json};
use sluice::core::policy::MAX_EXACT;
use sluice::{Decision, Identity, Policy, StoreError};

use super::check::parse_identity;
use super::{count, json_response, kind, problem, read_json};
use crate::state::{Runtime, Shared};

/// The routes of this module: reading state alone (the decision listener when `server.admin`
/// is set), or with reset, charge and refund (`with_changes`).
pub(super) fn routes(with_changes: bool) -> Router<Shared> {
    if !with_changes {
        return Router::new().route("/v1/state", post(read_state));
    }
    Router::new()
        .route("/v1/state", post(read_state).delete(reset_state))
        .route("/v1/charge", post(charge))
        .route("/v1/refund", post(refund))
}

/// Which call, for metrics, logs and the token it needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Op {
    Read,
    Reset,
    Charge,
    Refund,
}

impl Op {
    fn name(self) -> &'static str {
        match self {
            Op::Read => "state",
            Op::Reset => "reset",
            Op::Charge => "charge",
            Op::Refund => "refund",
        }
    }
    fn takes_cost(self) -> bool {
        matches!(self, Op::Charge | Op::Refund)
    }
}

/// A parsed body: the policy, the identity and (for charge and refund) the cost.
struct Target {
    policy: Arc<Policy>,
    identity: Identity,
    cost: u64,
}

fn parse_target(rt: &Runtime, op: Op, mut m: Map<String, Value>) -> Result<Target, String> {
    let policy = match m.remove("policy") {
        Some(Value::String(name)) => match super::named_policy(rt, &name) {
            Some(p) => p,
            None => return Err(format!("unknown policy {name:?}")),
        },
        Some(other) => return Err(format!("\"policy\" must be a string, not {}", kind(&other))),
        None => return Err("missing \"policy\" (a policy name)".into()),
    };
    let identity = parse_identity(rt, &mut m)?.ok_or_else(|| {
        "missing \"identity\" (e.g. \"user:42\") or \"credential\" (a secret such as an \
         API key, hashed by the server)"
            .to_string()
    })?;
    let cost = if op.takes_cost() {
        match m.remove("cost") {
            Some(Value::Number(n)) => match n.as_u64() {
                Some(c) if c <= MAX_EXACT => c,
                Some(_) => return Err(format!("\"cost\" must be at most {MAX_EXACT}")),
                None if n.as_i64().is_some() => {
                    return Err("\"cost\" must not be negative".into());
                }
                None => return Err("\"cost\" must be a whole number".into()),
            },
            Some(other) => {
                return Err(format!(
                    "\"cost\" must be a non-negative integer, not {}",
                    kind(&other)
                ));
            }
            None => return Err(format!("missing \"cost\" (the units to {})", op.name())),
        }
    } else {
        0
    };
    if let Some(k) = m.keys().next() {
        let expected = if op.takes_cost() {
            "policy, identity or credential, cost"
        } else {
            "policy, identity or credential"
        };
        return Err(format!("unknown field {k:?}: expected {expected}"));
    }
    Ok(Target {
        policy,
        identity,
        cost,
    })
}

/// The JSON answer: the state of the policy for the identity after the call.
fn state_answer(target: &Target, d: &Decision) -> Value {
    json!({
        "policy": target.policy.name,
        "identity": target.identity.as_str(),
        "allowed": d.allowed,
        "limit": d.limit,
        "remaining": d.remaining,
        "retry_after_ms": d.retry_after_ms,
        "reset_after_ms": d.reset_after_ms,
    })
}

fn store_failure(op: Op, e: &StoreError) -> Response {
    let status = sluice_http::headers::store_error_status(e);
    count(op.name(), status);
    let detail = match e {
        StoreError::Invalid(msg) => msg.clone(),
        other => format!("the store did not answer, nothing was changed or read: {other}"),
    };
    problem(status, &detail)
}

async fn handle(shared: Shared, op: Op, req: Request) -> Response {
    // Who may call (reading: the API or the admin token; the rest: the admin token) is
    // decided in front of every route, by `super::auth::guard`.
    let rt = shared.runtime();
    let peer = req
        .extensions()
        .get::<ConnectInfo<SocketAddr>>()
        .map(|c| c.0.to_string())
        .unwrap_or_else(|| "unknown".into());
    let body = match read_json(req, rt.config.server.max_body_bytes).await {
        Ok(b) => b,
        Err(res) => {
            count(op.name(), res.status());
            return res;
        }
    };
    let target = match parse_target(&rt, op, body) {
        Ok(t) => t,
        Err(msg) => {
            count(op.name(), StatusCode::BAD_REQUEST);
            return problem(StatusCode::BAD_REQUEST, &msg);
        }
    };
    let limiter = &rt.limiter;
    let (policy, identity, cost) = (&target.policy, &target.identity, target.cost);
    let answer = match op {
        Op::Read => limiter
            .state(identity, policy)
            .await
            .map(|d| state_answer(&target, &d)),
        Op::Reset => limiter.reset(identity, policy).await.map(|existed| {
            json!({
                "policy": policy.name,
                "identity": identity.as_str(),
                "reset": true,
                "existed": existed,
            })
        }),
        Op::Charge => limiter
            .charge(identity, policy, cost)
            .await
            .map(|d| state_answer(&target, &d)),
        Op::Refund => limiter
            .refund(identity, policy, cost)
            .await
            .map(|d| state_answer(&target, &d)),
    };
    match answer {
        Ok(v) => {
            if op != Op::Read {
                tracing::info!(
                    target: "sluice::admin",
                    op = op.name(),
                    policy = %policy.name,
                    identity = identity.as_str(),
                    cost,
                    source = %peer,
                    "state changed"
                );
            }
            count(op.name(), StatusCode::OK);
            json_response(StatusCode::OK, &v)
        }
        Err(e) => store_failure(op, &e),
    }
}

async fn read_state(State(shared): State<Shared>, req: Request) -> Response {
    handle(shared, Op::Read, req).await
}

async fn reset_state(State(shared): State<Shared>, req: Request) -> Response {
    handle(shared, Op::Reset, req).await
}

async fn charge(State(shared): State<Shared>, req: Request) -> Response {
    handle(shared, Op::Charge, req).await
}

async fn refund(State(shared): State<Shared>, req: Request) -> Response {
    handle(shared, Op::Refund, req).await
}

/// Adds this module's paths and schemas to the OpenAPI document.
pub(super) fn add_openapi(doc: &mut Value) {
    let problem = |what: &str| json!({ "description": what, "content": { "application/problem+json": { "schema": { "$ref": "#/components/schemas/Problem" } } } });
    let body = |schema: &str| json!({ "required": true, "content": { "application/json": { "schema": { "$ref": format!("#/components/schemas/{schema}") } } } });
    let state = json!({ "description": "The state afterwards", "content": { "application/json": { "schema": { "$ref": "#/components/schemas/StateResponse" } } } });
    let admin = "admin_token is set (else server.api_token) and the request does not carry it";
    let paths = json!({
        "/v1/state": {
            "post": {
                "summary": "Read an identity's state for a policy without consuming",
                "requestBody": body("StateRequest"),
                "responses": { "200": state.clone(), "400": problem("Malformed request or unknown policy"),
                    "401": problem("server.api_token is set and the request carries neither it nor admin_token"),
                    "503": problem("The store did not answer") }
            },
            "delete": {
                "summary": "Reset an identity's state for a policy (every shard); logged with the peer address",
                "requestBody": body("StateRequest"),
                "responses": { "200": { "description": "Reset", "content": { "application/json": { "schema": {
                        "type": "object", "required": ["policy", "identity", "reset", "existed"], "properties": {
                            "policy": { "type": "string" }, "identity": { "type": "string" },
                            "reset": { "const": true }, "existed": { "type": "boolean", "description": "Whether there was state to delete" } } } } } },
                    "400": problem("Malformed request or unknown policy"), "401": problem(admin),
                    "503": problem("The store did not answer; nothing was reset") }
            }
        },
        "/v1/charge": { "post": {
            "summary": "Consume cost without an admission check (the state may go into debt); logged with the peer address",
            "requestBody": body("AdjustRequest"),
            "responses": { "200": state.clone(), "400": problem("Malformed request, unknown policy, or a concurrency policy"),
                "401": problem(admin), "503": problem("The store did not answer; nothing was charged") }
        } },
        "/v1/refund": { "post": {
            "summary": "Give cost back, never beyond the policy's capacity; logged with the peer address",
            "requestBody": body("AdjustRequest"),
            "responses": { "200": state, "400": problem("Malformed request, unknown policy, or a concurrency policy"),
                "401": problem(admin), "503": problem("The store did not answer; nothing was refunded") }
        } }
    });
    let who = json!({
        "policy": { "type": "string", "description": "A policy name from the configuration" },
        "identity": { "type": "string", "minLength": 1, "description": "Who, e.g. user:42" },
        "credential": { "type": "string", "minLength": 1, "description": "Instead of identity: a secret hashed as /v1/check hashes it" }
    });
    let mut adjust_props = who.clone();
    adjust_props["cost"] = json!({ "type": "integer", "minimum": 0, "maximum": MAX_EXACT, "description": "Units to charge or refund" });
    let one_of = json!([ { "required": ["identity"] }, { "required": ["credential"] } ]);
    let schemas = json!({
        "StateRequest": { "type": "object", "additionalProperties": false, "required": ["policy"], "properties": who, "oneOf": one_of.clone() },
        "AdjustRequest": { "type": "object", "additionalProperties": false, "required": ["policy", "cost"], "properties": adjust_props, "oneOf": one_of },
        "StateResponse": { "type": "object",
            "required": ["policy", "identity", "allowed", "limit", "remaining", "retry_after_ms", "reset_after_ms"],
            "properties": {
                "policy": { "type": "string" },
                "identity": { "type": "string", "description": "The identity as keyed (a credential's hash)" },
                "allowed": { "type": "boolean", "description": "Whether a check of cost 0 admits: false while the state is in debt beyond the limit" },
                "limit": { "type": "integer" }, "remaining": { "type": "integer" },
                "retry_after_ms": { "type": "integer" },
                "reset_after_ms": { "type": "integer", "description": "Time until the state is back to full (for a calendar window, to the next boundary)" } } }
    });
    if let (Some(p), Value::Object(add)) = (doc["paths"].as_object_mut(), paths) {
        p.extend(add);
    }
    if let (Some(s), Value::Object(add)) = (doc["components"]["schemas"].as_object_mut(), schemas) {
        s.extend(add);
    }
}
