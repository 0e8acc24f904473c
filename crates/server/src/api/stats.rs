//! `GET /v1/stats`: everything the console and `sluice top` show, as one JSON document.
//!
//! It names identities (the heaviest ones, the banned ones), so it takes the admin token as
//! the control plane does (else `server.api_token` when only that is set). Identities appear
//! as keyed: a credential only as its keyed hash.

use axum::extract::State;
use axum::response::Response;
use http::StatusCode;
use serde_json::{Value, json};
use sluice::ListKind;

use super::{count, json_response};
use crate::state::Shared;

/// Identities in each heavy-hitter list of the report.
const TOP_N: usize = 20;

/// Entries of each control kind listed.
const MAX_LISTED: usize = 200;

pub(super) async fn stats(State(shared): State<Shared>) -> Response {
    let rt = shared.runtime();
    // The token itself was checked by the auth boundary ([`super::auth`]) before this ran.
    let guarded = rt.config.guarded(sluice_config::Access::Control);
    if !served_without_token(&rt.config, guarded) {
        count("stats", StatusCode::FORBIDDEN);
        return super::problem(
            StatusCode::FORBIDDEN,
            "/v1/stats names identities: set admin_token to serve it on a non-loopback listener              (or server.public_admin_without_token = true)",
        );
    }
    let mut configured: Vec<&str> = rt.config.policies.keys().map(String::as_str).collect();
    configured.sort_unstable();
    let mut report = shared.stats().report(TOP_N, &configured);
    let policies: Vec<Value> = configured
        .iter()
        .filter_map(|n| rt.config.policies.get(*n))
        .map(|pc| {
            json!({
                "name": pc.policy.name,
                "shadow": pc.policy.shadow,
                "quota": pc.policy.algorithm.quota(),
            })
        })
        .collect();
    let control = rt.limiter.control();
    let listing = control.listing(MAX_LISTED);
    let overrides: Vec<Value> = listing
        .overrides
        .iter()
        .map(|o| json!({"policy": o.policy, "identity": o.identity, "target": o.target, "expires_at_ms": o.expires_at_ms}))
        .collect();
    let bans: Vec<Value> = listing
        .bans
        .iter()
        .map(|b| json!({"identity": b.identity, "policies": b.policies, "until_ms": b.until_ms}))
        .collect();
    let lists: Vec<Value> = listing
        .lists
        .iter()
        .map(|e| {
            json!({
                "list": match e.list { ListKind::Allow => "allow", ListKind::Deny => "deny" },
                "entry": e.entry,
                "expires_at_ms": e.expires_at_ms,
                "from_config": e.from_config,
            })
        })
        .collect();
    let store = rt.limiter.store().kind();
    if let Value::Object(m) = &mut report {
        m.insert("generation".into(), json!(rt.generation));
        m.insert("configured_policies".into(), Value::from(policies));
        m.insert(
            "control".into(),
            json!({
                "backend": control.backend(),
                "snapshot_age_seconds": control.snapshot_age().map(|a| a.as_secs_f64()),
                "sizes": control_sizes(control),
                "overrides": overrides,
                "bans": bans,
                "lists": lists,
                "truncated": listing.truncated,
            }),
        );
        if let Some(Value::Object(s)) = m.get_mut("store") {
            s.insert("kind".into(), json!(store));
            s.insert(
                "breaker".into(),
                json!(if rt.limiter.store_circuit_open() {
                    "open"
                } else {
                    "closed"
                }),
            );
        }
    }
    count("stats", StatusCode::OK);
    json_response(StatusCode::OK, &report)
}

/// Runtime entries per control table in this instance's memory, with their limits.
fn control_sizes(control: &sluice::ControlPlane) -> Value {
    let (sizes, limits) = (control.sizes(), control.limits());
    json!({
        "allow": sizes.allow, "max_allow": limits.max_allow,
        "deny": sizes.deny, "max_deny": limits.max_deny,
        "bans": sizes.bans, "max_bans": limits.max_bans,
        "overrides": sizes.overrides, "max_overrides": limits.max_overrides,
    })
}

/// Identities are not for everyone who can reach a public listener: without any token the
/// report is served on a loopback listener only (or when explicitly allowed).
fn served_without_token(config: &crate::Config, guarded: bool) -> bool {
    guarded
        || config
            .server
            .admin
            .unwrap_or(config.server.http)
            .ip()
            .is_loopback()
        || config.server.public_admin_without_token
}

/// `/v1/stats` in the OpenAPI document.
pub(super) fn add_openapi(doc: &mut Value) {
    doc["paths"]["/v1/stats"] = json!({
        "get": {
            "summary": "Live statistics: per-policy counters of the last 5 minutes, store latency and breaker, heavy hitters, the last reload, control entries in force (docs/console.md)",
            "responses": {
                "200": { "description": "The report", "content": { "application/json": { "schema": { "type": "object",
                    "required": ["generation", "uptime_s", "policies", "store", "top", "last_reload", "control"] } } } },
                "401": { "description": "admin_token is set (else server.api_token) and the request does not carry it",
                    "content": { "application/problem+json": { "schema": { "$ref": "#/components/schemas/Problem" } } } }
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn without_a_token_only_a_loopback_listener_serves_the_report() {
        let config = |extra: &str| {
            crate::Config::parse(
                &format!("[server]\nhttp = \"127.0.0.1:8080\"\nadmin = \"0.0.0.0:9090\"\n{extra}"),
                "sluice.toml",
                None,
            )
            .unwrap()
        };
        assert!(!served_without_token(&config(""), false));
        assert!(served_without_token(&config(""), true));
        assert!(served_without_token(
            &config("public_admin_without_token = true"),
            false
        ));
        let local = crate::Config::parse("", "sluice.toml", None).unwrap();
        assert!(served_without_token(&local, false));
        // A public decision listener with a loopback admin listener: the report is served
        // on the admin listener only, so without a token.
        let split = crate::Config::parse(
            "[server]\nhttp = \"0.0.0.0:8080\"\nadmin = \"127.0.0.1:9090\"\n",
            "sluice.toml",
            None,
        )
        .unwrap();
        assert!(served_without_token(&split, false));
    }
}
