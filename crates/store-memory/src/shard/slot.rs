//! One slot of a shard's table: a key and its state in exactly one 64-byte cache line, and
//! what each part costs in heap bytes.
//!
//! Kept apart from the table's probing because the layout is what decides how many cache
//! lines a lookup reads (issue 23: a 100k-key table must stay cache-friendly) and what the
//! shard's byte count charges for a key; the tests below pin the slot at one line.
#![forbid(unsafe_code)]

use sluice_core::Algorithm;
use sluice_core::Timestamp;
use sluice_core::algorithm::{State, rest_time};

use crate::cell::{Cell, CellKind};

/// A stored state and when it is back to its initial value.
#[derive(Debug, Clone)]
pub(crate) struct Entry {
    pub(crate) state: State,
    pub(crate) expires_at: Timestamp,
}

/// How a slot holds its state.
#[derive(Debug)]
pub(super) enum Value {
    Cell(Cell),
    Boxed(Box<Entry>),
}

impl Value {
    /// A cell when the state fits one and its expiry follows from it and `algorithm` (the
    /// slot's policy, `None` for keys of the shared sketch); else a box.
    pub(super) fn of(entry: Entry, algorithm: Option<&Algorithm>) -> Self {
        let derived = algorithm.and_then(|a| rest_time(a, &entry.state));
        match (CellKind::encode(&entry.state), derived) {
            (Some((kind, bits)), Some(at)) => {
                debug_assert_eq!(
                    at, entry.expires_at,
                    "{:?} under {algorithm:?}",
                    entry.state
                );
                Value::Cell(Cell::new(kind, bits))
            }
            _ => Value::Boxed(Box::new(entry)),
        }
    }

    /// The entry, with its expiry (a cell's from `algorithm`, the slot's policy).
    pub(super) fn held(&self, algorithm: Option<&Algorithm>) -> Held<'_> {
        match self {
            Value::Cell(c) => {
                let (_, state) = c.read();
                let expires_at = algorithm
                    .and_then(|a| rest_time(a, &state))
                    .unwrap_or(Timestamp::MAX);
                Held::Copied(Entry { state, expires_at })
            }
            Value::Boxed(e) => Held::Ref(e),
        }
    }

    /// When the state is back at rest (a cell's from `algorithm`, the slot's policy).
    #[inline]
    pub(super) fn expires_at(&self, algorithm: Option<&Algorithm>) -> Timestamp {
        match self {
            Value::Cell(c) => algorithm
                .and_then(|a| rest_time(a, &c.read().1))
                .unwrap_or(Timestamp::MAX),
            Value::Boxed(e) => e.expires_at,
        }
    }

    /// Heap bytes: the box and the state's own heap part.
    pub(super) fn heap(&self) -> usize {
        match self {
            Value::Cell(_) => 0,
            Value::Boxed(e) => alloc_bytes(std::mem::size_of::<Entry>()) + state_heap(&e.state),
        }
    }
}

/// A stored entry as read: borrowed from its box or copied out of its cell.
#[derive(Debug)]
pub(crate) enum Held<'a> {
    Ref(&'a Entry),
    Copied(Entry),
}

impl std::ops::Deref for Held<'_> {
    type Target = Entry;
    fn deref(&self) -> &Entry {
        match self {
            Held::Ref(e) => e,
            Held::Copied(e) => e,
        }
    }
}

/// Key bytes held in the slot itself; a longer key gets a heap block of its own.
pub(super) const INLINE_KEY: usize = 29;

/// A slot's key and the index of the policy its state was written under (which sketch
/// summarizes the key if it is evicted). A key of up to [`INLINE_KEY`] bytes (most
/// `rl:{ip:...}:<policy>` and `rl:{user:...}:<policy>` keys) sits in the slot, so finding it
/// reads no cache line besides the slot's and costs no heap block; a longer one is boxed.
/// 32 bytes either way.
#[derive(Debug)]
pub(super) enum Key {
    Inline {
        policy: u8,
        len: u8,
        bytes: [u8; INLINE_KEY],
    },
    Heap {
        policy: u8,
        bytes: Box<[u8]>,
    },
}

