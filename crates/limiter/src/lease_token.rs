//! [`LeaseToken`]: a check's concurrency leases as one opaque text, for callers that release
//! them in a later request (`sluice serve`'s `/v1/release`).
//!
//! A token lists `policy~key~id` per lease, `,` between leases, each part percent-escaped so
//! neither separator appears inside it. It carries no algorithm: [`LeaseToken::leases`] finds
//! it again from the policy, and accepts only keys that the limiter builds for that policy,
//! so a token, which the caller can edit, cannot touch any other state.

use std::fmt::Write as _;

use sluice_core::{Identity, KeyScheme, LeaseId, Policy};

use crate::limiter::{Checked, Lease};

/// One lease of a token, named by its policy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenLease {
    /// The policy the lease was taken under.
    pub policy: String,
    /// The key holding the lease.
    pub key: String,
    /// The lease id.
    pub id: LeaseId,
}

/// Why a token cannot be released.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LeaseTokenError {
    /// The text is not a token.
    #[error("malformed lease token")]
    Malformed,
    /// The token names a policy that is not configured.
    #[error("unknown policy {0:?}")]
    UnknownPolicy(String),
    /// The token names a policy that takes no leases.
    #[error("policy {0:?} is not a concurrency policy")]
    NotConcurrency(String),
    /// A key of the token is not one the limiter builds for its policy.
    #[error("the lease token names a key that is not one of policy {0:?}'s")]
    ForeignKey(String),
    /// A key of the token belongs to another identity than the one given.
    #[error("the lease token was not taken for this identity")]
    OtherIdentity,
}

/// The concurrency leases of one check.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct LeaseToken {
    leases: Vec<TokenLease>,
}

/// Bytes written as they are; every other byte is `%XX`. `~` and `,` are not among them.
fn is_plain(b: u8) -> bool {
    b.is_ascii_alphanumeric()
        || matches!(
            b,
            b'-' | b'_' | b'.' | b':' | b'{' | b'}' | b'#' | b'@' | b'/' | b'+' | b'='
        )
}

fn escape_into(out: &mut String, s: &str) {
    for b in s.bytes() {
        if is_plain(b) {
            out.push(b as char);
        } else {
            let _ = write!(out, "%{b:02X}");
        }
    }
}

fn unescape(s: &str) -> Option<String> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let hex = s.get(i + 1..i + 3)?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

impl LeaseToken {
    /// The leases `checked` took, each named by its policy; `None` when it took none.
    pub fn from_checked(checked: &Checked) -> Option<Self> {
        let leases: Vec<TokenLease> = checked
            .leases
            .iter()
            .filter_map(|lease| {
                let limit = checked.limits.iter().find(|l| l.key == lease.key)?;
                Some(TokenLease {
                    policy: limit.policy.name.clone(),
                    key: lease.key.clone(),
                    id: lease.id.clone(),
                })
            })
            .collect();
        (!leases.is_empty()).then_some(Self { leases })
    }

    /// The leases of the token, as written.
    pub fn entries(&self) -> &[TokenLease] {
        &self.leases
    }

