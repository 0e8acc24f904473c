//! `Limiter`: a [`sluice::Limiter`] chosen by URL, checked from Node without blocking.
//!
//! Identities given as `{ credential }` are hashed with
//! [`sluice_http::identity::api_key_identity`], the function the Rust layer applies to an
//! `x-api-key` header and `sluice serve` to a `credential` field: with the same hash key all
//! of them limit one API key under one Redis key.

use std::sync::Arc;
use std::time::Duration;

use napi::bindgen_prelude::{Either, Function, PromiseRaw, Unknown};
use napi::threadsafe_function::{ThreadsafeFunction, ThreadsafeFunctionCallMode};
use napi::{Env, Status};
use napi_derive::napi;
use sluice::core::key::{MAX_IDENTITY_LEN, default_hash_key};
use sluice::{Identity, LeaseToken, StoreOptions};
use sluice_http::HeaderOptions;
use sluice_http::identity::api_key_identity;

use crate::decision::CheckResult;
use crate::policy::Policy;
use crate::{invalid, number, store_error, whole};

/// Options of `Limiter.connect`.
#[napi(object)]
#[derive(Debug, Default)]
pub struct ConnectOptions {
    /// Bound of every store call, in ms (default 50).
    pub timeout_ms: Option<f64>,
    /// Embedded store: the most keys tracked before eviction.
    pub max_keys: Option<f64>,
    /// Embedded store: the most bytes allocated before eviction.
    pub max_memory: Option<f64>,
    /// The secret credentials are hashed with: 64 hex digits, the `identity_hash_key` of the
    /// other services that must share limits (default: sluice's built-in key).
    pub hash_key: Option<String>,
    /// Also give `X-RateLimit-Limit`, `-Remaining` and `-Reset` in `headers`.
    pub legacy_headers: Option<bool>,
}

/// Options of `limiter.check`.
#[napi(object)]
#[derive(Default)]
pub struct CheckOptions {
    /// What the request costs (default 1).
    pub cost: Option<f64>,
    /// An API key or other secret to limit by instead of an identity; hashed first.
    pub credential: Option<Either<String, napi::bindgen_prelude::Buffer>>,
}

impl std::fmt::Debug for CheckOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never print the credential.
        f.debug_struct("CheckOptions")
            .field("cost", &self.cost)
            .field("credential", &self.credential.as_ref().map(|_| "<secret>"))
            .finish()
    }
}

/// Parses a hash key written as 64 hex digits (`openssl rand -hex 32`), as `sluice.toml`'s
/// `identity_hash_key` is written.
pub(crate) fn hash_key_from_hex(text: Option<&str>) -> napi::Result<[u8; 32]> {
    let Some(s) = text.map(str::trim) else {
        return Ok(default_hash_key());
    };
    if s.len() != 64 || !s.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(invalid(
            "hashKey must be 64 hex digits (32 bytes), e.g. the output of `openssl rand -hex 32`",
        ));
    }
    let mut out = [0u8; 32];
    for (i, byte) in out.iter_mut().enumerate() {
        *byte = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).map_err(|e| invalid(e.to_string()))?;
    }
    Ok(out)
}

/// The identity of a check: `identity` as given, or `credential` hashed; exactly one.
fn identity_of(
    identity: Option<String>,
    credential: Option<&[u8]>,
    hash_key: &[u8; 32],
) -> napi::Result<Identity> {
    match (identity, credential) {
        (Some(_), Some(_)) => Err(invalid(
            "give either an identity or { credential }, not both: a credential is hashed into the identity",
        )),
        (None, None) => Err(invalid(
            "missing identity (who is limited, e.g. 'user:42') or { credential } (an API key)",
        )),
        (Some(s), None) if s.is_empty() => Err(invalid("identity must not be empty")),
        (Some(s), None) if s.len() > MAX_IDENTITY_LEN => Err(invalid(format!(
            "identity is {} bytes; the most is {MAX_IDENTITY_LEN}",
            s.len()
        ))),
        (Some(s), None) => Ok(Identity::new(s)),
        (None, Some([])) => Err(invalid("credential must not be empty")),
        (None, Some(c)) => Ok(api_key_identity(c, hash_key)),
    }
}

/// One finished check on its way back to JS: the id `submit` was given and the result.
#[napi(object)]
#[derive(Debug, Clone)]
pub struct Completion {
    pub id: u32,
    pub result: CheckResult,
}

