//! `Limiter`: a [`sluice::Limiter`] chosen by URL, checked from Node without blocking.
//!
//! Identities given as `{ credential }` are hashed with
//! [`sluice_http::identity::api_key_identity`], the function the Rust layer applies to an
//! `x-api-key` header and `sluice serve` to a `credential` field: with the same hash key all
//! of them limit one API key under one Redis key.

use std::future::Future;
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use futures::StreamExt;
use futures::stream::FuturesUnordered;

use napi::bindgen_prelude::{Either, Float64Array, Function, PromiseRaw, Unknown, Utf16String};
use napi::threadsafe_function::{ThreadsafeFunction, ThreadsafeFunctionCallMode};
use napi::{Env, Status};
use napi_derive::napi;
use sluice::core::key::{MAX_IDENTITY_LEN, default_hash_key};
use sluice::{Checked, Identity, LeaseToken, StoreOptions, Verdict};
use sluice_http::HeaderOptions;
use sluice_http::headers::{lead_of, rate_limit_headers};
use sluice_http::identity::api_key_identity;

use crate::config::Config;
use crate::decision::{CheckedJs, reason_of};
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
pub(crate) fn identity_of(
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

/// Finished checks on their way back to JS, in the compact form `index.js` reads: no object
/// and no string per check is built here. `numbers` holds [`NUMBERS_PER_CHECK`] values per
/// check: the id `submit` was given, allowed (0/1), remaining, limit, retryAfterMs,
/// resetAfterMs, delayMs, the verdict (0 decided, 1 failed_open, 2 failed_closed), and where
/// the check's three texts end in `text` (in UTF-16 units, counted from the start of
/// `text`): the headers as `name\nvalue\n` pairs (parsed in JS only when `result.headers` is
/// read), the reason of a denial and the lease token. A check's texts follow the previous
/// check's; an empty reason or lease token means none (neither is ever empty when present).
///
/// Why: building a JS object of ten properties and a headers object per check from Rust (a
/// property key interned and a hidden-class transition per field) was most of the JS
/// thread's work per decision. Three strings per check were then still three napi element
/// writes and a string creation each; one typed array and one string per batch are two.
#[napi(object)]
pub struct Completed {
    pub numbers: Float64Array,
    pub text: String,
}

impl std::fmt::Debug for Completed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Completed")
            .field("checks", &(self.numbers.len() / NUMBERS_PER_CHECK))
            .finish_non_exhaustive()
    }
}

/// Numbers per check in [`Completed::numbers`].
pub(crate) const NUMBERS_PER_CHECK: usize = 11;
/// Texts per check in [`Completed::text`] (headers, reason, lease token).
pub(crate) const TEXTS_PER_CHECK: usize = 3;
/// Numbers per check in `submitMany`'s `checks`: id, registered policy index, cost and the
/// identity's length in UTF-16 units.
pub(crate) const SUBMITTED_NUMBERS_PER_CHECK: usize = 4;

/// One finished check in its compact form (see [`Completed`]), made on the tokio thread that
/// finished it, so the JS thread only copies it out. The last [`TEXTS_PER_CHECK`] numbers
/// (where the texts end) are filled in when the batch is put together ([`compact`]).
#[derive(Debug)]
struct Completion {
    numbers: [f64; NUMBERS_PER_CHECK],
    texts: [Option<String>; TEXTS_PER_CHECK],
}

