//! Who is limited: [`Identity`], the text keys are made of, and [`ClientNet`], the client
//! address an identity made for one carries typed.
//!
//! Apart from the key scheme (the parent module) because an identity is made by the front ends
//! (the HTTP layer, the Envoy service, the bindings) and read by the control plane, which
//! matches its lists against the typed address and never parses the text; the scheme only
//! escapes the text into a key.

use std::fmt::Write as _;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// The longest identity accepted, in bytes (before escaping).
pub const MAX_IDENTITY_LEN: usize = 512;

/// Who is being limited, e.g. `user:42`, `ip:203.0.113.0`, `key:h.3f9a...`.
///
/// The text is what keys are made of. An identity made for a client address
/// ([`Identity::client_ip`], or [`Identity::with_network`] for an address that arrived inside
/// another format, such as an Envoy `remote_address` descriptor) also carries that address,
/// typed: the control plane's lists match networks against [`Identity::network`] only, never
/// against the text, so an identity whose text merely spells an address (a header value, an
/// API key, an application's user name) is not that address.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Identity {
    text: String,
    network: Option<ClientNet>,
}

/// A client address, or a group of client addresses (an IPv6 /64, an IPv4 /24): an address
/// and a prefix length, host bits cleared, IPv4-mapped IPv6 addresses read as IPv4.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ClientNet {
    addr: IpAddr,
    prefix_len: u8,
}

impl ClientNet {
    /// The network of `prefix_len` bits around `addr` (at most the family's length).
    pub fn new(addr: IpAddr, prefix_len: u8) -> Self {
        match addr.to_canonical() {
            IpAddr::V4(v4) => {
                let len = prefix_len.min(32);
                let mask = u32::MAX.checked_shl(32 - u32::from(len)).unwrap_or(0);
                ClientNet {
                    addr: IpAddr::V4(Ipv4Addr::from(u32::from(v4) & mask)),
                    prefix_len: len,
                }
            }
            IpAddr::V6(v6) => {
                let len = prefix_len.min(128);
                let mask = u128::MAX.checked_shl(128 - u32::from(len)).unwrap_or(0);
                ClientNet {
                    addr: IpAddr::V6(Ipv6Addr::from(u128::from(v6) & mask)),
                    prefix_len: len,
                }
            }
        }
    }

    /// One address.
    pub fn host(addr: IpAddr) -> Self {
        Self::new(addr, 128)
    }

    /// The network's first address.
    pub fn addr(&self) -> IpAddr {
        self.addr
    }

    /// The prefix length in bits.
    pub fn prefix_len(&self) -> u8 {
        self.prefix_len
    }

    /// Whether this is one whole address (a /32 or a /128).
    pub fn is_host(&self) -> bool {
        self.prefix_len == if self.addr.is_ipv4() { 32 } else { 128 }
    }
}

impl std::fmt::Display for ClientNet {
    /// `203.0.113.7` for one address, `2001:db8:1:2::/64` for a group.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.is_host() {
            write!(f, "{}", self.addr)
        } else {
            write!(f, "{}/{}", self.addr, self.prefix_len)
        }
    }
}

impl Identity {
    /// An identity from its text as given (an application-chosen id...). It names no
    /// address, whatever the text says: see [`Identity::client_ip`].
    pub fn new(text: impl Into<String>) -> Self {
        Self {
            text: text.into(),
            network: None,
        }
    }

    /// The identity of a client address or group of addresses: `ip:203.0.113.7`,
    /// `ip:203.0.113.0/24`, `ip6:2001:db8::1` or `ip6:2001:db8:1:2::/64`, carrying `net`.
    pub fn client_ip(net: ClientNet) -> Self {
        let family = if net.addr.is_ipv4() { "ip:" } else { "ip6:" };
        let mut text = String::with_capacity(48);
        text.push_str(family);
        let _ = write!(text, "{net}");
        Self {
            text,
            network: Some(net),
        }
    }

    /// Reads the text [`Identity::client_ip`] writes back into that identity, for inputs
    /// where a trusted caller names a client by that text (the check API). Only the exact
    /// text `client_ip` would write is accepted, so the key name stays the same; anything
    /// else is `None`.
    pub fn parse_client_ip(text: &str) -> Option<Self> {
        let (bare, v4) = if let Some(b) = text.strip_prefix("ip:") {
            (b, true)
        } else {
            (text.strip_prefix("ip6:")?, false)
        };
        let (addr, len) = match bare.split_once('/') {
            Some((a, l)) => (a, Some(l.parse::<u8>().ok()?)),
            None => (bare, None),
        };
        let addr: IpAddr = addr.parse().ok()?;
        if addr.is_ipv4() != v4 {
            return None;
        }
        let net = ClientNet::new(addr, len.unwrap_or(128));
        let id = Self::client_ip(net);
        (id.text == text).then_some(id)
    }

    /// The identity a trusted caller names a client by (the check API): the text
    /// [`Identity::client_ip`] writes (read back as that identity), or a bare address or
    /// network (`203.0.113.7`, `2001:db8::/48`), kept as written and carrying that address.
    /// Anything else is `None`: an identity that names no address.
    pub fn parse_address(text: &str) -> Option<Self> {
        if let Some(id) = Self::parse_client_ip(text) {
            return Some(id);
        }
        if !text.starts_with(|c: char| c.is_ascii_hexdigit() || c == ':') {
            return None;
        }
        let net = match text.split_once('/') {
            Some((addr, len)) => {
                let addr: IpAddr = addr.parse().ok()?;
                let max = if addr.is_ipv4() { 32 } else { 128 };
                let len = len.parse::<u8>().ok().filter(|&l| l <= max)?;
                ClientNet::new(addr, len)
            }
            None => ClientNet::host(text.parse().ok()?),
        };
        Some(Self::new(text).with_network(net))
    }