    /// The token as text.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        for (i, l) in self.leases.iter().enumerate() {
            if i > 0 {
                out.push(',');
            }
            escape_into(&mut out, &l.policy);
            out.push('~');
            escape_into(&mut out, &l.key);
            out.push('~');
            escape_into(&mut out, &l.id.0);
        }
        out
    }

    /// Reads a token's text back.
    pub fn decode(text: &str) -> Result<Self, LeaseTokenError> {
        let mut leases = Vec::new();
        for part in text.split(',') {
            let mut it = part.split('~');
            let (Some(p), Some(k), Some(i), None) = (it.next(), it.next(), it.next(), it.next())
            else {
                return Err(LeaseTokenError::Malformed);
            };
            let [policy, key, id] = [p, k, i].map(unescape);
            let (Some(policy), Some(key), Some(id)) = (policy, key, id) else {
                return Err(LeaseTokenError::Malformed);
            };
            if policy.is_empty() || key.is_empty() || id.is_empty() {
                return Err(LeaseTokenError::Malformed);
            }
            leases.push(TokenLease {
                policy,
                key,
                id: LeaseId(id),
            });
        }
        Ok(Self { leases })
    }

    /// The leases to hand to [`crate::Limiter::release`]. Every key must be one `keys` builds
    /// for its policy (the right shard range included), found by `policy`, which must be a
    /// concurrency policy; with `identity`, every key must also be that identity's.
    pub fn leases<'p>(
        &self,
        keys: &KeyScheme,
        policy: impl Fn(&str) -> Option<&'p Policy>,
        identity: Option<&Identity>,
    ) -> Result<Vec<Lease>, LeaseTokenError> {
        self.leases
            .iter()
            .map(|l| {
                let p = policy(&l.policy)
                    .ok_or_else(|| LeaseTokenError::UnknownPolicy(l.policy.clone()))?;
                let parsed = keys
                    .parse(&l.key)
                    .map_err(|_| LeaseTokenError::ForeignKey(l.policy.clone()))?;
                let shard_fits = match parsed.shard {
                    None => p.shards <= 1,
                    Some(s) => p.shards > 1 && s < p.shards,
                };
                if parsed.policy != p.name || !shard_fits {
                    return Err(LeaseTokenError::ForeignKey(l.policy.clone()));
                }
                // By text: keys are made of it, and a parsed key carries no address.
                if identity.is_some_and(|id| id.as_str() != parsed.identity.as_str()) {
                    return Err(LeaseTokenError::OtherIdentity);
                }
                let algorithm = p.shard_algorithm();
                if !algorithm.holds_leases() {
                    return Err(LeaseTokenError::NotConcurrency(l.policy.clone()));
                }
                Ok(Lease {
                    key: l.key.clone(),
                    algorithm,
                    id: l.id.clone(),
                })
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_core::Algorithm;

    fn uploads(shards: u32) -> Policy {
        let mut p = Policy::new(
            "uploads",
            Algorithm::Concurrency {
                limit: 4,
                lease_ms: 60_000,
            },
        )
        .unwrap();
        p.shards = shards;
        p
    }

    #[test]
    fn parts_round_trip_without_separators() {
        for s in ["rl:{user:42}:uploads", "a~b,c%d", "é ", ""] {
            let mut out = String::new();
            escape_into(&mut out, s);
            assert!(!out.contains('~') && !out.contains(','));
            assert_eq!(unescape(&out).as_deref(), Some(s));
        }
    }

    #[test]
    fn a_token_round_trips_and_resolves_to_its_leases() {
        let keys = KeyScheme::default();
        let p = uploads(1);
        let alice = Identity::new("user:a~l,i%ce");
        let token = LeaseToken {
            leases: vec![
                TokenLease {
                    policy: "uploads".into(),
                    key: keys.key(&alice, "uploads"),
                    id: LeaseId("id,1~x".into()),
                },
                TokenLease {
                    policy: "uploads".into(),
                    key: keys.key(&alice, "uploads"),
                    id: LeaseId("2".into()),
                },
            ],
        };
        let text = token.encode();
        assert_eq!(text.matches(',').count(), 1, "{text}");
        let back = LeaseToken::decode(&text).unwrap();
        assert_eq!(back, token);
        let find = |n: &str| (n == "uploads").then_some(&p);
        let leases = back.leases(&keys, find, Some(&alice)).unwrap();
        assert_eq!(leases.len(), 2);
        assert_eq!(leases[0].key, keys.key(&alice, "uploads"));
        assert_eq!(leases[0].id, LeaseId("id,1~x".into()));
        assert_eq!(leases[0].algorithm, p.algorithm);
        assert_eq!(
            back.leases(&keys, find, Some(&Identity::new("user:bob"))),
            Err(LeaseTokenError::OtherIdentity)
        );
        // A client-IP identity owns the leases of its key (a key names no address).
        let client = Identity::parse_client_ip("ip:203.0.113.7").unwrap();
        let token = LeaseToken {
            leases: vec![TokenLease {
                policy: "uploads".into(),
                key: keys.key(&client, "uploads"),
                id: LeaseId("1".into()),
            }],
        };
        assert_eq!(
            token.leases(&keys, find, Some(&client)).map(|l| l.len()),
            Ok(1)
        );
    }

    #[test]
    fn a_token_cannot_name_other_state() {
        let keys = KeyScheme::default();
        let p = uploads(1);
        let sharded = uploads(4);
        let id = Identity::new("u");
        let resolve = |policy: &Policy, key: String| {
            let token = LeaseToken {
                leases: vec![TokenLease {
                    policy: "uploads".into(),
                    key,
                    id: LeaseId("1".into()),
                }],
            };
            let token = LeaseToken::decode(&token.encode()).unwrap();
            token.leases(&keys, |_| Some(policy), None).map(|l| l.len())
        };
        let foreign = Err(LeaseTokenError::ForeignKey("uploads".into()));
        assert_eq!(resolve(&p, keys.key(&id, "uploads")), Ok(1));
        assert_eq!(resolve(&p, keys.key(&id, "other")), foreign);
        assert_eq!(resolve(&p, "session:42".into()), foreign);
        assert_eq!(
            resolve(&p, keys.shard_key(&id, "uploads", Some(0))),
            foreign
        );
        let in_range = keys.shard_key(&id, "uploads", Some(3));
        assert_eq!(resolve(&sharded, in_range), Ok(1));
        let beyond = keys.shard_key(&id, "uploads", Some(4));
        assert_eq!(resolve(&sharded, beyond), foreign);
        let mut window = uploads(1);
        window.algorithm = Algorithm::FixedWindow {
            limit: 1,
            window_ms: 1000,
        };
        assert_eq!(
            resolve(&window, keys.key(&id, "uploads")),
            Err(LeaseTokenError::NotConcurrency("uploads".into()))
        );
        let unknown = LeaseToken::decode("nope~k~1").unwrap();
        assert_eq!(
            unknown.leases(&keys, |_| None, None),
            Err(LeaseTokenError::UnknownPolicy("nope".into()))
        );
        for bad in ["", "a~b", "a~b~c~d", "a~b~%G1", "a~~1", "p~k~1,"] {
            assert_eq!(
                LeaseToken::decode(bad),
                Err(LeaseTokenError::Malformed),
                "{bad:?}"
            );
        }
    }
}
