//! One script call on the server, under the per-call timeout, and the runners the background
//! tasks (batching, lease compensation) use to make theirs.
//!
//! The timeout wraps the call itself (the round trip, with the `NOSCRIPT` or missing-library
//! recovery), never time spent waiting in sluice's own queues: that wait has its own bound
//! and its own error ([`StoreError::Overloaded`]).

use super::compensation::{Compensator, PendingRelease, ReleaseRunner};
use super::connection::Conn;
use super::{Lua, ScriptMode, is_missing_function, map_err};
use crate::batch::MIN_BATCH;
use crate::scripts;
use redis::{ErrorKind, RedisError, ServerErrorKind, Value};
use sluice_core::algorithm::AlgorithmKind;
use sluice_core::{Clock, StoreError};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// Runs a script (or its function) with `keys` and `args`, recovering from a flushed script
/// cache or a missing library without the caller seeing it.
async fn invoke(
    conn: &Conn,
    mode: ScriptMode,
    lua: &Lua,
    function: &'static str,
    keys: &[String],
    args: &[String],
) -> Result<Value, RedisError> {
    match mode {
        ScriptMode::Eval => {
            let mut cmd = redis::cmd("EVALSHA");
            cmd.arg(&*lua.sha).arg(keys.len()).arg(keys).arg(args);
            match conn.query(&cmd).await {
                Err(e) if e.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
                    // EVAL runs the script and caches it again on the node that owns the keys.
                    let mut cmd = redis::cmd("EVAL");
                    cmd.arg(lua.src).arg(keys.len()).arg(keys).arg(args);
                    conn.query(&cmd).await
                }
                r => r,
            }
        }
        ScriptMode::Functions => {
            let mut cmd = redis::cmd("FCALL");
            cmd.arg(function).arg(keys.len()).arg(keys).arg(args);
            match conn.query(&cmd).await {
                Err(e) if is_missing_function(&e) => {
                    let mut load = redis::cmd("FUNCTION");
                    load.arg("LOAD")
                        .arg("REPLACE")
                        .arg(scripts::function_library());
                    conn.query(&load).await?;
                    match conn.query(&cmd).await {
                        // Flushed again between the load and the call: the same logic as a
                        // script, which carries its own body and cannot go missing.
                        Err(e) if is_missing_function(&e) => {
                            let mut eval = redis::cmd("EVAL");
                            eval.arg(lua.src).arg(keys.len()).arg(keys).arg(args);
                            conn.query(&eval).await
                        }
                        r => r,
                    }
                }
                r => r,
            }
        }
    }
}

/// [`invoke`] under `timeout`, with errors mapped to [`StoreError`].
///
/// A call that outlives its timeout is a store failure only when the store has gone quiet.
/// Two kinds of load make a healthy server's answer late: this process saturated (thousands
/// of requests on two cores), so the answer sits unread in the socket although the server
/// spent a millisecond on it; and the server itself busy (other processes' batches, other
/// clients' scripts), so the call waits in the server's queue. Either way the server keeps
/// answering calls. So the connection's reader gets a chance to run first, and a standalone
/// server that answered any call within its silence window
/// ([`crate::RedisOptions::unresponsive_after`]) is alive: the call is then
/// [`StoreError::Overloaded`], which is denied, never failed open. A flood that slows the
/// store down therefore cannot switch the limits off; a server that answers nothing for the
/// whole window (paused, hung, partitioned) gets the policy's failure mode.
pub(super) async fn invoke_timed(
    conn: &Conn,
    mode: ScriptMode,
    timeout: Duration,
    lua: &Lua,
    function: &'static str,
    keys: Vec<String>,
    args: Vec<String>,
) -> Result<Value, StoreError> {
    let call = {
        let (conn, lua) = (conn.clone(), lua.clone());
        Box::pin(async move { invoke(&conn, mode, &lua, function, &keys, &args).await })
    };
    timed(conn, timeout, call).await
}

