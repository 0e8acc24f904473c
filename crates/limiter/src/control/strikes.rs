//! Automatic bans: a policy's [`BanRule`] counts the enforced denials of each identity and
//! bans it after `after` of them within `within_ms`, each repeat ban longer. On Redis the
//! counting is a script ([`super::redis`]); on the embedded backend it is these counters,
//! bounded so a flood of distinct identities cannot grow them without end.

use std::collections::HashMap;
use std::sync::atomic::Ordering;

use super::clock::Now;
use super::{Backend, BanEntry, BanRule, ControlPlane};

/// Counters of the embedded backend's automatic bans.
#[derive(Debug, Default)]
pub(super) struct Strikes {
    /// (policy, identity) to (denials, window start ms).
    pub(super) counts: HashMap<(String, String), (u32, u64)>,
    /// (policy, identity) to (escalation level, forgotten at ms).
    pub(super) levels: HashMap<(String, String), (u32, u64)>,
}

/// The most identities whose denials (and escalation levels) the embedded backend counts
/// at once.
const MAX_STRIKE_ENTRIES: usize = 100_000;

impl ControlPlane {
    /// Counts a denial of `identity` by `policy` towards the policy's automatic ban.
    pub(crate) fn note_denial(&self, identity: &str, policy: &str) {
        if !self.shared.has_ban_rules.load(Ordering::Relaxed) {
            return;
        }
        let Some(rule) = self
            .shared
            .configured
            .read()
            .config
            .bans
            .get(policy)
            .cloned()
        else {
            return;
        };
        let now = self.now_ms();
        if self
            .shared
            .tables
            .read()
            .ban_left_ms(identity, policy, &Now::at(now))
            > 0
        {
            return;
        }
        match &self.shared.backend {
            Backend::Local => {
                if let Some(ban) = self.local_strike(identity, policy, &rule, now) {
                    self.shared.tables.write().add_ban(identity, ban);
                    self.shared.automatic_bans.fetch_add(1, Ordering::Relaxed);
                    self.shared.update_active();
                    metrics::counter!("sluice_bans_total", "policy" => policy.to_string(), "source" => "automatic")
                        .increment(1);
                }
            }
            #[cfg(feature = "redis")]
            Backend::Redis(r) => r.strike(&self.shared, identity, policy, rule, now),
        }
    }

    fn local_strike(
        &self,
        identity: &str,
        policy: &str,
        rule: &BanRule,
        now: u64,
    ) -> Option<BanEntry> {
        let mut s = self.shared.strikes.lock();
        if s.counts.len() >= MAX_STRIKE_ENTRIES {
            s.counts
                .retain(|_, (_, start)| now < start.saturating_add(rule.within_ms));
            if s.counts.len() >= MAX_STRIKE_ENTRIES {
                return None;
            }
        }
        let key = (policy.to_string(), identity.to_string());
        let count = s.counts.entry(key.clone()).or_insert((0, now));
        if now >= count.1.saturating_add(rule.within_ms) {
            *count = (0, now);
        }
        count.0 += 1;
        if count.0 < rule.after {
            return None;
        }
        s.counts.remove(&key);
        let level = match s.levels.get(&key) {
            Some(&(level, forget_at)) if forget_at > now => level,
            _ => 0,
        };
        let until = now.saturating_add(rule.duration_at(level));
        if s.levels.len() >= MAX_STRIKE_ENTRIES && !s.levels.contains_key(&key) {
            s.levels.retain(|_, (_, forget_at)| *forget_at > now);
        }
        if s.levels.len() < MAX_STRIKE_ENTRIES || s.levels.contains_key(&key) {
            s.levels
                .insert(key, (level + 1, until.saturating_add(rule.max_ms)));
        }
        Some(BanEntry {
            policies: Some(vec![policy.to_string()]),
            until_ms: until,
        })
    }
}
