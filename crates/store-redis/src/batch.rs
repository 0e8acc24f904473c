//! Automatic batching of concurrent one-limit checks into one script call.
//!
//! Entering Lua and reading `TIME` cost Redis more than a decision itself (see
//! `docs/benchmarks.md`), so when many checks are in flight at once their items are sent
//! together: each check queues its item; a background task takes whatever has queued while
//! earlier batches were in flight (at most [`MAX_IN_FLIGHT`] batches at once) and sends them
//! in one script call, which decides every item on its own, in order, exactly as separate
//! calls arriving in the same microsecond would be decided. A lone check goes out at once as a
//! batch of one: batching never waits for company.
//!
//! A batch of one policy (the common case: one limit on many identities) of an algorithm
//! with a Lua step (the registry's `step`) goes to `lua/batch_step.lua`: one loop running the
//! algorithm's step per item, the parameters once per call, per item only the key (and the
//! cost when any item costs more than 1), one `MGET`, and one write per distinct key, since
//! the per-item dispatch and argument parsing of the generic `lua/batch.lua` cost Redis more
//! than the decision. Mixed batches keep `lua/batch.lua`.
//!
//! On a Cluster each node is a lane of its own (from the store's slot map): its items queue
//! apart from the other nodes', it has at most [`NODE_IN_FLIGHT`] batch in flight, and its
//! batch is split per policy, one call each (see the one-policy script's Cluster form and
//! `docs/redis.md`); only algorithms with a step are batched there. Splitting one shared batch
//! per node instead cut every node's calls to a third of the batch and kept them small (17
//! items per call with 192 checks in flight on 3 masters, against 32 per node lane).
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
//! Only script mode with the server's clock uses it (an injected clock gives each call its
//! own `now`).

use std::collections::{HashMap, HashSet, VecDeque};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use redis::Value;
use sluice_core::algorithm::AlgorithmKind;
use sluice_core::{Algorithm, StoreError};
use tokio::sync::{mpsc, oneshot};

use crate::protocol::{self, ROW};
use crate::store::compensation::{Compensator, PendingRelease};

/// Fewest items a batch takes when that many are queued.
pub(crate) const MIN_BATCH: usize = 64;
/// Most items per script call (a batch of 512 costs Redis a few ms).
pub(crate) const MAX_BATCH: usize = 512;
/// Most batches in flight at once to a standalone server; beyond, items wait (and gather) in
/// the queue.
pub(crate) const MAX_IN_FLIGHT: usize = 4;
/// Most batches in flight at once to one Cluster node. One: a node's items gather while its
/// batch runs, so its next call carries all of them. The checks in flight are spread over
/// the nodes, so each node's share is small, and every extra call on a node pays the script's
/// fixed cost again (measured in `docs/benchmarks.md`, "Redis Cluster").
pub(crate) const NODE_IN_FLIGHT: usize = 1;
/// Most items queued at once; a caller beyond waits for room, within the queue bound.
pub(crate) const QUEUE_CAPACITY: usize = 65_536;

/// Which batch script a call runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum BatchScript {
    /// `lua/batch.lua`: any mix of algorithms, 7 arguments per item.
    Generic,
    /// `lua/batch_step.lua` around this algorithm's step: one policy of an algorithm with a
    /// step.
    OnePolicy(AlgorithmKind),
}

/// Reply integers per item of the one-policy script: verdict, remaining, reset, delay.
const STEP_WIDTH: usize = 4;

impl BatchScript {
    /// Reply integers per item.
    fn width(self) -> usize {
        match self {
            BatchScript::Generic => ROW,
            BatchScript::OnePolicy(_) => STEP_WIDTH,
        }
    }
}

/// Runs a batch script under the store's per-call timeout: `(script, items, keys, args)` ->
/// the flat reply.
pub(crate) type Runner = Arc<
    dyn Fn(
            BatchScript,
            usize,
            Vec<String>,
            Vec<String>,
        ) -> Pin<Box<dyn Future<Output = Result<Value, StoreError>> + Send>>
        + Send
        + Sync,
>;

/// Which Cluster node serves a key's slot, as far as the store last heard.
pub(crate) trait NodeMap: Send + Sync {
    /// The node (an index of the map's own node list) serving `key`'s slot, if known.
    fn node(&self, key: &str) -> Option<u32>;
    /// A call found the map out of date: fetch it again.
    fn stale(&self);
}

/// The node map of a Cluster store's batcher.
pub(crate) type NodeOf = Arc<dyn NodeMap>;

