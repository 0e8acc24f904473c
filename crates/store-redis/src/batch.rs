//! Automatic batching of concurrent one-limit checks into one script call.
//!
//! Entering Lua and reading `TIME` cost Redis more than a decision itself (see
//! `docs/benchmarks.md`), so when many checks are in flight at once their items are sent
//! together: each check queues its item; a background task takes whatever has queued while
//! earlier batches were in flight (at most [`MAX_IN_FLIGHT`] batches at once) and runs
//! `lua/batch.lua`, which decides every item on its own, in order, exactly as separate calls
//! arriving in the same microsecond would be decided. A lone check goes out at once as a batch
//! of one: batching never waits for company.
//!
//! Overload is not failure. The store's timeout bounds the script call alone (the runner
//! applies it, once per [`MIN_BATCH`] items of the batch), never the time an item spends in
//! this queue, so a burst on a healthy server
//! is decided, not timed out and failed open. Under load the batches grow: a batch takes a
//! share of the queue, from [`MIN_BATCH`] up to [`MAX_BATCH`] items. The queue holds at most
//! [`QUEUE_CAPACITY`] items (a caller waits for room) and an item waits at most the queue
//! bound; beyond either, sluice itself is saturated and the item is answered
//! [`StoreError::Overloaded`], which callers deny.
//!
//! A concurrency acquire whose reply its caller cannot receive (the call failed, or the
//! caller stopped waiting) hands its lease to the [`Compensator`], which releases it once the
//! server answers again.
//!
//! Only standalone servers in script mode with the server's clock use it (every key of a
//! batch must be on one node; an injected clock gives each call its own `now`).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use redis::Value;
use sluice_core::StoreError;
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc, oneshot};

use crate::protocol::ROW;
use crate::store::compensation::{Compensator, PendingRelease};

/// Fewest items a batch takes when that many are queued.
pub(crate) const MIN_BATCH: usize = 64;
/// Most items per script call (a batch of 512 costs Redis a few ms).
pub(crate) const MAX_BATCH: usize = 512;
/// Most batches in flight at once; beyond, items wait (and gather) in the queue.
pub(crate) const MAX_IN_FLIGHT: usize = 4;
/// Most items queued at once; a caller beyond waits for room, within the queue bound.
pub(crate) const QUEUE_CAPACITY: usize = 65_536;

/// Runs the batch script under the store's per-call timeout: `(keys, args)` -> the flat reply.
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
    /// For a concurrency acquire: the release to run if its outcome is lost.
    lease: Option<PendingRelease>,
    queued_at: Instant,
    reply: oneshot::Sender<Result<[i64; ROW], StoreError>>,
}

/// The queue in front of the batching task. Dropping it ends the task.
pub(crate) struct Batcher {
    tx: mpsc::Sender<Job>,
    queue_wait: Duration,
}

impl std::fmt::Debug for Batcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Batcher")
            .field("queue_wait", &self.queue_wait)
            .finish_non_exhaustive()
    }
}

/// The batch size for `queued` waiting items: an equal share per in-flight slot, within
/// [`MIN_BATCH`]..=[`MAX_BATCH`].
pub(crate) fn batch_size(queued: usize) -> usize {
    queued.div_ceil(MAX_IN_FLIGHT).clamp(MIN_BATCH, MAX_BATCH)
}

fn overloaded(what: &str, bound: Duration) -> StoreError {
    StoreError::Overloaded(format!(
        "{what} beyond the queue bound of {} ms",
        bound.as_millis()
    ))
}