impl Completion {
    /// The compact form of `checked`, with the numbers and header text [`CheckedJs::of`]
    /// gives, written straight from the check: the header fields go into one string as they
    /// are formatted, with no map of owned names and values on the way (a check's result
    /// was about ten small allocations; this is three).
    fn new(id: u32, checked: &Checked, opts: &HeaderOptions) -> Self {
        let lead = lead_of(checked);
        let leader = lead.leader;
        let verdict = match checked.verdict {
            Verdict::Decided => 0.0,
            Verdict::FailedOpen(_) => 1.0,
            Verdict::FailedClosed(_) => 2.0,
        };
        let fields = rate_limit_headers(checked, opts);
        let mut headers = String::with_capacity(
            fields
                .iter()
                .map(|(n, v)| n.as_str().len() + v.len() + 2)
                .sum(),
        );
        for (name, value) in &fields {
            headers.push_str(display_header_name_static(name.as_str()));
            headers.push('\n');
            headers.push_str(&String::from_utf8_lossy(value.as_bytes()));
            headers.push('\n');
        }
        Self {
            numbers: [
                f64::from(id),
                f64::from(u8::from(checked.allowed)),
                number(leader.map_or(0, |s| s.remaining())),
                number(leader.map_or(0, |s| s.limit())),
                number(lead.wait_ms()),
                number(leader.map_or(0, |s| s.decision.reset_after_ms)),
                number(checked.delay_ms()),
                verdict,
                0.0,
                0.0,
                0.0,
            ],
            texts: [
                Some(headers),
                reason_of(checked, leader.and_then(|s| s.decision.reason)),
                LeaseToken::from_checked(checked).map(|t| t.encode()),
            ],
        }
    }
}

/// [`sluice_http::headers::display_header_name`] without an allocation for the names sluice sends.
fn display_header_name_static(name: &str) -> &str {
    match name {
        "ratelimit" => "RateLimit",
        "ratelimit-policy" => "RateLimit-Policy",
        "retry-after" => "Retry-After",
        "x-ratelimit-limit" => "X-RateLimit-Limit",
        "x-ratelimit-remaining" => "X-RateLimit-Remaining",
        "x-ratelimit-reset" => "X-RateLimit-Reset",
        other => other,
    }
}

/// A batch of checks as one [`Completed`]: their numbers one after another, their texts
/// joined into one string, with where each text ends.
fn compact(batch: Vec<Completion>) -> Completed {
    let mut numbers = Vec::with_capacity(batch.len() * NUMBERS_PER_CHECK);
    let mut text = String::with_capacity(
        batch
            .iter()
            .flat_map(|c| c.texts.iter().flatten())
            .map(String::len)
            .sum(),
    );
    let mut end = 0usize;
    for mut c in batch {
        for (k, t) in c.texts.iter().enumerate() {
            if let Some(t) = t {
                text.push_str(t);
                end += utf16_len(t);
            }
            c.numbers[NUMBERS_PER_CHECK - TEXTS_PER_CHECK + k] = end as f64;
        }
        numbers.extend_from_slice(&c.numbers);
    }
    Completed {
        numbers: Float64Array::new(numbers),
        text,
    }
}

/// The length of `s` in UTF-16 units, as JS counts string offsets.
fn utf16_len(s: &str) -> usize {
    if s.is_ascii() {
        s.len()
    } else {
        s.encode_utf16().count()
    }
}

/// The identities of a `submitMany` batch, cut out of their joined UTF-16 text by their
/// lengths; `None` when the lengths do not add up to the text.
fn split_identities(text: &[u16], lengths: impl Iterator<Item = f64>) -> Option<Vec<String>> {
    let mut out = Vec::new();
    let mut at = 0usize;
    for len in lengths {
        if !(len.is_finite() && len >= 0.0 && len.fract() == 0.0) {
            return None;
        }
        let end = at.checked_add(len as usize)?;
        // Lone surrogates become U+FFFD, as napi's UTF-8 conversion of a string makes them.
        out.push(String::from_utf16_lossy(text.get(at..end)?));
        at = end;
    }
    (at == text.len()).then_some(out)
}

/// The JS function that receives batches of completions; weak, so it never keeps the
/// process alive by itself (`index.js` holds a timer while checks are pending).
type Deliver = ThreadsafeFunction<(), Unknown<'static>, Completed, Status, false, true, 0>;

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
        self.push_all(&mut vec![completion]);
    }

    /// Queues every completion of `done` (leaving it empty) with one lock and at most one
    /// wake-up of the JS thread.
    fn push_all(&self, done: &mut Vec<Completion>) {
        if done.is_empty() {
            return;
        }
        let first = {
            let mut queue = self.queue.lock().unwrap_or_else(|e| e.into_inner());
            let first = queue.is_empty();
            queue.append(done);
            first
        };
        // A non-empty queue already has a delivery on its way, which takes everything.
        if first {
            self.deliver
                .call((), ThreadsafeFunctionCallMode::NonBlocking);
        }
    }
}

