//! `/v1/overrides`, `/v1/bans` and `/v1/lists/{allow,deny}`: runtime changes to the limiter's
//! control plane ([`sluice::control`]).
//!
//! Every call needs the admin token when one is configured (else `server.api_token` when that
//! is set), checked in front of these handlers by the auth boundary ([`super::auth`]); every
//! change is logged with the peer that made it. Who is concerned comes as `identity` or `credential`, read exactly as
//! `/v1/check` reads them, so a change made with an API key reaches the bucket the proxy and
//! `/v1/check` use for that key. Changes go to the store; every instance sharing it applies
//! them to its next decision within a second.
//!
//! Bodies are read up to `control.max_body_bytes` (6 MiB by default, so a bulk import of
//! 10,000 list entries fits), not the decision API's `server.max_body_bytes`. A table at
//! its most entries (`[control]`) refuses a new one with `409`.

use std::time::Duration;

use axum::extract::{Request, State};
use axum::response::Response;
use http::StatusCode;
use serde_json::{Map, Value, json};
use sluice::control::{ControlError, MAX_BULK};
use sluice::core::policy::{format_duration_ms, parse_duration_ms, within_max_duration};
use sluice::{BanEntry, Identity, ListEntry, ListKind, OverrideEntry, OverrideTarget};

use super::check::parse_identity;
use super::{count, json_response, kind, problem, read_json};
use crate::config::control::{ParamsText, overlay};
use crate::state::{Runtime, Shared};

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

/// The most per-entry errors a refused bulk import lists.
const MAX_LISTED_ERRORS: usize = 100;

