//! [`Limiter`]: policies + identities in, verdicts out, whatever the store.

use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::{Duration, Instant};

use sluice_core::key::key_slot;
use sluice_core::store::CheckItem;
use sluice_core::{FailureMode, Identity, KeyScheme, MultiDecision, Policy, Store, StoreError};

use crate::breaker::CircuitBreaker;
use crate::control::ControlPlane;
use crate::deny_cache::{DenyCache, DenyCacheMode};
use crate::leased::LeaseTable;
use crate::local::LocalFallback;

mod builder;
mod checked;
mod leased_ops;

mod reservation_ops;

mod state_ops;

mod store_call;
use store_call::Answer;

pub use builder::LimiterBuilder;
pub use checked::{Checked, Lease, LimitResult, Verdict};

#[derive(Debug)]
struct Inner {
    store: Arc<dyn Store>,
    keys: KeyScheme,
    timeout: Duration,
    breaker: CircuitBreaker,
    global_shadow: bool,
    log_interval_ms: u64,
    last_log_ms: AtomicU64,
    started: Instant,
    deny_mode: DenyCacheMode,
    deny_cache: Option<DenyCache>,
    local: LocalFallback,
    control: ControlPlane,
    observer: std::sync::OnceLock<Arc<dyn crate::observer::DecisionObserver>>,
    /// Leased-mode slices (`crate::leased`).
    leases: LeaseTable,
    /// Set once the task returning unspent slices runs.
    sweeper: std::sync::OnceLock<()>,
    /// Records of open reservations (`crate::reservation`).
    reservations: crate::reservation::Book,
}

/// One policy of a check on its way through [`Limiter::check_many`]: the result being filled
/// in, and what the store is asked to evaluate for it.
#[derive(Debug)]
pub(crate) struct PlannedItem {
    /// Policy, key and (once answered) the decision.
    pub(crate) result: LimitResult,
    /// The algorithm as evaluated on `result.key` (per shard for a sharded policy).
    pub(crate) algorithm: sluice_core::Algorithm,
    /// The cost of the request against this policy.
    cost: u64,
    /// Whether the policy only counts (its own `shadow` flag, or the limiter's global one).
    pub(crate) shadow: bool,
    /// Changed or answered by the control plane (override, allow list): the deny cache,
    /// filled under other parameters, does not answer for it.
    pub(crate) screened: bool,
}

impl PlannedItem {
    fn check_item(&self) -> CheckItem<'_> {
        CheckItem {
            key: &self.result.key,
            algorithm: &self.algorithm,
            cost: self.cost,
        }
    }

    /// The concurrency lease this item's decision holds, if any.
    fn lease(&self) -> Option<Lease> {
        let id = self.result.decision.as_ref()?.lease.clone()?;
        Some(Lease {
            key: self.result.key.clone(),
            algorithm: self.algorithm.clone(),
            id,
        })
    }
}

/// One store call of a check: the items (indices into the planned items) that go together.
#[derive(Debug)]
struct StoreCall {
    /// Shadow items are never in a call with enforced ones.
    shadow: bool,
    /// The Cluster slot of every key in the call (`None` when the store takes any keys).
    slot: Option<u16>,
    items: Vec<usize>,
}

/// The most denials the deny cache remembers at once.
const DENY_CACHE_CAPACITY: usize = 65_536;

impl Inner {
    /// µs on the limiter's monotonic clock (the deny cache's time).
    fn now_us(&self) -> u64 {
        self.started.elapsed().as_micros() as u64
    }
}

/// The rate limiter. Cheap to clone; clones share the store and the circuit breaker.
#[derive(Debug, Clone)]
pub struct Limiter {
    inner: Arc<Inner>,
}

impl Limiter {
    /// A limiter on a fresh embedded store (the `memory` feature).
    #[cfg(feature = "memory")]
    pub fn memory() -> Self {
        Self::builder(Arc::new(sluice_memory::MemoryStore::builder().build())).build()
    }

