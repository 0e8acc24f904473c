//! `limiter.reserve` and `Reservation`: [`sluice::Limiter::reserve`] from Node, for calls
//! whose cost is known only after they ran (an LLM call's tokens).
//!
//! `await limiter.reserve(policy, identity, maxCost)` checks and consumes the maximum;
//! `await reservation.settle(used)` gives back what was not used (or charges the excess as
//! debt), once. A reservation collected unsettled stays spent in full: nothing is refunded
//! without a settle. `limiter.settle(id, cost)` settles one made by another process sharing
//! the store.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use napi::Env;
use napi::bindgen_prelude::{Buffer, Either, PromiseRaw};
use napi_derive::napi;
use sluice::{SettleError, Settled};

use crate::decision::CheckedJs;
use crate::limiter::{Limiter, identity_of};
use crate::policy::Policy;
use crate::{invalid, store_error, whole};

/// Options of `limiter.reserve`.
#[napi(object)]
#[derive(Default)]
pub struct ReserveOptions {
    /// When an unsettled reservation counts in full, in ms (default 60000).
    pub ttl_ms: Option<f64>,
    /// An API key or other secret to limit by instead of an identity; hashed first.
    pub credential: Option<Either<String, Buffer>>,
}

impl std::fmt::Debug for ReserveOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never print the credential.
        f.debug_struct("ReserveOptions")
            .field("ttl_ms", &self.ttl_ms)
            .field("credential", &self.credential.as_ref().map(|_| "<secret>"))
            .finish()
    }
}

/// What a settle did.
#[napi(object)]
#[derive(Debug, Clone)]
pub struct SettledJs {
    /// The policy reserved from.
    pub policy: String,
    /// The identity reserved for (a credential's hash).
    pub identity: String,
    /// The maximum reserved.
    pub max_cost: f64,
    /// The real cost it was settled with.
    pub cost: f64,
    /// Units given back.
    pub refunded: f64,
    /// Units charged beyond the maximum.
    pub debt: f64,
}

impl From<Settled> for SettledJs {
    fn from(s: Settled) -> Self {
        SettledJs {
            policy: s.policy,
            identity: s.identity,
            max_cost: s.max_cost as f64,
            cost: s.actual as f64,
            refunded: s.refunded as f64,
            debt: s.debt as f64,
        }
    }
}

fn settle_error(e: SettleError) -> napi::Error {
    match e {
        SettleError::Store(sluice::StoreError::Invalid(m)) => invalid(m),
        SettleError::Store(e) => store_error(format!(
            "the reservation was not settled and counts in full: {e}"
        )),
        other => napi::Error::new(napi::Status::GenericFailure, other.to_string()),
    }
}

/// An admitted (or denied) reservation: the check of the maximum, and the handle to settle.
#[napi]
#[derive(Debug)]
pub struct Reservation {
    checked: CheckedJs,
    id: Option<String>,
    max_cost: u64,
    /// Taken by the first settle.
    handle: Arc<Mutex<Option<sluice::Reservation>>>,
}

#[napi]
impl Reservation {
    /// Whether the request may go ahead.
    #[napi(getter)]
    pub fn allowed(&self) -> bool {
        self.checked.allowed
    }

    /// The id that settles it from any process sharing the store; null when denied, or
    /// admitted without consuming (failed open, allow-listed): nothing to settle.
    #[napi(getter)]
    pub fn id(&self) -> Option<String> {
        self.id.clone()
    }

    /// The maximum reserved.
    #[napi(getter)]
    pub fn max_cost(&self) -> f64 {
        self.max_cost as f64
    }

    /// The check of the maximum, as `limiter.check` answers it (numbers and headers).
    #[napi(getter)]
    pub fn checked(&self) -> CheckedJs {
        self.checked.clone()
    }

    /// Settles it with the real `cost`; a Promise of what was refunded or charged as debt.
    /// Rejects when settled already, when nothing was reserved, or when the store failed
    /// (the reservation then counts in full).
    #[napi(ts_return_type = "Promise<SettledJs>")]
    pub fn settle<'env>(
        &self,
        env: &'env Env,
        cost: f64,
    ) -> napi::Result<PromiseRaw<'env, SettledJs>> {
        let cost = whole(cost, "cost")?;
        let handle = self
            .handle
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
            .ok_or_else(|| {
                invalid(if self.id.is_some() {
                    "the reservation was settled already"
                } else {
                    "nothing was reserved (denied, or admitted without consuming): nothing to settle"
                })
            })?;
        env.spawn_future(async move {
            handle
                .settle(cost)
                .await
                .map(SettledJs::from)
                .map_err(settle_error)
        })
    }
}

#[napi]
impl Limiter {
    /// Reserves `maxCost` of `policy` for `identity` (or `{ credential }`) until it is settled
    /// with the real cost or `{ ttlMs }` ends (then it counts in full); a Promise of a
    /// `Reservation`.
    #[napi(ts_return_type = "Promise<Reservation>")]
    pub fn reserve<'env>(
        &self,
        env: &'env Env,
        policy: &Policy,
        identity: Option<String>,
        max_cost: f64,
        options: Option<ReserveOptions>,
    ) -> napi::Result<PromiseRaw<'env, Reservation>> {
        let o = options.unwrap_or_default();
        let max_cost = whole(max_cost, "maxCost")?;
        let ttl = Duration::from_millis(
            o.ttl_ms
                .map(|t| whole(t, "ttlMs"))
                .transpose()?
                .unwrap_or(60_000),
        );
        let credential = o.credential.as_ref().map(|c| match c {
            Either::A(text) => text.as_bytes(),
            Either::B(buf) => buf.as_ref(),
        });
        let identity = identity_of(identity, credential, &self.hash_key)?;
        let limiter = self.limiter.clone();
        let policy = Arc::clone(&policy.inner);
        let headers = self.headers;
        env.spawn_future(async move {
            let reserved = limiter
                .reserve(&identity, &policy, max_cost, ttl)
                .await
                .map_err(|e| match e {
                    sluice::StoreError::Invalid(m) => invalid(m),
                    other => store_error(format!("could not reserve: {other}")),
                })?;
            Ok(Reservation {
                checked: CheckedJs::of(&reserved.checked, &headers),
                id: reserved.reservation.as_ref().map(|r| r.id().to_string()),
                max_cost,
                handle: Arc::new(Mutex::new(reserved.reservation)),
            })
        })
    }

    /// Settles the reservation `id` (made by any process sharing the store) with the real
    /// `cost`; a Promise of what was refunded or charged as debt.
    #[napi(ts_return_type = "Promise<SettledJs>")]
    pub fn settle<'env>(
        &self,
        env: &'env Env,
        id: String,
        cost: f64,
    ) -> napi::Result<PromiseRaw<'env, SettledJs>> {
        let cost = whole(cost, "cost")?;
        let limiter = self.limiter.clone();
        env.spawn_future(async move {
            limiter
                .settle(&id, cost)
                .await
                .map(SettledJs::from)
                .map_err(settle_error)
        })
    }
}
