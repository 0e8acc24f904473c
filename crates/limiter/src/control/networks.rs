//! The lists' networks and the places of identities and networks on the two lists. A
//! client identity's address is matched here, grouped by prefix length, so a decision costs
//! one hash lookup per distinct length listed, however many networks there are.

use ipnet::IpNet;

use super::ListKind;
use super::clock::Now;
use super::tables::FastMap;

/// A place on one list: written in the configuration file (kept until the file changes),
/// added at runtime (with its expiry, Unix ms, `None` = never), or both.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(super) struct Listed {
    pub(super) configured: bool,
    pub(super) runtime: Option<Option<u64>>,
}

impl Listed {
    pub(super) fn is_empty(&self) -> bool {
        !self.configured && self.runtime.is_none()
    }

    pub(super) fn live(&self, now: &Now<'_>) -> bool {
        self.configured || self.runtime.is_some_and(|e| e.is_none_or(|t| t > now.ms()))
    }
}

/// The places of one identity or network on the two lists.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(super) struct Lists {
    pub(super) allow: Listed,
    pub(super) deny: Listed,
}

impl Lists {
    pub(super) fn of(&mut self, kind: ListKind) -> &mut Listed {
        match kind {
            ListKind::Allow => &mut self.allow,
            ListKind::Deny => &mut self.deny,
        }
    }

    pub(super) fn is_empty(&self) -> bool {
        self.allow.is_empty() && self.deny.is_empty()
    }
}

/// The networks of both lists. They are grouped by prefix length, so matching an address
/// costs one hash lookup per distinct length present, however many networks there are.
#[derive(Debug, Default)]
pub(super) struct Networks {
    pub(super) nets: FastMap<IpNet, Lists>,
    /// (IPv4?, prefix length) of the networks present, each with how many, sorted.
    lengths: Vec<((bool, u8), usize)>,
}

impl Networks {
    pub(super) fn is_empty(&self) -> bool {
        self.nets.is_empty()
    }

    pub(super) fn entry(&mut self, n: IpNet) -> &mut Lists {
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
    pub(super) fn prune(&mut self, n: &IpNet) {
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
    pub(super) fn find(&self, ip: &IpNet, now: &Now<'_>) -> Option<ListKind> {
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
    pub(super) fn of_kind(&self, kind: ListKind) -> impl Iterator<Item = (IpNet, Listed)> + '_ {
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
