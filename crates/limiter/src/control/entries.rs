//! The control plane's entries as operators write them: overrides, bans and list entries.
//! Kept apart from the tables that index them and the store format that spells them, since
//! the API, the configuration reader and both backends share these types.

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

/// An allow or deny list entry: an identity, or a network matched against the address a
/// client identity carries ([`sluice_core::Identity::network`]): an address or a group of
/// addresses (`ip:203.0.113.0/24`) that lies inside the network.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum ListEntry {
    /// Matches this identity exactly.
    Identity(String),
    /// Matches client addresses and groups inside it.
    Net(IpNet),
}

impl ListEntry {
    /// Reads an entry as an operator writes it: a CIDR or address (optionally written
    /// `ip:`/`ip6:`, as client identities are), else an identity.
    pub fn parse(text: &str) -> Result<Self, String> {
        let text = text.trim();
        if text.is_empty() || text.len() > 512 || text.contains('\n') {
            return Err("a list entry must be 1 to 512 characters on one line".into());
        }
        let bare = text
            .strip_prefix("ip:")
            .or_else(|| text.strip_prefix("ip6:"))
            .unwrap_or(text);
        if let Some(net) = network_of_entry(bare) {
            return Ok(ListEntry::Net(net));
        }
        // `ADDRESS/LENGTH` that did not parse as a network: a prefix length beyond the
        // family's (`1.2.3.4/33`) or not a number. Refused rather than kept as an identity
        // that no client identity could ever match.
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

/// The network an operator's entry text names (an address is a one-address network).
/// Only operator input is read here: decisions never parse an identity's text, they read
/// the address it carries.
fn network_of_entry(text: &str) -> Option<IpNet> {
    if !text.starts_with(|c: char| c.is_ascii_hexdigit() || c == ':') {
        return None;
    }
    if text.contains('/') {
        return text.parse::<IpNet>().ok();
    }
    text.parse::<IpAddr>()
        .ok()
        .map(|ip| IpNet::from(ip.to_canonical()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_read_networks_addresses_and_identities() {
        let net = |s: &str| ListEntry::Net(s.parse().unwrap());
        assert_eq!(ListEntry::parse("10.0.0.0/8").unwrap(), net("10.0.0.0/8"));
        assert_eq!(ListEntry::parse("ip:10.0.0.1").unwrap(), net("10.0.0.1/32"));
        assert_eq!(
            ListEntry::parse("ip6:2001:db8::/32").unwrap(),
            net("2001:db8::/32")
        );
        assert_eq!(
            ListEntry::parse("::ffff:10.0.0.1").unwrap(),
            net("10.0.0.1/32"),
            "IPv4-mapped addresses are IPv4"
        );
        assert_eq!(
            ListEntry::parse(" user:mallory ").unwrap(),
            ListEntry::Identity("user:mallory".into())
        );
        assert_eq!(
            ListEntry::parse("deadbeef").unwrap(),
            ListEntry::Identity("deadbeef".into())
        );
        assert!(
            ListEntry::parse("ip:10.0.0.0/40")
                .unwrap_err()
                .contains("from 0 to 32 for an IPv4")
        );
        assert!(ListEntry::parse("").is_err());
        assert!(ListEntry::parse("a\nb").is_err());
        assert_eq!(ListEntry::parse("10.1.2.3/8").unwrap().text(), "10.0.0.0/8");
    }
}
