//! `/v1/overrides`, `/v1/bans` and `/v1/lists/{allow,deny}`: runtime changes to the limiter's
//! control plane ([`sluice::control`]).
//!
//! Every call needs the admin token when one is configured (else `server.api_token` when that
//! is set), checked in front of these handlers by the auth boundary ([`super::auth`]); every
//! change is logged with the peer that made it. Who is concerned comes as `identity` or
//! `credential`, read exactly as `/v1/check` reads them, so a change made with an API key
//! reaches the bucket the proxy and `/v1/check` use for that key. Changes go to the store; every instance sharing it applies
//! them to its next decision within a second.
//!
//! Bodies are read up to `control.max_body_bytes` (6 MiB by default, so a bulk import of
//! 10,000 list entries fits), not the decision API's `server.max_body_bytes`. A table at
//! its most entries (`[control]`) refuses a new one with `409`.
//!
//! Layout: this file holds the overrides and bans and what every endpoint shares (reading the
//! body, the fields, the refusals); `lists` the allow and deny lists with their bulk import;
//! `openapi` the endpoints' OpenAPI entries.

mod lists;
mod openapi;

use std::time::Duration;

use axum::extract::{Request, State};
use axum::response::Response;
use http::StatusCode;
use serde_json::{Map, Value, json};
use sluice::control::ControlError;
use sluice::core::policy::{format_duration_ms, parse_duration_ms, within_max_duration};
use sluice::{BanEntry, Identity, OverrideEntry, OverrideTarget};

use super::check::parse_identity;
use super::{count, json_response, kind, problem, read_json};
use crate::config::control::{ParamsText, overlay};
use crate::state::{Runtime, Shared};

pub(super) use lists::{allow_add, allow_remove, deny_add, deny_remove};
pub(super) use openapi::add_openapi;

/// The body, or the answer that refuses the request (the token was checked by the auth
/// boundary before the handler ran).
async fn admit(
    shared: &Shared,
    req: Request,
    endpoint: &'static str,
) -> Result<(std::sync::Arc<Runtime>, String, Map<String, Value>), Response> {
    let rt = shared.runtime();
    let peer = sluice_http::identity::peer_addr(req.extensions())
        .map_or_else(|| "unknown".to_string(), |a| a.to_string());
    let max_body = usize::try_from(rt.config.control.limits.max_body_bytes).unwrap_or(usize::MAX);
    match read_json(req, max_body).await {
        Ok(body) => Ok((rt, peer, body)),
        Err(res) => {
            count(endpoint, res.status());
            Err(res)
        }
    }
}

fn bad(endpoint: &'static str, msg: &str) -> Response {
    count(endpoint, StatusCode::BAD_REQUEST);
    problem(StatusCode::BAD_REQUEST, msg)
}

fn store_failed(endpoint: &'static str, e: &ControlError) -> Response {
    let status = match e {
        ControlError::Full { table, max } => {
            count(endpoint, StatusCode::CONFLICT);
            return problem_with(
                StatusCode::CONFLICT,
                &format!(
                    "the change was not stored: the {table} table is full (at most {max} \
                     entries; control.max_{table} in the configuration). Remove entries or \
                     raise the limit"
                ),
                json!({"table": table, "max": max}),
            );
        }
        ControlError::Store(e) => sluice_http::headers::store_error_status(e),
    };
    count(endpoint, status);
    problem(status, &format!("the change was not stored: {e}"))
}

/// A problem+json response with extension members.
fn problem_with(status: StatusCode, detail: &str, extra: Value) -> Response {
    let mut body = json!({
        "type": "about:blank",
        "title": status.canonical_reason().unwrap_or("Error"),
        "status": status.as_u16(),
        "detail": detail,
    });
    if let (Value::Object(b), Value::Object(e)) = (&mut body, extra) {
        b.extend(e);
    }
    let mut res = json_response(status, &body);
    res.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/problem+json"),
    );
    res
}