/// Drives a batch's checks and queues their completions for the JS thread, all those that
/// finished by the same wake-up together.
///
/// Why: the checks of one Redis reply finish in one poll of the batch's task. Queued one by
/// one, the first woke the JS thread (`napi_call_threadsafe_function`: a futex and an
/// eventfd write), which could drain the queue before the others landed and then be woken
/// again for them; about one wake-up per 28 checks at 64 in flight. Queued after the poll,
/// one reply is one wake-up.
async fn deliver_as_they_finish<F>(mut pending: FuturesUnordered<F>, outbox: &Outbox)
where
    F: Future<Output = Completion>,
{
    let mut done = Vec::with_capacity(pending.len());
    std::future::poll_fn(|cx| {
        loop {
            match pending.poll_next_unpin(cx) {
                Poll::Ready(Some(completion)) => done.push(completion),
                Poll::Ready(None) => {
                    outbox.push_all(&mut done);
                    return Poll::Ready(());
                }
                Poll::Pending => {
                    outbox.push_all(&mut done);
                    return Poll::Pending;
                }
            }
        }
    })
    .await;
}

/// A rate limiter on one store.
#[napi]
#[derive(Debug, Clone)]
pub struct Limiter {
    pub(crate) limiter: sluice::Limiter,
    pub(crate) hash_key: [u8; 32],
    pub(crate) headers: HeaderOptions,
    outbox: Option<Arc<Outbox>>,
    /// Policies registered for `submitMany`, by the index `registerPolicy` gave.
    policies: Arc<std::sync::Mutex<Vec<Arc<sluice::Policy>>>>,
}

