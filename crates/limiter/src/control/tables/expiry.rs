//! Removing entries that ended, from the expiry queue: each sweep pops at most the given
//! number of ended items, so the tables' write lock is held for a bounded time however many
//! entries end at once. An item may be stale (its entry changed since); the entry decides.

use std::cmp::Reverse;

use super::super::ListKind;
use super::super::networks::Listed;
use super::{Slot, Tables};

impl Tables {
    /// Removes at most `max` entries that ended at `now_ms` or before; how many went.
    pub(crate) fn sweep(&mut self, now_ms: u64, max: usize) -> usize {
        let mut removed = 0;
        for _ in 0..max {
            match self.expiring.peek() {
                Some(Reverse((t, _))) if *t <= now_ms => {}
                _ => break,
            }
            let Some(Reverse((_, slot))) = self.expiring.pop() else {
                break;
            };
            removed += self.drop_ended(&slot, now_ms);
        }
        removed
    }

    /// Removes what ended on one identity or network.
    fn drop_ended(&mut self, slot: &Slot, now_ms: u64) -> usize {
        let ended = |l: &mut Listed| matches!(l.runtime, Some(Some(t)) if t <= now_ms);
        let mut removed = 0;
        match slot {
            Slot::Identity(identity) => {
                let Some(e) = self.identities.get_mut(&**identity) else {
                    return 0;
                };
                for kind in [ListKind::Allow, ListKind::Deny] {
                    let l = e.lists.of(kind);
                    if ended(l) {
                        l.runtime = None;
                        *self.counts.list(kind) -= 1;
                        removed += 1;
                    }
                }
                let before = e.bans.len();
                e.bans.retain(|b| b.until_ms > now_ms);
                let gone = before - e.bans.len();
                self.counts.bans -= gone;
                let before = e.overrides.len();
                e.overrides
                    .retain(|(_, o)| o.entry.expires_at_ms.is_none_or(|t| t > now_ms));
                let gone_o = before - e.overrides.len();
                self.counts.overrides -= gone_o;
                removed += gone + gone_o;
                self.prune(identity);
            }
            Slot::Net(n) => {
                let Some(lists) = self.networks.nets.get_mut(n) else {
                    return 0;
                };
                for kind in [ListKind::Allow, ListKind::Deny] {
                    let l = lists.of(kind);
                    if ended(l) {
                        l.runtime = None;
                        *self.counts.list(kind) -= 1;
                        removed += 1;
                    }
                }
                self.networks.prune(n);
            }
        }
        removed
    }
}
