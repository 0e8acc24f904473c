//! Request bodies and responses that trickle: the minimum body rate, the per-address cap on
//! bodies in progress, and the write stall timeout.
//!
//! Why: a connection in the middle of a request is busy, so the budget cannot displace it;
//! a client that sends request heads and then a byte of body now and then holds one
//! connection per request for the whole `body_timeout` (30 s by default). A few addresses
//! doing that with a thousand connections fill the cap, and every other client's `/v1/check`
//! waits or gets 503. Three bounds take that away:
//! - [`PacedBody`]: once `body_rate_grace` has passed, a body must have averaged
//!   `min_body_rate` bytes per second since its head arrived, or the request ends with 408
//!   and the connection closes (an honest client sends a JSON check in one packet);
//! - [`BodiesInProgress`]: while the listeners are under pressure (see
//!   [`super::budget::PRESSURE_NUM`]), one address group has at most `max_bodies_per_ip`
//!   bodies in progress; a further request with a body gets 503 at once, which frees its
//!   connection instead of letting it hold a slot;
//! - [`StallGuard`]: a response write that makes no progress for `write_stall_timeout` (a
//!   client that does not read its answers) ends the connection.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Body as HttpBody, Frame, SizeHint};
use hyper::body::Incoming;
use parking_lot::Mutex;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::{Instant, Sleep};

use super::budget::AddressGroup;

/// The request bodies in progress per address group, against `max_bodies_per_ip`.
#[derive(Debug)]
pub struct BodiesInProgress {
    cap: usize,
    by_address: Arc<Mutex<HashMap<AddressGroup, usize>>>,
}

impl BodiesInProgress {
    /// At most `cap` bodies in progress per address group under pressure (0: no cap).
    pub fn new(cap: usize) -> Self {
        Self {
            cap,
            by_address: Arc::default(),
        }
    }

    /// A slot for one body from `group`, or `None` when `pressure` is on and the group holds
    /// the cap already.
    pub fn start(&self, group: AddressGroup, pressure: bool) -> Option<BodySlot> {
        let mut map = self.by_address.lock();
        let n = map.entry(group).or_insert(0);
        if self.cap > 0 && pressure && *n >= self.cap {
            if *n == 0 {
                map.remove(&group);
            }
            return None;
        }
        *n += 1;
        Some(BodySlot {
            group,
            by_address: Arc::clone(&self.by_address),
        })
    }

    /// Bodies in progress from `group` now.
    pub fn in_progress(&self, group: AddressGroup) -> usize {
        self.by_address.lock().get(&group).copied().unwrap_or(0)
    }
}

/// One body in progress, given back when the body ends or is dropped.
#[derive(Debug)]
pub struct BodySlot {
    group: AddressGroup,
    by_address: Arc<Mutex<HashMap<AddressGroup, usize>>>,
}

impl Drop for BodySlot {
    fn drop(&mut self) {
        let mut map = self.by_address.lock();
        if let Some(n) = map.get_mut(&self.group) {
            *n -= 1;
            if *n == 0 {
                map.remove(&self.group);
            }
        }
    }
}

/// How a body ended early; shared between the body and the request that reads it.
#[derive(Debug, Clone, Default)]
pub struct BodyOutcome(Arc<AtomicU8>);

impl BodyOutcome {
    const TIMED_OUT: u8 = 1;
    const TOO_SLOW: u8 = 2;

    /// `body_timeout` passed before the body ended.
    pub fn timed_out(&self) -> bool {
        self.0.load(Ordering::Relaxed) == Self::TIMED_OUT
    }

    /// The body fell below `min_body_rate` after its grace period.
    pub fn too_slow(&self) -> bool {
        self.0.load(Ordering::Relaxed) == Self::TOO_SLOW
    }
}

