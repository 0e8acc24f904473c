//! The tables every decision reads: identities (their list places, bans and overrides) and
//! the lists' networks, with the expiry queue the sweep works from. Both backends keep one:
//! the embedded backend edits it directly, the Redis backend rebuilds it from its hashes and
//! change log ([`super::store_format`] spells the entries there).
//!
//! A decision looks its identity up by text, and its address (only when the identity
//! carries one, [`sluice_core::Identity::network`]) in the networks: no identity's text is
//! ever read as an address.
#![cfg_attr(not(feature = "redis"), allow(dead_code))]

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};

use ipnet::IpNet;
use sluice_core::{Algorithm, ClientNet};

use super::ListKind;
use super::clock::Now;
use super::entries::{BanEntry, ListEntry, OverrideEntry, OverrideTarget};
use super::made::OverrideSlot;
use super::networks::{Listed, Lists, Networks};
use super::store_format::ban_field;

mod expiry;
mod live;

/// The maps every decision reads: foldhash instead of SipHash, since each check hashes its
/// identity several times; the tables hold only what operators and the ban rules wrote.
pub(super) type FastMap<K, V> = HashMap<K, V, foldhash::fast::RandomState>;

/// Everything the tables hold about one identity: one probe answers "listed, banned or
/// overridden" for a decision.
#[derive(Debug, Default)]
struct IdentityEntries {
    lists: Lists,
    bans: Vec<BanEntry>,
    /// By policy name (an identity has overrides for a few policies at most).
    overrides: Vec<(Box<str>, OverrideSlot)>,
}

impl IdentityEntries {
    fn is_empty(&self) -> bool {
        self.lists.is_empty() && self.bans.is_empty() && self.overrides.is_empty()
    }

    fn override_of(&self, policy: &str, now: &Now<'_>) -> Option<&OverrideSlot> {
        self.overrides
            .iter()
            .find(|(p, _)| &**p == policy)
            .map(|(_, o)| o)
            .filter(|o| o.entry.expires_at_ms.is_none_or(|t| t > now.ms()))
    }

    fn ban_left_ms(&self, policy: &str, now: &Now<'_>) -> u64 {
        if self.bans.is_empty() {
            return 0;
        }
        let now_ms = now.ms();
        self.bans
            .iter()
            .filter(|b| b.until_ms > now_ms)
            .filter(|b| {
                b.policies
                    .as_ref()
                    .is_none_or(|ps| ps.iter().any(|p| p == policy))
            })
            .map(|b| b.until_ms - now_ms)
            .max()
            .unwrap_or(0)
    }
}

/// What the tables say about one identity under one policy (see [`Tables::screen`]).
#[derive(Debug)]
pub(crate) enum Found<'a> {
    Pass,
    Denied,
    Allowed,
    Banned(u64),
    /// A live override; the parameters it names for the policy (`None`: a plan without them).
    Override(&'a OverrideSlot, Option<&'a Algorithm>),
}

/// Every entry a decision reads, as one table: identities (with their list places, bans and
/// overrides) and the lists' networks. The entries of the configuration file's lists are kept
/// here too, marked as such, so a decision probes one table for the identity and, only when
/// some network is listed and the identity names an address, one per prefix length.
#[derive(Debug, Default)]
pub(crate) struct Tables {
    identities: FastMap<Box<str>, IdentityEntries>,
    networks: Networks,
    /// The configuration's plans (plan name, then policy name), for plan overrides.
    plans: std::sync::Arc<HashMap<String, HashMap<String, Algorithm>>>,
    /// Runtime entries per table (the file's list entries are not counted).
    counts: TableSizes,
    /// Where an entry with an end lives, by its end: [`Tables::sweep`] removes what ended.
    /// An entry changed since may leave a stale item here; the sweep checks the entry itself.
    expiring: BinaryHeap<Reverse<(u64, Slot)>>,
}