fn ok(endpoint: &'static str, v: &Value) -> Response {
    count(endpoint, StatusCode::OK);
    json_response(StatusCode::OK, v)
}

fn not_found(endpoint: &'static str, msg: &str) -> Response {
    count(endpoint, StatusCode::NOT_FOUND);
    problem(StatusCode::NOT_FOUND, msg)
}

fn need_identity(rt: &Runtime, m: &mut Map<String, Value>) -> Result<Identity, String> {
    parse_identity(rt, m)?.ok_or_else(|| {
        "missing \"identity\" (e.g. \"user:42\") or \"credential\" (a secret, hashed as \
         /v1/check hashes it)"
            .to_string()
    })
}

fn need_string(m: &mut Map<String, Value>, field: &str) -> Result<String, String> {
    match m.remove(field) {
        Some(Value::String(s)) if !s.is_empty() => Ok(s),
        Some(Value::String(_)) => Err(format!("\"{field}\" must not be empty")),
        Some(other) => Err(format!(
            "\"{field}\" must be a string, not {}",
            kind(&other)
        )),
        None => Err(format!("missing \"{field}\"")),
    }
}

/// A duration given as text (`10m`) or whole seconds.
fn duration(m: &mut Map<String, Value>, field: &str) -> Result<Option<Duration>, String> {
    let ms = match m.remove(field) {
        None | Some(Value::Null) => return Ok(None),
        Some(Value::String(s)) => parse_duration_ms(&s).map_err(|e| format!("\"{field}\": {e}"))?,
        Some(Value::Number(n)) => {
            let s = n
                .as_u64()
                .ok_or_else(|| format!("\"{field}\" must be a whole number of seconds"))?;
            // The one ceiling of every duration, for seconds as for text.
            within_max_duration(s.saturating_mul(1000)).map_err(|e| format!("\"{field}\": {e}"))?
        }
        Some(other) => {
            return Err(format!(
                "\"{field}\" must be a duration such as \"10m\" or seconds, not {}",
                kind(&other)
            ));
        }
    };
    if ms == 0 {
        return Err(format!("\"{field}\" must be above 0"));
    }
    Ok(Some(Duration::from_millis(ms)))
}

fn no_more_fields(m: &Map<String, Value>, expected: &str) -> Result<(), String> {
    match m.keys().next() {
        Some(k) => Err(format!("unknown field {k:?}: expected {expected}")),
        None => Ok(()),
    }
}

fn override_json(policy: &str, identity: &Identity, o: &OverrideEntry, rt: &Runtime) -> Value {
    let effective = match &o.target {
        OverrideTarget::Params(a) => Some(a.clone()),
        OverrideTarget::Plan(p) => rt
            .config
            .control
            .plans
            .get(p)
            .and_then(|t| t.get(policy))
            .cloned(),
    };
    json!({
        "policy": policy,
        "identity": identity.as_str(),
        "plan": match &o.target { OverrideTarget::Plan(p) => json!(p), _ => Value::Null },
        "params": effective.map_or(Value::Null, |a| serde_json::to_value(a).unwrap_or(Value::Null)),
        "expires_at_ms": o.expires_at_ms,
    })
}