/// The pace a body must keep: all of it within `timeout`, and after `grace`, on average at
/// least `min_rate` bytes per second since its head (0: no minimum).
#[derive(Debug, Clone, Copy)]
pub struct BodyPace {
    /// `body_timeout`.
    pub timeout: Duration,
    /// `min_body_rate`, bytes per second.
    pub min_rate: u64,
    /// `body_rate_grace`.
    pub grace: Duration,
}

impl BodyPace {
    /// When a body that started at `started` and has `received` bytes so far must have sent
    /// more (or ended), and whether that moment is the rate's (`true`) or the timeout's.
    pub fn deadline(&self, started: Instant, received: u64) -> (Instant, bool) {
        let total = started + self.timeout;
        if self.min_rate == 0 {
            return (total, false);
        }
        let earned = Duration::from_secs_f64(received as f64 / self.min_rate as f64);
        let by_rate = started + self.grace.max(earned);
        if by_rate < total {
            (by_rate, true)
        } else {
            (total, false)
        }
    }
}

/// A request body held to a [`BodyPace`]; it fails once the pace is missed while it is still
/// being read, and holds its [`BodySlot`] until it ends.
pub struct PacedBody {
    inner: Incoming,
    pace: BodyPace,
    started: Instant,
    received: u64,
    timer: Pin<Box<Sleep>>,
    outcome: BodyOutcome,
    slot: Option<BodySlot>,
}

impl PacedBody {
    /// `inner`, paced from now; `outcome` tells the request how it ended.
    pub fn new(
        inner: Incoming,
        pace: BodyPace,
        outcome: BodyOutcome,
        slot: Option<BodySlot>,
    ) -> Self {
        let started = Instant::now();
        let (deadline, _) = pace.deadline(started, 0);
        Self {
            inner,
            pace,
            started,
            received: 0,
            timer: Box::pin(tokio::time::sleep_until(deadline)),
            outcome,
            slot,
        }
    }
}

impl std::fmt::Debug for PacedBody {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PacedBody")
            .field("pace", &self.pace)
            .field("received", &self.received)
            .finish_non_exhaustive()
    }
}

/// The error a request body ends with when it misses its pace.
#[derive(Debug, thiserror::Error)]
#[error("request body timed out")]
pub struct BodyTimedOut;

impl HttpBody for PacedBody {
    type Data = Bytes;
    type Error = Box<dyn std::error::Error + Send + Sync>;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let this = self.get_mut();
        if let Poll::Ready(frame) = Pin::new(&mut this.inner).poll_frame(cx) {
            match &frame {
                Some(Ok(f)) => {
                    if let Some(data) = f.data_ref() {
                        this.received += data.len() as u64;
                        let (deadline, _) = this.pace.deadline(this.started, this.received);
                        this.timer.as_mut().reset(deadline);
                    }
                    if this.inner.is_end_stream() {
                        this.slot = None;
                    }
                }
                _ => this.slot = None,
            }
            return Poll::Ready(frame.map(|r| r.map_err(Into::into)));
        }
        if this.timer.as_mut().poll(cx).is_ready() {
            let (deadline, by_rate) = this.pace.deadline(this.started, this.received);
            if deadline > Instant::now() {
                // Data arrived since the timer was set: wait for the new deadline.
                this.timer.as_mut().reset(deadline);
                let _ = this.timer.as_mut().poll(cx);
                return Poll::Pending;
            }
            let code = if by_rate {
                BodyOutcome::TOO_SLOW
            } else {
                BodyOutcome::TIMED_OUT
            };
            this.outcome.0.store(code, Ordering::Relaxed);
            this.slot = None;
            return Poll::Ready(Some(Err(Box::new(BodyTimedOut))));
        }
        Poll::Pending
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// A connection's socket whose writes fail with `TimedOut` once one has made no progress for
/// `timeout`: a client that stops reading its answers frees its connection.
pub struct StallGuard<S> {
    inner: S,
    timeout: Duration,
    stalled: Option<Pin<Box<Sleep>>>,
}

impl<S> std::fmt::Debug for StallGuard<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StallGuard")
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

impl<S> StallGuard<S> {
    /// `inner` with writes bounded by `timeout` without progress.
    pub fn new(inner: S, timeout: Duration) -> Self {
        Self {
            inner,
            timeout,
            stalled: None,
        }
    }

