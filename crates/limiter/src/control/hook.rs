//! Where the control plane meets a check: before the store is asked, each policy of the
//! check is screened (deny list, allow list, ban, override); after the answer, enforced
//! denials count towards automatic bans. The lists' networks are matched against the client
//! address an identity carries ([`Identity::network`]), never against its text: an
//! identity whose text merely spells an address is not that client.

use std::sync::Arc;

use sluice_core::{Decision, DenyReason, Identity, Policy};

use std::sync::atomic::Ordering;

use super::ControlPlane;
use super::clock::Now;
use super::tables::Found;
use crate::limiter::{Checked, PlannedItem, Verdict};

/// What the control plane says about one policy of a check.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Screen {
    Pass,
    Override(Arc<Policy>),
    Allowed,
    Denied,
    Banned(u64),
}

impl ControlPlane {
    /// True when some entry or list could change a decision.
    pub(crate) fn active(&self) -> bool {
        self.shared.active.load(Ordering::Relaxed)
    }

    /// What the control plane says about the identity of text `identity` under `policy`,
    /// for callers that only look for an override: the lists' networks are not matched (no
    /// address is known here). Order: deny list, allow list, ban, override.
    pub(crate) fn screen(&self, identity: &str, policy: &Arc<Policy>, now_ms: u64) -> Screen {
        self.screen_with(identity, None, policy, &Now::at(now_ms))
    }

    /// What the control plane says about `identity` under `policy`, at a time read only if
    /// an entry needs it; the lists' networks are matched against the client address the
    /// identity carries ([`sluice_core::Identity::network`]), never against its text.
    pub(crate) fn screen_lazy(
        &self,
        identity: &sluice_core::Identity,
        policy: &Arc<Policy>,
        now: &Now<'_>,
    ) -> Screen {
        self.screen_with(identity.as_str(), identity.network(), policy, now)
    }

    fn screen_with(
        &self,
        identity: &str,
        network: Option<sluice_core::ClientNet>,
        policy: &Arc<Policy>,
        now: &Now<'_>,
    ) -> Screen {
        let tables = self.shared.tables.read();
        match tables.screen(identity, network, &policy.name, now) {
            Found::Pass => Screen::Pass,
            Found::Denied => Screen::Denied,
            Found::Allowed => Screen::Allowed,
            Found::Banned(left) => Screen::Banned(left),
            // An override made for another algorithm (the policy changed since) is ignored.
            Found::Override(o, Some(a)) if a.kind() == policy.algorithm.kind() => {
                let generation = self.shared.generation.load(Ordering::Relaxed);
                Screen::Override(o.resolve(policy, generation, a, &self.shared.made))
            }
            Found::Override(..) => Screen::Pass,
        }
    }

    /// The time of one decision, read from the clock only if an entry needs it.
    pub(crate) fn now(&self) -> Now<'_> {
        Now::lazy(&*self.shared.clock)
    }

    /// The clock of the entries, Unix ms.
    pub(crate) fn clock_ms(&self) -> u64 {
        self.now_ms()
    }
}

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
        let screen = control.screen_lazy(identity, policy, &now);
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
