//! The exact memory of evicted keys: one slot per evicted key, found again by the key's own
//! keyed hash, so a key inherits a trace only if it is the key that left it.
//!
//! Why not only the sketch ([`crate::summary`]): a sketch cell is shared by every key that hashes
//! to it, so once a flood has evicted a few times as many keys as a row has cells, most of a
//! fresh identity's cells hold some flooder's trace and the identity is denied from its first
//! request (with `max_keys = 10000`, 50,000 fresh identities at cost = capacity denied about
//! two thirds of new ones). Here a slot holds a tag (56 bits of the evicted key's 64-bit keyed
//! hash and its 8-bit policy index) and its trace, 24 bytes; another key matches it only if
//! those 56 bits are equal, about 16 in 2^56 per check. The sketch stays as the fallback for the
//! traces that find no slot.
//!
//! # Layout
//! Buckets of [`BUCKET`] slots; a key may sit in either of two buckets (its hash times two
//! different odd constants, scaled to the number of buckets) and goes to the emptier one, which
//! keeps the table over 90% full before a bucket overflows. A slot whose trace is back at rest is free. The table
//! starts at [`INITIAL_SLOTS`] and doubles when both buckets of a new trace are full of live
//! ones: each bucket splits into two, so every slot finds room (a last step up to `max_slots`
//! that is not a doubling may push a few slots to the sketch). At `max_slots` it stops
//! growing; a trace that finds both of its buckets full then pushes out the trace of the 17
//! (16 held and the new one) that is back at rest soonest, and [`Fingerprints::record`] returns
//! it for the sketch. So a flood larger than the table degrades to the sketch's precision for
//! the excess, never to less restriction.
#![forbid(unsafe_code)]

use sluice_core::Timestamp;

use crate::summary::Trace;

/// Slots per bucket.
pub const BUCKET: usize = 8;
/// Slots of a table when its first trace is recorded.
pub const INITIAL_SLOTS: usize = 64;
/// Bytes of one slot.
pub const SLOT_BYTES: usize = std::mem::size_of::<Slot>();

/// One evicted key: its [`tag`] and its trace. Free when `until` has passed (`until == 0` for
/// a slot never used).
#[derive(Debug, Clone, Copy, Default)]
struct Slot {
    tag: u64,
    until: Timestamp,
    amount: u64,
}

/// The high 56 bits of a key's hash, which place it in the table, and the policy index in the
/// low 8: what a slot matches on.
#[inline]
fn tag(hash: u64, policy: u8) -> u64 {
    (hash & !0xFF) | u64::from(policy)
}

/// A trace that found no slot: it belongs in the sketch of `policy`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Overflow {
    pub hash: u64,
    pub policy: u8,
    pub trace: Trace,
}

impl Overflow {
    /// The trace of a slot, for the sketch (which places keys by the 56 bits a tag keeps).
    fn of(slot: Slot) -> Self {
        Overflow {
            hash: slot.tag & !0xFF,
            policy: slot.tag as u8,
            trace: Trace {
                amount: slot.amount,
                until: slot.until,
            },
        }
    }
}

/// The table of evicted keys (see the module docs).
#[derive(Debug, Clone)]
pub struct Fingerprints {
    slots: Vec<Slot>,
    /// The most slots the table grows to: a power of two, at least one bucket.
    max_slots: usize,
}

impl Fingerprints {
    /// An empty table (no allocation) that grows to at most `max_slots` slots (rounded down to
    /// whole buckets, at least one).
    pub fn new(max_slots: usize) -> Self {
        let max_slots = (max_slots / BUCKET).max(1) * BUCKET;
        Self {
            slots: Vec::new(),
            max_slots,
        }
    }

    /// The most slots this table grows to.
    pub fn max_slots(&self) -> usize {
        self.max_slots
    }

    /// Slots allocated.
    pub fn slots(&self) -> usize {
        self.slots.len()
    }