/// The JS function that receives batches of completions; weak, so it never keeps the
/// process alive by itself (`index.js` holds a timer while checks are pending).
type Deliver = ThreadsafeFunction<(), Unknown<'static>, Vec<Completion>, Status, false, true, 0>;

/// Finished checks waiting for the JS thread. Results are queued and the JS thread is woken
/// once per batch, not once per check: with many checks in flight one wake-up delivers all
/// the results that finished meanwhile, which is where a per-call Promise spends its time.
struct Outbox {
    queue: Arc<std::sync::Mutex<Vec<Completion>>>,
    deliver: Deliver,
}

impl std::fmt::Debug for Outbox {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Outbox").finish_non_exhaustive()
    }
}

impl Outbox {
    fn push(&self, completion: Completion) {
        let first = {
            let mut queue = self.queue.lock().unwrap_or_else(|e| e.into_inner());
            queue.push(completion);
            queue.len() == 1
        };
        // A non-empty queue already has a delivery on its way, which takes everything.
        if first {
            self.deliver
                .call((), ThreadsafeFunctionCallMode::NonBlocking);
        }
    }
}

/// A rate limiter on one store.
#[napi]
#[derive(Debug, Clone)]
pub struct Limiter {
    pub(crate) limiter: sluice::Limiter,
    pub(crate) hash_key: [u8; 32],
    pub(crate) headers: HeaderOptions,
    outbox: Option<Arc<Outbox>>,
}

