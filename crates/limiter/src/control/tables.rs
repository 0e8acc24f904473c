//! The control plane's entries as every decision reads them, and their text form in the
//! store. One format serves both backends: the embedded backend edits these tables directly,
//! the Redis backend rebuilds them from its hashes whenever the version counter moves.
//!
//! Every stored value starts with its expiry in Unix ms (`0` = never), so one rule prunes
//! every kind: `<expires>` for list entries and bans, `<expires>\n<target>` for overrides.
#![cfg_attr(not(feature = "redis"), allow(dead_code))]

use std::collections::HashMap;

/// The time of one decision in Unix ms, read from the clock on first use only: a decision
/// that meets no entry with an expiry (the usual case) never reads it.
pub(crate) struct Now<'a> {
    clock: Option<&'a dyn sluice_core::Clock>,
    ms: std::cell::Cell<Option<u64>>,
}

impl<'a> Now<'a> {
    /// Read from `clock` when first needed.
    pub(crate) fn lazy(clock: &'a dyn sluice_core::Clock) -> Self {
        Now {
            clock: Some(clock),
            ms: std::cell::Cell::new(None),
        }
    }

    /// A time already known.
    pub(crate) fn at(ms: u64) -> Now<'static> {
        Now {
            clock: None,
            ms: std::cell::Cell::new(Some(ms)),
        }
    }

    /// The time, Unix ms.
    pub(crate) fn ms(&self) -> u64 {
        if let Some(ms) = self.ms.get() {
            return ms;
        }
        let ms = self.clock.map_or(0, |c| c.now() / 1000);
        self.ms.set(Some(ms));
        ms
    }
}

/// The maps every decision reads: foldhash instead of SipHash, since each check hashes its
/// identity several times; the tables hold only what operators and the ban rules wrote.
type FastMap<K, V> = HashMap<K, V, foldhash::fast::RandomState>;
use std::net::IpAddr;

use ipnet::IpNet;
use sluice_core::Algorithm;

/// What an override binds an identity of a policy to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OverrideTarget {
    /// These parameters (the policy's algorithm, other numbers).
    Params(Algorithm),
    /// A plan of the configuration (`[plans.NAME.POLICY]`).
    Plan(String),
}

/// One override as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OverrideEntry {
    /// Parameters or plan.
    pub target: OverrideTarget,
    /// Unix ms after which it no longer applies; `None` = until removed.
    pub expires_at_ms: Option<u64>,
}

/// One ban as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BanEntry {
    /// The policies it refuses; `None` = every policy.
    pub policies: Option<Vec<String>>,
    /// Unix ms at which it ends.
    pub until_ms: u64,
}

/// An allow or deny list entry: an identity, or a network matched against client-IP
/// identities (`ip:203.0.113.7`, `ip6:2001:db8::1`, a raw address, or a grouped
/// `ip:203.0.113.0/24` that lies inside the network).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum ListEntry {
    /// Matches this identity exactly.
    Identity(String),
    /// Matches addresses and networks inside it.
    Net(IpNet),
}

impl ListEntry {
    /// Reads an entry: a CIDR or address (optionally written `ip:`/`ip6:`), else an identity.
    pub fn parse(text: &str) -> Result<Self, String> {
        let text = text.trim();
        if text.is_empty() || text.len() > 512 || text.contains('\n') {
            return Err("a list entry must be 1 to 512 characters on one line".into());
        }
        Ok(match ip_of(text) {
            Some(net) => ListEntry::Net(net),
            None => ListEntry::Identity(text.to_string()),
        })
    }

    /// The canonical text (the field name in the store).
    pub fn text(&self) -> String {
        match self {
            ListEntry::Identity(s) => s.clone(),
            ListEntry::Net(n) => n.trunc().to_string(),
        }
    }
}

