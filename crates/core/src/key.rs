//! The key scheme: `rl:{<identity>}:<policy>`.
//!
//! The identity sits inside `{}` so it is the Redis Cluster hash tag: every key of one
//! identity lands in one slot, and a multi-limit check over them is a single script call.
//! Identities are escaped so that no input (braces, spaces, newlines, any bytes) can move a
//! key to another slot or make two identities share a key: bytes outside a safe alphabet,
//! and `%` itself, are written as `%XX`. Escaping is injective, so distinct identities give
//! distinct keys, and the escaped form never contains `{` or `}`.
//!
//! Identities taken from credentials (API keys, bearer tokens) never reach a key in clear:
//! [`Identity::credential`] replaces them with a keyed BLAKE3 hash.
//!
//! [`KeyScheme::parse`] is the inverse of [`KeyScheme::shard_key`], kept next to it so the
//! format is known in one place: tools that read key names back (lease tokens, key dumps)
//! ask the scheme instead of matching strings themselves.

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

/// Builds key names from identities and policy names.
#[derive(Debug, Clone)]
pub struct KeyScheme {
    prefix: String,
}

impl Default for KeyScheme {
    fn default() -> Self {
        Self {
            prefix: "rl".to_string(),
        }
    }
}

fn is_safe(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b':' | b'@' | b'/' | b'+' | b'=')
}

/// Appends `identity` escaped for use inside a hash tag. The empty identity is written as a
/// lone `%` (which no escape produces), because an empty hash tag `{}` would make Redis
/// hash the whole key and scatter one identity's keys over several slots.
pub fn escape_identity_into(out: &mut String, identity: &[u8]) {
    const HEX: &[u8; 16] = b"0123456789ABCDEF";
    if identity.is_empty() {
        out.push('%');
        return;
    }
    // Most identities (hashed credentials, addresses) need no escape: one copy.
    if identity.iter().all(|&b| is_safe(b)) {
        out.push_str(std::str::from_utf8(identity).unwrap_or_default());
        return;
    }
    for &b in identity {
        if is_safe(b) {
            out.push(b as char);
        } else {
            out.push('%');
            out.push(HEX[(b >> 4) as usize] as char);
            out.push(HEX[(b & 15) as usize] as char);
        }
    }
}

impl KeyScheme {
    /// A scheme with another prefix than `rl` (ASCII letters, digits, `-`, `_`, `.`).
    pub fn with_prefix(prefix: impl Into<String>) -> Self {
        Self {
            prefix: prefix.into(),
        }
    }

    /// The key prefix.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// `rl:{<identity>}:<policy>`.
    pub fn key(&self, identity: &Identity, policy: &str) -> String {
        self.shard_key(identity, policy, None)
    }

    /// The key of one shard of a sharded policy: `rl:{<identity>#<n>}:<policy>`, so shards of
    /// one hot identity spread over slots. `None` gives the unsharded key.
    pub fn shard_key(&self, identity: &Identity, policy: &str, shard: Option<u32>) -> String {
        let id = identity.as_str().as_bytes();
        let mut k = String::with_capacity(self.prefix.len() + id.len() + policy.len() + 8);
        k.push_str(&self.prefix);
        k.push_str(":{");
        escape_identity_into(&mut k, id);
        if let Some(n) = shard {
            let _ = write!(k, "#{n}");
        }
        k.push_str("}:");
        k.push_str(policy);
        k
    }
}

/// The parts of a key name, as [`KeyScheme::parse`] reads them back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParsedKey {
    /// The identity, unescaped.
    pub identity: Identity,
    /// The policy name.
    pub policy: String,
    /// The shard of a sharded policy's key, `None` for an unsharded key.
    pub shard: Option<u32>,
}

/// Why a text is not a key name of a [`KeyScheme`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("not a key of the scheme with prefix {prefix:?}: {reason} (key {key:?})")]
pub struct KeyParseError {
    /// The scheme's prefix.
    pub prefix: String,
    /// The text that was given.
    pub key: String,
    /// What is wrong with it.
    pub reason: &'static str,
}

