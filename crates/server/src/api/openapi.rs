//! The OpenAPI 3.1 description of the HTTP listener, served at `/openapi.json`.

use axum::response::Response;
use http::StatusCode;
use serde_json::{Value, json};
use sluice::core::key::MAX_IDENTITY_LEN;
use sluice::core::policy::MAX_EXACT;

use super::json_response;

pub(super) async fn openapi_json() -> Response {
    json_response(StatusCode::OK, &openapi())
}

/// The OpenAPI 3.1 description of the HTTP listener.
pub fn openapi() -> Value {
    let problem = json!({ "description": "Malformed request", "content": { "application/problem+json": { "schema": { "$ref": "#/components/schemas/Problem" } } } });
    let mut doc = json!({
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
                        "several": { "value": { "policies": ["burst", "daily"], "identity": "user:42" } },
                        "credential": { "value": { "policy": "per-key", "credential": "sk_live_abc" } }
                    } } } },
                "responses": {
                    "200": { "description": "The decision", "content": { "application/json": { "schema": { "$ref": "#/components/schemas/CheckResponse" } } } },
                    "400": problem.clone(),
                    "401": { "description": "server.api_token is set and the request does not carry it", "content": { "application/problem+json": { "schema": { "$ref": "#/components/schemas/Problem" } } } },
                    "413": { "description": "Body larger than server.max_body_bytes", "content": { "application/problem+json": { "schema": { "$ref": "#/components/schemas/Problem" } } } },
                    "415": { "description": "Body is not application/json", "content": { "application/problem+json": { "schema": { "$ref": "#/components/schemas/Problem" } } } }
                }
            } },
            "/v1/release": { "post": {
                "summary": "Release the concurrency leases a check took",
                "requestBody": { "required": true, "content": { "application/json": { "schema": { "$ref": "#/components/schemas/ReleaseRequest" } } } },
                "responses": {
                    "200": { "description": "Released (false when the lease had already expired)", "content": { "application/json": { "schema": {
                        "type": "object", "required": ["released"], "properties": { "released": { "type": "boolean" } } } } } },
                    "400": problem,
                    "401": { "description": "server.api_token is set and the request does not carry it" },
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
                "type": "object", "additionalProperties": false,
                "properties": {
                    "policy": { "type": "string", "description": "A policy name from the configuration" },
                    "policies": { "type": "array", "items": { "type": "string" }, "minItems": 1, "description": "Several policies, all-or-nothing" },
                    "identity": { "type": "string", "minLength": 1, "maxLength": MAX_IDENTITY_LEN, "description": "Who is limited, e.g. user:42 or ip:203.0.113.7" },
                    "credential": { "type": "string", "minLength": 1, "description": "Instead of identity: a secret such as an API key, hashed by the server with identity_hash_key exactly as the proxy hashes an API key header" },
                    "cost": { "type": "integer", "minimum": 0, "maximum": MAX_EXACT, "default": 1, "description": "Units to consume; 0 only looks" }
                },
                "allOf": [
                    { "oneOf": [ { "required": ["policy"] }, { "required": ["policies"] } ] },
                    { "oneOf": [ { "required": ["identity"] }, { "required": ["credential"] } ] }
                ]
            },
            "CheckResponse": {
                "type": "object",
                "required": ["allowed", "limit", "remaining", "retry_after_ms", "reset_after_ms", "policies", "headers", "lease"],
                "properties": {
                    "allowed": { "type": "boolean", "description": "Let the request through" },
                    "limit": { "type": "integer", "description": "Quota of the deciding policy (the denying one, else the one with the least left); a sharded policy's whole quota" },
                    "remaining": { "type": "integer" },
                    "retry_after_ms": { "type": "integer", "description": "0 when allowed; otherwise when to retry" },
                    "reset_after_ms": { "type": "integer", "description": "Time until the deciding policy is back to full" },
                    "delay_ms": { "type": "integer", "description": "Shaping policies: hold the request this long" },
                    "verdict": { "enum": ["decided", "failed_open", "failed_closed"], "description": "failed_* when the store did not answer" },
                    "policies": { "type": "array", "items": { "$ref": "#/components/schemas/PolicyDecision" } },
                    "headers": { "type": "object", "additionalProperties": { "type": "string" }, "description": "Headers to send on your response: RateLimit-Policy, RateLimit; on a denial also Retry-After and Cache-Control: no-store" },
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
            "ReleaseRequest": { "type": "object", "additionalProperties": false, "required": ["lease"], "properties": {
                "lease": { "type": "string" },
                "identity": { "type": "string", "description": "Optional: refuse the token unless its leases are this identity's" },
                "credential": { "type": "string", "description": "Optional, instead of identity: the same check for a hashed credential" } } },
            "Problem": { "type": "object", "properties": {
                "type": { "type": "string" }, "title": { "type": "string" }, "status": { "type": "integer" }, "detail": { "type": "string" } } }
        } }
    });
    super::state::add_openapi(&mut doc);
    super::reserve::add_openapi(&mut doc);
    super::control::add_openapi(&mut doc);
    super::stats::add_openapi(&mut doc);
    doc
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn openapi_is_complete() {
        let doc = openapi();
        for p in [
            "/v1/check",
            "/v1/release",
            "/healthz",
            "/readyz",
            "/metrics",
            "/v1/state",
            "/v1/charge",
            "/v1/refund",
            "/v1/overrides",
            "/v1/bans",
            "/v1/lists/allow",
            "/v1/lists/deny",
            "/v1/stats",
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
