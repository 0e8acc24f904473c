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
//!
//! [`Identity`] itself, and the [`ClientNet`] it may carry, live in `key/identity.rs`: the
//! scheme only escapes an identity's text into a key.

use std::fmt::Write as _;

mod identity;

pub use identity::{ClientNet, Identity, MAX_IDENTITY_LEN, default_hash_key};

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
}
