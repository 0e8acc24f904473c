//! The text form of the entries in the store (the Redis backend's hashes and change log).
//! Every stored value starts with its expiry in Unix ms (`0` = never), so one rule prunes
//! every kind: `<expires>` for list entries and bans, `<expires>\n<target>` for overrides.
//! Kept in one place so the writer and the reader cannot drift apart.
#![cfg_attr(not(feature = "redis"), allow(dead_code))]

use super::entries::{BanEntry, OverrideEntry, OverrideTarget};

/// The field of an override or escalation level: policy and identity.
pub(crate) fn pair_field(policy: &str, identity: &str) -> String {
    format!("{policy}\n{identity}")
}

/// The field of a ban: identity and scope (`*` for every policy, else the sorted policies).
pub(crate) fn ban_field(identity: &str, policies: Option<&[String]>) -> String {
    match policies {
        None => format!("{identity}\n*"),
        Some(ps) => format!("{identity}\n{}", ps.join(",")),
    }
}

fn expiry_text(expires: Option<u64>) -> String {
    expires.unwrap_or(0).to_string()
}

fn read_expiry(text: &str) -> Option<Option<u64>> {
    let n: u64 = text.parse().ok()?;
    Some((n > 0).then_some(n))
}

/// The stored value of an override.
pub(crate) fn encode_override(o: &OverrideEntry) -> String {
    let target = match &o.target {
        OverrideTarget::Plan(p) => format!("plan:{p}"),
        OverrideTarget::Params(a) => {
            format!(
                "params:{}",
                serde_json::to_string(a).unwrap_or_else(|_| "{}".into())
            )
        }
    };
    format!("{}\n{target}", expiry_text(o.expires_at_ms))
}

/// Reads an override's field and value back; `None` for anything malformed.
pub(crate) fn decode_override(field: &str, value: &str) -> Option<(String, String, OverrideEntry)> {
    let (policy, identity) = field.split_once('\n')?;
    let (expires, target) = value.split_once('\n')?;
    let target = if let Some(plan) = target.strip_prefix("plan:") {
        OverrideTarget::Plan(plan.to_string())
    } else {
        let json = target.strip_prefix("params:")?;
        OverrideTarget::Params(serde_json::from_str(json).ok()?)
    };
    Some((
        policy.to_string(),
        identity.to_string(),
        OverrideEntry {
            target,
            expires_at_ms: read_expiry(expires)?,
        },
    ))
}

/// Reads a ban's field and value back.
pub(crate) fn decode_ban(field: &str, value: &str) -> Option<(String, BanEntry)> {
    let (identity, scope) = field.split_once('\n')?;
    let policies = (scope != "*").then(|| scope.split(',').map(str::to_string).collect());
    Some((
        identity.to_string(),
        BanEntry {
            policies,
            until_ms: value.parse().ok()?,
        },
    ))
}

/// The stored value of a list entry or ban: its expiry.
pub(crate) fn encode_expiry(expires: Option<u64>) -> String {
    expiry_text(expires)
}

/// Reads a list entry's expiry back.
pub(crate) fn decode_expiry(value: &str) -> Option<Option<u64>> {
    read_expiry(value)
}
