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

use std::fmt::Write as _;

/// The longest identity accepted, in bytes (before escaping).
pub const MAX_IDENTITY_LEN: usize = 512;

/// Who is being limited, e.g. `user:42`, `ip:203.0.113.0`, `key:h.3f9a...`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Identity(String);

impl Identity {
    /// An identity from its text as given (an application-chosen id, an IP...).
    pub fn new(text: impl Into<String>) -> Self {
        Self(text.into())
    }

    /// An identity derived from a secret credential: `<kind>:` followed by a keyed hash, so
    /// a key dump or `MONITOR` session never shows the credential.
    pub fn credential(kind: &str, secret: &[u8], hash_key: &[u8; 32]) -> Self {
        let digest = blake3::keyed_hash(hash_key, secret);
        let mut s = String::with_capacity(kind.len() + 34);
        s.push_str(kind);
        s.push_str(":h");
        for b in &digest.as_bytes()[..16] {
            let _ = write!(s, "{b:02x}");
        }
        Self(s)
    }

    /// The identity's text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Display for Identity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
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
    fn credentials_are_hashed() {
        let key = default_hash_key();
        let id = Identity::credential("key", b"sk_live_abc", &key);
        assert!(id.as_str().starts_with("key:h"));
        assert!(!id.as_str().contains("sk_live_abc"));
        assert_eq!(id, Identity::credential("key", b"sk_live_abc", &key));
        assert_ne!(id, Identity::credential("key", b"sk_live_abd", &key));
    }
}
