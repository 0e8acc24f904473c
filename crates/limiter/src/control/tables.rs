//! The control plane's entries as every decision reads them, and their text form in the
//! store. One format serves both backends: the embedded backend edits these tables directly,
//! the Redis backend rebuilds them from its hashes whenever the version counter moves.
//!
//! Every stored value starts with its expiry in Unix ms (`0` = never), so one rule prunes
//! every kind: `<expires>` for list entries and bans, `<expires>\n<target>` for overrides.
#![cfg_attr(not(feature = "redis"), allow(dead_code))]

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};

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

use super::ListKind;

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
        if let Some(net) = ip_of(text) {
            return Ok(ListEntry::Net(net));
        }
        // `ADDRESS/LENGTH` that did not parse as a network: a prefix length beyond the
        // family's (`1.2.3.4/33`) or not a number. Refused rather than kept as an identity
        // that no client-IP identity could ever match.
        let bare = text
            .strip_prefix("ip:")
            .or_else(|| text.strip_prefix("ip6:"))
            .unwrap_or(text);
        if let Some((addr, len)) = bare.split_once('/')
            && let Ok(addr) = addr.parse::<IpAddr>()
        {
            let max = if addr.is_ipv4() { 32 } else { 128 };
            return Err(format!(
                "{text:?}: the prefix length must be a number from 0 to {max} for an {} network, not {len:?}",
                if addr.is_ipv4() { "IPv4" } else { "IPv6" }
            ));
        }
        Ok(ListEntry::Identity(text.to_string()))
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
/// (`envoy:DOMAIN:remote_address=10.0.0.1`, its `:` escaped as `%3A`). Every decision on a
/// table with networks asks this, so what cannot be an address is turned away before any
/// parser runs, and a network parser runs only on text with a `/`.
fn ip_of(identity: &str) -> Option<IpNet> {
    if identity.starts_with("envoy:") {
        let (_, rest) = identity.rsplit_once("remote_address=")?;
        let value = rest.split('/').next()?;
        if value.contains("%3A") {
            return ip_of(&value.replace("%3A", ":"));
        }
        return ip_of(value);
    }
    let bare = identity
        .strip_prefix("ip:")
        .or_else(|| identity.strip_prefix("ip6:"))
        .unwrap_or(identity);
    if !bare.starts_with(|c: char| c.is_ascii_hexdigit() || c == ':') {
        return None;
    }
    if let Some(v4) = dotted_quad(bare) {
        return Some(IpNet::from(IpAddr::from(v4)));
    }
    if bare.contains('/') {
        return bare.parse::<IpNet>().ok();
    }
    bare.parse::<IpAddr>()
        .ok()
        .map(|ip| IpNet::from(ip.to_canonical()))
}

/// `a.b.c.d` read in one pass: the common client-IP identity, several times cheaper than
/// the general parser. Anything else (IPv6, a network, leading zeros) is `None`, left to the
/// general parser, which reads every address this one does the same way.
fn dotted_quad(text: &str) -> Option<std::net::Ipv4Addr> {
    let bytes = text.as_bytes();
    if bytes.len() > 15 {
        return None;
    }
    let mut octets = [0u8; 4];
    let (mut part, mut value, mut digits) = (0usize, 0u16, 0u8);
    for (i, &c) in bytes.iter().enumerate() {
        match c {
            b'0'..=b'9' => {
                // A leading zero is refused (the general parser refuses it too).
                if digits == 1 && value == 0 {
                    return None;
                }
                value = value * 10 + u16::from(c - b'0');
                digits += 1;
                if value > 255 {
                    return None;
                }
            }
            b'.' if digits > 0 && part < 3 && i + 1 < bytes.len() => {
                octets[part] = value as u8;
                (part, value, digits) = (part + 1, 0, 0);
            }
            _ => return None,
        }
    }
    if part != 3 || digits == 0 {
        return None;
    }
    octets[3] = value as u8;
    Some(std::net::Ipv4Addr::from(octets))
}

/// A place on one list: written in the configuration file (kept until the file changes),
/// added at runtime (with its expiry, Unix ms, `None` = never), or both.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct Listed {
    configured: bool,
    runtime: Option<Option<u64>>,
}

impl Listed {
    fn is_empty(&self) -> bool {
        !self.configured && self.runtime.is_none()
    }

    fn live(&self, now: &Now<'_>) -> bool {
        self.configured || self.runtime.is_some_and(|e| e.is_none_or(|t| t > now.ms()))
    }
}

/// The places of one identity or network on the two lists.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct Lists {
    allow: Listed,
    deny: Listed,
}

impl Lists {
    fn of(&mut self, kind: ListKind) -> &mut Listed {
        match kind {
            ListKind::Allow => &mut self.allow,
            ListKind::Deny => &mut self.deny,
        }
    }

    fn is_empty(&self) -> bool {
        self.allow.is_empty() && self.deny.is_empty()
    }
}

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

