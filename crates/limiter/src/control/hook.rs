//! Where the control plane meets a check: before the store is asked, each policy of the
//! check is screened (deny list, allow list, ban, override); after the answer, enforced
//! denials count towards automatic bans.

use std::sync::Arc;

use sluice_core::{Decision, DenyReason, Identity, Policy};

use super::{ControlPlane, Screen};
use crate::limiter::{Checked, PlannedItem, Verdict};

/// Applies the control plane to the planned items of a check. Overrides change an item's
/// parameters; allow-listed items get an admitting decision and skip the store; a deny-listed
/// or banned enforced item refuses the whole check, answered here without the store.
pub(crate) fn screen(
    control: &ControlPlane,
    items: &[(&Identity, &Arc<Policy>, u64)],
    planned: &mut Vec<PlannedItem>,
) -> Option<Checked> {
    if !control.active() {
        return None;
    }
    let now = control.now();
    let mut refused = false;
    for (item, &(identity, policy, _)) in planned.iter_mut().zip(items) {
        let quota = policy.algorithm.quota();
        let screen = control.screen_lazy(identity.as_str(), policy, &now);
        item.screened = screen != Screen::Pass;
        match screen {
            Screen::Pass => {}
            Screen::Override(p) => {
                item.algorithm = p.shard_algorithm();
                item.result.policy = p;
            }
            Screen::Allowed => {
                let quota = item.algorithm.quota();
                item.result.decision = Some(Decision::allow(quota, quota, 0));
                metrics::counter!("sluice_list_bypass_total", "policy" => policy.name.clone())
                    .increment(1);
            }
            Screen::Denied => {
                item.result.decision = Some(Decision::deny_listed(quota));
                refused |= !item.shadow;
            }
            Screen::Banned(left) => {
                item.result.decision = Some(Decision::banned(quota, left));
                refused |= !item.shadow;
            }
        }
    }
    if !refused {
        return None;
    }
    let limits = std::mem::take(planned)
        .into_iter()
        .map(|item| {
            let mut l = item.result;
            let d = l.decision.get_or_insert_with(|| not_evaluated(&l.policy));
            if d.allowed {
                *d = not_evaluated(&l.policy);
            }
            let outcome = match d.reason {
                Some(DenyReason::Banned) => "banned",
                Some(DenyReason::Denied) => "deny_listed",
                _ => "denied",
            };
            metrics::counter!("sluice_decisions_total", "policy" => l.policy.name.clone(), "outcome" => outcome)
                .increment(1);
            l
        })
        .collect();
    Some(Checked {
        allowed: false,
        verdict: Verdict::Decided,
        limits,
        leases: Vec::new(),
    })
}

/// The decision of a policy left unasked because another part of the check was refused by
/// the control plane (its state is unknown, so nothing remaining is claimed).
fn not_evaluated(policy: &Policy) -> Decision {
    Decision {
        allowed: false,
        limit: policy.algorithm.quota(),
        remaining: 0,
        retry_after_ms: 0,
        reset_after_ms: 0,
        delay_ms: 0,
        reason: Some(DenyReason::OtherLimitDenied),
        lease: None,
    }
}

/// Counts the check's enforced denials (limit used up) towards automatic bans.
pub(crate) fn after(
    control: &ControlPlane,
    items: &[(&Identity, &Arc<Policy>, u64)],
    checked: &Checked,
) {
    if !control
        .shared
        .has_ban_rules
        .load(std::sync::atomic::Ordering::Relaxed)
    {
        return;
    }
    for (l, &(identity, _, _)) in checked.limits.iter().zip(items) {
        if !l.policy.shadow
            && l.decision
                .as_ref()
                .is_some_and(|d| d.reason == Some(DenyReason::Limited))
        {
            control.note_denial(identity.as_str(), &l.policy.name);
        }
    }
}
