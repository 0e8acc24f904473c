//! `/v1/reserve` and `/v1/settle`: the decision API for requests whose cost is known only
//! after they ran (an LLM call's tokens), never over-spent (`sluice::reservation`).
//!
//! `POST /v1/reserve` is a check of the declared maximum (`cost`) that, when admitted and
//! consumed, answers the usual decision plus `"reservation": "<id>"`. `POST /v1/settle` with
//! that id and the real cost gives the unused part back or charges the excess as debt, once:
//! a second settle is a `409`, an unknown or ended reservation a `404`. A reservation not
//! settled within its `ttl` (milliseconds, default 60 s) counts in full. Both are decision
//! calls ([`super::auth`]): the id is the capability, and a settle moves only the units that
//! reservation consumed, for the identity it consumed them from.

use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Request, State};
use axum::response::Response;
use http::StatusCode;
use serde_json::{Map, Value, json};
use sluice::core::policy::MAX_EXACT;
use sluice::reservation::{MAX_TTL, MIN_TTL};
use sluice::{Identity, Policy, SettleError, StoreError};
use sluice_http::headers::HeaderOptions;

use super::check::{check_answer, parse_identity};
use super::{count, json_response, kind, problem, read_json};
use crate::state::{Runtime, Shared};

/// The ttl of a reservation that names none.
pub(crate) const DEFAULT_TTL: Duration = Duration::from_secs(60);

/// A parsed `/v1/reserve` body.
struct ReserveRequest {
    policy: Arc<Policy>,
    identity: Identity,
    max_cost: u64,
    ttl: Duration,
}

/// A whole number field of at most [`MAX_EXACT`].
fn units(m: &mut Map<String, Value>, name: &str, what: &str) -> Result<Option<u64>, String> {
    match m.remove(name) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Number(n)) => match n.as_u64() {
            Some(c) if c <= MAX_EXACT => Ok(Some(c)),
            Some(_) => Err(format!("\"{name}\" must be at most {MAX_EXACT}")),
            None if n.as_i64().is_some() => Err(format!("\"{name}\" must not be negative")),
            None => Err(format!("\"{name}\" must be a whole number ({what})")),
        },
        Some(other) => Err(format!(
            "\"{name}\" must be a non-negative integer ({what}), not {}",
            kind(&other)
        )),
    }
}

fn parse_reserve(rt: &Runtime, mut m: Map<String, Value>) -> Result<ReserveRequest, String> {
    let policy = match m.remove("policy") {
        Some(Value::String(name)) => match rt.config.policies.get(&name) {
            Some(p) => Arc::clone(&p.policy),
            None => return Err(format!("unknown policy {name:?}")),
        },
        Some(other) => return Err(format!("\"policy\" must be a string, not {}", kind(&other))),
        None => return Err("missing \"policy\" (a policy name)".into()),
    };
    let identity = parse_identity(rt, &mut m)?.ok_or_else(|| {
        "missing \"identity\" (who is limited, e.g. \"team:42\") or \"credential\" \
         (a secret such as an API key, hashed by the server)"
            .to_string()
    })?;
    let max_cost = units(&mut m, "cost", "the most the request may cost")?
        .ok_or("missing \"cost\" (the most the request may cost, e.g. its max_tokens)")?;
    let ttl = match units(&mut m, "ttl", "milliseconds")? {
        None => DEFAULT_TTL,
        Some(ms) => {
            let ttl = Duration::from_millis(ms);
            if !(MIN_TTL..=MAX_TTL).contains(&ttl) {
                return Err(format!(
                    "\"ttl\" must be between {} and {} milliseconds",
                    MIN_TTL.as_millis(),
                    MAX_TTL.as_millis()
                ));
            }
            ttl
        }
    };
    if let Some(k) = m.keys().next() {
        return Err(format!(
            "unknown field {k:?}: expected policy, identity or credential, cost, ttl"
        ));
    }
    Ok(ReserveRequest {
        policy,
        identity,
        max_cost,
        ttl,
    })
}

fn store_failure(endpoint: &'static str, e: &StoreError, what: &str) -> Response {
    let status = sluice_http::headers::store_error_status(e);
    count(endpoint, status);
    let detail = match e {
        StoreError::Invalid(msg) => msg.clone(),
        other => format!("the store did not answer: {other}; {what}"),
    };
    problem(status, &detail)
}