/// The networks of both lists. They are grouped by prefix length, so matching an address
/// costs one hash lookup per distinct length present, however many networks there are.
#[derive(Debug, Default)]
struct Networks {
    nets: FastMap<IpNet, Lists>,
    /// (IPv4?, prefix length) of the networks present, each with how many, sorted.
    lengths: Vec<((bool, u8), usize)>,
}

impl Networks {
    fn is_empty(&self) -> bool {
        self.nets.is_empty()
    }

    fn entry(&mut self, n: IpNet) -> &mut Lists {
        let key = length_key(&n);
        let lengths = &mut self.lengths;
        self.nets.entry(n).or_insert_with(|| {
            match lengths.binary_search_by_key(&key, |&(k, _)| k) {
                Ok(i) => lengths[i].1 += 1,
                Err(i) => lengths.insert(i, (key, 1)),
            }
            Lists::default()
        })
    }

    /// Drops `n` if nothing is left on it.
    fn prune(&mut self, n: &IpNet) {
        if !self.nets.get(n).is_some_and(Lists::is_empty) {
            return;
        }
        self.nets.remove(n);
        let key = length_key(n);
        if let Ok(i) = self.lengths.binary_search_by_key(&key, |&(k, _)| k) {
            self.lengths[i].1 -= 1;
            if self.lengths[i].1 == 0 {
                self.lengths.remove(i);
            }
        }
    }

    /// Which list `ip` is on through a network containing it (deny first), if any.
    fn find(&self, ip: &IpNet, now: &Now<'_>) -> Option<ListKind> {
        let v4 = matches!(ip, IpNet::V4(_));
        let mut allowed = false;
        for &((family, len), _) in &self.lengths {
            if family != v4 || len > ip.prefix_len() {
                continue;
            }
            let Some(lists) = IpNet::new(ip.addr(), len)
                .ok()
                .and_then(|n| self.nets.get(&n.trunc()))
            else {
                continue;
            };
            if lists.deny.live(now) {
                return Some(ListKind::Deny);
            }
            allowed |= lists.allow.live(now);
        }
        allowed.then_some(ListKind::Allow)
    }

    /// Every network of `kind` and its place.
    fn of_kind(&self, kind: ListKind) -> impl Iterator<Item = (IpNet, Listed)> + '_ {
        self.nets.iter().filter_map(move |(n, l)| {
            let listed = match kind {
                ListKind::Allow => l.allow,
                ListKind::Deny => l.deny,
            };
            (!listed.is_empty()).then_some((*n, listed))
        })
    }
}

fn length_key(n: &IpNet) -> (bool, u8) {
    (matches!(n, IpNet::V4(_)), n.prefix_len())
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

    /// `base` with `algorithm`, remembered for `generation` of the plans; made by `made`,
    /// so slots with the same parameters share one policy.
    pub(crate) fn resolve(
        &self,
        base: &std::sync::Arc<sluice_core::Policy>,
        generation: u64,
        algorithm: &Algorithm,
        made: &MadePolicies,
    ) -> std::sync::Arc<sluice_core::Policy> {
        let mut cached = self.resolved.lock();
        if let Some(r) = cached.as_ref()
            && r.generation == generation
            && std::sync::Arc::ptr_eq(&r.base, base)
        {
            return std::sync::Arc::clone(&r.policy);
        }
        let policy = made.get(base, generation, algorithm);
        *cached = Some(Resolved {
            generation,
            base: std::sync::Arc::clone(base),
            policy: std::sync::Arc::clone(&policy),
        });
        policy
    }
}

/// The policies overrides make, one per base policy and parameters: a thousand identities
/// on one plan (or with the same numbers) share one policy, so deciding for them keeps one
/// policy in the CPU's cache instead of one per identity.
#[derive(Debug, Default)]
pub(crate) struct MadePolicies(parking_lot::Mutex<FastMap<(usize, Algorithm), Resolved>>);

/// The most distinct policies [`MadePolicies`] keeps (it starts over beyond).
const MAX_MADE_POLICIES: usize = 4096;