/// The address or network an identity names, if it names one: a client-IP identity, a raw
/// address or network, or an Envoy descriptor identity with a `remote_address` entry
/// (`envoy:DOMAIN:remote_address=10.0.0.1`, its `:` escaped as `%3A`).
fn ip_of(identity: &str) -> Option<IpNet> {
    if identity.starts_with("envoy:") {
        let (_, rest) = identity.rsplit_once("remote_address=")?;
        let value = rest.split('/').next()?.replace("%3A", ":");
        return ip_of(&value);
    }
    let bare = identity
        .strip_prefix("ip:")
        .or_else(|| identity.strip_prefix("ip6:"))
        .unwrap_or(identity);
    if let Ok(net) = bare.parse::<IpNet>() {
        return Some(net);
    }
    bare.parse::<IpAddr>()
        .ok()
        .map(|ip| IpNet::from(ip.to_canonical()))
}

/// Identities and networks of one list, each with its expiry (Unix ms, `None` = never).
/// Networks are grouped by prefix length, so matching an address costs one hash lookup per
/// distinct length on the list, however many networks it holds.
#[derive(Debug, Default, Clone)]
pub(crate) struct ListSet {
    pub(super) exact: FastMap<String, Option<u64>>,
    pub(super) nets: FastMap<IpNet, Option<u64>>,
    /// The prefix lengths present among `nets`, IPv4 then IPv6, each counted.
    lengths: std::collections::BTreeMap<(bool, u8), usize>,
}

impl ListSet {
    pub(crate) fn insert(&mut self, entry: &ListEntry, expires: Option<u64>) {
        match entry {
            ListEntry::Identity(s) => {
                self.exact.insert(s.clone(), expires);
            }
            ListEntry::Net(n) => {
                let n = n.trunc();
                if self.nets.insert(n, expires).is_none() {
                    *self.lengths.entry(length_key(&n)).or_default() += 1;
                }
            }
        }
    }

    pub(crate) fn remove(&mut self, entry: &ListEntry) -> bool {
        match entry {
            ListEntry::Identity(s) => self.exact.remove(s).is_some(),
            ListEntry::Net(n) => {
                let n = n.trunc();
                if self.nets.remove(&n).is_none() {
                    return false;
                }
                let key = length_key(&n);
                if let Some(c) = self.lengths.get_mut(&key) {
                    *c -= 1;
                    if *c == 0 {
                        self.lengths.remove(&key);
                    }
                }
                true
            }
        }
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.exact.is_empty() && self.nets.is_empty()
    }

    /// Whether the list holds any network.
    pub(crate) fn has_nets(&self) -> bool {
        !self.nets.is_empty()
    }

    /// Whether `identity` (whose address or network is `ip`, see [`ip_of_identity`]) is on
    /// the list at `now_ms`.
    pub(crate) fn contains(&self, identity: &str, ip: Option<&IpNet>, now: &Now<'_>) -> bool {
        let live = |e: &Option<u64>| e.is_none_or(|t| t > now.ms());
        if self.exact.get(identity).is_some_and(live) {
            return true;
        }
        let Some(ip) = ip.filter(|_| !self.nets.is_empty()) else {
            return false;
        };
        let v4 = matches!(ip, IpNet::V4(_));
        self.lengths
            .keys()
            .filter(|(family, len)| *family == v4 && *len <= ip.prefix_len())
            .any(|&(_, len)| {
                IpNet::new(ip.addr(), len)
                    .ok()
                    .and_then(|n| self.nets.get(&n.trunc()))
                    .is_some_and(live)
            })
    }
}

fn length_key(n: &IpNet) -> (bool, u8) {
    (matches!(n, IpNet::V4(_)), n.prefix_len())
}

/// The address or network an identity names, for matching list networks.
pub(crate) fn ip_of_identity(identity: &str) -> Option<IpNet> {
    ip_of(identity)
}

/// An override and the policy it makes, built on first use and kept while the policy it was
/// built from and the configuration's plans stay the same (a decision then costs an `Arc`
/// clone, not a copy of the policy).
#[derive(Debug)]
pub(crate) struct OverrideSlot {
    pub(crate) entry: OverrideEntry,
    resolved: parking_lot::Mutex<Option<Resolved>>,
}

#[derive(Debug)]
struct Resolved {
    generation: u64,
    base: std::sync::Arc<sluice_core::Policy>,
    policy: std::sync::Arc<sluice_core::Policy>,
}

impl OverrideSlot {
    pub(crate) fn new(entry: OverrideEntry) -> Self {
        OverrideSlot {
            entry,
            resolved: parking_lot::Mutex::new(None),
        }
    }