/// A call on the server (`call`) under `timeout`, with errors mapped to [`StoreError`]: the
/// rules of [`invoke_timed`].
async fn timed(
    conn: &Conn,
    timeout: Duration,
    call: Pin<Box<dyn Future<Output = Result<Value, RedisError>> + Send>>,
) -> Result<Value, StoreError> {
    let ms = timeout.as_millis() as u64;
    let mut call = call;
    let outcome = match tokio::time::timeout(timeout, &mut call).await {
        Ok(r) => Some(r),
        Err(_) => {
            // Let the I/O driver and the connection's reader run, then look once more.
            for _ in 0..2 {
                tokio::task::yield_now().await;
            }
            let now = futures::FutureExt::now_or_never(&mut call);
            if now.is_none() {
                // The answer still counts as a sign of life when it comes: a busy server
                // answers every call late, and only noting answers that arrive in time would
                // take it for a silent one.
                let conn = conn.clone();
                tokio::spawn(async move {
                    match tokio::time::timeout(LATE_ANSWER_WAIT, call).await {
                        Ok(r) if shows_life(&r) => conn.note_answer(),
                        Ok(Err(e))
                            if e.is_io_error()
                                || e.is_connection_dropped()
                                || e.is_connection_refusal() =>
                        {
                            conn.note_broken();
                        }
                        _ => {}
                    }
                });
            }
            now
        }
    };
    let alive = outcome.is_none() && conn.answered_recently().await;
    match outcome {
        None if alive => Err(StoreError::Overloaded(format!(
            "no answer within {ms} ms while the server kept answering other calls: the store \
             or this process is busy, not failing"
        ))),
        None => {
            conn.suspect();
            Err(StoreError::Timeout(ms))
        }
        Some(r) => {
            if shows_life(&r) {
                conn.note_answer();
            } else if let Err(e) = &r
                && (e.is_io_error() || e.is_connection_dropped() || e.is_connection_refusal())
            {
                conn.note_broken();
            }
            r.map_err(|e| match map_err(e) {
                StoreError::Timeout(_) => StoreError::Timeout(ms),
                other => other,
            })
        }
    }
}

/// How long the answer of a timed-out call is still awaited, to note that the server lives.
const LATE_ANSWER_WAIT: Duration = Duration::from_secs(30);

/// Whether a call's outcome came from the server: a reply, or an error the server sent.
fn shows_life(r: &Result<Value, RedisError>) -> bool {
    match r {
        Ok(_) => true,
        Err(e) => {
            !(e.is_io_error() || e.is_connection_dropped() || e.is_timeout())
                && matches!(e.kind(), ErrorKind::Server(_))
        }
    }
}

/// Runs the batches on `conn` under [`batch_timeout`]; `cluster` selects the one-policy
/// scripts' Cluster form. One-policy batches go to the batch function library (`FCALL`,
/// loaded on the first call and again whenever a server answers that it is missing) while
/// the server takes functions; a server that refuses them (no `FUNCTION` before Redis 7, or
/// an ACL without `FUNCTION LOAD`/`FCALL`) gets the same code as scripts (`EVALSHA`, `EVAL`
/// when the script cache was flushed) from then on. Mixed batches always go to the generic
/// script.
pub(super) fn batch_runner(conn: Conn, timeout: Duration, cluster: bool) -> crate::batch::Runner {
    use crate::batch::BatchScript;
    let generic = Arc::new(Lua::new(&scripts::BATCH));
    // One script per algorithm with a step, by registry index (none for the others).
    let one_policy: Arc<[Option<Lua>]> = AlgorithmKind::ALL
        .iter()
        .map(|&kind| scripts::batch_step(kind, cluster).map(Lua::new))
        .collect();
    let functions = Arc::new(AtomicBool::new(true));
    Arc::new(
        move |script: BatchScript, items: usize, keys: Vec<String>, args: Vec<String>| {
            let (conn, generic, one_policy, functions) = (
                conn.clone(),
                Arc::clone(&generic),
                Arc::clone(&one_policy),
                Arc::clone(&functions),
            );
            let timeout = batch_timeout(timeout, items);
            Box::pin(async move {
                let kind = match script {
                    BatchScript::Generic => {
                        return invoke_timed(
                            &conn,
                            ScriptMode::Eval,
                            timeout,
                            &generic,
                            "",
                            keys,
                            args,
                        )
                        .await;
                    }
                    BatchScript::OnePolicy(kind) => kind,
                };
                let library = scripts::batch_library(cluster);
                let (Some(lua), Some(function)) =
                    (&one_policy[kind.index()], library.function(kind))
                else {
                    return Err(StoreError::Invalid(format!(
                        "{kind} has no one-policy batch script"
                    )));
                };
                let call = {
                    let (conn, lua) = (conn.clone(), lua.clone());
                    Box::pin(async move {
                        invoke_batch(&conn, &functions, library, function, &lua, &keys, &args).await
                    })
                };
                timed(&conn, timeout, call).await
            })
        },
    )
}
/// One batch call of a one-policy script: `FCALL function` while `functions` holds (loading
/// `library` when the server answers that the function is missing), else the script `lua`.
/// Only a refusal of functions as such (see [`refuses_functions`]) switches `functions` off;
/// an error of the call itself (a Cluster node refusing a key of a slot it no longer serves,
/// a lost connection) is the caller's, as with a script.
async fn invoke_batch(
    conn: &Conn,
    functions: &AtomicBool,
    library: &scripts::BatchLibrary,
    function: &str,
    lua: &Lua,
    keys: &[String],
    args: &[String],
) -> Result<Value, RedisError> {
    if functions.load(Ordering::Relaxed) {
        let mut cmd = redis::cmd("FCALL");
        cmd.arg(function).arg(keys.len()).arg(keys).arg(args);
        match conn.query(&cmd).await {
            Err(e) if is_missing_function(&e) => {
                let mut load = redis::cmd("FUNCTION");
                load.arg("LOAD").arg("REPLACE").arg(&library.src);
                match conn.query(&load).await {
                    Ok(_) => match conn.query(&cmd).await {
                        // Flushed again between the load and the call: the script below.
                        Err(e) if is_missing_function(&e) => {}
                        r => return r,
                    },
                    // The server sent an error that will not pass (no FUNCTION command, no
                    // right to load, a library it cannot take): scripts from now on.
                    Err(e) if matches!(e.kind(), ErrorKind::Server(_)) && !transient(&e) => {
                        tracing::debug!("batch function library not loaded ({e}); using scripts");
                        functions.store(false, Ordering::Relaxed);
                    }
                    // A state that passes (a server loading its data, a failover), or a
                    // master out of reach: the load goes to every master of a Cluster, so one
                    // of them fails it even for a batch of a healthy node. This batch runs as
                    // a script on its own node, and the next one tries functions again.
                    Err(e) => {
                        tracing::debug!(
                            "batch function library not loaded ({e}); this batch as a script"
                        );
                    }
                }
            }
            Err(e) if refuses_functions(&e) => {
                tracing::debug!("FCALL refused ({e}); batches use scripts");
                functions.store(false, Ordering::Relaxed);
            }
            // Over `maxmemory` (noeviction) Redis refuses a function that may write before it
            // runs, where a script runs and fails only at a write: this batch goes as a
            // script, so what writes nothing (a cost-0 peek: `/readyz`, a denial's answer)
            // is still answered, as it was before functions.
            Err(e) if e.code() == Some("OOM") => {}
            r => return r,
        }
    }
    invoke(conn, ScriptMode::Eval, lua, "", keys, args).await
}

