//! One key's slice in leased mode: how much of it may still be spent now, how much may go
//! back to the store, and how large the next one should be. The rules that keep leased mode
//! from ever admitting more than the limit (see [`super`]) live here, as pure arithmetic on
//! times, apart from the table's locking and the store calls.

use std::sync::Arc;

use sluice_core::{Algorithm, Rate, Timestamp};

/// How the slice of one key shrinks or ends.
#[derive(Debug, Clone, Copy)]
pub(super) enum Bound {
    /// Token bucket and GCRA: units held may not exceed `room` minus what the store has
    /// refilled at `rate` since the slice was taken (the room under the capacity it left).
    Refill {
        room: u64,
        rate: Rate,
        slack_us: u64,
    },
    /// Fixed and calendar windows: the window ends (estimated early) at this time.
    Window { end: Timestamp },
}

/// One key's slice and what the table learnt about the key.
#[derive(Debug)]
pub(super) struct Slot {
    pub(super) algorithm: Algorithm,
    pub(super) ttl_us: u64,
    /// Units of the current slice not yet spent (before shrinking by `bound`).
    pub(super) held: u64,
    /// The size of the current slice, and how much of it was spent.
    pub(super) size: u64,
    pub(super) used: u64,
    /// When the reservation was sent; the slice ends at `expires`.
    pub(super) taken: Timestamp,
    pub(super) expires: Timestamp,
    pub(super) bound: Bound,
    /// Counts slices, so a unit given back after its slice was replaced is not added to the
    /// new one.
    pub(super) generation: u64,
    /// The store's `remaining` and reset time as of the reservation (for the answer).
    pub(super) store_remaining: u64,
    pub(super) reset_at: Timestamp,
    pub(super) limit: u64,
    /// A reservation for this key is on its way: other requests meanwhile wait for it (up to
    /// the call timeout) on `waiters`, then are checked exactly.
    pub(super) in_flight: bool,
    pub(super) waiters: Option<Arc<tokio::sync::Notify>>,
    /// A remembered denial: requests of at least `denied_cost` are denied until `denied_until`.
    pub(super) denied_until: Timestamp,
    pub(super) denied_cost: u64,
    pub(super) denied_retry_at: Timestamp,
    pub(super) denied_reset_at: Timestamp,
    pub(super) denied_remaining: u64,
}

impl Slot {
    pub(super) fn new(algorithm: &Algorithm, ttl_us: u64) -> Self {
        Self {
            algorithm: algorithm.clone(),
            ttl_us,
            held: 0,
            size: 0,
            used: 0,
            taken: 0,
            expires: 0,
            bound: Bound::Window { end: 0 },
            generation: 0,
            store_remaining: 0,
            reset_at: 0,
            limit: algorithm.quota(),
            in_flight: false,
            waiters: None,
            denied_until: 0,
            denied_cost: 0,
            denied_retry_at: 0,
            denied_reset_at: 0,
            denied_remaining: 0,
        }
    }

    /// The reservation on its way is answered (or abandoned): its waiters spend again.
    pub(super) fn end_reservation(&mut self) {
        self.in_flight = false;
        if let Some(waiters) = self.waiters.take() {
            waiters.notify_waiters();
        }
    }

    /// Units of the slice that may still be spent at `at`.
    pub(super) fn spendable(&self, at: Timestamp) -> u64 {
        if at >= self.expires {
            return 0;
        }
        self.held_within_bound(at)
    }

    /// Units that may go back to the store by a refund sent at `at` that reaches the store
    /// within `margin_us`.
    pub(super) fn refundable(&self, at: Timestamp, margin_us: u64) -> u64 {
        self.held_within_bound(at.saturating_add(margin_us))
    }

    /// The units held that the store's state still leaves room for at `at`: none once the
    /// window has ended, and no more than the room a bucket has not refilled by then.
    fn held_within_bound(&self, at: Timestamp) -> u64 {
        match self.bound {
            Bound::Window { end } if at >= end => 0,
            Bound::Window { .. } => self.held,
            Bound::Refill {
                room,
                rate,
                slack_us,
            } => self.held.min(room.saturating_sub(refilled(
                rate,
                at.saturating_sub(self.taken),
                slack_us,
            ))),
        }
    }