    /// Whether nothing was ever recorded.
    pub fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }

    /// Bytes of the slot array.
    pub fn heap_bytes(&self) -> usize {
        self.slots.capacity() * SLOT_BYTES
    }

    /// Slots holding a live trace at `now`.
    pub fn live(&self, now: Timestamp) -> usize {
        self.slots.iter().filter(|s| s.until > now).count()
    }

    /// The first slot of each of the two buckets of `hash` (or of a tag: only its high 56
    /// bits count) in a table of `len` slots: the product of the hash and an odd constant,
    /// scaled to the number of buckets (`x * n / 2^64`, so doubling `n` sends a bucket's keys
    /// to buckets `2b` and `2b + 1` only).
    fn buckets(hash: u64, len: usize) -> [usize; 2] {
        let hash = hash & !0xFF;
        let n = (len / BUCKET) as u128;
        let pick = |c: u64| ((u128::from(hash.wrapping_mul(c)) * n) >> 64) as usize * BUCKET;
        [pick(0x9E37_79B9_7F4A_7C15), pick(0xC2B2_AE3D_27D4_EB4F)]
    }

    /// The trace recorded for the key of `hash` under `policy`, if it is still live.
    pub fn find(&self, hash: u64, policy: u8, now: Timestamp) -> Option<Trace> {
        if self.slots.is_empty() {
            return None;
        }
        let tag = tag(hash, policy);
        Self::buckets(hash, self.slots.len())
            .into_iter()
            .flat_map(|b| &self.slots[b..b + BUCKET])
            .find(|s| s.tag == tag && s.until > now)
            .map(|s| Trace {
                amount: s.amount,
                until: s.until,
            })
    }

    /// Records the trace of an evicted key. A live trace of the same hash and policy is
    /// merged (the larger amount, the later time: the key's state was rebuilt from it, and if
    /// another key shares the hash both stay covered). Returns the traces that found no slot
    /// (usually none, one when the table is full, a few when its last growth could not place
    /// them all): they must go to the sketch.
    pub fn record(&mut self, hash: u64, policy: u8, trace: Trace, now: Timestamp) -> Vec<Overflow> {
        let mut spilled = Vec::new();
        if trace.until <= now {
            return spilled;
        }
        if self.slots.is_empty() {
            self.slots = vec![Slot::default(); INITIAL_SLOTS.min(self.max_slots)];
        }
        let tag = tag(hash, policy);
        loop {
            let buckets = Self::buckets(hash, self.slots.len());
            for b in buckets {
                if let Some(s) = self.slots[b..b + BUCKET]
                    .iter_mut()
                    .find(|s| s.tag == tag && s.until > now)
                {
                    s.amount = s.amount.max(trace.amount);
                    s.until = s.until.max(trace.until);
                    return spilled;
                }
            }
            let live = |b: usize| {
                self.slots[b..b + BUCKET]
                    .iter()
                    .filter(|s| s.until > now)
                    .count()
            };
            let emptier = if live(buckets[1]) < live(buckets[0]) {
                buckets[1]
            } else {
                buckets[0]
            };
            if let Some(s) = self.slots[emptier..emptier + BUCKET]
                .iter_mut()
                .find(|s| s.until <= now)
            {
                *s = Slot {
                    tag,
                    until: trace.until,
                    amount: trace.amount,
                };
                return spilled;
            }
            if self.slots.len() < self.max_slots {
                self.grow(now, &mut spilled);
                continue;
            }
            // Full: the trace back at rest soonest leaves for the sketch.
            let soonest = buckets
                .into_iter()
                .flat_map(|b| b..b + BUCKET)
                .min_by_key(|&i| self.slots[i].until)
                .unwrap_or(0);
            let out = self.slots[soonest];
            if trace.until <= out.until {
                spilled.push(Overflow {
                    hash,
                    policy,
                    trace,
                });
                return spilled;
            }
            self.slots[soonest] = Slot {
                tag,
                until: trace.until,
                amount: trace.amount,
            };
            // The slot kept the hash's high 56 bits: all the sketch places a key by.
            spilled.push(Overflow::of(out));
            return spilled;
        }
    }

    /// Doubles the table (or grows it to `max_slots`, if less), dropping the traces back at
    /// rest. A live slot goes to the new bucket of the same choice it sat in; when the table
    /// doubles that always has room (each old bucket splits into two new ones). On a last,
    /// smaller step a new bucket can receive slots from two old ones: a slot that finds both of
    /// its buckets full is pushed to `spilled`, for the sketch.
    fn grow(&mut self, now: Timestamp, spilled: &mut Vec<Overflow>) {
        let len = (self.slots.len() * 2).min(self.max_slots);
        let mut next = vec![Slot::default(); len];
        for (i, s) in self.slots.iter().enumerate() {
            if s.until <= now {
                continue;
            }
            let old = Self::buckets(s.tag, self.slots.len());
            // The bucket it sat in (the first if both are the same one).
            let which = usize::from(old[0] != i / BUCKET * BUCKET);
            let new = Self::buckets(s.tag, len);
            let free = [new[which], new[1 - which]]
                .into_iter()
                .find_map(|b| (b..b + BUCKET).find(|&j| next[j].until == 0));
            match free {
                Some(j) => next[j] = *s,
                None => spilled.push(Overflow::of(*s)),
            }
        }
        self.slots = next;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const T0: Timestamp = 1_700_000_000_000_000;

    fn trace(amount: u64, until: Timestamp) -> Trace {
        Trace { amount, until }
    }

    fn hash(i: u64) -> u64 {
        i.wrapping_mul(0x2545_F491_4F6C_DD1D) ^ (i << 7)
    }

    #[test]
    fn a_slot_is_24_bytes() {
        assert_eq!(SLOT_BYTES, 24);
    }

    #[test]
    fn a_key_finds_only_its_own_trace() {
        let mut f = Fingerprints::new(1 << 12);
        for i in 0..1000 {
            assert_eq!(f.record(hash(i), 0, trace(i, T0 + 10), T0), vec![]);
        }
        for i in 0..1000 {
            assert_eq!(f.find(hash(i), 0, T0), Some(trace(i, T0 + 10)));
            assert_eq!(f.find(hash(i), 1, T0), None, "another policy");
        }
        for i in 1000..100_000 {
            assert_eq!(f.find(hash(i), 0, T0), None);
        }
        // Gone once back at rest.
        assert_eq!(f.find(hash(3), 0, T0 + 10), None);
    }

    #[test]
    fn a_key_recorded_twice_keeps_the_larger_trace() {
        let mut f = Fingerprints::new(64);
        f.record(7, 0, trace(5, T0 + 10), T0);
        f.record(7, 0, trace(2, T0 + 30), T0);
        assert_eq!(f.find(7, 0, T0), Some(trace(5, T0 + 30)));
        assert_eq!(f.live(T0), 1);
    }

    #[test]
    fn growth_keeps_every_live_trace_and_drops_those_at_rest() {
        let mut f = Fingerprints::new(1 << 16);
        for i in 0..20_000 {
            let until = if i % 2 == 0 { T0 + 5 } else { T0 + 100 };
            assert_eq!(f.record(hash(i), 0, trace(1, until), T0), vec![]);
        }
        assert!(f.slots() <= 1 << 15, "{} slots", f.slots());
        // After the even ones are back at rest, the odd ones survive more growth.
        for i in 20_000..40_000 {
            assert_eq!(f.record(hash(i), 0, trace(1, T0 + 100), T0 + 6), vec![]);
        }
        for i in (1..40_000).step_by(2) {
            assert!(f.find(hash(i), 0, T0 + 6).is_some(), "{i}");
        }
        assert_eq!(f.live(T0 + 6), 30_000);
    }

    #[test]
    fn a_full_table_hands_the_soonest_trace_to_the_sketch() {
        // A power of two, and sizes whose last growth is not a doubling.
        for max in [64usize, 1000, 1032, 4096] {
            let mut f = Fingerprints::new(max);
            let n = 3 * max as u64;
            let mut out = Vec::new();
            for i in 0..n {
                out.extend(f.record(hash(i), 0, trace(1, T0 + 1000 + i), T0));
            }
            assert_eq!(f.slots(), max);
            // Every trace is either held or handed out, none lost.
            for i in 0..n {
                let held = f.find(hash(i), 0, T0).is_some();
                let handed = out.iter().any(|o| o.hash == hash(i) & !0xFF);
                assert!(held ^ handed, "{max}: {i}: held {held}, handed {handed}");
            }
            // Most of the table is used.
            assert!(f.live(T0) >= max * 8 / 10, "{max}: {} live", f.live(T0));
        }
    }
}
