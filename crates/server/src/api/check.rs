//! `/v1/check` and `/v1/release`: the decision API.
//!
//! A check names one or several policies and an identity; several policies are one
//! all-or-nothing check. The answer is 200 whatever the decision, with the numbers, the
//! headers to send and, for concurrency policies, a lease token to hand back to
//! `/v1/release`.
//!
//! Who is limited comes as `identity` (the caller's own name for it, e.g. `user:42`) or as
//! `credential` (a secret such as an API key). A credential is hashed here with the
//! configuration's `identity_hash_key`, exactly as the proxy hashes an API key header, so the
//! raw secret never reaches a key name and an app behind the proxy and one calling this API
//! share one bucket per key.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::response::Response;
use http::StatusCode;
use serde_json::{Map, Value, json};
use sluice::core::key::MAX_IDENTITY_LEN;
use sluice::core::policy::MAX_EXACT;
use sluice::{Checked, Decision, Identity, LeaseToken, Policy, Verdict};
use sluice_http::headers::{HeaderOptions, Shown, answer_headers, display_header_name, lead_of};
use sluice_http::identity::api_key_identity;

use super::{count, json_response, kind, problem, read_json};
use crate::state::{Runtime, Shared};

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
    let identity = parse_identity(rt, &mut m)?.ok_or_else(|| {
        "missing \"identity\" (who is limited, e.g. \"user:42\") or \"credential\" \
         (a secret such as an API key, hashed by the server)"
            .to_string()
    })?;
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
            "unknown field {k:?}: expected policy or policies, identity or credential, cost"
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

/// The identity of a request body: `"identity"` as given, or `"credential"` hashed as the
/// proxy hashes an API key. `None` when neither is given.
pub(super) fn parse_identity(
    rt: &Runtime,
    m: &mut Map<String, Value>,
) -> Result<Option<Identity>, String> {
    match (m.remove("identity"), m.remove("credential")) {
        (Some(_), Some(_)) => Err(
            "give either \"identity\" or \"credential\", not both: a credential is hashed \
             into the identity"
                .into(),
        ),
        (None, None) => Ok(None),
        (Some(Value::String(s)), None) if s.is_empty() => {
            Err("\"identity\" must not be empty".into())
        }
        (Some(Value::String(s)), None) if s.len() > MAX_IDENTITY_LEN => Err(format!(
            "\"identity\" is {} bytes; the most is {MAX_IDENTITY_LEN}",
            s.len()
        )),
        // `ip:ADDRESS` / `ip6:ADDRESS[/LEN]` as the proxy writes a client address, or a bare
        // address or network, names that client: the caller vouches for the address, and
        // the control plane's network lists apply. Any other text names no address.
        (Some(Value::String(s)), None) => Ok(Some(
            Identity::parse_address(&s).unwrap_or_else(|| Identity::new(s)),
        )),
        (Some(other), None) => Err(format!(
            "\"identity\" must be a string, not {}",
            kind(&other)
        )),
        (None, Some(Value::String(s))) if s.is_empty() => {
            Err("\"credential\" must not be empty".into())
        }
        (None, Some(Value::String(s))) => Ok(Some(api_key_identity(
            s.as_bytes(),
            &rt.config.identity_hash_key,
        ))),
        (None, Some(other)) => Err(format!(
            "\"credential\" must be a string, not {}",
            kind(&other)
        )),
    }
}

fn reason_name(d: &Decision) -> Value {
    match d.reason {
        None => Value::Null,
        Some(r) => serde_json::to_value(r).unwrap_or(Value::Null),
    }
}

/// The JSON answer to a check. Every number is the whole policy's (see
/// [`sluice_http::headers::Shown`]), so the JSON and the headers tell one story.
pub(super) fn check_answer(checked: &Checked, opts: &HeaderOptions) -> Value {
    // The headline numbers: the denying policy, else the enforced one with the least left.
    let lead = lead_of(checked);
    let (limit, remaining, reset) = lead.leader.map_or((0, 0, 0), |s| {
        (s.limit(), s.remaining(), s.decision.reset_after_ms)
    });
    let policies: Vec<Value> = checked
        .limits
        .iter()
        .map(|l| match &l.decision {
            Some(d) => {
                let shown = Shown::new(&l.policy, d);
                json!({
                    "policy": l.policy.name,
                    "allowed": d.allowed,
                    "shadow": l.policy.shadow,
                    "limit": shown.limit(),
                    "remaining": shown.remaining(),
                    "retry_after_ms": d.retry_after_ms,
                    "reset_after_ms": d.reset_after_ms,
                    "delay_ms": d.delay_ms,
                    "reason": reason_name(d),
                })
            }
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
    for (n, v) in answer_headers(checked, opts) {
        headers.insert(
            display_header_name(n.as_str()),
            Value::String(v.to_str().unwrap_or("").to_string()),
        );
    }
    let lease =
        LeaseToken::from_checked(checked).map_or(Value::Null, |t| Value::String(t.encode()));
    json!({
        "allowed": checked.allowed,
        "limit": limit,
        "remaining": remaining,
        "retry_after_ms": lead.wait_ms(),
        "reset_after_ms": reset,
        "delay_ms": checked.delay_ms(),
        "verdict": checked.verdict.as_str(),
        "policies": policies,
        "headers": headers,
        "lease": lease,
    })
}

pub(super) async fn check(State(shared): State<Shared>, req: Request) -> Response {
    // One span per check when `[telemetry]` is on, a child of the caller's `traceparent`.
    let span = shared
        .telemetry()
        .start_http(crate::telemetry::Entry::Api, req.headers());
    let status = |r: &Response| Some(i64::from(r.status().as_u16()));
    span.run(decide(shared, req), status).await
}

async fn decide(shared: Shared, req: Request) -> Response {
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

pub(super) async fn release(State(shared): State<Shared>, req: Request) -> Response {
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
    let identity = match parse_identity(&rt, &mut body) {
        Ok(id) => id,
        Err(msg) => {
            count("release", StatusCode::BAD_REQUEST);
            return problem(StatusCode::BAD_REQUEST, &msg);
        }
    };
    if let Some(k) = body.keys().next() {
        count("release", StatusCode::BAD_REQUEST);
        return problem(
            StatusCode::BAD_REQUEST,
            &format!("unknown field {k:?}: expected lease, and optionally identity or credential"),
        );
    }
    let policy = |name: &str| rt.config.policies.get(name).map(|pc| &*pc.policy);
    let leases = match LeaseToken::decode(&token)
        .and_then(|t| t.leases(rt.limiter.key_scheme(), policy, identity.as_ref()))
    {
        Ok(l) => l,
        Err(e) => {
            count("release", StatusCode::BAD_REQUEST);
            return problem(StatusCode::BAD_REQUEST, &e.to_string());
        }
    };
    let mut released = true;
    for lease in &leases {
        match rt.limiter.release(lease).await {
            Ok(held) => released &= held,
            Err(e) => {
                let status = sluice_http::headers::store_error_status(&e);
                count("release", status);
                return problem(
                    status,
                    &format!("could not release the lease: {e}; it expires by itself"),
                );
            }
        }
    }
    count("release", StatusCode::OK);
    json_response(StatusCode::OK, &json!({ "released": released }))
}