pub(super) async fn reserve(State(shared): State<Shared>, req: Request) -> Response {
    let rt = shared.runtime();
    let body = match read_json(req, rt.config.server.max_body_bytes).await {
        Ok(b) => b,
        Err(res) => {
            count("reserve", res.status());
            return res;
        }
    };
    let parsed = match parse_reserve(&rt, body) {
        Ok(p) => p,
        Err(msg) => {
            count("reserve", StatusCode::BAD_REQUEST);
            return problem(StatusCode::BAD_REQUEST, &msg);
        }
    };
    let reserved = match rt
        .limiter
        .reserve(
            &parsed.identity,
            &parsed.policy,
            parsed.max_cost,
            parsed.ttl,
        )
        .await
    {
        Ok(r) => r,
        Err(e) => {
            return store_failure(
                "reserve",
                &e,
                "if the maximum was consumed, it counts in full",
            );
        }
    };
    let opts = HeaderOptions {
        ratelimit: true,
        legacy: rt.config.legacy_headers,
    };
    let mut answer = check_answer(&reserved.checked, &opts);
    answer["reservation"] = reserved
        .reservation
        .as_ref()
        .map_or(Value::Null, |r| Value::String(r.id().to_string()));
    answer["ttl_ms"] = json!(parsed.ttl.as_millis() as u64);
    // The handle is not kept: the id settles it, here or on another instance.
    drop(reserved.reservation);
    count("reserve", StatusCode::OK);
    json_response(StatusCode::OK, &answer)
}

/// A parsed `/v1/settle` body: the reservation id and the real cost.
fn parse_settle(body: &mut Map<String, Value>) -> Result<(String, u64), String> {
    let id = match body.remove("reservation") {
        Some(Value::String(s)) => s,
        Some(other) => {
            return Err(format!(
                "\"reservation\" must be a string (the id /v1/reserve answered), not {}",
                kind(&other)
            ));
        }
        None => return Err("missing \"reservation\" (the id /v1/reserve answered)".into()),
    };
    let cost = units(body, "cost", "the real cost")?
        .ok_or("missing \"cost\" (the real cost, e.g. the tokens the response used)")?;
    if let Some(k) = body.keys().next() {
        return Err(format!("unknown field {k:?}: expected reservation, cost"));
    }
    Ok((id, cost))
}

pub(super) async fn settle(State(shared): State<Shared>, req: Request) -> Response {
    let rt = shared.runtime();
    let mut body = match read_json(req, rt.config.server.max_body_bytes).await {
        Ok(b) => b,
        Err(res) => {
            count("settle", res.status());
            return res;
        }
    };
    let parsed = parse_settle(&mut body);
    let (id, cost) = match parsed {
        Ok(p) => p,
        Err(msg) => {
            count("settle", StatusCode::BAD_REQUEST);
            return problem(StatusCode::BAD_REQUEST, &msg);
        }
    };
    match rt.limiter.settle(&id, cost).await {
        Ok(s) => {
            count("settle", StatusCode::OK);
            let mut v = json!({
                "reservation": id,
                "policy": s.policy,
                "identity": s.identity,
                "max_cost": s.max_cost,
                "cost": s.actual,
                "refunded": s.refunded,
                "debt": s.debt,
            });
            if let Some(d) = &s.decision {
                v["remaining"] = json!(d.remaining);
                v["limit"] = json!(d.limit);
            }
            json_response(StatusCode::OK, &v)
        }
        Err(SettleError::AlreadySettled) => {
            count("settle", StatusCode::CONFLICT);
            problem(
                StatusCode::CONFLICT,
                &format!("reservation {id} was settled already; a reservation is settled once"),
            )
        }
        Err(SettleError::Unknown) => {
            count("settle", StatusCode::NOT_FOUND);
            problem(
                StatusCode::NOT_FOUND,
                &format!(
                    "no reservation {id:?}: never made, or its ttl ended and it counted in full"
                ),
            )
        }
        Err(SettleError::Store(e)) => store_failure(
            "settle",
            &e,
            "the reservation was not settled and counts in full",
        ),
    }
}