    /// The size of the next slice, between 1 and `max` and at most twice the last one: the
    /// rate seen over the last slice for a whole lifetime, or twice the last size when the
    /// last slice lasted less than a tenth of its lifetime or was shrunk away before its end
    /// (`shrunk`: a bucket refilling faster than this instance spends, a key far under its
    /// limit, where a smaller slice would only die sooner).
    pub(super) fn next_size(&self, now: Timestamp, max: u64, shrunk: bool) -> u64 {
        if self.size == 0 {
            return 1;
        }
        let elapsed_us = now.saturating_sub(self.taken);
        let doubled = self.size.saturating_mul(2);
        if elapsed_us < self.ttl_us / 10 || shrunk {
            return doubled.clamp(1, max);
        }
        let by_rate = self.used as u128 * self.ttl_us as u128 / elapsed_us.max(1000) as u128;
        (by_rate as u64).min(doubled).clamp(1, max)
    }
}

/// Units a bucket refilling at `rate` may have gained in `elapsed_us`, rounded up; `slack_us`
/// covers a store that counts refill in whole milliseconds (the token bucket).
pub(super) fn refilled(rate: Rate, elapsed_us: u64, slack_us: u64) -> u64 {
    let us = elapsed_us as u128 + slack_us as u128;
    (us * rate.amount as u128).div_ceil(rate.per_ms as u128 * 1000) as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: u64 = 1_000_000;

    fn slot(size: u64, used: u64, taken: Timestamp) -> Slot {
        let mut s = Slot::new(
            &Algorithm::FixedWindow {
                limit: 10_000,
                window_ms: 60_000,
            },
            S,
        );
        (s.size, s.used, s.taken) = (size, used, taken);
        s
    }

    #[test]
    fn a_first_slice_is_one_unit_and_a_rarely_seen_key_keeps_slices_of_one() {
        assert_eq!(slot(0, 0, 0).next_size(10 * S, 1000, false), 1);
        // One request every 10 s with a 1 s lifetime.
        assert_eq!(slot(1, 1, 0).next_size(10 * S, 1000, false), 1);
    }

    #[test]
    fn slices_follow_the_rate_and_at_most_double() {
        // 50 spent over 0.5 s: 100 per lifetime, but at most twice the 40 of the last slice.
        assert_eq!(slot(40, 50, 0).next_size(S / 2, 1000, false), 80);
        // 30 spent over 2 s: 15 per lifetime.
        assert_eq!(slot(100, 30, 0).next_size(2 * S, 1000, false), 15);
        // Gone within a tenth of the lifetime: doubles, up to the largest slice.
        assert_eq!(slot(600, 1, 0).next_size(S / 20, 1000, false), 1000);
        // Shrunk away by a refill, late in its life: doubles too.
        assert_eq!(slot(300, 1, 0).next_size(S / 2, 1000, true), 600);
    }

    #[test]
    fn a_bucket_slice_shrinks_with_the_refill_and_a_window_slice_ends_with_its_window() {
        let mut s = slot(10, 0, 0);
        s.held = 10;
        s.expires = S;
        s.bound = Bound::Refill {
            room: 10,
            rate: Rate::per_second(1000),
            slack_us: 0,
        };
        assert_eq!(s.spendable(0), 10);
        // 1 unit per ms refilled: 4 ms leave room for 6.
        assert_eq!(s.spendable(4000), 6);
        assert_eq!(s.spendable(20_000), 0);
        s.bound = Bound::Window { end: 5000 };
        assert_eq!(s.spendable(4999), 10);
        assert_eq!(s.spendable(5000), 0);
        // A refund that may arrive after the window's end is not sent.
        assert_eq!(s.refundable(4000, 1000), 0);
        assert_eq!(s.refundable(3000, 1000), 10);
    }
}