/// `POST /v1/overrides`.
pub(super) async fn set_override(State(shared): State<Shared>, req: Request) -> Response {
    const EP: &str = "overrides";
    let (rt, peer, mut m) = match admit(&shared, req, EP).await {
        Ok(x) => x,
        Err(res) => return res,
    };
    let parsed = (|| {
        let policy = need_string(&mut m, "policy")?;
        let base = super::named_policy(&rt, &policy)
            .ok_or_else(|| format!("unknown policy {policy:?}"))?;
        let identity = need_identity(&rt, &mut m)?;
        let ttl = duration(&mut m, "ttl")?;
        let target = match (m.remove("params"), m.remove("plan")) {
            (Some(_), Some(_)) => return Err("give either \"params\" or \"plan\", not both".into()),
            (None, None) => {
                return Err("missing \"params\" (an object) or \"plan\" (a name)".into());
            }
            (Some(p), None) => {
                let text: ParamsText =
                    serde_json::from_value(p).map_err(|e| format!("\"params\": {e}"))?;
                OverrideTarget::Params(
                    overlay(&base, &text).map_err(|e| format!("\"params\": {e}"))?,
                )
            }
            (None, Some(Value::String(plan))) => {
                let has = rt
                    .config
                    .control
                    .plans
                    .get(&plan)
                    .is_some_and(|t| t.contains_key(&policy));
                if !has {
                    return Err(format!(
                        "plan {plan:?} has no [plans.{plan}.{policy}] table"
                    ));
                }
                OverrideTarget::Plan(plan)
            }
            (None, Some(other)) => {
                return Err(format!("\"plan\" must be a string, not {}", kind(&other)));
            }
        };
        no_more_fields(&m, "policy, identity or credential, params or plan, ttl")?;
        Ok((policy, identity, target, ttl))
    })();
    let (policy, identity, target, ttl) = match parsed {
        Ok(x) => x,
        Err(msg) => return bad(EP, &msg),
    };
    match rt
        .limiter
        .control()
        .set_override(&policy, identity.as_str(), target, ttl)
        .await
    {
        Ok(entry) => {
            tracing::info!(target: "sluice::admin", source = %peer, policy, identity = identity.as_str(), ttl_ms = ttl.map(|t| t.as_millis() as u64), "override set");
            ok(EP, &override_json(&policy, &identity, &entry, &rt))
        }
        Err(e) => store_failed(EP, &e),
    }
}

/// `GET /v1/overrides?policy=P&identity=I` (or `credential=C`).
pub(super) async fn get_override(State(shared): State<Shared>, req: Request) -> Response {
    const EP: &str = "overrides";
    let rt = shared.runtime();
    let query =
        axum::extract::Query::<std::collections::HashMap<String, String>>::try_from_uri(req.uri());
    let mut m: Map<String, Value> = match query {
        Ok(q) => {
            q.0.into_iter()
                .map(|(k, v)| (k, Value::String(v)))
                .collect()
        }
        Err(e) => return bad(EP, &format!("invalid query: {e}")),
    };
    let parsed = (|| {
        let policy = need_string(&mut m, "policy")?;
        let identity = need_identity(&rt, &mut m)?;
        no_more_fields(&m, "policy, identity or credential")?;
        Ok::<_, String>((policy, identity))
    })();
    let (policy, identity) = match parsed {
        Ok(x) => x,
        Err(msg) => return bad(EP, &msg),
    };
    match rt
        .limiter
        .control()
        .get_override(&policy, identity.as_str())
        .await
    {
        Ok(Some(entry)) => ok(EP, &override_json(&policy, &identity, &entry, &rt)),
        Ok(None) => not_found(
            EP,
            &format!("no override of policy {policy:?} for this identity"),
        ),
        Err(e) => store_failed(EP, &e),
    }
}

/// `DELETE /v1/overrides`.
pub(super) async fn remove_override(State(shared): State<Shared>, req: Request) -> Response {
    const EP: &str = "overrides";
    let (rt, peer, mut m) = match admit(&shared, req, EP).await {
        Ok(x) => x,
        Err(res) => return res,
    };
    let parsed = (|| {
        let policy = need_string(&mut m, "policy")?;
        let identity = need_identity(&rt, &mut m)?;
        no_more_fields(&m, "policy, identity or credential")?;
        Ok::<_, String>((policy, identity))
    })();
    let (policy, identity) = match parsed {
        Ok(x) => x,
        Err(msg) => return bad(EP, &msg),
    };
    match rt
        .limiter
        .control()
        .remove_override(&policy, identity.as_str())
        .await
    {
        Ok(true) => {
            tracing::info!(target: "sluice::admin", source = %peer, policy, identity = identity.as_str(), "override removed");
            ok(
                EP,
                &json!({"policy": policy, "identity": identity.as_str(), "removed": true}),
            )
        }
        Ok(false) => not_found(
            EP,
            &format!("no override of policy {policy:?} for this identity"),
        ),
        Err(e) => store_failed(EP, &e),
    }
}