/// Adds this module's paths and schemas to the OpenAPI document.
pub(super) fn add_openapi(doc: &mut Value) {
    let problem = |what: &str| json!({ "description": what, "content": { "application/problem+json": { "schema": { "$ref": "#/components/schemas/Problem" } } } });
    let body = |schema: &str| json!({ "required": true, "content": { "application/json": { "schema": { "$ref": format!("#/components/schemas/{schema}") } } } });
    let ok = |schema: &str, what: &str| json!({ "description": what, "content": { "application/json": { "schema": { "$ref": format!("#/components/schemas/{schema}") } } } });
    let token = "server.api_token is set and the request carries neither it nor admin_token";
    let paths = json!({
        "/v1/reserve": { "post": {
            "summary": "Check and consume a request's maximum cost, to settle with its real cost later",
            "requestBody": body("ReserveRequest"),
            "responses": { "200": ok("ReserveResponse", "The decision, with the reservation when admitted"),
                "400": problem("Malformed request, unknown policy, a concurrency policy, or a ttl out of range"),
                "401": problem(token), "503": problem("The store did not answer") }
        } },
        "/v1/settle": { "post": {
            "summary": "Settle a reservation with the real cost: the unused part goes back, an excess is charged as debt",
            "requestBody": body("SettleRequest"),
            "responses": { "200": ok("SettleResponse", "Settled"),
                "400": problem("Malformed request"), "401": problem(token),
                "404": problem("No such reservation: never made, or its ttl ended (it counted in full)"),
                "409": problem("Settled already"),
                "503": problem("The store did not answer; the reservation counts in full") }
        } }
    });
    let mut reserve_response = doc["components"]["schemas"]["CheckResponse"].clone();
    if let Some(props) = reserve_response["properties"].as_object_mut() {
        props.insert("reservation".into(), json!({ "type": ["string", "null"], "description": "The id to settle with; null when denied, or admitted without consuming (failed open, allow-listed): nothing to settle" }));
        props.insert(
            "ttl_ms".into(),
            json!({ "type": "integer", "description": "When an unsettled reservation counts in full" }),
        );
    }
    let schemas = json!({
        "ReserveRequest": { "type": "object", "additionalProperties": false, "required": ["policy", "cost"],
            "properties": {
                "policy": { "type": "string", "description": "A policy name from the configuration" },
                "identity": { "type": "string", "minLength": 1, "description": "Who, e.g. team:42" },
                "credential": { "type": "string", "minLength": 1, "description": "Instead of identity: a secret hashed as /v1/check hashes it" },
                "cost": { "type": "integer", "minimum": 0, "maximum": MAX_EXACT, "description": "The most the request may cost (e.g. max_tokens)" },
                "ttl": { "type": "integer", "minimum": MIN_TTL.as_millis() as u64, "maximum": MAX_TTL.as_millis() as u64, "default": DEFAULT_TTL.as_millis() as u64, "description": "Milliseconds until an unsettled reservation counts in full" } },
            "oneOf": [ { "required": ["identity"] }, { "required": ["credential"] } ] },
        "ReserveResponse": reserve_response,
        "SettleRequest": { "type": "object", "additionalProperties": false, "required": ["reservation", "cost"],
            "properties": {
                "reservation": { "type": "string", "description": "The id /v1/reserve answered" },
                "cost": { "type": "integer", "minimum": 0, "maximum": MAX_EXACT, "description": "The real cost" } } },
        "SettleResponse": { "type": "object", "required": ["reservation", "policy", "identity", "max_cost", "cost", "refunded", "debt"],
            "properties": {
                "reservation": { "type": "string" }, "policy": { "type": "string" },
                "identity": { "type": "string", "description": "The identity as keyed (a credential's hash)" },
                "max_cost": { "type": "integer" }, "cost": { "type": "integer" },
                "refunded": { "type": "integer", "description": "max_cost - cost, given back" },
                "debt": { "type": "integer", "description": "cost - max_cost, charged beyond the reservation" },
                "limit": { "type": "integer" },
                "remaining": { "type": "integer", "description": "The state afterwards (absent when nothing moved)" } } }
    });
    if let (Some(p), Value::Object(add)) = (doc["paths"].as_object_mut(), paths) {
        p.extend(add);
    }
    if let (Some(s), Value::Object(add)) = (doc["components"]["schemas"].as_object_mut(), schemas) {
        s.extend(add);
    }
}