    /// A limiter on the store named by `url` (see [`crate::StoreUrl`]).
    pub async fn connect(url: &str, options: crate::StoreOptions) -> Result<Self, StoreError> {
        let parsed: crate::StoreUrl = url.parse()?;
        let prefix = KeyScheme::default().prefix().to_string();
        let (store, control) = crate::control::connect(&parsed, &options, &prefix).await?;
        Ok(Self::builder(store)
            .timeout(options.timeout)
            .control(control)
            .build())
    }

    /// The store behind this limiter.
    pub fn store(&self) -> &Arc<dyn Store> {
        &self.inner.store
    }

    /// The control plane: overrides, bans, allow and deny lists.
    pub fn control(&self) -> &ControlPlane {
        &self.inner.control
    }

    /// The key scheme.
    pub fn key_scheme(&self) -> &KeyScheme {
        &self.inner.keys
    }

    /// Checks one policy for one identity.
    pub async fn check(&self, identity: &Identity, policy: &Arc<Policy>, cost: u64) -> Checked {
        self.check_many(&[(identity, policy, cost)]).await
    }

    /// Checks several policies at once. Enforced policies whose keys share a hash tag are
    /// all-or-nothing (one store call); shadow policies are checked in a separate call so they
    /// never block consumption of enforced ones.
    pub async fn check_many(&self, items: &[(&Identity, &Arc<Policy>, u64)]) -> Checked {
        // The clock is read only for an observer: a clock read is not free on every host.
        let start = self.inner.observer.get().map(|_| Instant::now());
        let checked = self.decide_many(items).await;
        crate::control::hook::after(&self.inner.control, items, &checked);
        if let Some(observer) = self.inner.observer.get()
            && let Some(start) = start
        {
            observer.decision(&crate::observer::DecisionEvent {
                items,
                checked: &checked,
                elapsed: start.elapsed(),
                global_shadow: self.inner.global_shadow,
            });
        }
        checked
    }

    /// Sets the observer of every later decision and store call; `false` (and nothing
    /// changes) when one is already set.
    pub fn set_observer(&self, observer: Arc<dyn crate::observer::DecisionObserver>) -> bool {
        self.inner.observer.set(observer).is_ok()
    }