fn ban_json(identity: &Identity, ban: &BanEntry, now_ms: u64) -> Value {
    let left = ban.until_ms.saturating_sub(now_ms);
    json!({
        "identity": identity.as_str(),
        "policies": ban.policies,
        "until_ms": ban.until_ms,
        "retry_after_ms": left,
        "duration": format_duration_ms(left.max(1)),
    })
}

/// `POST /v1/bans`.
pub(super) async fn ban(State(shared): State<Shared>, req: Request) -> Response {
    const EP: &str = "bans";
    let (rt, peer, mut m) = match admit(&shared, req, EP).await {
        Ok(x) => x,
        Err(res) => return res,
    };
    let parsed = (|| {
        let identity = need_identity(&rt, &mut m)?;
        let duration =
            duration(&mut m, "duration")?.ok_or("missing \"duration\" (e.g. \"10m\")")?;
        let policies = match m.remove("policies") {
            None | Some(Value::Null) => None,
            Some(Value::Array(list)) if !list.is_empty() => {
                let mut names = Vec::new();
                for v in list {
                    match v {
                        Value::String(s) if super::named_policy(&rt, &s).is_some() => names.push(s),
                        Value::String(s) => return Err(format!("unknown policy {s:?}")),
                        other => {
                            return Err(format!(
                                "\"policies\" must hold strings, not {}",
                                kind(&other)
                            ));
                        }
                    }
                }
                Some(names)
            }
            Some(other) => {
                return Err(format!(
                    "\"policies\" must be a non-empty list of policy names, not {}",
                    kind(&other)
                ));
            }
        };
        no_more_fields(&m, "identity or credential, duration, policies")?;
        Ok::<_, String>((identity, duration, policies))
    })();
    let (identity, duration, policies) = match parsed {
        Ok(x) => x,
        Err(msg) => return bad(EP, &msg),
    };
    let control = rt.limiter.control();
    match control.ban(identity.as_str(), duration, policies).await {
        Ok(ban) => {
            tracing::info!(target: "sluice::admin", source = %peer, identity = identity.as_str(), duration_ms = duration.as_millis() as u64, policies = ?ban.policies, "ban set");
            let now = ban
                .until_ms
                .saturating_sub(duration.as_millis().max(1) as u64);
            ok(EP, &ban_json(&identity, &ban, now))
        }
        Err(e) => store_failed(EP, &e),
    }
}

/// `DELETE /v1/bans`.
pub(super) async fn unban(State(shared): State<Shared>, req: Request) -> Response {
    const EP: &str = "bans";
    let (rt, peer, mut m) = match admit(&shared, req, EP).await {
        Ok(x) => x,
        Err(res) => return res,
    };
    let parsed = (|| {
        let identity = need_identity(&rt, &mut m)?;
        no_more_fields(&m, "identity or credential")?;
        Ok::<_, String>(identity)
    })();
    let identity = match parsed {
        Ok(x) => x,
        Err(msg) => return bad(EP, &msg),
    };
    match rt.limiter.control().unban(identity.as_str()).await {
        Ok(true) => {
            tracing::info!(target: "sluice::admin", source = %peer, identity = identity.as_str(), "ban lifted");
            ok(EP, &json!({"identity": identity.as_str(), "removed": true}))
        }
        Ok(false) => not_found(EP, "no ban for this identity"),
        Err(e) => store_failed(EP, &e),
    }
}
