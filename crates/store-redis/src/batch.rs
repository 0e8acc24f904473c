//! Automatic batching of concurrent one-limit checks into one script call.
//!
//! Entering Lua and reading `TIME` cost Redis more than a decision itself (see
//! `docs/benchmarks.md`), so when many checks are in flight at once their items are sent
//! together: each check queues its item; a background task takes whatever has queued while
//! earlier batches were in flight (at most [`MAX_BATCH`] items, at most [`MAX_IN_FLIGHT`]
//! batches at once) and runs `lua/batch.lua`, which decides every item on its own, in order,
//! exactly as separate calls arriving in the same microsecond would be decided. A lone check
//! goes out at once as a batch of one: batching never waits for company.
//!
//! Only standalone servers in script mode with the server's clock use it (every key of a
//! batch must be on one node; an injected clock gives each call its own `now`).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use redis::Value;
use sluice_core::StoreError;
use tokio::sync::{Semaphore, mpsc, oneshot};

use crate::protocol::ROW;

/// Most items per script call.
pub(crate) const MAX_BATCH: usize = 64;
/// Most batches in flight at once; beyond, items wait (and gather) in the queue.
pub(crate) const MAX_IN_FLIGHT: usize = 4;

/// Runs the batch script: `(keys, args)` -> the flat reply.
pub(crate) type Runner = Arc<
    dyn Fn(
            Vec<String>,
            Vec<String>,
        ) -> Pin<Box<dyn Future<Output = Result<Value, StoreError>> + Send>>
        + Send
        + Sync,
>;

/// One queued item: its key, its 7 item arguments, where to send its 7 reply integers.
struct Job {
    key: String,
    args: Vec<String>,
    reply: oneshot::Sender<Result<[i64; ROW], StoreError>>,
}

/// The queue in front of the batching task. Dropping it ends the task.
pub(crate) struct Batcher {
    tx: mpsc::UnboundedSender<Job>,
}

impl std::fmt::Debug for Batcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Batcher").finish_non_exhaustive()
    }
}

impl Batcher {
    /// Spawns the batching task on the current tokio runtime. `pad` is ARGV[2] of every call.
    pub(crate) fn spawn(run: Runner, pad: String) -> Self {
        let (tx, mut rx) = mpsc::unbounded_channel::<Job>();
        tokio::spawn(async move {
            let permits = Arc::new(Semaphore::new(MAX_IN_FLIGHT));
            while let Some(first) = rx.recv().await {
                let Ok(permit) = Arc::clone(&permits).acquire_owned().await else {
                    return;
                };
                let mut jobs = vec![first];
                while jobs.len() < MAX_BATCH {
                    match rx.try_recv() {
                        Ok(job) => jobs.push(job),
                        Err(_) => break,
                    }
                }
                let (run, pad) = (Arc::clone(&run), pad.clone());
                tokio::spawn(async move {
                    let mut keys = Vec::with_capacity(jobs.len());
                    let mut args = Vec::with_capacity(2 + jobs.len() * ROW);
                    args.push(String::new());
                    args.push(pad);
                    let mut replies = Vec::with_capacity(jobs.len());
                    for job in jobs {
                        keys.push(job.key);
                        args.extend(job.args);
                        replies.push(job.reply);
                    }
                    let result = run(keys, args).await.and_then(crate::store::ints);
                    drop(permit);
                    match result {
                        Ok(flat) if flat.len() == replies.len() * ROW => {
                            for (reply, row) in replies.into_iter().zip(flat.chunks_exact(ROW)) {
                                let mut r = [0i64; ROW];
                                r.copy_from_slice(row);
                                let _ = reply.send(Ok(r));
                            }
                        }
                        Ok(flat) => {
                            let e = StoreError::Backend(format!(
                                "batch script returned {} integers for {} items",
                                flat.len(),
                                replies.len()
                            ));
                            for reply in replies {
                                let _ = reply.send(Err(e.clone()));
                            }
                        }
                        Err(e) => {
                            for reply in replies {
                                let _ = reply.send(Err(e.clone()));
                            }
                        }
                    }
                });
            }
        });
        Self { tx }
    }

    /// Queues one item and waits for its reply row (the caller applies its own timeout).
    pub(crate) async fn check(
        &self,
        key: String,
        args: Vec<String>,
    ) -> Result<[i64; ROW], StoreError> {
        let (reply, rx) = oneshot::channel();
        self.tx
            .send(Job { key, args, reply })
            .map_err(|_| StoreError::Unavailable("batching task stopped".into()))?;
        rx.await
            .map_err(|_| StoreError::Unavailable("batching task stopped".into()))?
    }
}