/// Whether `e` is an error reply of a state that passes (loading, busy, a failover).
fn transient(e: &RedisError) -> bool {
    matches!(
        e.code(),
        Some("LOADING" | "BUSY" | "TRYAGAIN" | "CLUSTERDOWN" | "MASTERDOWN" | "READONLY")
    )
}

/// Whether `e` says the server does not run functions for this client at all: an unknown
/// command (before Redis 7) or an ACL refusal.
fn refuses_functions(e: &RedisError) -> bool {
    e.code() == Some("NOPERM")
        || e.to_string()
            .to_ascii_lowercase()
            .contains("unknown command")
}

/// The timeout of a batch of `items`: the per-call timeout for each [`MIN_BATCH`] items
/// begun. A batch of up to `MIN_BATCH` items gets the per-call timeout itself; a larger one,
/// sent only when the queue is deep, is that much more work for the server and the client,
/// so it gets proportionally longer before it counts as the store being slow.
pub(super) fn batch_timeout(timeout: Duration, items: usize) -> Duration {
    let per = items.div_ceil(MIN_BATCH).max(1);
    timeout.saturating_mul(u32::try_from(per).unwrap_or(u32::MAX))
}

/// What a release needs, outside the store.
pub(super) struct ReleaseContext {
    pub(super) conn: Conn,
    pub(super) mode: ScriptMode,
    pub(super) timeout: Duration,
    pub(super) lua: Arc<Lua>,
    pub(super) clock: Option<Arc<dyn Clock>>,
    pub(super) pad: String,
}

impl ReleaseContext {
    /// Releases lease `token` on the server key `key`: whether it was held.
    pub(super) async fn release(&self, key: String, token: String) -> Result<bool, StoreError> {
        let now = self
            .clock
            .as_ref()
            .map_or_else(String::new, |c| c.now().to_string());
        let keys = vec![key];
        let args = vec![now, self.pad.clone(), token];
        let reply = invoke_timed(
            &self.conn,
            self.mode,
            self.timeout,
            &self.lua,
            scripts::FN_RELEASE,
            keys,
            args,
        )
        .await?;
        match reply {
            Value::Int(i) => Ok(i == 1),
            other => Err(StoreError::Backend(format!(
                "unexpected release reply {other:?}"
            ))),
        }
    }
}

/// The compensation task's release runner.
pub(super) fn release_runner(context: ReleaseContext) -> ReleaseRunner {
    let context = Arc::new(context);
    Arc::new(move |key: String, token: String| {
        let context = Arc::clone(&context);
        Box::pin(async move { context.release(key, token).await })
    })
}

/// Leases whose outcome the caller may not see: handed to the [`Compensator`] when dropped
/// armed (the call failed, or the caller stopped waiting mid-call).
pub(super) struct LeaseGuard<'a> {
    compensator: &'a Compensator,
    leases: Vec<PendingRelease>,
}

impl<'a> LeaseGuard<'a> {
    pub(super) fn new(compensator: &'a Compensator, leases: Vec<PendingRelease>) -> Self {
        Self {
            compensator,
            leases,
        }
    }

    /// The caller has the outcome: nothing to compensate.
    pub(super) fn disarm(mut self) {
        self.leases.clear();
    }
}

impl Drop for LeaseGuard<'_> {
    fn drop(&mut self) {
        for lease in self.leases.drain(..) {
            self.compensator.push(lease);
        }
    }
}