    async fn decide_many(&self, items: &[(&Identity, &Arc<Policy>, u64)]) -> Checked {
        let inner = &*self.inner;
        let mut planned: Vec<PlannedItem> = items
            .iter()
            .map(|&(identity, policy, cost)| self.plan(identity, policy, cost))
            .collect();

        if let Some(checked) = crate::control::hook::screen(&inner.control, items, &mut planned) {
            return checked;
        }
        if let Some(checked) = self.denied_locally(&mut planned) {
            return checked;
        }

        let mut spent = leased_ops::Spent::new();
        let mut enforced_denied = self.spend_leases(&mut planned, &mut spent).await;
        let calls = self.group_into_calls(&planned);
        let mut verdict = Verdict::Decided;
        for call in &calls {
            if !call.shadow && enforced_denied {
                break;
            }
            let sent = inner.now_us();
            let lease_sent = inner.leases.now();
            // One limit (most requests): the store's one-limit check, no `Vec` either way.
            let result = match call.items[..] {
                [i] => self
                    .call_store_one(&planned[i].check_item())
                    .await
                    .map(Answer::One),
                _ => {
                    let check_items: Vec<CheckItem<'_>> = call
                        .items
                        .iter()
                        .map(|&i| planned[i].check_item())
                        .collect();
                    self.call_store(&check_items).await.map(Answer::Many)
                }
            };
            if let Some(observer) = inner.observer.get() {
                let policies: Vec<&str> = call
                    .items
                    .iter()
                    .map(|&i| planned[i].result.policy.name.as_str())
                    .collect();
                let elapsed = Duration::from_micros(inner.now_us().saturating_sub(sent));
                observer.store_call(&policies, elapsed, result.as_ref().err());
            }
            match result {
                Ok(answer) => {
                    let allowed = answer.allowed();
                    for (&i, d) in call.items.iter().zip(answer) {
                        let item = &mut planned[i];
                        if let Some(cache) = &inner.deny_cache
                            && !call.shadow
                            && !item.screened
                            && inner.deny_mode.caches(&item.algorithm)
                        {
                            cache.record(&item.result.key, item.cost, sent, &d);
                        }
                        item.result.decision = Some(d);
                        if !call.shadow && !allowed {
                            self.note_leased_denial(item, lease_sent);
                        }
                    }
                    if !call.shadow && !allowed {
                        enforced_denied = true;
                    }
                }
                Err(e) => {
                    if call.shadow {
                        continue;
                    }
                    // sluice itself is saturated: answered conservatively, never failed open.
                    if matches!(e, StoreError::Overloaded(_)) {
                        verdict = Verdict::FailedClosed(e);
                        enforced_denied = true;
                        break;
                    }
                    let mode = |i: usize| planned[i].result.policy.failure_mode;
                    let mut closed = call.items.iter().any(|&i| mode(i) == FailureMode::Closed);
                    if !closed && call.items.iter().any(|&i| mode(i) == FailureMode::Local) {
                        let local: Vec<usize> = call
                            .items
                            .iter()
                            .copied()
                            .filter(|&i| mode(i) == FailureMode::Local)
                            .collect();
                        let items: Vec<CheckItem<'_>> =
                            local.iter().map(|&i| planned[i].check_item()).collect();
                        if let Some(MultiDecision { allowed, decisions }) =
                            inner.local.check(&items)
                        {
                            self.note_failure(&e, "local");
                            for (&i, d) in local.iter().zip(decisions) {
                                planned[i].result.decision = Some(d);
                            }
                            // Open policies of the same call still fail open.
                            if local.len() < call.items.len() {
                                verdict = Verdict::FailedOpen(e);
                            }
                            if !allowed {
                                enforced_denied = true;
                            }
                            continue;
                        }
                        // No embedded store in this build: the conservative answer.
                        closed = true;
                    }
                    self.note_failure(&e, if closed { "closed" } else { "open" });
                    verdict = if closed {
                        Verdict::FailedClosed(e)
                    } else {
                        Verdict::FailedOpen(e)
                    };
                    if closed {
                        enforced_denied = true;
                        break;
                    }
                }
            }
        }

        if enforced_denied {
            self.give_back_leases(&planned, &spent);
        }
        let mut leases: Vec<Lease> = planned.iter().filter_map(PlannedItem::lease).collect();
        // All-or-nothing across groups is best effort: if a later enforced group denied, release
        // leases taken by earlier groups (other algorithms' consumption cannot be undone; see docs).
        if enforced_denied && !leases.is_empty() {
            for lease in leases.drain(..) {
                let _ = self.release(&lease).await;
            }
        }

        let limits: Vec<LimitResult> = planned.into_iter().map(|item| item.result).collect();
        for l in &limits {
            let outcome = match (&l.decision, &verdict) {
                (Some(d), _) if d.allowed => "allowed",
                (Some(_), _) if l.policy.shadow || inner.global_shadow => "shadow_denied",
                (Some(_), _) => "denied",
                (None, Verdict::FailedClosed(StoreError::Overloaded(_))) => "overloaded",
                (None, Verdict::FailedClosed(_)) => "failed_closed",
                (None, _) => "failed_open",
            };
            metrics::counter!("sluice_decisions_total", "policy" => l.policy.name.clone(), "outcome" => outcome)
                .increment(1);
            if let Some(d) = &l.decision
                && d.allowed
                && d.limit > 0
                && d.remaining * 10 < d.limit
            {
                metrics::counter!("sluice_near_limit_total", "policy" => l.policy.name.clone())
                    .increment(1);
            }
        }

        Checked {
            allowed: !enforced_denied,
            verdict,
            limits,
            leases,
        }
    }