    /// `base` with `algorithm`, remembered for `generation` of the plans.
    pub(crate) fn resolve(
        &self,
        base: &std::sync::Arc<sluice_core::Policy>,
        generation: u64,
        algorithm: &Algorithm,
    ) -> std::sync::Arc<sluice_core::Policy> {
        let mut cached = self.resolved.lock();
        if let Some(r) = cached.as_ref()
            && r.generation == generation
            && std::sync::Arc::ptr_eq(&r.base, base)
        {
            return std::sync::Arc::clone(&r.policy);
        }
        let mut p = (**base).clone();
        p.algorithm = algorithm.clone();
        let policy = std::sync::Arc::new(p);
        *cached = Some(Resolved {
            generation,
            base: std::sync::Arc::clone(base),
            policy: std::sync::Arc::clone(&policy),
        });
        policy
    }
}

/// Every runtime entry: overrides by policy then identity, bans by identity, the two lists.
#[derive(Debug, Default)]
pub(crate) struct Tables {
    pub(crate) overrides: FastMap<String, FastMap<String, OverrideSlot>>,
    pub(crate) bans: FastMap<String, Vec<BanEntry>>,
    pub(crate) allow: ListSet,
    pub(crate) deny: ListSet,
}

impl Tables {
    pub(crate) fn is_empty(&self) -> bool {
        self.overrides.is_empty()
            && self.bans.is_empty()
            && self.allow.is_empty()
            && self.deny.is_empty()
    }

    /// The override of `identity` for `policy`, if one is live.
    pub(crate) fn override_of(
        &self,
        policy: &str,
        identity: &str,
        now: &Now<'_>,
    ) -> Option<&OverrideSlot> {
        self.overrides
            .get(policy)?
            .get(identity)
            .filter(|o| o.entry.expires_at_ms.is_none_or(|t| t > now.ms()))
    }

    /// How long `identity` stays banned for `policy`, in ms (0 = not banned).
    pub(crate) fn ban_left_ms(&self, identity: &str, policy: &str, now: &Now<'_>) -> u64 {
        let Some(bans) = self.bans.get(identity) else {
            return 0;
        };
        let now_ms = now.ms();
        bans.iter()
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

    /// Adds a ban, replacing one of the same scope.
    pub(crate) fn add_ban(&mut self, identity: &str, ban: BanEntry) {
        let list = self.bans.entry(identity.to_string()).or_default();
        list.retain(|b| b.policies != ban.policies);
        list.push(ban);
    }
}

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn networks_match_client_ip_identities_and_nothing_else() {
        struct Check(ListSet);
        impl Check {
            fn contains(&self, identity: &str, now: u64) -> bool {
                self.0
                    .contains(identity, ip_of_identity(identity).as_ref(), &Now::at(now))
            }
            fn insert(&mut self, e: &ListEntry, expires: Option<u64>) {
                self.0.insert(e, expires)
            }
        }
        let mut deny = Check(ListSet::default());
        deny.insert(&ListEntry::parse("203.0.113.0/24").unwrap(), None);
        deny.insert(&ListEntry::parse("user:mallory").unwrap(), Some(2_000));
        assert!(deny.contains("ip:203.0.113.7", 1_000));
        assert!(deny.contains("203.0.113.9", 1_000));
        assert!(deny.contains("ip:203.0.113.0/25", 1_000));
        assert!(!deny.contains("ip:203.0.114.1", 1_000));
        assert!(!deny.contains("ip:203.0.112.0/23", 1_000));
        assert!(deny.contains("user:mallory", 1_999));
        assert!(!deny.contains("user:mallory", 2_000), "expired");
        assert!(!deny.contains("hdr:203.0.113.7", 1_000));
        assert!(deny.contains("envoy:edge:remote_address=203.0.113.8", 1_000));
        assert!(deny.contains("envoy:edge:path=%2Fa/remote_address=203.0.113.8", 1_000));
        assert!(!deny.contains("envoy:edge:user=203.0.113.8", 1_000));
        deny.insert(&ListEntry::parse("2001:db8::/32").unwrap(), None);
        assert!(deny.contains("envoy:edge:remote_address=2001%3Adb8%3A%3A1", 1_000));
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
