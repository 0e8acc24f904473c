//! `/v1/check` and `/v1/release`: the decision API.
//!
//! A check names one or several policies and an identity; several policies are one
//! all-or-nothing check. The answer is 200 whatever the decision, with the numbers, the
//! headers to send and, for concurrency policies, a lease token to hand back to
//! `/v1/release`.

use std::fmt::Write as _;
use std::sync::Arc;

use axum::extract::{Request, State};
use axum::response::Response;
use http::StatusCode;
use serde_json::{Map, Value, json};
use sluice::core::LeaseId;
use sluice::core::key::MAX_IDENTITY_LEN;
use sluice::core::policy::MAX_EXACT;
use sluice::{Checked, Decision, Identity, Lease, Policy, Verdict};
use sluice_http::headers::{HeaderOptions, rate_limit_headers};

use super::{count, display_header_name, json_response, kind, problem, read_json};
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

pub(super) async fn check(State(shared): State<Shared>, req: Request) -> Response {
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
}
