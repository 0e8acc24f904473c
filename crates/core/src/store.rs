//! The [`Store`] trait: where limiter state lives. A store evaluates the algorithms of
//! [`crate::algorithm`] atomically against its state; the embedded store runs the Rust
//! functions under a lock, the Redis store runs Lua scripts with the same semantics.

use crate::algorithm::Adjustment;
use crate::decision::{Decision, LeaseId, MultiDecision};
use crate::policy::Algorithm;

/// One limit of a check: the full key name, the algorithm, and the cost of this request.
#[derive(Debug, Clone, Copy)]
pub struct CheckItem<'a> {
    /// The key, built by [`crate::KeyScheme`].
    pub key: &'a str,
    /// The algorithm and its parameters.
    pub algorithm: &'a Algorithm,
    /// Units to consume; 0 peeks without consuming.
    pub cost: u64,
}

/// Why a store could not answer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StoreError {
    /// The store did not answer within the configured timeout.
    #[error("store timed out after {0} ms")]
    Timeout(u64),
    /// The store could not be reached (connection refused, reset, circuit open...).
    #[error("store unavailable: {0}")]
    Unavailable(String),
    /// The store answered something unexpected (a script error, a protocol error...).
    #[error("store error: {0}")]
    Backend(String),
    /// The request itself was invalid (e.g. keys of one check in different Cluster slots).
    #[error("invalid request: {0}")]
    Invalid(String),
    /// sluice itself is saturated: the call waited in sluice's own queue beyond its bound (or
    /// the queue was full) and was never sent. Says nothing about the store's health, so it
    /// is answered conservatively (denied), never failed open.
    #[error("overloaded: {0}")]
    Overloaded(String),
}

/// A place where limiter state lives.
///
/// `check` is all-or-nothing: when every item admits, every item is consumed; when any item
/// denies, nothing is consumed and the decisions show the unconsumed state. It is atomic with
/// respect to every other call on the same keys, from any process sharing the store.
#[async_trait::async_trait]
pub trait Store: Send + Sync + std::fmt::Debug + 'static {
    /// Checks (and, if every item admits, consumes) several limits at once.
    async fn check(&self, items: &[CheckItem<'_>]) -> Result<MultiDecision, StoreError>;

    /// Checks (and, if it admits, consumes) one limit: what [`Store::check`] answers for one
    /// item, without the result `Vec`. The default asks `check`; a store with a cheaper path
    /// for one limit overrides it (the embedded store decides in place).
    async fn check_one(&self, item: &CheckItem<'_>) -> Result<Decision, StoreError> {
        let mut answer = self.check(std::slice::from_ref(item)).await?;
        answer
            .decisions
            .pop()
            .ok_or_else(|| StoreError::Backend("the store answered no decision".into()))
    }

    /// Releases a concurrency lease taken by an earlier check of `key`. Returns whether the
    /// lease was still held (false once it expired or was released).
    async fn release(
        &self,
        key: &str,
        algorithm: &Algorithm,
        lease: &LeaseId,
    ) -> Result<bool, StoreError>;

    /// A short name for logs and metrics (`memory`, `redis`, `redis-cluster`).
    fn kind(&self) -> &'static str;

    /// Deletes the state of `key`, whatever its algorithm: the identity starts afresh.
    /// Returns whether there was a state. (Reading a state without consuming is a `check` of
    /// cost 0, which never writes.)
    async fn reset(&self, key: &str) -> Result<bool, StoreError> {
        let _ = key;
        Err(StoreError::Invalid(format!(
            "the {} store cannot reset state",
            self.kind()
        )))
    }

    /// Charges or refunds `key`'s state without an admission check, atomically, as
    /// [`crate::algorithm::adjust`] defines; answers the state afterwards as a check of cost 0
    /// sees it. A concurrency limit answers [`StoreError::Invalid`].
    async fn adjust(
        &self,
        key: &str,
        algorithm: &Algorithm,
        adjustment: Adjustment,
    ) -> Result<Decision, StoreError> {
        let _ = (key, algorithm);
        Err(StoreError::Invalid(format!(
            "the {} store cannot {}",
            self.kind(),
            adjustment.name()
        )))
    }

    /// True when every key of one `check` must hash to one Redis Cluster slot. Callers then
    /// check limits of different hash tags in separate calls (see `docs/redis.md`).
    fn requires_single_slot(&self) -> bool {
        false
    }

    /// The longest one call can take when the store bounds its own calls: its wait in the
    /// store's own queue plus its round trip, each under its own bound. `None` (the default):
    /// the caller's timeout bounds the whole call. A caller that waits longer than this bound
    /// is saturated itself, not seeing a store failure.
    fn call_bound(&self) -> Option<std::time::Duration> {
        None
    }

    /// How many entries the store dropped before they expired, by kind (the embedded store's
    /// `at_rest` and `informative` evictions, see `docs/embedded-store.md`). Empty for stores
    /// that never evict on their own (Redis evicts by its `maxmemory-policy`, which sluice
    /// cannot see).
    fn evictions(&self) -> Vec<(&'static str, u64)> {
        Vec::new()
    }
}

#[async_trait::async_trait]
impl<S: Store + ?Sized> Store for std::sync::Arc<S> {
    async fn check(&self, items: &[CheckItem<'_>]) -> Result<MultiDecision, StoreError> {
        (**self).check(items).await
    }
    async fn check_one(&self, item: &CheckItem<'_>) -> Result<Decision, StoreError> {
        (**self).check_one(item).await
    }
    async fn release(
        &self,
        key: &str,
        algorithm: &Algorithm,
        lease: &LeaseId,
    ) -> Result<bool, StoreError> {
        (**self).release(key, algorithm, lease).await
    }
    fn kind(&self) -> &'static str {
        (**self).kind()
    }
    async fn reset(&self, key: &str) -> Result<bool, StoreError> {
        (**self).reset(key).await
    }
    async fn adjust(
        &self,
        key: &str,
        algorithm: &Algorithm,
        adjustment: Adjustment,
    ) -> Result<Decision, StoreError> {
        (**self).adjust(key, algorithm, adjustment).await
    }
    fn requires_single_slot(&self) -> bool {
        (**self).requires_single_slot()
    }
    fn call_bound(&self) -> Option<std::time::Duration> {
        (**self).call_bound()
    }
    fn evictions(&self) -> Vec<(&'static str, u64)> {
        (**self).evictions()
    }
}