impl Key {
    pub(super) fn new(key: &[u8], policy: u8) -> Self {
        if key.len() <= INLINE_KEY {
            let mut bytes = [0; INLINE_KEY];
            bytes[..key.len()].copy_from_slice(key);
            Key::Inline {
                policy,
                len: key.len() as u8,
                bytes,
            }
        } else {
            Key::Heap {
                policy,
                bytes: key.into(),
            }
        }
    }

    #[inline]
    pub(super) fn bytes(&self) -> &[u8] {
        match self {
            Key::Inline { len, bytes, .. } => bytes.get(..usize::from(*len)).unwrap_or(bytes),
            Key::Heap { bytes, .. } => bytes,
        }
    }

    #[inline]
    pub(super) fn policy(&self) -> u8 {
        match self {
            Key::Inline { policy, .. } | Key::Heap { policy, .. } => *policy,
        }
    }

    pub(super) fn set_policy(&mut self, to: u8) {
        match self {
            Key::Inline { policy, .. } | Key::Heap { policy, .. } => *policy = to,
        }
    }

    /// Heap bytes: the block of a key too long for its slot.
    pub(super) fn heap(&self) -> usize {
        match self {
            Key::Inline { .. } => 0,
            Key::Heap { bytes, .. } => alloc_bytes(bytes.len()),
        }
    }
}

/// A key and its state. Exactly one cache line, aligned to one, so a lookup that misses the
/// cache costs one line for the slot (and, for a key longer than [`INLINE_KEY`], one for its
/// bytes). The key's hash is not kept: growing the table hashes the keys again.
#[derive(Debug)]
#[repr(align(64))]
pub(super) struct Slot {
    pub(super) key: Key,
    pub(super) value: Value,
}

impl Slot {
    #[inline]
    pub(super) fn is(&self, key: &[u8]) -> bool {
        self.key.bytes() == key
    }
}

/// Bytes the allocator takes for a block of `n` bytes (glibc: 8 bytes of header, 16-byte
/// steps, 32 bytes at least).
#[inline]
pub(super) fn alloc_bytes(n: usize) -> usize {
    if n == 0 {
        0
    } else {
        (n + 8).next_multiple_of(16).max(32)
    }
}

/// Heap bytes held by a state.
#[inline]
pub(super) fn state_heap(state: &State) -> usize {
    match state {
        State::SlidingWindowLog(s) => {
            alloc_bytes(s.entries.capacity() * std::mem::size_of::<(u64, u64)>())
        }
        State::Concurrency(s) => {
            alloc_bytes(
                s.leases.capacity()
                    * std::mem::size_of::<sluice_core::algorithm::concurrency::Lease>(),
            ) + s
                .leases
                .iter()
                .map(|l| alloc_bytes(l.id.0.capacity()))
                .sum::<usize>()
        }
        _ => 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_slot_fits_one_cache_line() {
        assert_eq!(std::mem::size_of::<Slot>(), 64);
        assert_eq!(std::mem::size_of::<Key>(), 32);
    }

    #[test]
    fn keys_up_to_29_bytes_sit_in_the_slot() {
        for len in [0, 1, 21, INLINE_KEY, INLINE_KEY + 1, 100] {
            let text: Vec<u8> = (0..len).map(|i| b'a' + (i % 26) as u8).collect();
            let mut key = Key::new(&text, 3);
            assert_eq!(key.bytes(), &text[..]);
            assert_eq!(key.policy(), 3);
            key.set_policy(7);
            assert_eq!((key.bytes(), key.policy()), (&text[..], 7));
            let heap = if len <= INLINE_KEY {
                0
            } else {
                alloc_bytes(len)
            };
            assert_eq!(key.heap(), heap, "{len}");
            // A key is never taken for a prefix or an extension of itself.
            let slot = Slot {
                key,
                value: Value::Cell(Cell::new(CellKind::Gcra, 1)),
            };
            assert!(slot.is(&text));
            assert!(len == 0 || !slot.is(&text[..len - 1]));
            assert!(!slot.is(&[&text[..], b"a"].concat()));
        }
    }
}