    /// After a write attempt: clears the stall timer on progress, starts or checks it when
    /// the write is pending.
    fn watch<T>(
        &mut self,
        cx: &mut Context<'_>,
        r: Poll<std::io::Result<T>>,
    ) -> Poll<std::io::Result<T>> {
        if r.is_ready() {
            self.stalled = None;
            return r;
        }
        let timeout = self.timeout;
        let timer = self
            .stalled
            .get_or_insert_with(|| Box::pin(tokio::time::sleep(timeout)));
        if timer.as_mut().poll(cx).is_ready() {
            return Poll::Ready(Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                "the client did not read its response within server.write_stall_timeout",
            )));
        }
        Poll::Pending
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for StallGuard<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for StallGuard<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let this = self.get_mut();
        let r = Pin::new(&mut this.inner).poll_write(cx, buf);
        this.watch(cx, r)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        let r = Pin::new(&mut this.inner).poll_flush(cx);
        this.watch(cx, r)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        let r = Pin::new(&mut this.inner).poll_shutdown(cx);
        this.watch(cx, r)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        let this = self.get_mut();
        let r = Pin::new(&mut this.inner).poll_write_vectored(cx, bufs);
        this.watch(cx, r)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

#[cfg(test)]
mod tests {
    use std::net::Ipv4Addr;

    use tokio::io::AsyncWriteExt;

    use super::*;

    #[test]
    fn the_pace_starts_after_the_grace_and_moves_with_the_bytes() {
        let pace = BodyPace {
            timeout: Duration::from_secs(30),
            min_rate: 1024,
            grace: Duration::from_secs(5),
        };
        let t0 = Instant::now();
        assert_eq!(pace.deadline(t0, 0), (t0 + Duration::from_secs(5), true));
        assert_eq!(
            pace.deadline(t0, 5 * 1024),
            (t0 + Duration::from_secs(5), true)
        );
        assert_eq!(
            pace.deadline(t0, 10 * 1024),
            (t0 + Duration::from_secs(10), true)
        );
        // A fast body's rate deadline lies past the timeout: the timeout holds.
        assert_eq!(
            pace.deadline(t0, 100 * 1024),
            (t0 + Duration::from_secs(30), false)
        );
        let off = BodyPace {
            min_rate: 0,
            ..pace
        };
        assert_eq!(off.deadline(t0, 0), (t0 + Duration::from_secs(30), false));
    }

    #[test]
    fn bodies_per_address_are_capped_only_under_pressure() {
        let bodies = BodiesInProgress::new(2);
        let a = AddressGroup::V4(Ipv4Addr::new(10, 0, 0, 1));
        let b = AddressGroup::V4(Ipv4Addr::new(10, 0, 0, 2));
        let held: Vec<_> = (0..3).map(|_| bodies.start(a, false).unwrap()).collect();
        assert!(bodies.start(a, true).is_none());
        assert!(bodies.start(b, true).is_some());
        drop(held);
        assert_eq!(bodies.in_progress(a), 0);
        let _one = bodies.start(a, true).unwrap();
        assert_eq!(bodies.in_progress(a), 1);
    }

    #[tokio::test]
    async fn a_write_the_client_never_reads_fails_after_the_stall_timeout() {
        let (client, server) = tokio::io::duplex(64);
        let mut guarded = StallGuard::new(server, Duration::from_millis(100));
        let start = std::time::Instant::now();
        let err = guarded.write_all(&[0u8; 4096]).await.unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::TimedOut);
        assert!(start.elapsed() < Duration::from_secs(2));
        drop(client);
    }
}