/// The identity bytes of an escaped hash tag, or `None` when the text is not an escape's
/// output (a bad `%XX`, or a byte that would have been escaped).
fn unescape_identity(escaped: &str) -> Option<Vec<u8>> {
    if escaped == "%" {
        return Some(Vec::new());
    }
    let b = escaped.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let hex = escaped.get(i + 1..i + 3)?;
            if !hex
                .bytes()
                .all(|h| h.is_ascii_digit() || (b'A'..=b'F').contains(&h))
            {
                return None;
            }
            let v = u8::from_str_radix(hex, 16).ok()?;
            // A safe byte is never escaped: `%41` is not how `A` is written.
            if is_safe(v) {
                return None;
            }
            out.push(v);
            i += 3;
        } else if is_safe(b[i]) {
            out.push(b[i]);
            i += 1;
        } else {
            return None;
        }
    }
    Some(out)
}

impl KeyScheme {
    /// Reads a key name back into identity, policy and shard: the inverse of
    /// [`KeyScheme::shard_key`]. Only texts that `shard_key` produces are accepted, so
    /// `parse(shard_key(i, p, s)) == (i, p, s)` and a key has one parse.
    pub fn parse(&self, key: &str) -> Result<ParsedKey, KeyParseError> {
        let fail = |reason| KeyParseError {
            prefix: self.prefix.clone(),
            key: key.to_string(),
            reason,
        };
        let rest = key
            .strip_prefix(self.prefix.as_str())
            .and_then(|r| r.strip_prefix(":{"))
            .ok_or_else(|| fail("it does not start with the prefix, `:` and `{`"))?;
        // The escaped identity never contains `}` or `#`, so the first `}` closes the tag
        // and a `#` in it starts the shard number.
        let (tag, policy) = rest
            .split_once('}')
            .ok_or_else(|| fail("the hash tag is not closed"))?;
        let policy = policy
            .strip_prefix(':')
            .ok_or_else(|| fail("no `:` between the hash tag and the policy"))?;
        let (escaped, shard) = match tag.split_once('#') {
            Some((id, n)) => {
                let canonical = !n.is_empty()
                    && n.bytes().all(|d| d.is_ascii_digit())
                    && (n == "0" || !n.starts_with('0'));
                let n = n
                    .parse::<u32>()
                    .ok()
                    .filter(|_| canonical)
                    .ok_or_else(|| fail("the shard is not a number"))?;
                (id, Some(n))
            }
            None => (tag, None),
        };
        if escaped.is_empty() {
            return Err(fail(
                "the identity is empty (an empty identity is written `%`)",
            ));
        }
        let bytes = unescape_identity(escaped)
            .ok_or_else(|| fail("the identity is not escaped as the scheme escapes it"))?;
        let identity = String::from_utf8(bytes).map_err(|_| fail("the identity is not UTF-8"))?;
        Ok(ParsedKey {
            identity: Identity::new(identity),
            policy: policy.to_string(),
            shard,
        })
    }
}

/// The hash-tag part of a key as Redis Cluster defines it: the text between the first `{`
/// and the next `}` if that is non-empty, else the whole key.
pub fn hash_tag(key: &[u8]) -> &[u8] {
    if let Some(open) = key.iter().position(|&b| b == b'{')
        && let Some(len) = key[open + 1..].iter().position(|&b| b == b'}')
        && len > 0
    {
        return &key[open + 1..open + 1 + len];
    }
    key
}

