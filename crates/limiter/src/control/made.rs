//! The policies overrides make. An override names parameters or a plan; a decision needs a
//! policy. Building one per decision would copy the policy on every check of an overridden
//! identity, so each override keeps the policy it made, and identities with the same
//! parameters share one.

use sluice_core::Algorithm;

use super::entries::OverrideEntry;
use super::tables::FastMap;

/// An override and the policy it makes, built on first use and kept while the policy it was
/// built from and the configuration's plans stay the same (a decision then costs an `Arc`
/// clone, not a copy of the policy).
#[derive(Debug)]
pub(crate) struct OverrideSlot {
    pub(crate) entry: OverrideEntry,
    resolved: parking_lot::Mutex<Option<Resolved>>,
}

#[derive(Debug)]
struct Resolved {
    generation: u64,
    base: std::sync::Arc<sluice_core::Policy>,
    policy: std::sync::Arc<sluice_core::Policy>,
}

impl OverrideSlot {
    pub(crate) fn new(entry: OverrideEntry) -> Self {
        OverrideSlot {
            entry,
            resolved: parking_lot::Mutex::new(None),
        }
    }

    /// `base` with `algorithm`, remembered for `generation` of the plans; made by `made`,
    /// so slots with the same parameters share one policy.
    pub(crate) fn resolve(
        &self,
        base: &std::sync::Arc<sluice_core::Policy>,
        generation: u64,
        algorithm: &Algorithm,
        made: &MadePolicies,
    ) -> std::sync::Arc<sluice_core::Policy> {
        let mut cached = self.resolved.lock();
        if let Some(r) = cached.as_ref()
            && r.generation == generation
            && std::sync::Arc::ptr_eq(&r.base, base)
        {
            return std::sync::Arc::clone(&r.policy);
        }
        let policy = made.get(base, generation, algorithm);
        *cached = Some(Resolved {
            generation,
            base: std::sync::Arc::clone(base),
            policy: std::sync::Arc::clone(&policy),
        });
        policy
    }
}

/// The policies overrides make, one per base policy and parameters: a thousand identities
/// on one plan (or with the same numbers) share one policy, so deciding for them keeps one
/// policy in the CPU's cache instead of one per identity.
#[derive(Debug, Default)]
pub(crate) struct MadePolicies(parking_lot::Mutex<FastMap<(usize, Algorithm), Resolved>>);

/// The most distinct policies [`MadePolicies`] keeps (it starts over beyond).
const MAX_MADE_POLICIES: usize = 4096;

impl MadePolicies {
    fn get(
        &self,
        base: &std::sync::Arc<sluice_core::Policy>,
        generation: u64,
        algorithm: &Algorithm,
    ) -> std::sync::Arc<sluice_core::Policy> {
        let mut made = self.0.lock();
        let key = (std::sync::Arc::as_ptr(base) as usize, algorithm.clone());
        if let Some(r) = made.get(&key)
            && r.generation == generation
            && std::sync::Arc::ptr_eq(&r.base, base)
        {
            return std::sync::Arc::clone(&r.policy);
        }
        if made.len() >= MAX_MADE_POLICIES {
            made.clear();
        }
        let mut p = (**base).clone();
        p.algorithm = algorithm.clone();
        let policy = std::sync::Arc::new(p);
        made.insert(
            key,
            Resolved {
                generation,
                base: std::sync::Arc::clone(base),
                policy: std::sync::Arc::clone(&policy),
            },
        );
        policy
    }
}