impl Batcher {
    /// Spawns the batching task on the current tokio runtime. `pad` is ARGV[2] of every call;
    /// an item that waited longer than `queue_wait` is answered overloaded.
    pub(crate) fn spawn(
        run: Runner,
        pad: String,
        queue_wait: Duration,
        compensator: Compensator,
    ) -> Self {
        let (tx, mut rx) = mpsc::channel::<Job>(QUEUE_CAPACITY);
        tokio::spawn(async move {
            let permits = Arc::new(Semaphore::new(MAX_IN_FLIGHT));
            while let Some(first) = rx.recv().await {
                let Ok(permit) = Arc::clone(&permits).acquire_owned().await else {
                    return;
                };
                let size = batch_size(rx.len() + 1);
                let mut jobs = Vec::with_capacity(size);
                let mut next = Some(first);
                while jobs.len() < size {
                    let Some(job) = next.take().or_else(|| rx.try_recv().ok()) else {
                        break;
                    };
                    // The caller stopped waiting before its item was sent: nothing to do.
                    if job.reply.is_closed() {
                        continue;
                    }
                    if job.queued_at.elapsed() > queue_wait {
                        let _ = job.reply.send(Err(overloaded("waited", queue_wait)));
                        continue;
                    }
                    jobs.push(job);
                }
                if jobs.is_empty() {
                    continue;
                }
                tokio::spawn(run_batch(
                    Arc::clone(&run),
                    pad.clone(),
                    jobs,
                    permit,
                    compensator.clone(),
                ));
            }
        });
        Self { tx, queue_wait }
    }

    /// Queues one item and waits for its reply row. `lease` is the release to run if the
    /// item is a concurrency acquire whose outcome is lost.
    pub(crate) async fn check(
        &self,
        key: String,
        args: Vec<String>,
        lease: Option<PendingRelease>,
    ) -> Result<[i64; ROW], StoreError> {
        let (reply, rx) = oneshot::channel();
        let job = Job {
            key,
            args,
            lease,
            queued_at: Instant::now(),
            reply,
        };
        // Backpressure: a full queue makes the caller wait for room, within the queue bound.
        match tokio::time::timeout(self.queue_wait, self.tx.send(job)).await {
            Err(_) => return Err(overloaded("the queue stayed full", self.queue_wait)),
            Ok(Err(_)) => return Err(StoreError::Unavailable("batching task stopped".into())),
            Ok(Ok(())) => {}
        }
        rx.await
            .map_err(|_| StoreError::Unavailable("batching task stopped".into()))?
    }
}

/// Sends one batch and hands each item its row (or the error).
async fn run_batch(
    run: Runner,
    pad: String,
    jobs: Vec<Job>,
    permit: OwnedSemaphorePermit,
    compensator: Compensator,
) {
    let mut keys = Vec::with_capacity(jobs.len());
    let mut args = Vec::with_capacity(2 + jobs.len() * ROW);
    args.push(String::new());
    args.push(pad);
    let mut waiting = Vec::with_capacity(jobs.len());
    for job in jobs {
        keys.push(job.key);
        args.extend(job.args);
        waiting.push((job.reply, job.lease));
    }
    let result = run(keys, args).await.and_then(crate::store::ints);
    drop(permit);
    let result = match result {
        Ok(flat) if flat.len() == waiting.len() * ROW => Ok(flat),
        Ok(flat) => Err(StoreError::Backend(format!(
            "batch script returned {} integers for {} items",
            flat.len(),
            waiting.len()
        ))),
        Err(e) => Err(e),
    };
    match result {
        Ok(flat) => {
            for ((reply, lease), row) in waiting.into_iter().zip(flat.chunks_exact(ROW)) {
                let mut r = [0i64; ROW];
                r.copy_from_slice(row);
                let admitted = r[0] == 1;
                // Taken for a caller that stopped waiting: nobody will release it.
                if reply.send(Ok(r)).is_err()
                    && admitted
                    && let Some(lease) = lease
                {
                    compensator.push(lease);
                }
            }
        }
        Err(e) => {
            // The call may still run on the server (a paused or slow server runs it later).
            let may_have_run = !matches!(e, StoreError::Invalid(_));
            for (reply, lease) in waiting {
                if may_have_run && let Some(lease) = lease {
                    compensator.push(lease);
                }
                let _ = reply.send(Err(e.clone()));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batches_grow_with_the_queue() {
        assert_eq!(batch_size(1), MIN_BATCH);
        assert_eq!(batch_size(4 * MIN_BATCH), MIN_BATCH);
        assert_eq!(batch_size(4 * 100), 100);
        assert_eq!(batch_size(3_000), 750.min(MAX_BATCH));
        assert_eq!(batch_size(QUEUE_CAPACITY), MAX_BATCH);
    }
}
