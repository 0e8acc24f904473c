//! What the configuration gives the control plane (plans, ban rules, the file's lists, the
//! tables' maxima) and the vocabulary its operations answer in (tables, lists, errors):
//! plain data, apart from the plane that acts on it.

use std::collections::HashMap;

use sluice_core::{Algorithm, StoreError};

use super::entries::ListEntry;

/// The most entries of each control table (`[control]` in the server's configuration).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ControlLimits {
    /// Runtime allow-list entries (default 1,000,000).
    pub max_allow: u64,
    /// Runtime deny-list entries (default 2,000,000).
    pub max_deny: u64,
    /// Bans, one per identity and scope, automatic ones included (default 1,000,000).
    pub max_bans: u64,
    /// Overrides, one per policy and identity (default 1,000,000).
    pub max_overrides: u64,
    /// The largest request body the HTTP control endpoints read, in bytes (default 6 MiB:
    /// a bulk import of [`super::MAX_BULK`] entries fits). The control plane itself ignores it.
    pub max_body_bytes: u64,
}

impl Default for ControlLimits {
    fn default() -> Self {
        ControlLimits {
            max_allow: 1_000_000,
            max_deny: 2_000_000,
            max_bans: 1_000_000,
            max_overrides: 1_000_000,
            max_body_bytes: 6 << 20,
        }
    }
}

impl ControlLimits {
    pub(super) fn max_of(&self, table: Table) -> u64 {
        match table {
            Table::Overrides => self.max_overrides,
            Table::Bans => self.max_bans,
            Table::Allow => self.max_allow,
            Table::Deny => self.max_deny,
        }
    }
}

/// Why a change was not made.
#[derive(Debug, thiserror::Error)]
pub enum ControlError {
    /// The table holds its most entries already; nothing changed.
    #[error("the {table} table is full: it holds at most {max} entries (control.max_{table})")]
    Full {
        /// `allow`, `deny`, `bans` or `overrides`.
        table: &'static str,
        /// Its most entries.
        max: u64,
    },
    /// The store refused or did not answer, or the request was invalid
    /// ([`StoreError::Invalid`]); nothing changed.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// One control table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Table {
    Overrides,
    Bans,
    Allow,
    Deny,
}

impl Table {
    pub(super) fn of(kind: ListKind) -> Self {
        match kind {
            ListKind::Allow => Table::Allow,
            ListKind::Deny => Table::Deny,
        }
    }

    /// Its name in messages and in `control.max_*`.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Table::Overrides => "overrides",
            Table::Bans => "bans",
            Table::Allow => "allow",
            Table::Deny => "deny",
        }
    }

    /// Its one-letter code in the store's log and expiry set.
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    pub(super) fn code(self) -> &'static str {
        match self {
            Table::Overrides => "o",
            Table::Bans => "b",
            Table::Allow => "a",
            Table::Deny => "d",
        }
    }

    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    pub(super) fn from_code(code: &str) -> Option<Self> {
        Some(match code {
            "o" => Table::Overrides,
            "b" => Table::Bans,
            "a" => Table::Allow,
            "d" => Table::Deny,
            _ => return None,
        })
    }
}

/// A policy's automatic ban: `after` denials within `within_ms` ban the identity for
/// `duration_ms`; each ban while the previous one's level is remembered lasts `multiplier`
/// times longer, at most `max_ms`. The level is forgotten `max_ms` after a ban ends.
#[derive(Debug, Clone, PartialEq)]
pub struct BanRule {
    /// Denials that trigger a ban.
    pub after: u32,
    /// The window the denials are counted in, ms.
    pub within_ms: u64,
    /// The first ban's length, ms.
    pub duration_ms: u64,
    /// Growth of each repeat ban.
    pub multiplier: f64,
    /// The longest ban, ms.
    pub max_ms: u64,
}

impl BanRule {
    /// The length of a ban at escalation `level` (0 for the first).
    pub fn duration_at(&self, level: u32) -> u64 {
        let ms = self.duration_ms as f64 * self.multiplier.powi(level.min(64) as i32);
        if ms.is_finite() {
            (ms as u64).clamp(1, self.max_ms.max(1))
        } else {
            self.max_ms.max(1)
        }
    }
}

/// What the configuration contributes: plans, ban rules and the lists written in the file.
#[derive(Debug, Clone, Default)]
pub struct ControlConfig {
    /// Plan name, then policy name, to the parameters of that policy in that plan.
    pub plans: HashMap<String, HashMap<String, Algorithm>>,
    /// Policy name to its automatic ban.
    pub bans: HashMap<String, BanRule>,
    /// Identities and networks that bypass every limit.
    pub allow: Vec<ListEntry>,
    /// Identities and networks refused by every policy.
    pub deny: Vec<ListEntry>,
    /// The most entries of each table.
    pub limits: ControlLimits,
}

/// Which list.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ListKind {
    /// Bypasses limits.
    Allow,
    /// Refused.
    Deny,
}