/// Most policies one limiter registers for `submitMany`; checks of further policies take
/// `submit` (a bound for apps that build a policy per request).
const MAX_REGISTERED_POLICIES: usize = 1024;

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
                policies: Arc::default(),
            })
        })
    }

    /// The limiter a checked `sluice.toml` describes: its store, timeouts, key prefix,
    /// `identity_hash_key`, `legacy_headers`, and the file's lists, plans and ban rules, built
    /// by the code `sluice serve` uses ([`sluice_config::connect_limiter`]); a Promise.
    #[napi(ts_return_type = "Promise<Limiter>")]
    pub fn from_config<'env>(
        env: &'env Env,
        config: &Config,
    ) -> napi::Result<PromiseRaw<'env, Limiter>> {
        let config = Arc::clone(&config.inner);
        env.spawn_future(async move {
            let limiter = sluice_config::connect_limiter(&config).await.map_err(|e| {
                store_error(format!(
                    "cannot use store {}: {e}",
                    sluice::url::redact(&config.store.url)
                ))
            })?;
            Ok(Limiter {
                limiter,
                hash_key: config.identity_hash_key,
                headers: config.headers,
                outbox: None,
                policies: Arc::default(),
            })
        })
    }

    /// Checks `policy` for `identity` (or `{ credential }`) at `{ cost }`; a Promise of the
    /// result. A store failure never rejects: the policy's failure mode decides.
    #[napi(ts_return_type = "Promise<Checked>")]
    pub fn check<'env>(
        &self,
        env: &'env Env,
        policy: &Policy,
        identity: Option<String>,
        options: Option<CheckOptions>,
    ) -> napi::Result<PromiseRaw<'env, CheckedJs>> {
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
            Ok(CheckedJs::of(&checked, &headers))
        })
    }

    /// Sets the function that receives finished `submit` checks in their compact form
    /// ([`Completed`]), several at once when several finished meanwhile.
    #[napi(ts_args_type = "deliver: (batch: Completed) => void")]
    pub fn deliver_to(
        &mut self,
        deliver: Function<'_, Completed, Unknown<'static>>,
    ) -> napi::Result<()> {
        let queue: Arc<std::sync::Mutex<Vec<Completion>>> = Arc::default();
        let drained = Arc::clone(&queue);
        let deliver = deliver
            .build_threadsafe_function::<()>()
            .weak::<true>()
            .callee_handled::<false>()
            .build_callback(move |_| {
                Ok(compact(std::mem::take(
                    &mut *drained.lock().unwrap_or_else(|e| e.into_inner()),
                )))
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
            outbox.push(Completion::new(id, &checked, &headers));
        });
        Ok(())
    }

    /// Registers `policy` for `submitMany`; its index there, or `null` when this limiter
    /// already holds [`MAX_REGISTERED_POLICIES`] of them.
    #[napi]
    pub fn register_policy(&self, policy: &Policy) -> Option<u32> {
        let mut policies = self.policies.lock().unwrap_or_else(|e| e.into_inner());
        if policies.len() >= MAX_REGISTERED_POLICIES {
            return None;
        }
        policies.push(Arc::clone(&policy.inner));
        u32::try_from(policies.len() - 1).ok()
    }

    /// Many `submit`s in one call, for identities given as text: check `i` is the numbers
    /// `checks[4i..4i+4]` (id, registered policy index, cost, the identity's length in
    /// UTF-16 units), its identity the next that many units of `identities` (all of the
    /// batch's identities joined). The results come back through `deliverTo`'s function as
    /// each finishes. One call and one tokio task per batch instead of per check, and two
    /// values cross napi however many checks there are (an array of numbers and a string per
    /// check took a napi call per element). Bad input (an unknown policy index, an empty or
    /// too long identity, a cost that is not a whole number, lengths that do not add up)
    /// throws and submits nothing, so the caller can retry the checks one by one with
    /// `submit` to find which one is wrong.
    #[napi]
    pub fn submit_many(&self, checks: &[f64], identities: Utf16String) -> napi::Result<()> {
        let outbox = self
            .outbox
            .clone()
            .ok_or_else(|| invalid("submitMany needs deliverTo first"))?;
        if checks.len() % SUBMITTED_NUMBERS_PER_CHECK != 0 {
            return Err(invalid(
                "submitMany: checks must hold 4 numbers per check (id, policy, cost, identity length)",
            ));
        }
        let rows = checks.chunks_exact(SUBMITTED_NUMBERS_PER_CHECK);
        let names =
            split_identities(&identities, rows.clone().map(|row| row[3])).ok_or_else(|| {
                invalid("submitMany: the identity lengths do not add up to the identities given")
            })?;
        let mut jobs = Vec::with_capacity(names.len());
        {
            let registered = self.policies.lock().unwrap_or_else(|e| e.into_inner());
            for (row, identity) in rows.zip(names) {
                let id = whole(row[0], "id")?;
                let id = u32::try_from(id).map_err(|_| invalid("submitMany: id above 2^32"))?;
                let p = whole(row[1], "policy")?;
                let policy = usize::try_from(p)
                    .ok()
                    .and_then(|p| registered.get(p))
                    .ok_or_else(|| invalid(format!("submitMany: no policy registered as {p}")))?;
                let cost = whole(row[2], "cost")?;
                let identity = identity_of(Some(identity), None, &self.hash_key)?;
                jobs.push((id, Arc::clone(policy), identity, cost));
            }
        }
        let limiter = self.limiter.clone();
        let headers = self.headers;
        napi::bindgen_prelude::spawn(async move {
            let limiter = &limiter;
            let pending: FuturesUnordered<_> = jobs
                .into_iter()
                .map(|(id, policy, identity, cost)| async move {
                    let checked = limiter.check(&identity, &policy, cost).await;
                    Completion::new(id, &checked, &headers)
                })
                .collect();
            deliver_as_they_finish(pending, &outbox).await;
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