/// One check: its server key, algorithm, cost and token (a lease or log entry id, or "").
#[derive(Debug, Clone)]
pub(crate) struct Item {
    pub(crate) key: String,
    pub(crate) algorithm: Algorithm,
    pub(crate) cost: u64,
    pub(crate) token: String,
}

/// One queued item and where to send its 7 reply integers.
struct Job {
    item: Item,
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

/// The batch size for `queued` waiting items of a lane with `slots` batches in flight at
/// most: an equal share per slot, within [`MIN_BATCH`]..=[`MAX_BATCH`].
pub(crate) fn batch_size(queued: usize, slots: usize) -> usize {
    queued.div_ceil(slots.max(1)).clamp(MIN_BATCH, MAX_BATCH)
}

fn overloaded(what: &str, bound: Duration) -> StoreError {
    StoreError::Overloaded(format!(
        "{what} beyond the queue bound of {} ms",
        bound.as_millis()
    ))
}

/// Whether checks of `algorithm` can go to the one-policy script: its algorithm has a step.
fn has_step(algorithm: &Algorithm) -> bool {
    algorithm.algorithm_kind().info().step
}

/// Whether a Cluster store batches checks of `algorithm` (only the one-policy script has the
/// Cluster form).
pub(crate) fn cluster_batches(algorithm: &Algorithm) -> bool {
    has_step(algorithm)
}

/// The script `items` go to: a one-policy script when every item has the same algorithm and
/// parameters and the algorithm has one (unless `generic`), else `lua/batch.lua`.
pub(crate) fn script_for(items: &[&Item], generic: bool) -> BatchScript {
    let Some(first) = items.first() else {
        return BatchScript::Generic;
    };
    if !generic
        && has_step(&first.algorithm)
        && items.iter().all(|i| i.algorithm == first.algorithm)
    {
        BatchScript::OnePolicy(first.algorithm.algorithm_kind())
    } else {
        BatchScript::Generic
    }
}

/// The keys and arguments of one batch call of `items` to `script`. `now` is ARGV[1] ("" for
/// the server clock). `cluster`: the one-policy Cluster form (one key in KEYS, the rest in
/// ARGV).
pub(crate) fn encode(
    script: BatchScript,
    items: &[&Item],
    now: String,
    pad: String,
    cluster: bool,
) -> (Vec<String>, Vec<String>) {
    let mut args = Vec::with_capacity(9 + items.len() * 2);
    args.push(now);
    args.push(pad);
    if script == BatchScript::Generic {
        let keys = items.iter().map(|i| i.key.clone()).collect();
        for i in items {
            protocol::push_item_args(&mut args, &i.algorithm, i.cost, &i.token);
        }
        return (keys, args);
    }
    // p1..p4 once for the whole call (the script holds the algorithm's step). A 0 goes as
    // "", which the script reads as 0: no allocation for the parameters an algorithm leaves
    // unused.
    let param = |v: u64| if v == 0 { String::new() } else { v.to_string() };
    args.extend(items[0].algorithm.store_params().map(param));
    // Every key once (the common case on a large keyspace): the script skips its per-key
    // bookkeeping.
    let mut seen = HashSet::with_capacity(items.len());
    let distinct = items.iter().all(|i| seen.insert(i.key.as_str()));
    args.push(if distinct { "1" } else { "0" }.to_string());
    let keys = if cluster {
        args.push((items.len() - 1).to_string());
        args.extend(items[1..].iter().map(|i| i.key.clone()));
        vec![items[0].key.clone()]
    } else {
        args.push("0".to_string());
        items.iter().map(|i| i.key.clone()).collect()
    };
    if items.iter().any(|i| i.cost != 1) {
        args.extend(items.iter().map(|i| i.cost.to_string()));
    }
    (keys, args)
}

/// The reply rows (7 integers each, as `lua/check.lua` gives them) of a call of `items` to
/// `script` that answered `flat`.
pub(crate) fn decode(
    script: BatchScript,
    items: &[&Item],
    flat: &[i64],
) -> Result<Vec<[i64; ROW]>, StoreError> {
    let width = script.width();
    if flat.len() != items.len() * width {
        return Err(StoreError::Backend(format!(
            "batch script returned {} integers for {} items",
            flat.len(),
            items.len()
        )));
    }
    if script == BatchScript::Generic {
        return Ok(flat
            .chunks_exact(ROW)
            .map(|row| {
                let mut r = [0i64; ROW];
                r.copy_from_slice(row);
                r
            })
            .collect());
    }
    let limit = items.first().map_or(0, |i| i.algorithm.quota() as i64);
    Ok(flat
        .chunks_exact(width)
        .map(|r| match r[0] {
            0 => [1, limit, r[1], 0, r[2], r[3], 0],
            -1 => [0, limit, r[1], 0, r[2], 0, 2],
            retry => [0, limit, r[1], retry, r[2], 0, 1],
        })
        .collect())
}

/// Runs one batch call (encode, send, decode). `Err(Ok(e))`: the server refused the call
/// with an error reply; `Err(Err(e))`: any other failure (the call may have run).
async fn call_batch(
    run: &Runner,
    script: BatchScript,
    items: &[&Item],
    pad: &str,
    cluster: bool,
) -> Result<Vec<[i64; ROW]>, Result<StoreError, StoreError>> {
    let (keys, args) = encode(script, items, String::new(), pad.to_string(), cluster);
    let reply = match run(script, items.len(), keys, args).await {
        Ok(v) => v,
        Err(e @ StoreError::Backend(_)) => return Err(Ok(e)),
        Err(e) => return Err(Err(e)),
    };
    crate::store::ints(reply)
        .and_then(|flat| decode(script, items, &flat))
        .map_err(Err)
}

/// The items queued for one lane and the batches it has in flight.
#[derive(Default)]
struct Lane {
    pending: VecDeque<Job>,
    in_flight: usize,
}

/// Tells the batching task that a batch of lane `.1` is over when dropped, however its task
/// ends (a panic too), so the lane's slot is never lost.
struct Finished(mpsc::UnboundedSender<Option<u32>>, Option<u32>);

impl Drop for Finished {
    fn drop(&mut self) {
        let _ = self.0.send(self.1);
    }
}

impl Batcher {
    /// Spawns the batching task on the current tokio runtime. `pad` is ARGV[2] of every call;
    /// an item that waited longer than `queue_wait` is answered overloaded. `node_of` is set
    /// on a Cluster: each node is then a lane of its own, and a batch is split per policy,
    /// each part one call.
    pub(crate) fn spawn(
        run: Runner,
        pad: String,
        queue_wait: Duration,
        compensator: Compensator,
        node_of: Option<NodeOf>,
    ) -> Self {
        let (tx, mut rx) = mpsc::channel::<Job>(QUEUE_CAPACITY);
        tokio::spawn(async move {
            // A finished batch names its lane here.
            let (done_tx, mut done_rx) = mpsc::unbounded_channel::<Option<u32>>();
            let mut lanes: HashMap<Option<u32>, Lane> = HashMap::new();
            let mut queued = 0usize;
            let lane_of = |job: &Job| node_of.as_ref().and_then(|n| n.node(&job.item.key));
            let slots = if node_of.is_some() {
                NODE_IN_FLIGHT
            } else {
                MAX_IN_FLIGHT
            };
            loop {
                tokio::select! {
                    biased;
                    Some(lane) = done_rx.recv() => {
                        if let Some(l) = lanes.get_mut(&lane) {
                            l.in_flight -= 1;
                        }
                    }
                    job = rx.recv(), if queued < QUEUE_CAPACITY => {
                        // The store is gone: batches in flight finish on their own.
                        let Some(job) = job else { return };
                        lanes.entry(lane_of(&job)).or_default().pending.push_back(job);
                        queued += 1;
                    }
                }
                // Everything else that is ready, without waiting.
                while let Ok(lane) = done_rx.try_recv() {
                    if let Some(l) = lanes.get_mut(&lane) {
                        l.in_flight -= 1;
                    }
                }
                while queued < QUEUE_CAPACITY {
                    let Ok(job) = rx.try_recv() else { break };
                    lanes
                        .entry(lane_of(&job))
                        .or_default()
                        .pending
                        .push_back(job);
                    queued += 1;
                }
                for (&lane_id, lane) in lanes.iter_mut() {
                    while lane.in_flight < slots && !lane.pending.is_empty() {
                        let size = batch_size(lane.pending.len(), slots);
                        let mut jobs = Vec::with_capacity(size);
                        while jobs.len() < size {
                            let Some(job) = lane.pending.pop_front() else {
                                break;
                            };
                            queued -= 1;
                            // The caller stopped waiting before its item was sent.
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
                        lane.in_flight += 1;
                        let (run, pad, compensator, done) = (
                            Arc::clone(&run),
                            pad.clone(),
                            compensator.clone(),
                            Finished(done_tx.clone(), lane_id),
                        );
                        let node_of = node_of.clone();
                        tokio::spawn(async move {
                            match node_of {
                                None => {
                                    run_batch(run, pad, jobs, compensator, false).await;
                                }
                                Some(node_of) => {
                                    // One call per policy; the parts run at once.
                                    let parts = split_per_policy(jobs).into_iter().map(|part| {
                                        run_batch(
                                            Arc::clone(&run),
                                            pad.clone(),
                                            part,
                                            compensator.clone(),
                                            true,
                                        )
                                    });
                                    let stale = futures::future::join_all(parts).await;
                                    if stale.into_iter().any(|s| s) {
                                        node_of.stale();
                                    }
                                }
                            }
                            drop(done);
                        });
                    }
                }
                lanes.retain(|_, l| l.in_flight > 0 || !l.pending.is_empty());
            }
        });
        Self { tx, queue_wait }
    }

    /// Queues one item and waits for its reply row. `lease` is the release to run if the
    /// item is a concurrency acquire whose outcome is lost.
    pub(crate) async fn check(
        &self,
        item: Item,
        lease: Option<PendingRelease>,
    ) -> Result<[i64; ROW], StoreError> {
        let (reply, rx) = oneshot::channel();
        let job = Job {
            item,
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

/// Splits a Cluster lane's batch into parts of one policy, in queue order within each.
fn split_per_policy(jobs: Vec<Job>) -> Vec<Vec<Job>> {
    let mut parts: Vec<Vec<Job>> = Vec::new();
    let mut index: HashMap<Algorithm, usize> = HashMap::new();
    for job in jobs {
        match index.get(&job.item.algorithm) {
            Some(&i) => parts[i].push(job),
            None => {
                index.insert(job.item.algorithm.clone(), parts.len());
                parts.push(vec![job]);
            }
        }
    }
    parts
}

/// Sends one batch and hands each item its row (or the error). On a Cluster (`cluster`),
/// a part the node refused with an error reply (a key's slot is no longer there: the node
/// map was stale) is decided again one item per call, which the client routes (MOVED, ASK)
/// like any unbatched call: the refusal came from a read, before any write
/// (`lua/batch_step.lua`), so nothing was decided twice. Returns whether that happened.
async fn run_batch(
    run: Runner,
    pad: String,
    jobs: Vec<Job>,
    compensator: Compensator,
    cluster: bool,
) -> bool {
    let items: Vec<&Item> = jobs.iter().map(|j| &j.item).collect();
    let script = script_for(&items, false);
    let mut refused = false;
    let results: Vec<Result<[i64; ROW], StoreError>> =
        match call_batch(&run, script, &items, &pad, cluster).await {
            Ok(rows) => rows.into_iter().map(Ok).collect(),
            Err(Ok(_)) if cluster && items.len() > 1 => {
                refused = true;
                let mut each = Vec::with_capacity(items.len());
                for item in &items {
                    each.push(match call_batch(&run, script, &[item], &pad, true).await {
                        Ok(mut r) => Ok(r.remove(0)),
                        Err(Ok(e) | Err(e)) => Err(e),
                    });
                }
                each
            }
            Err(Ok(e) | Err(e)) => items.iter().map(|_| Err(e.clone())).collect(),
        };
    drop(items);
    for (job, result) in jobs.into_iter().zip(results) {
        match result {
            Ok(r) => {
                let admitted = r[0] == 1;
                // Taken for a caller that stopped waiting: nobody will release it.
                if job.reply.send(Ok(r)).is_err()
                    && admitted
                    && let Some(lease) = job.lease
                {
                    compensator.push(lease);
                }
            }
            Err(e) => {
                // The call may still run on the server (a paused or slow server runs it
                // later).
                if !matches!(e, StoreError::Invalid(_))
                    && let Some(lease) = job.lease
                {
                    compensator.push(lease);
                }
                let _ = job.reply.send(Err(e));
            }
        }
    }
    refused
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batches_grow_with_the_queue() {
        let all = MAX_IN_FLIGHT;
        assert_eq!(batch_size(1, all), MIN_BATCH);
        assert_eq!(batch_size(4 * MIN_BATCH, all), MIN_BATCH);
        assert_eq!(batch_size(4 * 100, all), 100);
        assert_eq!(batch_size(3_000, all), 750.min(MAX_BATCH));
        assert_eq!(batch_size(QUEUE_CAPACITY, all), MAX_BATCH);
        // A Cluster node, one batch in flight: everything queued for it, up to the most.
        assert_eq!(batch_size(100, NODE_IN_FLIGHT), 100);
        assert_eq!(batch_size(3_000, NODE_IN_FLIGHT), MAX_BATCH);
    }
}