    /// This identity, standing for `net` (an identity whose text is made elsewhere, such as
    /// an Envoy descriptor with a `remote_address` entry). The text, and so the key, stays.
    pub fn with_network(mut self, net: ClientNet) -> Self {
        self.network = Some(net);
        self
    }

    /// The client address or network this identity was made for, if any.
    pub fn network(&self) -> Option<ClientNet> {
        self.network
    }

    /// An identity derived from a secret credential: `<kind>:` followed by a keyed hash, so
    /// a key dump or `MONITOR` session never shows the credential.
    pub fn credential(kind: &str, secret: &[u8], hash_key: &[u8; 32]) -> Self {
        let digest = blake3::keyed_hash(hash_key, secret);
        let mut s = String::with_capacity(kind.len() + 34);
        s.push_str(kind);
        s.push_str(":h");
        // Hex by table: `write!` per byte costs more than the hash itself on the request path.
        const HEX: &[u8; 16] = b"0123456789abcdef";
        for &b in &digest.as_bytes()[..16] {
            s.push(HEX[(b >> 4) as usize] as char);
            s.push(HEX[(b & 15) as usize] as char);
        }
        Self::new(s)
    }

    /// The identity's text.
    pub fn as_str(&self) -> &str {
        &self.text
    }
}

impl std::fmt::Display for Identity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.text)
    }
}

impl From<&str> for Identity {
    fn from(s: &str) -> Self {
        Self::new(s)
    }
}

/// The default key for hashing credentials when none is configured. Deployments should set
/// their own secret so hashes cannot be recomputed by someone who only sees key names.
pub fn default_hash_key() -> [u8; 32] {
    blake3::derive_key("sluice 2026 identity hashing default key", b"")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn client_ip_identities_keep_their_text_and_carry_their_network() {
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        let host = Identity::client_ip(ClientNet::host(ip("203.0.113.7")));
        assert_eq!(host.as_str(), "ip:203.0.113.7");
        assert_eq!(host.network(), Some(ClientNet::new(ip("203.0.113.7"), 32)));
        let mapped = Identity::client_ip(ClientNet::host(ip("::ffff:203.0.113.7")));
        assert_eq!(mapped, host, "IPv4-mapped addresses are IPv4");
        let group = Identity::client_ip(ClientNet::new(ip("203.0.113.77"), 24));
        assert_eq!(group.as_str(), "ip:203.0.113.0/24");
        let v6 = Identity::client_ip(ClientNet::new(ip("2001:db8:1:2::a"), 64));
        assert_eq!(v6.as_str(), "ip6:2001:db8:1:2::/64");
        assert_eq!(
            Identity::client_ip(ClientNet::host(ip("2001:db8::1"))).as_str(),
            "ip6:2001:db8::1"
        );
        assert_eq!(
            ClientNet::new(ip("10.1.2.3"), 0),
            ClientNet::new(ip("0.0.0.0"), 0)
        );
        // Text alone names no address; the same text made for an address does.
        assert_eq!(Identity::new("ip:203.0.113.7").network(), None);
        assert_ne!(Identity::new("ip:203.0.113.7"), host);
        for text in [
            "ip:203.0.113.7",
            "ip:203.0.113.0/24",
            "ip6:2001:db8:1:2::/64",
            "ip6:2001:db8::1",
        ] {
            let id = Identity::parse_client_ip(text).unwrap();
            assert_eq!(id.as_str(), text);
            assert!(id.network().is_some());
        }
        for text in [
            "ip:203.0.113.7/24",
            "ip:203.0.113.7/32",
            "ip6:203.0.113.7",
            "ip:2001:db8::1",
            "ip:010.0.0.1",
            "ip:unknown",
            "hdr:ip:10.0.0.1",
            "10.0.0.1",
            "ip: 10.0.0.1",
        ] {
            assert_eq!(Identity::parse_client_ip(text), None, "{text}");
        }
        let bare = Identity::parse_address("203.0.113.7").unwrap();
        assert_eq!(bare.as_str(), "203.0.113.7", "the text stays as written");
        assert_eq!(bare.network(), Some(ClientNet::host(ip("203.0.113.7"))));
        let net = Identity::parse_address("2001:db8::1/48").unwrap();
        assert_eq!(net.network(), Some(ClientNet::new(ip("2001:db8::"), 48)));
        assert_eq!(
            Identity::parse_address("ip:203.0.113.7"),
            Identity::parse_client_ip("ip:203.0.113.7")
        );
        for text in [
            "user:1",
            "10.0.0.1/33",
            "deadbeef",
            "ip:unknown",
            "1.2.3.4 ",
        ] {
            assert_eq!(Identity::parse_address(text), None, "{text}");
        }
        let e = Identity::new("envoy:edge:remote_address=10.0.0.1")
            .with_network(ClientNet::host(ip("10.0.0.1")));
        assert_eq!(e.as_str(), "envoy:edge:remote_address=10.0.0.1");
        assert_eq!(e.network(), Some(ClientNet::host(ip("10.0.0.1"))));
    }

    #[test]
    fn credentials_are_hashed() {
        let key = default_hash_key();
        let id = Identity::credential("key", b"sk_live_abc", &key);
        assert!(id.as_str().starts_with("key:h"));
        assert!(!id.as_str().contains("sk_live_abc"));
        assert_eq!(id, Identity::credential("key", b"sk_live_abc", &key));
        assert_ne!(id, Identity::credential("key", b"sk_live_abd", &key));
    }
}
