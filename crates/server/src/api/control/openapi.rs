//! The OpenAPI entries of the control endpoints (`/v1/overrides`, `/v1/bans`,
//! `/v1/lists/*`), apart from their handlers so the handlers read without the schema text.

use serde_json::{Value, json};
use sluice::control::MAX_BULK;

/// The OpenAPI entries of these endpoints.
pub(in crate::api) fn add_openapi(doc: &mut Value) {
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
                "entry": { "type": "string", "description": "An identity, an address or a CIDR (an address or CIDR matches the client address an identity carries: the client IP of the HTTP layer, or an Envoy remote_address descriptor; never the identity's text)" },
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