/// Reads `entries` of a bulk import: every entry, or every error (index, entry, message).
fn bulk_entries(list: Vec<Value>) -> Result<Vec<ListEntry>, (String, Vec<Value>)> {
    if list.is_empty() {
        return Err(("\"entries\" must not be empty".into(), Vec::new()));
    }
    if list.len() > MAX_BULK {
        return Err((
            format!(
                "\"entries\" holds {} entries: at most {MAX_BULK} per call (send several calls)",
                list.len()
            ),
            Vec::new(),
        ));
    }
    let total = list.len();
    let mut entries = Vec::with_capacity(total);
    let mut errors = Vec::new();
    let mut bad = 0usize;
    for (i, v) in list.into_iter().enumerate() {
        let parsed = match &v {
            Value::String(s) => ListEntry::parse(s),
            other => Err(format!("must be a string, not {}", kind(other))),
        };
        match parsed {
            Ok(e) => entries.push(e),
            Err(msg) => {
                bad += 1;
                if errors.len() < MAX_LISTED_ERRORS {
                    errors.push(json!({"index": i, "entry": v, "error": msg}));
                }
            }
        }
    }
    if bad == 0 {
        return Ok(entries);
    }
    let first = &errors[0];
    Err((
        format!(
            "{bad} of {total} entries are invalid, so none was added (all or nothing); the \
             first, at index {}: {}",
            first["index"],
            first["error"].as_str().unwrap_or_default()
        ),
        errors,
    ))
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

async fn list_change(shared: Shared, req: Request, which: ListKind, add: bool) -> Response {
    const EP: &str = "lists";
    let (rt, peer, mut m) = match admit(&shared, req, EP).await {
        Ok(x) => x,
        Err(res) => return res,
    };
    if add && m.contains_key("entries") {
        return list_add_many(&rt, &peer, m, which).await;
    }
    let parsed = (|| {
        let entry = match (m.remove("entry"), m.contains_key("credential")) {
            (Some(Value::String(s)), false) => ListEntry::parse(&s)?,
            (Some(_), true) => {
                return Err("give either \"entry\" or \"credential\", not both".into());
            }
            (None, true) => ListEntry::Identity(need_identity(&rt, &mut m)?.as_str().to_string()),
            (Some(other), false) => {
                return Err(format!("\"entry\" must be a string, not {}", kind(&other)));
            }
            (None, false) => {
                return Err(
                    "missing \"entry\" (an identity, address or CIDR such as 203.0.113.0/24)"
                        .into(),
                );
            }
        };
        let ttl = if add { duration(&mut m, "ttl")? } else { None };
        no_more_fields(
            &m,
            if add {
                "entry or credential, ttl"
            } else {
                "entry or credential"
            },
        )?;
        Ok::<_, String>((entry, ttl))
    })();
    let (entry, ttl) = match parsed {
        Ok(x) => x,
        Err(msg) => return bad(EP, &msg),
    };
    let list = match which {
        ListKind::Allow => "allow",
        ListKind::Deny => "deny",
    };
    let control = rt.limiter.control();
    if add {
        match control.list_add(which, &entry, ttl).await {
            Ok(()) => {
                tracing::info!(target: "sluice::admin", source = %peer, list, entry = entry.text(), ttl_ms = ttl.map(|t| t.as_millis() as u64), "list entry added");
                ok(
                    EP,
                    &json!({"list": list, "entry": entry.text(), "ttl_ms": ttl.map(|t| t.as_millis() as u64)}),
                )
            }
            Err(e) => store_failed(EP, &e),
        }
    } else {
        match control.list_remove(which, &entry).await {
            Ok(true) => {
                tracing::info!(target: "sluice::admin", source = %peer, list, entry = entry.text(), "list entry removed");
                ok(
                    EP,
                    &json!({"list": list, "entry": entry.text(), "removed": true}),
                )
            }
            Ok(false) => not_found(
                EP,
                &format!("{} is not on the runtime {list} list", entry.text()),
            ),
            Err(e) => store_failed(EP, &e),
        }
    }
}

/// `POST /v1/lists/{allow,deny}` with `entries`: a bulk import, all or nothing.
async fn list_add_many(
    rt: &Runtime,
    peer: &str,
    mut m: Map<String, Value>,
    which: ListKind,
) -> Response {
    const EP: &str = "lists";
    let list = match which {
        ListKind::Allow => "allow",
        ListKind::Deny => "deny",
    };
    let parsed = (|| {
        let raw = match m.remove("entries") {
            Some(Value::Array(a)) => a,
            Some(other) => {
                return Err((
                    format!(
                        "\"entries\" must be a list of strings, not {}",
                        kind(&other)
                    ),
                    Vec::new(),
                ));
            }
            None => unreachable!("checked by the caller"),
        };
        if m.contains_key("entry") || m.contains_key("credential") {
            return Err((
                "give either \"entries\" or one \"entry\"/\"credential\", not both".into(),
                Vec::new(),
            ));
        }
        let ttl = duration(&mut m, "ttl").map_err(|e| (e, Vec::new()))?;
        no_more_fields(&m, "entries, ttl").map_err(|e| (e, Vec::new()))?;
        Ok((bulk_entries(raw)?, ttl))
    })();
    let (entries, ttl) = match parsed {
        Ok(x) => x,
        Err((msg, errors)) if errors.is_empty() => return bad(EP, &msg),
        Err((msg, errors)) => {
            count(EP, StatusCode::BAD_REQUEST);
            return problem_with(StatusCode::BAD_REQUEST, &msg, json!({"errors": errors}));
        }
    };
    match rt
        .limiter
        .control()
        .list_add_many(which, &entries, ttl)
        .await
    {
        Ok(added) => {
            tracing::info!(target: "sluice::admin", source = %peer, list, entries = added, ttl_ms = ttl.map(|t| t.as_millis() as u64), "list entries added");
            ok(
                EP,
                &json!({"list": list, "added": added, "ttl_ms": ttl.map(|t| t.as_millis() as u64)}),
            )
        }
        Err(e) => store_failed(EP, &e),
    }
}

/// `POST /v1/lists/allow`.
pub(super) async fn allow_add(State(shared): State<Shared>, req: Request) -> Response {
    list_change(shared, req, ListKind::Allow, true).await
}

/// `DELETE /v1/lists/allow`.
pub(super) async fn allow_remove(State(shared): State<Shared>, req: Request) -> Response {
    list_change(shared, req, ListKind::Allow, false).await
}

/// `POST /v1/lists/deny`.
pub(super) async fn deny_add(State(shared): State<Shared>, req: Request) -> Response {
    list_change(shared, req, ListKind::Deny, true).await
}

/// `DELETE /v1/lists/deny`.
pub(super) async fn deny_remove(State(shared): State<Shared>, req: Request) -> Response {
    list_change(shared, req, ListKind::Deny, false).await
}

/// The OpenAPI entries of these endpoints.
pub(super) fn add_openapi(doc: &mut Value) {
    let problem = |what: &str| json!({ "description": what, "content": { "application/problem+json": { "schema": { "$ref": "#/components/schemas/Problem" } } } });
    let body = |schema: &str| json!({ "required": true, "content": { "application/json": { "schema": { "$ref": format!("#/components/schemas/{schema}") } } } });
    let answer = |what: &str| json!({ "description": what, "content": { "application/json": { "schema": { "type": "object" } } } });
    let errors = |notfound: Option<&str>| {
        let mut r = json!({
            "400": problem("Malformed request, unknown policy or plan, parameters the algorithm does not take"),
            "401": problem("admin_token is set (else server.api_token) and the request does not carry it"),
            "409": problem("The table holds its most entries ([control] max_*); nothing changed"),
            "503": problem("The store did not answer; nothing changed"),
        });
        if let Some(what) = notfound {
            r["404"] = problem(what);
        }
        r
    };
    let with = |ok: Value, mut errs: Value| {
        errs["200"] = ok;
        errs
    };
    let paths = json!({
        "/v1/overrides": {
            "post": { "summary": "Bind one identity of one policy to other parameters or to a plan, optionally for a ttl",
                "requestBody": body("OverrideRequest"),
                "responses": with(answer("The override: policy, identity, plan, params (effective), expires_at_ms"), errors(None)) },
            "get": { "summary": "Read the override of ?policy=P&identity=I (or &credential=C)",
                "responses": with(answer("The override"), errors(Some("No override"))) },
            "delete": { "summary": "Remove an override", "requestBody": body("PolicyIdentity"),
                "responses": with(answer("{removed: true}"), errors(Some("No override"))) }
        },
        "/v1/bans": {
            "post": { "summary": "Ban an identity for a duration, from every policy or the listed ones",
                "requestBody": body("BanRequest"),
                "responses": with(answer("The ban: identity, policies, until_ms, retry_after_ms"), errors(None)) },
            "delete": { "summary": "Lift every ban of an identity", "requestBody": body("Identity"),
                "responses": with(answer("{removed: true}"), errors(Some("No ban"))) }
        },
        "/v1/lists/allow": {
            "post": { "summary": "Add an identity or network that bypasses every limit (still counted in metrics)", "requestBody": body("ListEntry"),
                "responses": with(answer("The entry"), errors(None)) },
            "delete": { "summary": "Remove a runtime allow entry", "requestBody": body("ListEntry"),
                "responses": with(answer("{removed: true}"), errors(Some("Not on the runtime list"))) }
        },
        "/v1/lists/deny": {
            "post": { "summary": "Add an identity or network refused by every policy (reason denied, 403 in the proxy)", "requestBody": body("ListEntry"),
                "responses": with(answer("The entry"), errors(None)) },
            "delete": { "summary": "Remove a runtime deny entry", "requestBody": body("ListEntry"),
                "responses": with(answer("{removed: true}"), errors(Some("Not on the runtime list"))) }
        }
    });
    let who = json!({
        "identity": { "type": "string", "description": "e.g. user:42, ip:203.0.113.7" },
        "credential": { "type": "string", "description": "Instead of identity: a secret, hashed as /v1/check hashes it" }
    });
    let duration = json!({ "type": ["string", "integer"], "description": "A duration such as \"10m\", or whole seconds" });
    let with_who = |mut props: Value| {
        for (k, v) in who.as_object().into_iter().flatten() {
            props[k] = v.clone();
        }
        props
    };
    let schemas = json!({
        "OverrideRequest": { "type": "object", "additionalProperties": false, "required": ["policy"],
            "properties": with_who(json!({
                "policy": { "type": "string" },
                "params": { "type": "object", "description": "Parameters under the names of [policies.*] (capacity, rate, burst, limit, window, mode, lease), laid over the policy's own; same algorithm" },
                "plan": { "type": "string", "description": "A plan with a [plans.NAME.POLICY] table" },
                "ttl": duration.clone() })) },
        "PolicyIdentity": { "type": "object", "additionalProperties": false, "required": ["policy"],
            "properties": with_who(json!({ "policy": { "type": "string" } })) },
        "Identity": { "type": "object", "additionalProperties": false, "properties": with_who(json!({})) },
        "BanRequest": { "type": "object", "additionalProperties": false, "required": ["duration"],
            "properties": with_who(json!({
                "duration": duration.clone(),
                "policies": { "type": "array", "items": { "type": "string" }, "minItems": 1, "description": "The ban's scope; every policy when absent" } })) },
        "ListEntry": { "type": "object", "additionalProperties": false,
            "properties": {
                "entry": { "type": "string", "description": "An identity, an address or a CIDR (matched against ip:, ip6: and Envoy remote_address identities)" },
                "credential": { "type": "string", "description": "Instead of entry: a secret, hashed as /v1/check hashes it" },
                "entries": { "type": "array", "items": { "type": "string" }, "minItems": 1, "maxItems": MAX_BULK, "description": "POST only, instead of entry: up to 10,000 entries added all or nothing (any invalid entry refuses the call with a 400 listing the errors by index)" },
                "ttl": duration } }
    });
    for (k, v) in paths.as_object().into_iter().flatten() {
        doc["paths"][k] = v.clone();
    }
    for (k, v) in schemas.as_object().into_iter().flatten() {
        doc["components"]["schemas"][k] = v.clone();
    }
    if let Some(reasons) =
        doc["components"]["schemas"]["PolicyDecision"]["properties"]["reason"]["enum"]
            .as_array_mut()
    {
        reasons.extend([json!("banned"), json!("denied")]);
    }
}
