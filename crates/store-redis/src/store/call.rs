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
use sluice_core::{Clock, StoreError};
use std::sync::Arc;
use std::time::Duration;

/// Runs a script (or its function) with `keys` and `args`, recovering from a flushed script
/// cache or a missing library without the caller seeing it.
async fn invoke(
    conn: &Conn,
    mode: ScriptMode,
    lua: &Lua,
    function: &str,
    keys: &[String],
    args: &[String],
) -> Result<Value, RedisError> {
    match mode {
        ScriptMode::Eval => {
            let mut cmd = redis::cmd("EVALSHA");
            cmd.arg(&lua.sha).arg(keys.len()).arg(keys).arg(args);
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
                        .arg(scripts::FUNCTION_LIBRARY);
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
/// When the process is saturated (thousands of requests on two cores), the answer can sit
/// unread in the socket past the timeout although the server spent a millisecond on it; so
/// the connection's reader gets a chance to run first, and a standalone server that answered
/// other calls within the timeout is alive: the call is then [`StoreError::Overloaded`],
/// which is denied, never failed open.
pub(super) async fn invoke_timed(
    conn: &Conn,
    mode: ScriptMode,
    timeout: Duration,
    lua: &Lua,
    function: &str,
    keys: &[String],
    args: &[String],
) -> Result<Value, StoreError> {
    let ms = timeout.as_millis() as u64;
    let call = invoke(conn, mode, lua, function, keys, args);
    tokio::pin!(call);
    let outcome = match tokio::time::timeout(timeout, &mut call).await {
        Ok(r) => Some(r),
        Err(_) => {
            // Let the I/O driver and the connection's reader run, then look once more.
            for _ in 0..2 {
                tokio::task::yield_now().await;
            }
            futures::FutureExt::now_or_never(&mut call)
        }
    };
    match outcome {
        None if conn.answered_within(timeout) => Err(StoreError::Overloaded(format!(
            "no answer within {ms} ms while the server answered other calls: this process is \
             too busy to read the store's answers in time"
        ))),
        None => {
            conn.suspect();
            Err(StoreError::Timeout(ms))
        }
        Some(Err(e)) => Err(match map_err(e) {
            StoreError::Timeout(_) => StoreError::Timeout(ms),
            other => other,
        }),
        Some(Ok(v)) => {
            conn.note_answer();
            Ok(v)
        }
    }
}

/// Runs `lua/batch.lua` on `conn` (EVALSHA, EVAL when the script cache was flushed) under
/// [`batch_timeout`].
pub(super) fn batch_runner(conn: Conn, timeout: Duration) -> crate::batch::Runner {
    let lua = Arc::new(Lua::new(scripts::BATCH));
    Arc::new(move |keys: Vec<String>, args: Vec<String>| {
        let (conn, lua) = (conn.clone(), Arc::clone(&lua));
        let timeout = batch_timeout(timeout, keys.len());
        Box::pin(async move {
            invoke_timed(&conn, ScriptMode::Eval, timeout, &lua, "", &keys, &args).await
        })
    })
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
        let keys = [key];
        let args = [now, self.pad.clone(), token];
        let reply = invoke_timed(
            &self.conn,
            self.mode,
            self.timeout,
            &self.lua,
            scripts::FN_RELEASE,
            &keys,
            &args,
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