impl MadePolicies {
    fn get(
        &self,
        base: &std::sync::Arc<sluice_core::Policy>,
        generation: u64,
        algorithm: &Algorithm,
    ) -> std::sync::Arc<sluice_core::Policy> {
        let mut made = self.0.lock();
        let key = (std::sync::Arc::as_ptr(base) as usize, algorithm.clone());
        if let Some(r) = made.get(&key)
            && r.generation == generation
            && std::sync::Arc::ptr_eq(&r.base, base)
        {
            return std::sync::Arc::clone(&r.policy);
        }
        if made.len() >= MAX_MADE_POLICIES {
            made.clear();
        }
        let mut p = (**base).clone();
        p.algorithm = algorithm.clone();
        let policy = std::sync::Arc::new(p);
        made.insert(
            key,
            Resolved {
                generation,
                base: std::sync::Arc::clone(base),
                policy: std::sync::Arc::clone(&policy),
            },
        );
        policy
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

impl Tables {
    pub(crate) fn is_empty(&self) -> bool {
        self.identities.is_empty() && self.networks.is_empty()
    }

    /// What applies to `identity` under `policy`, in order: deny list, allow list, ban,
    /// override.
    pub(crate) fn screen(&self, identity: &str, policy: &str, now: &Now<'_>) -> Found<'_> {
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
            && let Some(ip) = ip_of(identity)
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

    /// Removes at most `max` entries that ended at `now_ms` or before; how many went.
    pub(crate) fn sweep(&mut self, now_ms: u64, max: usize) -> usize {
        let mut removed = 0;
        for _ in 0..max {
            match self.expiring.peek() {
                Some(Reverse((t, _))) if *t <= now_ms => {}
                _ => break,
            }
            let Some(Reverse((_, slot))) = self.expiring.pop() else {
                break;
            };
            removed += self.drop_ended(&slot, now_ms);
        }
        removed
    }

    /// Removes what ended on one identity or network.
    fn drop_ended(&mut self, slot: &Slot, now_ms: u64) -> usize {
        let ended = |l: &mut Listed| matches!(l.runtime, Some(Some(t)) if t <= now_ms);
        let mut removed = 0;
        match slot {
            Slot::Identity(identity) => {
                let Some(e) = self.identities.get_mut(&**identity) else {
                    return 0;
                };
                for kind in [ListKind::Allow, ListKind::Deny] {
                    let l = e.lists.of(kind);
                    if ended(l) {
                        l.runtime = None;
                        *self.counts.list(kind) -= 1;
                        removed += 1;
                    }
                }
                let before = e.bans.len();
                e.bans.retain(|b| b.until_ms > now_ms);
                let gone = before - e.bans.len();
                self.counts.bans -= gone;
                let before = e.overrides.len();
                e.overrides
                    .retain(|(_, o)| o.entry.expires_at_ms.is_none_or(|t| t > now_ms));
                let gone_o = before - e.overrides.len();
                self.counts.overrides -= gone_o;
                removed += gone + gone_o;
                self.prune(identity);
            }
            Slot::Net(n) => {
                let Some(lists) = self.networks.nets.get_mut(n) else {
                    return 0;
                };
                for kind in [ListKind::Allow, ListKind::Deny] {
                    let l = lists.of(kind);
                    if ended(l) {
                        l.runtime = None;
                        *self.counts.list(kind) -= 1;
                        removed += 1;
                    }
                }
                self.networks.prune(n);
            }
        }
        removed
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
        struct Check(Tables);
        impl Check {
            fn contains(&self, identity: &str, now: u64) -> bool {
                matches!(self.0.screen(identity, "p", &Now::at(now)), Found::Denied)
            }
            fn insert(&mut self, e: &ListEntry, expires: Option<u64>) {
                self.0.list_insert(ListKind::Deny, e, expires)
            }
        }
        let mut deny = Check(Tables::default());
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
    fn the_quick_ipv4_reader_agrees_with_the_general_one() {
        for text in [
            "10.0.0.1",
            "255.255.255.255",
            "0.0.0.0",
            "1.2.3",
            "1.2.3.4.5",
            "01.2.3.4",
            "256.1.1.1",
            "1..2.3",
            "1.2.3.4/8",
            "a.b.c.d",
            "1.2.3.",
            "999.1.1.1",
            "",
            ".1.2.3",
            "1.2.3.0",
            "1.0.0.00",
            "1.2.3.4 ",
            "10.20.30.40",
        ] {
            assert_eq!(
                dotted_quad(text),
                text.parse::<std::net::Ipv4Addr>().ok(),
                "{text}"
            );
            assert_eq!(
                ip_of(text),
                text.parse::<IpNet>()
                    .ok()
                    .or_else(|| text.parse::<IpAddr>().ok().map(IpNet::from)),
                "{text}"
            );
        }
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
        assert!(matches!(t.screen("vip", "p", &now), Found::Allowed));
        assert!(matches!(t.screen("ip:10.1.2.3", "p", &now), Found::Denied));
        // The runtime entry goes, the file's stays.
        assert!(t.list_remove(ListKind::Allow, &vip));
        assert!(
            !t.list_remove(ListKind::Deny, &net),
            "the file's entry is not removable"
        );
        assert!(matches!(t.screen("vip", "p", &now), Found::Allowed));
        // Tables read afresh from the store keep the file's entries.
        let mut fresh = Tables::default();
        fresh.install_configured(
            std::slice::from_ref(&vip),
            std::slice::from_ref(&net),
            &HashMap::new(),
        );
        assert!(matches!(fresh.screen("vip", "p", &now), Found::Allowed));
        assert!(matches!(
            fresh.screen("ip:10.1.2.3", "p", &now),
            Found::Denied
        ));
        // A file without them removes them.
        fresh.set_configured(&[], &[], &HashMap::new());
        assert!(fresh.is_empty());
        assert!(matches!(
            fresh.screen("ip:10.1.2.3", "p", &now),
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
