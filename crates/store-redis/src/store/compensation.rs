//! Lease compensation: releasing concurrency leases whose acquire's outcome nobody saw.
//!
//! A concurrency acquire that times out or fails may still run on the server: a paused or
//! slow server executes the queued call when it resumes. The caller was told the store
//! failed, so it holds no lease and will never release one; without compensation the slot
//! stays taken by nobody until the lease expires (a whole minute for a 60 s lease). The lease
//! id is chosen by sluice before the call, so the release can be sent without the reply.
//!
//! Such releases go to one background task through a bounded queue. The task sends them,
//! many at once, and retries those that fail with a back-off that doubles from
//! [`MIN_BACKOFF`] to [`MAX_BACKOFF`], so a release lands at most about `MAX_BACKOFF` after
//! the server answers again. Each is retried at most [`MAX_ATTEMPTS`] times and for at most
//! its retry window (see [`PendingRelease::new`]); a full queue drops the newest (the lease
//! then expires on its own, as before). A release is always sent after its acquire on the same
//! connection, so the server runs them in that order; a release of a lease that was never
//! taken does nothing.

use sluice_core::StoreError;
use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};
use tokio::sync::mpsc;

/// Most releases waiting at once.
pub(crate) const CAPACITY: usize = 65_536;
/// Most releases sent at once (pipelined on the connection).
const ROUND: usize = 128;
/// First wait after a round in which a release failed.
const MIN_BACKOFF: Duration = Duration::from_millis(50);
/// Longest wait between rounds: bounds how long a slot stays taken after the server is back.
pub(crate) const MAX_BACKOFF: Duration = Duration::from_millis(400);
/// Most attempts per release (more than the longest retry window at `MAX_BACKOFF`).
const MAX_ATTEMPTS: u32 = 5_000;
/// The longest any release is retried.
const MAX_WINDOW: Duration = Duration::from_secs(30 * 60);

/// Runs one release: `(server key, lease id)` -> done (held or not), under the store's
/// per-call timeout.
pub(crate) type ReleaseRunner = Arc<
    dyn Fn(String, String) -> Pin<Box<dyn Future<Output = Result<bool, StoreError>> + Send>>
        + Send
        + Sync,
>;

/// A lease to release once the server answers.
#[derive(Debug, Clone)]
pub(crate) struct PendingRelease {
    /// The key as sent to the server (namespace included).
    key: String,
    /// The lease id (the member of the lease set).
    token: String,
    /// Give up after this.
    deadline: Instant,
}

impl PendingRelease {
    /// The release of lease `token` on `key`, taken for `lease_ms`. It is retried for twice
    /// the lease time plus 10 s (at most 30 minutes): the acquire may run as late as the end
    /// of the outage, and holds its slot for the lease time from then.
    pub(crate) fn new(key: String, token: String, lease_ms: u64) -> Self {
        let window = Duration::from_millis(lease_ms.saturating_mul(2))
            .saturating_add(Duration::from_secs(10))
            .min(MAX_WINDOW);
        Self {
            key,
            token,
            deadline: Instant::now() + window,
        }
    }
}

/// The queue in front of the compensation task. Cheap to clone; the task ends when every
/// clone is dropped and nothing is left to retry.
#[derive(Clone)]
pub(crate) struct Compensator {
    tx: mpsc::Sender<PendingRelease>,
    dropped: Arc<AtomicU64>,
}

impl std::fmt::Debug for Compensator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Compensator").finish_non_exhaustive()
    }
}

impl Compensator {
    /// Spawns the compensation task on the current tokio runtime.
    pub(crate) fn spawn(run: ReleaseRunner) -> Self {
        let (tx, rx) = mpsc::channel(CAPACITY);
        tokio::spawn(work(rx, run));
        Self {
            tx,
            dropped: Arc::new(AtomicU64::new(0)),
        }
    }

    /// Queues a release; when the queue is full the release is dropped (its lease expires).
    pub(crate) fn push(&self, release: PendingRelease) {
        if self.tx.try_send(release).is_err() {
            let n = self.dropped.fetch_add(1, Ordering::Relaxed);
            if n.is_power_of_two() || n == 0 {
                tracing::warn!(
                    dropped = n + 1,
                    "lease compensation queue full: a lease taken by a failed call expires on its own"
                );
            }
        }
    }
}

async fn work(mut rx: mpsc::Receiver<PendingRelease>, run: ReleaseRunner) {
    let mut pending: VecDeque<(PendingRelease, u32)> = VecDeque::new();
    let mut backoff = MIN_BACKOFF;
    loop {
        if pending.is_empty() {
            match rx.recv().await {
                Some(p) => pending.push_back((p, 0)),
                None => return,
            }
        }
        while pending.len() < CAPACITY {
            match rx.try_recv() {
                Ok(p) => pending.push_back((p, 0)),
                Err(_) => break,
            }
        }
        let round: Vec<(PendingRelease, u32)> = pending.drain(..pending.len().min(ROUND)).collect();
        let calls = round
            .iter()
            .map(|(p, _)| run(p.key.clone(), p.token.clone()));
        let results = futures::future::join_all(calls).await;
        let mut failed = false;
        for ((p, attempts), result) in round.into_iter().zip(results) {
            match result {
                // Released, or it was not held (expired, never taken, released already).
                Ok(_) => {}
                // The release itself is wrong: retrying cannot help.
                Err(StoreError::Invalid(e)) => {
                    tracing::warn!(error = %e, key = %p.key, "lease compensation: release refused");
                }
                Err(_) => {
                    failed = true;
                    let attempts = attempts + 1;
                    if attempts < MAX_ATTEMPTS && Instant::now() < p.deadline {
                        pending.push_back((p, attempts));
                    } else {
                        tracing::warn!(key = %p.key, attempts, "lease compensation: gave up");
                    }
                }
            }
        }
        if failed {
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(MAX_BACKOFF);
        } else {
            backoff = MIN_BACKOFF;
        }
    }
}
