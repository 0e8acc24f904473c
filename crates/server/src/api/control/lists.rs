//! `/v1/lists/allow` and `/v1/lists/deny`: one entry added or removed, or a bulk import of
//! up to [`MAX_BULK`] entries that is all or nothing (an invalid entry refuses the whole call
//! with its errors listed by index, so an operator never has to find out which half landed).

use axum::extract::{Request, State};
use axum::response::Response;
use http::StatusCode;
use serde_json::{Map, Value, json};
use sluice::control::MAX_BULK;
use sluice::{ListEntry, ListKind};

use super::{
    admit, bad, duration, need_identity, no_more_fields, not_found, ok, problem_with, store_failed,
};
use crate::api::{count, kind};
use crate::state::{Runtime, Shared};

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
pub(in crate::api) async fn allow_add(State(shared): State<Shared>, req: Request) -> Response {
    list_change(shared, req, ListKind::Allow, true).await
}

/// `DELETE /v1/lists/allow`.
pub(in crate::api) async fn allow_remove(State(shared): State<Shared>, req: Request) -> Response {
    list_change(shared, req, ListKind::Allow, false).await
}

/// `POST /v1/lists/deny`.
pub(in crate::api) async fn deny_add(State(shared): State<Shared>, req: Request) -> Response {
    list_change(shared, req, ListKind::Deny, true).await
}

/// `DELETE /v1/lists/deny`.
pub(in crate::api) async fn deny_remove(State(shared): State<Shared>, req: Request) -> Response {
    list_change(shared, req, ListKind::Deny, false).await
}