#[napi]
impl Limiter {
    /// Connects to `url` (`memory`, `redis://`, `rediss://`, `redis+cluster://`); a Promise.
    #[napi(ts_return_type = "Promise<Limiter>")]
    pub fn connect<'env>(
        env: &'env Env,
        url: String,
        options: Option<ConnectOptions>,
    ) -> napi::Result<PromiseRaw<'env, Limiter>> {
        let o = options.unwrap_or_default();
        let mut store = StoreOptions::default();
        if let Some(ms) = o.timeout_ms {
            let ms = whole(ms, "timeoutMs")?;
            if ms == 0 {
                return Err(invalid("timeoutMs must be at least 1"));
            }
            store.timeout = Duration::from_millis(ms);
        }
        if let Some(n) = o.max_keys {
            store.max_keys = whole(n, "maxKeys")? as usize;
        }
        store.max_memory = o
            .max_memory
            .map(|n| whole(n, "maxMemory"))
            .transpose()?
            .map(|n| n as usize);
        let hash_key = hash_key_from_hex(o.hash_key.as_deref())?;
        let headers = HeaderOptions {
            ratelimit: true,
            legacy: o.legacy_headers.unwrap_or(false),
        };
        env.spawn_future(async move {
            let limiter = sluice::Limiter::connect(&url, store).await.map_err(|e| {
                store_error(format!(
                    "cannot use store {}: {e}",
                    sluice::url::redact(&url)
                ))
            })?;
            Ok(Limiter {
                limiter,
                hash_key,
                headers,
                outbox: None,
            })
        })
    }

    /// Checks `policy` for `identity` (or `{ credential }`) at `{ cost }`; a Promise of the
    /// result. A store failure never rejects: the policy's failure mode decides.
    #[napi(ts_return_type = "Promise<CheckResult>")]
    pub fn check<'env>(
        &self,
        env: &'env Env,
        policy: &Policy,
        identity: Option<String>,
        options: Option<CheckOptions>,
    ) -> napi::Result<PromiseRaw<'env, CheckResult>> {
        let o = options.unwrap_or_default();
        let cost = o.cost.map(|c| whole(c, "cost")).transpose()?.unwrap_or(1);
        let credential = o.credential.as_ref().map(|c| match c {
            Either::A(text) => text.as_bytes(),
            Either::B(buf) => buf.as_ref(),
        });
        let identity = identity_of(identity, credential, &self.hash_key)?;
        let limiter = self.limiter.clone();
        let policy = Arc::clone(&policy.inner);
        let headers = self.headers;
        env.spawn_future(async move {
            let checked = limiter.check(&identity, &policy, cost).await;
            Ok(CheckResult::of(&checked, &headers))
        })
    }

    /// Sets the function that receives finished `submit` checks, as arrays of
    /// `{ id, result }`, several at once when several finished meanwhile.
    #[napi(ts_args_type = "deliver: (batch: Completion[]) => void")]
    pub fn deliver_to(
        &mut self,
        deliver: Function<'_, Vec<Completion>, Unknown<'static>>,
    ) -> napi::Result<()> {
        let queue: Arc<std::sync::Mutex<Vec<Completion>>> = Arc::default();
        let drained = Arc::clone(&queue);
        let deliver = deliver
            .build_threadsafe_function::<()>()
            .weak::<true>()
            .callee_handled::<false>()
            .build_callback(move |_| {
                Ok(std::mem::take(
                    &mut *drained.lock().unwrap_or_else(|e| e.into_inner()),
                ))
            })?;
        self.outbox = Some(Arc::new(Outbox { queue, deliver }));
        Ok(())
    }

    /// `check` without a Promise per call: the result comes back through `deliverTo`'s
    /// function under `id`. Bad input throws here, synchronously.
    #[napi]
    pub fn submit(
        &self,
        id: u32,
        policy: &Policy,
        identity: Option<String>,
        options: Option<CheckOptions>,
    ) -> napi::Result<()> {
        let outbox = self
            .outbox
            .clone()
            .ok_or_else(|| invalid("submit needs deliverTo first"))?;
        let o = options.unwrap_or_default();
        let cost = o.cost.map(|c| whole(c, "cost")).transpose()?.unwrap_or(1);
        let credential = o.credential.as_ref().map(|c| match c {
            Either::A(text) => text.as_bytes(),
            Either::B(buf) => buf.as_ref(),
        });
        let identity = identity_of(identity, credential, &self.hash_key)?;
        let limiter = self.limiter.clone();
        let policy = Arc::clone(&policy.inner);
        let headers = self.headers;
        napi::bindgen_prelude::spawn(async move {
            let checked = limiter.check(&identity, &policy, cost).await;
            outbox.push(Completion {
                id,
                result: CheckResult::of(&checked, &headers),
            });
        });
        Ok(())
    }

    /// Gives back the concurrency leases of a check's `leaseToken`, taken under `policy`; a
    /// Promise of how many the store still held.
    #[napi(ts_return_type = "Promise<number>")]
    pub fn release<'env>(
        &self,
        env: &'env Env,
        policy: &Policy,
        lease_token: String,
    ) -> napi::Result<PromiseRaw<'env, f64>> {
        let token = LeaseToken::decode(&lease_token).map_err(|e| invalid(e.to_string()))?;
        let leases = token
            .leases(
                self.limiter.key_scheme(),
                |name| (name == policy.inner.name).then_some(&*policy.inner),
                None,
            )
            .map_err(|e| invalid(e.to_string()))?;
        let limiter = self.limiter.clone();
        env.spawn_future(async move {
            let mut released = 0u64;
            let mut first_error = None;
            for lease in &leases {
                match limiter.release(lease).await {
                    Ok(true) => released += 1,
                    Ok(false) => {}
                    Err(e) => {
                        first_error.get_or_insert(e);
                    }
                }
            }
            match first_error {
                Some(e) => Err(store_error(format!("lease release failed: {e}"))),
                None => Ok(number(released)),
            }
        })
    }

    /// The identity a credential is limited as with this limiter's hash key (`key:h...`).
    #[napi]
    pub fn credential_identity(
        &self,
        credential: Either<String, napi::bindgen_prelude::Buffer>,
    ) -> napi::Result<String> {
        let bytes: &[u8] = match &credential {
            Either::A(text) => text.as_bytes(),
            Either::B(buf) => buf.as_ref(),
        };
        identity_of(None, Some(bytes), &self.hash_key).map(|i| i.as_str().to_string())
    }

    /// The store key a policy keeps an identity's state under.
    #[napi]
    pub fn key(&self, policy: &Policy, identity: String) -> String {
        self.limiter
            .key_scheme()
            .key(&Identity::new(identity), &policy.inner.name)
    }

    /// `memory` or `redis`.
    #[napi(getter)]
    pub fn store(&self) -> String {
        self.limiter.store().kind().to_string()
    }

    /// True while the circuit breaker refuses to wait on a failing store.
    #[napi(getter)]
    pub fn circuit_open(&self) -> bool {
        self.limiter.store_circuit_open()
    }

    /// Denials answered by the local deny cache without a store call.
    #[napi(getter)]
    pub fn deny_cache_hits(&self) -> f64 {
        number(self.limiter.deny_cache_hits())
    }
}