    /// One policy of a check: its key (a random shard's, for a sharded policy) and the
    /// algorithm the store runs there.
    fn plan(&self, identity: &Identity, policy: &Arc<Policy>, cost: u64) -> PlannedItem {
        let inner = &*self.inner;
        let key = if policy.shards > 1 {
            let shard = rand::random_range(0..policy.shards);
            inner.keys.shard_key(identity, &policy.name, Some(shard))
        } else {
            inner.keys.key(identity, &policy.name)
        };
        let algorithm = policy.shard_algorithm();
        PlannedItem {
            shadow: inner.global_shadow || policy.shadow,
            screened: false,
            result: LimitResult {
                policy: Arc::clone(policy),
                decision: None,
                key,
            },
            algorithm,
            cost,
        }
    }

    /// The store calls of a check: enforced vs shadow and, for Cluster, one per slot.
    /// Enforced calls come first, so a denial stops before later calls consume.
    fn group_into_calls(&self, planned: &[PlannedItem]) -> Vec<StoreCall> {
        let single_slot = self.inner.store.requires_single_slot();
        let mut calls: Vec<StoreCall> = Vec::new();
        for (i, item) in planned.iter().enumerate() {
            // Answered by the control plane (allow list) or refused (shadow ban).
            if item.result.decision.is_some() {
                continue;
            }
            let slot = single_slot.then(|| key_slot(item.result.key.as_bytes()));
            match calls
                .iter_mut()
                .find(|c| c.shadow == item.shadow && c.slot == slot)
            {
                Some(call) => call.items.push(i),
                None => calls.push(StoreCall {
                    shadow: item.shadow,
                    slot,
                    items: vec![i],
                }),
            }
        }
        calls.sort_by_key(|c| c.shadow);
        calls
    }

    /// The answer without a store call when every item of the check is an enforced policy
    /// whose key the deny cache holds as denied for this cost (see [`crate::deny_cache`]).
    fn denied_locally(&self, planned: &mut Vec<PlannedItem>) -> Option<Checked> {
        let inner = &*self.inner;
        let cache = inner.deny_cache.as_ref()?;
        if cache.is_empty() || planned.iter().any(|item| item.shadow || item.screened) {
            return None;
        }
        let now = inner.now_us();
        let mut decisions = Vec::with_capacity(planned.len());
        for item in planned.iter() {
            if !inner.deny_mode.caches(&item.algorithm) {
                return None;
            }
            decisions.push(cache.lookup(&item.result.key, item.cost, now)?);
        }
        let limits = std::mem::take(planned)
            .into_iter()
            .zip(decisions)
            .map(|(item, d)| {
                let mut l = item.result;
                l.decision = Some(d);
                metrics::counter!("sluice_decisions_total", "policy" => l.policy.name.clone(), "outcome" => "denied")
                    .increment(1);
                metrics::counter!("sluice_deny_cache_hits_total", "policy" => l.policy.name.clone())
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

    /// Forgets every denial the deny cache remembers. A remembered denial is exact only while
    /// the policy that made it is unchanged; a configuration reload that raises a limit makes
    /// room before the remembered time, so the server calls this when it installs a reload.
    pub fn forget_denials(&self) {
        if let Some(cache) = &self.inner.deny_cache {
            cache.clear();
        }
    }

    /// Denials answered by the deny cache without a store call, since the limiter was built.
    pub fn deny_cache_hits(&self) -> u64 {
        self.inner.deny_cache.as_ref().map_or(0, DenyCache::hits)
    }

    /// Releases a concurrency lease. Errors are returned, not retried: an unreleased lease
    /// expires after the policy's lease timeout.
    pub async fn release(&self, lease: &Lease) -> Result<bool, StoreError> {
        let inner = &*self.inner;
        // A lease taken in local mode is held by the embedded store.
        if inner.local.release(&lease.key, &lease.id) {
            return Ok(true);
        }
        let fut = inner.store.release(&lease.key, &lease.algorithm, &lease.id);
        self.bounded(fut).await
    }

    /// True while the circuit breaker is rejecting calls.
    pub fn store_circuit_open(&self) -> bool {
        self.inner.breaker.is_open()
    }
}
