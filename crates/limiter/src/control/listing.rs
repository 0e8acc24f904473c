//! The live control entries as a list, for operators to see what is in force (the console,
//! `sluice top`). Read from the local tables, which on a shared store follow the store within
//! one poll interval. A listing reads at most `limit + 1` entries of each kind, so asking for
//! one costs the same with a million entries as with a hundred (and holds the tables' read
//! lock as briefly): with more entries than `limit` it shows some of them, sorted.

use super::entries::OverrideTarget;
use super::{ControlPlane, ListKind};

/// One live override.
#[derive(Debug, Clone, PartialEq)]
pub struct ListedOverride {
    /// The policy it changes.
    pub policy: String,
    /// The identity, as keyed.
    pub identity: String,
    /// `plan:NAME` or the parameters as JSON.
    pub target: String,
    /// Unix ms it ends at; `None` = until removed.
    pub expires_at_ms: Option<u64>,
}

/// One live ban.
#[derive(Debug, Clone, PartialEq)]
pub struct ListedBan {
    /// The identity, as keyed.
    pub identity: String,
    /// The policies it refuses; `None` = every policy.
    pub policies: Option<Vec<String>>,
    /// Unix ms it ends at.
    pub until_ms: u64,
}

/// One live list entry.
#[derive(Debug, Clone, PartialEq)]
pub struct ListedEntry {
    /// Allow or deny.
    pub list: ListKind,
    /// The entry's canonical text.
    pub entry: String,
    /// Unix ms it ends at; `None` = until removed.
    pub expires_at_ms: Option<u64>,
    /// Written in the configuration file (removed only by changing the file).
    pub from_config: bool,
}

/// Every live entry, each kind sorted, at most `limit` of each kind.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ControlListing {
    /// Overrides by policy, then identity.
    pub overrides: Vec<ListedOverride>,
    /// Bans by identity.
    pub bans: Vec<ListedBan>,
    /// List entries: allow then deny.
    pub lists: Vec<ListedEntry>,
    /// True when some kind held more than `limit` entries (the listing then shows `limit` of
    /// them, not the first `limit` in order).
    pub truncated: bool,
}

impl ControlPlane {
    /// The entries in force now, at most `limit` of each kind, each kind sorted.
    pub fn listing(&self, limit: usize) -> ControlListing {
        let now = self.now_ms();
        let tables = self.shared.tables.read();
        let mut overrides: Vec<ListedOverride> = tables
            .live_overrides(now, limit.saturating_add(1))
            .into_iter()
            .map(|(policy, identity, e)| ListedOverride {
                policy: policy.to_string(),
                identity: identity.to_string(),
                target: match &e.target {
                    OverrideTarget::Plan(p) => format!("plan:{p}"),
                    OverrideTarget::Params(a) => {
                        serde_json::to_string(a).unwrap_or_else(|_| "{}".into())
                    }
                },
                expires_at_ms: e.expires_at_ms,
            })
            .collect();
        overrides.sort_by(|a, b| (&a.policy, &a.identity).cmp(&(&b.policy, &b.identity)));
        let mut bans: Vec<ListedBan> = tables
            .live_bans(now, limit.saturating_add(1))
            .into_iter()
            .map(|(identity, b)| ListedBan {
                identity: identity.to_string(),
                policies: b.policies.clone(),
                until_ms: b.until_ms,
            })
            .collect();
        bans.sort_by(|a, b| a.identity.cmp(&b.identity));
        let mut lists: Vec<ListedEntry> = tables
            .live_list_entries(now, limit.saturating_add(1))
            .into_iter()
            .map(|p| ListedEntry {
                list: p.kind,
                entry: p.entry,
                expires_at_ms: p.expires_at_ms,
                from_config: p.configured,
            })
            .collect();
        lists.sort_by(|a, b| {
            (a.list == ListKind::Deny, &a.entry).cmp(&(b.list == ListKind::Deny, &b.entry))
        });
        let truncated = overrides.len() > limit || bans.len() > limit || lists.len() > limit;
        overrides.truncate(limit);
        bans.truncate(limit);
        lists.truncate(limit);
        ControlListing {
            overrides,
            bans,
            lists,
            truncated,
        }
    }
}