/// How many runtime entries each table holds.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct TableSizes {
    /// Runtime allow-list entries.
    pub allow: usize,
    /// Runtime deny-list entries.
    pub deny: usize,
    /// Bans (one per identity and scope).
    pub bans: usize,
    /// Overrides (one per policy and identity).
    pub overrides: usize,
}

impl TableSizes {
    fn list(&mut self, kind: ListKind) -> &mut usize {
        match kind {
            ListKind::Allow => &mut self.allow,
            ListKind::Deny => &mut self.deny,
        }
    }
}

/// An identity or a network, as the expiry queue names it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
enum Slot {
    Identity(Box<str>),
    Net(IpNet),
}

impl Tables {
    pub(crate) fn is_empty(&self) -> bool {
        self.identities.is_empty() && self.networks.is_empty()
    }

    /// What applies to `identity` under `policy`, in order: deny list, allow list, ban,
    /// override. `network` is the client address the identity carries, if any; the lists'
    /// networks are matched against it alone.
    pub(crate) fn screen(
        &self,
        identity: &str,
        network: Option<ClientNet>,
        policy: &str,
        now: &Now<'_>,
    ) -> Found<'_> {
        let entries = if self.identities.is_empty() {
            None
        } else {
            self.identities.get(identity)
        };
        if entries.is_some_and(|e| e.lists.deny.live(now)) {
            return Found::Denied;
        }
        let mut allowed = entries.is_some_and(|e| e.lists.allow.live(now));
        if !self.networks.is_empty()
            && let Some(ip) = network.and_then(|n| IpNet::new(n.addr(), n.prefix_len()).ok())
        {
            match self.networks.find(&ip, now) {
                Some(ListKind::Deny) => return Found::Denied,
                Some(ListKind::Allow) => allowed = true,
                None => {}
            }
        }
        if allowed {
            return Found::Allowed;
        }
        let Some(e) = entries else {
            return Found::Pass;
        };
        let left = e.ban_left_ms(policy, now);
        if left > 0 {
            return Found::Banned(left);
        }
        let Some(o) = e.override_of(policy, now) else {
            return Found::Pass;
        };
        let algorithm = match &o.entry.target {
            OverrideTarget::Params(a) => Some(a),
            OverrideTarget::Plan(plan) => self.plans.get(plan).and_then(|p| p.get(policy)),
        };
        Found::Override(o, algorithm)
    }

    /// The override of `identity` for `policy`, if one is live.
    pub(crate) fn override_of(
        &self,
        policy: &str,
        identity: &str,
        now: &Now<'_>,
    ) -> Option<&OverrideSlot> {
        self.identities.get(identity)?.override_of(policy, now)
    }

    /// Binds `identity` of `policy` to `entry`, replacing an override there was.
    pub(crate) fn set_override(&mut self, policy: &str, identity: &str, entry: OverrideEntry) {
        let expires = entry.expires_at_ms;
        let e = self.identities.entry(identity.into()).or_default();
        let slot = OverrideSlot::new(entry);
        match e.overrides.iter_mut().find(|(p, _)| &**p == policy) {
            Some((_, o)) => *o = slot,
            None => {
                e.overrides.push((policy.into(), slot));
                self.counts.overrides += 1;
            }
        }
        if let Some(t) = expires {
            self.expiring
                .push(Reverse((t, Slot::Identity(identity.into()))));
        }
    }

    /// Whether `identity` has an override (live or not) for `policy`.
    pub(crate) fn has_override(&self, policy: &str, identity: &str) -> bool {
        self.identities
            .get(identity)
            .is_some_and(|e| e.overrides.iter().any(|(p, _)| &**p == policy))
    }

    /// Whether `identity` has a ban of this scope (live or not).
    pub(crate) fn has_ban(&self, identity: &str, policies: Option<&[String]>) -> bool {
        self.identities
            .get(identity)
            .is_some_and(|e| e.bans.iter().any(|b| b.policies.as_deref() == policies))
    }

    /// Whether `entry` is on a list at runtime (live or not).
    pub(crate) fn has_runtime(&self, kind: ListKind, entry: &ListEntry) -> bool {
        let lists = match entry {
            ListEntry::Identity(s) => self.identities.get(s.as_str()).map(|e| e.lists),
            ListEntry::Net(n) => self.networks.nets.get(&n.trunc()).copied(),
        };
        lists.is_some_and(|mut l| l.of(kind).runtime.is_some())
    }

    /// How many runtime entries each table holds.
    pub(crate) fn sizes(&self) -> TableSizes {
        self.counts
    }

    /// Removes the override of `identity` for `policy`; whether there was one.
    pub(crate) fn remove_override(&mut self, policy: &str, identity: &str) -> bool {
        let Some(e) = self.identities.get_mut(identity) else {
            return false;
        };
        let before = e.overrides.len();
        e.overrides.retain(|(p, _)| &**p != policy);
        let removed = e.overrides.len() < before;
        if removed {
            self.counts.overrides -= 1;
        }
        self.prune(identity);
        removed
    }

    /// How long `identity` stays banned for `policy`, in ms (0 = not banned).
    pub(crate) fn ban_left_ms(&self, identity: &str, policy: &str, now: &Now<'_>) -> u64 {
        self.identities
            .get(identity)
            .map_or(0, |e| e.ban_left_ms(policy, now))
    }

    /// Adds a ban, replacing one of the same scope.
    pub(crate) fn add_ban(&mut self, identity: &str, ban: BanEntry) {
        let until = ban.until_ms;
        let list = &mut self.identities.entry(identity.into()).or_default().bans;
        let before = list.len();
        list.retain(|b| b.policies != ban.policies);
        self.counts.bans -= before - list.len();
        list.push(ban);
        self.counts.bans += 1;
        self.expiring
            .push(Reverse((until, Slot::Identity(identity.into()))));
    }

    /// The stored fields of every ban of `identity`.
    pub(crate) fn ban_fields(&self, identity: &str) -> Vec<String> {
        self.identities.get(identity).map_or_else(Vec::new, |e| {
            e.bans
                .iter()
                .map(|b| ban_field(identity, b.policies.as_deref()))
                .collect()
        })
    }

    /// Lifts the ban of `identity` with this scope; whether there was one.
    pub(crate) fn remove_ban(&mut self, identity: &str, policies: Option<&[String]>) -> bool {
        let Some(e) = self.identities.get_mut(identity) else {
            return false;
        };
        let before = e.bans.len();
        e.bans.retain(|b| b.policies.as_deref() != policies);
        let gone = before - e.bans.len();
        self.counts.bans -= gone;
        self.prune(identity);
        gone > 0
    }

    /// Lifts every ban of `identity`; whether there was one.
    pub(crate) fn remove_bans(&mut self, identity: &str) -> bool {
        let Some(e) = self.identities.get_mut(identity) else {
            return false;
        };
        let removed = !e.bans.is_empty();
        self.counts.bans -= e.bans.len();
        e.bans.clear();
        self.prune(identity);
        removed
    }

    /// Puts `entry` on a list at runtime, until `expires` (replacing an earlier expiry).
    pub(crate) fn list_insert(&mut self, kind: ListKind, entry: &ListEntry, expires: Option<u64>) {
        let place = self.place(kind, entry);
        let new = place.runtime.is_none();
        place.runtime = Some(expires);
        if new {
            *self.counts.list(kind) += 1;
        }
        if let Some(t) = expires {
            let slot = match entry {
                ListEntry::Identity(s) => Slot::Identity(s.as_str().into()),
                ListEntry::Net(n) => Slot::Net(n.trunc()),
            };
            self.expiring.push(Reverse((t, slot)));
        }
    }

    /// Takes a runtime entry off a list; whether it was there (the file's entries stay).
    pub(crate) fn list_remove(&mut self, kind: ListKind, entry: &ListEntry) -> bool {
        match entry {
            ListEntry::Identity(s) => {
                let Some(e) = self.identities.get_mut(s.as_str()) else {
                    return false;
                };
                let removed = e.lists.of(kind).runtime.take().is_some();
                if removed {
                    *self.counts.list(kind) -= 1;
                }
                self.prune(s);
                removed
            }
            ListEntry::Net(n) => {
                let n = n.trunc();
                let Some(lists) = self.networks.nets.get_mut(&n) else {
                    return false;
                };
                let removed = lists.of(kind).runtime.take().is_some();
                if removed {
                    *self.counts.list(kind) -= 1;
                }
                self.networks.prune(&n);
                removed
            }
        }
    }

    /// Installs the configuration file's lists and plans, replacing the previous file's.
    pub(crate) fn set_configured(
        &mut self,
        allow: &[ListEntry],
        deny: &[ListEntry],
        plans: &HashMap<String, HashMap<String, Algorithm>>,
    ) {
        for e in self.identities.values_mut() {
            e.lists.allow.configured = false;
            e.lists.deny.configured = false;
        }
        self.identities.retain(|_, e| !e.is_empty());
        let nets: Vec<IpNet> = self.networks.nets.keys().copied().collect();
        for n in nets {
            if let Some(l) = self.networks.nets.get_mut(&n) {
                l.allow.configured = false;
                l.deny.configured = false;
            }
            self.networks.prune(&n);
        }
        self.install_configured(allow, deny, plans);
    }

    /// Adds the configuration file's lists and plans to tables that hold none yet (tables
    /// freshly read from the store): costs the file's entries, not the tables'.
    pub(crate) fn install_configured(
        &mut self,
        allow: &[ListEntry],
        deny: &[ListEntry],
        plans: &HashMap<String, HashMap<String, Algorithm>>,
    ) {
        for (kind, entries) in [(ListKind::Allow, allow), (ListKind::Deny, deny)] {
            for entry in entries {
                self.place(kind, entry).configured = true;
            }
        }
        self.plans = std::sync::Arc::new(plans.clone());
    }

    /// The place of `entry` on a list, made if missing.
    fn place(&mut self, kind: ListKind, entry: &ListEntry) -> &mut Listed {
        match entry {
            ListEntry::Identity(s) => self
                .identities
                .entry(s.as_str().into())
                .or_default()
                .lists
                .of(kind),
            ListEntry::Net(n) => self.networks.entry(n.trunc()).of(kind),
        }
    }

    /// Drops `identity` if nothing is left on it.
    fn prune(&mut self, identity: &str) {
        if self.identities.get(identity).is_some_and(|e| e.is_empty()) {
            self.identities.remove(identity);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::store_format::*;
    use super::*;

    fn client(text: &str) -> (String, Option<ClientNet>) {
        let id = sluice_core::Identity::parse_client_ip(text).expect(text);
        (id.as_str().to_string(), id.network())
    }

    #[test]
    fn networks_match_the_address_an_identity_carries_and_nothing_else() {
        struct Check(Tables);
        impl Check {
            fn contains(&self, (identity, net): &(String, Option<ClientNet>), now: u64) -> bool {
                matches!(
                    self.0.screen(identity, *net, "p", &Now::at(now)),
                    Found::Denied
                )
            }
            fn insert(&mut self, e: &ListEntry, expires: Option<u64>) {
                self.0.list_insert(ListKind::Deny, e, expires)
            }
        }
        let text = |s: &str| (s.to_string(), None);
        let mut deny = Check(Tables::default());
        deny.insert(&ListEntry::parse("203.0.113.0/24").unwrap(), None);
        deny.insert(&ListEntry::parse("user:mallory").unwrap(), Some(2_000));
        assert!(deny.contains(&client("ip:203.0.113.7"), 1_000));
        assert!(deny.contains(&client("ip:203.0.113.0/25"), 1_000));
        assert!(!deny.contains(&client("ip:203.0.114.1"), 1_000));
        assert!(!deny.contains(&client("ip:203.0.112.0/23"), 1_000));
        assert!(deny.contains(&text("user:mallory"), 1_999));
        assert!(!deny.contains(&text("user:mallory"), 2_000), "expired");
        // Text that spells an address is not one: only the typed address is matched.
        for spelled in [
            "ip:203.0.113.7",
            "203.0.113.9",
            "ip:203.0.113.0/25",
            "hdr:203.0.113.7",
            "envoy:edge:remote_address=203.0.113.8",
        ] {
            assert!(!deny.contains(&text(spelled), 1_000), "{spelled}");
        }
        // Whatever the text, the carried address decides.
        let net = client("ip:203.0.113.8").1;
        assert!(deny.contains(
            &(
                "envoy:edge:path=%2Fa/remote_address=203.0.113.8".into(),
                net
            ),
            1_000
        ));
        deny.insert(&ListEntry::parse("2001:db8::/32").unwrap(), None);
        assert!(deny.contains(&client("ip6:2001:db8::1"), 1_000));
        assert!(deny.contains(&client("ip6:2001:db8:1:2::/64"), 1_000));
        assert!(!deny.contains(&client("ip6:2001:db9::1"), 1_000));
        assert!(!deny.contains(&text("ip6:2001:db8::1"), 1_000));
    }

    #[test]
    fn configured_entries_survive_a_reload_and_leave_with_the_file() {
        let now = Now::at(1_000);
        let mut t = Tables::default();
        let vip = ListEntry::parse("vip").unwrap();
        let net = ListEntry::parse("10.0.0.0/8").unwrap();
        t.set_configured(
            std::slice::from_ref(&vip),
            std::slice::from_ref(&net),
            &HashMap::new(),
        );
        t.list_insert(ListKind::Allow, &vip, Some(5_000));
        assert!(matches!(t.screen("vip", None, "p", &now), Found::Allowed));
        assert!(matches!(
            {
                let (i, n) = client("ip:10.1.2.3");
                t.screen(&i, n, "p", &now)
            },
            Found::Denied
        ));
        // The runtime entry goes, the file's stays.
        assert!(t.list_remove(ListKind::Allow, &vip));
        assert!(
            !t.list_remove(ListKind::Deny, &net),
            "the file's entry is not removable"
        );
        assert!(matches!(t.screen("vip", None, "p", &now), Found::Allowed));
        // Tables read afresh from the store keep the file's entries.
        let mut fresh = Tables::default();
        fresh.install_configured(
            std::slice::from_ref(&vip),
            std::slice::from_ref(&net),
            &HashMap::new(),
        );
        assert!(matches!(
            fresh.screen("vip", None, "p", &now),
            Found::Allowed
        ));
        assert!(matches!(
            {
                let (i, n) = client("ip:10.1.2.3");
                fresh.screen(&i, n, "p", &now)
            },
            Found::Denied
        ));
        // A file without them removes them.
        fresh.set_configured(&[], &[], &HashMap::new());
        assert!(fresh.is_empty());
        assert!(matches!(
            {
                let (i, n) = client("ip:10.1.2.3");
                fresh.screen(&i, n, "p", &now)
            },
            Found::Pass
        ));
    }

    #[test]
    fn overrides_and_bans_read_back_as_written() {
        let o = OverrideEntry {
            target: OverrideTarget::Params(Algorithm::FixedWindow {
                limit: 7,
                window_ms: 60_000,
            }),
            expires_at_ms: Some(123),
        };
        let (p, i, back) =
            decode_override(&pair_field("api", "user:1"), &encode_override(&o)).expect("decodes");
        assert_eq!((p.as_str(), i.as_str(), back), ("api", "user:1", o));
        let (i, ban) = decode_ban(&ban_field("u", Some(&["a".into(), "b".into()])), "99").unwrap();
        assert_eq!(i, "u");
        assert_eq!(ban.policies, Some(vec!["a".to_string(), "b".to_string()]));
        let mut t = Tables::default();
        t.add_ban("u", ban);
        assert_eq!(t.ban_left_ms("u", "a", &Now::at(90)), 9);
        assert_eq!(t.ban_left_ms("u", "c", &Now::at(90)), 0, "out of scope");
    }
}
