//! What is in force, for the operators' listing: bounded by the caller's limit, never by the
//! size of the tables, so listing a table of millions costs what the page holds.

use super::super::ListKind;
use super::super::clock::Now;
use super::super::entries::{BanEntry, OverrideEntry};
use super::super::networks::Listed;
use super::Tables;

/// One list entry in force, for the operators' listing.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct ListedPlace {
    pub(crate) kind: ListKind,
    /// The identity, or the network in CIDR form.
    pub(crate) entry: String,
    /// Written in the configuration file.
    pub(crate) configured: bool,
    /// Unix ms a runtime entry ends at (`None`: never, or a file entry).
    pub(crate) expires_at_ms: Option<u64>,
}

impl Tables {
    /// Overrides in force at `now_ms`, at most `limit` (in no order): (policy, identity,
    /// entry). The cost is bounded by `limit`, not by the table.
    pub(crate) fn live_overrides(
        &self,
        now_ms: u64,
        limit: usize,
    ) -> Vec<(&str, &str, &OverrideEntry)> {
        self.identities
            .iter()
            .flat_map(|(identity, e)| {
                e.overrides
                    .iter()
                    .map(move |(policy, slot)| (&**policy, &**identity, &slot.entry))
            })
            .filter(|(_, _, e)| e.expires_at_ms.is_none_or(|t| t > now_ms))
            .take(limit)
            .collect()
    }

    /// Bans in force at `now_ms`, at most `limit` (in no order): (identity, ban).
    pub(crate) fn live_bans(&self, now_ms: u64, limit: usize) -> Vec<(&str, &BanEntry)> {
        self.identities
            .iter()
            .flat_map(|(identity, e)| e.bans.iter().map(move |b| (&**identity, b)))
            .filter(|(_, b)| b.until_ms > now_ms)
            .take(limit)
            .collect()
    }

    /// List entries in force at `now_ms`, identities and networks, at most `limit` of each
    /// list (in no order).
    pub(crate) fn live_list_entries(&self, now_ms: u64, limit: usize) -> Vec<ListedPlace> {
        let now = Now::at(now_ms);
        let mut out = Vec::new();
        for kind in [ListKind::Allow, ListKind::Deny] {
            let before = out.len();
            let place = |entry: String, listed: Listed| {
                listed.live(&now).then(|| ListedPlace {
                    kind,
                    entry,
                    configured: listed.configured,
                    expires_at_ms: if listed.configured {
                        None
                    } else {
                        listed.runtime.flatten()
                    },
                })
            };
            for (identity, e) in &self.identities {
                let listed = match kind {
                    ListKind::Allow => e.lists.allow,
                    ListKind::Deny => e.lists.deny,
                };
                if out.len() - before >= limit {
                    break;
                }
                if !listed.is_empty() {
                    out.extend(place(identity.to_string(), listed));
                }
            }
            for (n, listed) in self.networks.of_kind(kind) {
                if out.len() - before >= limit {
                    break;
                }
                out.extend(place(n.to_string(), listed));
            }
        }
        out
    }
}