/// The Redis Cluster slot of a key: CRC16 (XMODEM) of its hash tag, mod 16384.
pub fn key_slot(key: &[u8]) -> u16 {
    crc16::State::<crc16::XMODEM>::calculate(hash_tag(key)) % 16384
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn guide_keys_and_slots() {
        let s = KeyScheme::default();
        assert_eq!(s.key(&Identity::new("user:42"), "tb"), "rl:{user:42}:tb");
        // The guide's CLUSTER KEYSLOT outputs.
        assert_eq!(key_slot(b"rl:{user:42}:tb"), 15880);
        assert_eq!(key_slot(b"rl:{user:42}:sw"), 15880);
    }

    #[test]
    fn hostile_identities_cannot_escape_their_tag() {
        let s = KeyScheme::default();
        let k = s.key(&Identity::new("a}{b c\n%"), "p");
        assert_eq!(k, "rl:{a%7D%7Bb%20c%0A%25}:p");
        assert_eq!(hash_tag(k.as_bytes()), b"a%7D%7Bb%20c%0A%25");
        // An identity spelling an escape differs from the byte it escapes.
        assert_ne!(
            s.key(&Identity::new("%7D"), "p"),
            s.key(&Identity::new("}"), "p")
        );
    }

    #[test]
    fn the_empty_identity_keeps_a_non_empty_tag() {
        let s = KeyScheme::default();
        let (a, b) = (
            s.key(&Identity::new(""), "a"),
            s.key(&Identity::new(""), "b"),
        );
        assert_eq!(a, "rl:{%}:a");
        assert_eq!(key_slot(a.as_bytes()), key_slot(b.as_bytes()));
        assert_ne!(a, s.key(&Identity::new("%"), "a"));
    }

    #[test]
    fn parse_reads_back_what_the_builder_wrote() {
        let s = KeyScheme::default();
        let k = s.shard_key(&Identity::new("a}{b:c#d"), "per:min}", Some(7));
        assert_eq!(k, "rl:{a%7D%7Bb:c%23d#7}:per:min}");
        assert_eq!(
            s.parse(&k).unwrap(),
            ParsedKey {
                identity: Identity::new("a}{b:c#d"),
                policy: "per:min}".into(),
                shard: Some(7),
            }
        );
        let p = s.parse("rl:{%}:tb").unwrap();
        assert_eq!((p.identity.as_str(), p.shard), ("", None));
        let other = KeyScheme::with_prefix("app.v2");
        assert_eq!(
            other.parse("app.v2:{user:42}:tb").unwrap().identity,
            Identity::new("user:42")
        );
    }

    #[test]
    fn parse_refuses_what_the_builder_never_writes() {
        let s = KeyScheme::default();
        for bad in [
            "",
            "rl",
            "xx:{a}:p",
            "rl:a:p",
            "rl:{a:p",
            "rl:{a}p",
            "rl:{}:p",
            "rl:{a b}:p",
            "rl:{%7d}:p",
            "rl:{%41}:p",
            "rl:{%4}:p",
            "rl:{%FF}:p",
            "rl:{a#}:p",
            "rl:{a#07}:p",
            "rl:{a#-1}:p",
            "rl:{a#4294967296}:p",
        ] {
            let err = s.parse(bad).unwrap_err();
            assert_eq!(err.key, bad);
        }
        assert!(
            s.parse("rl:{%41}:p")
                .unwrap_err()
                .to_string()
                .contains("escaped")
        );
    }

    #[test]
    fn parse_round_trips_every_short_identity_over_hostile_bytes() {
        // Every identity of up to three characters from an alphabet holding the tag's
        // delimiters, the escape character, the shard separator and a non-ASCII letter.
        let alphabet = ['a', '{', '}', ':', '%', '#', ' ', 'é', '0'];
        let s = KeyScheme::with_prefix("rl");
        let mut ids = vec![String::new()];
        for len in 1..=3 {
            let mut next = Vec::new();
            for id in ids.iter().filter(|i| i.chars().count() == len - 1) {
                for c in alphabet {
                    next.push(format!("{id}{c}"));
                }
            }
            ids.extend(next);
        }
        assert_eq!(ids.len(), 1 + 9 + 81 + 729);
        for id in &ids {
            for (policy, shard) in [("p", None), ("a:b}{", Some(0)), ("", Some(u32::MAX))] {
                let identity = Identity::new(id.as_str());
                let key = s.shard_key(&identity, policy, shard);
                let parsed = s.parse(&key).unwrap();
                assert_eq!(
                    parsed,
                    ParsedKey {
                        identity,
                        policy: policy.to_string(),
                        shard
                    },
                    "{key}"
                );
            }
        }
    }

    proptest::proptest! {
        #[test]
        fn parse_inverts_shard_key(
            id in "(?s).{0,40}",
            policy in "(?s).{0,20}",
            shard in proptest::option::of(proptest::prelude::any::<u32>()),
        ) {
            let s = KeyScheme::default();
            let key = s.shard_key(&Identity::new(id.as_str()), &policy, shard);
            let parsed = s.parse(&key).unwrap();
            proptest::prop_assert_eq!(parsed.identity.as_str(), id.as_str());
            proptest::prop_assert_eq!(parsed.policy, policy);
            proptest::prop_assert_eq!(parsed.shard, shard);
        }

        #[test]
        fn a_parsed_key_rebuilds_to_itself(key in "rl:\\{[a-zA-Z0-9%:#{}]{0,12}\\}:[a-z:]{0,6}") {
            let s = KeyScheme::default();
            if let Ok(p) = s.parse(&key) {
                proptest::prop_assert_eq!(s.shard_key(&p.identity, &p.policy, p.shard), key);
            }
        }
    }

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
