//! The response side of the layer: [`LeaseGuard`], which gives a request's concurrency
//! leases back when it is dropped (or at once with [`LeaseGuard::release`]), and
//! [`RateLimitBody`], the response body that holds the guard until the body ends, so a lease
//! covers the whole response, streaming included.

use std::pin::Pin;
use std::task::{Context, Poll, ready};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use sluice::{Lease, Limiter};

/// Holds concurrency leases and releases them when dropped (on a spawned task, since `Drop`
/// cannot wait). Outside a tokio runtime the leases are left to expire.
#[derive(Debug)]
pub struct LeaseGuard {
    limiter: Limiter,
    leases: Vec<Lease>,
}

impl LeaseGuard {
    /// A guard over `leases`.
    pub fn new(limiter: Limiter, leases: Vec<Lease>) -> Self {
        Self { limiter, leases }
    }

    /// How many leases the guard holds.
    pub fn len(&self) -> usize {
        self.leases.len()
    }

    /// True when the guard holds no lease.
    pub fn is_empty(&self) -> bool {
        self.leases.is_empty()
    }

    /// Releases the leases now, waiting for the store (each release bounded by the limiter's
    /// store timeout), and returns how many the store released. For callers that are not
    /// inside a tokio runtime when they are done with the request (the Python and Node
    /// middleware), whose drop could not reach the store: a lease not released expires after
    /// its policy's lease timeout.
    pub async fn release(mut self) -> usize {
        let leases = std::mem::take(&mut self.leases);
        let mut released = 0;
        for lease in &leases {
            match self.limiter.release(lease).await {
                Ok(true) => released += 1,
                Ok(false) => {}
                Err(e) => {
                    tracing::debug!(error = %e, key = %lease.key, "lease release failed; it will expire");
                }
            }
        }
        released
    }
}

impl Drop for LeaseGuard {
    fn drop(&mut self) {
        if self.leases.is_empty() {
            return;
        }
        let leases = std::mem::take(&mut self.leases);
        let limiter = self.limiter.clone();
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(async move {
                for lease in &leases {
                    if let Err(e) = limiter.release(lease).await {
                        tracing::debug!(error = %e, key = %lease.key, "lease release failed; it will expire");
                    }
                }
            });
        }
    }
}

pin_project_lite::pin_project! {
    /// The response body of [`RateLimit`]: the inner service's body (holding the request's
    /// concurrency leases until it ends), or the layer's own problem+json denial.
    ///
    /// It is an `http_body::Body<Data = Bytes>` whose error is the inner body's, so axum
    /// (`Response<RateLimitBody<axum::body::Body>>: IntoResponse`) and hyper serve it as is.
    pub struct RateLimitBody<B> {
        #[pin]
        kind: Kind<B>,
        guard: Option<LeaseGuard>,
    }
}

pin_project_lite::pin_project! {
    #[project = KindProj]
    enum Kind<B> {
        Inner { #[pin] body: B },
        Full { data: Option<Bytes> },
    }
}

impl<B> std::fmt::Debug for RateLimitBody<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RateLimitBody")
            .field("holds_leases", &self.guard.is_some())
            .finish_non_exhaustive()
    }
}

impl<B> RateLimitBody<B> {
    pub(crate) fn inner(body: B, guard: Option<LeaseGuard>) -> Self {
        Self {
            kind: Kind::Inner { body },
            guard,
        }
    }
    pub(crate) fn full(data: Bytes) -> Self {
        Self {
            kind: Kind::Full { data: Some(data) },
            guard: None,
        }
    }
}

impl<B: Body<Data = Bytes>> Body for RateLimitBody<B> {
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        let this = self.project();
        match this.kind.project() {
            KindProj::Inner { mut body } => {
                let frame = ready!(body.as_mut().poll_frame(cx));
                // The body ended or failed (or this is its last frame): the request is over.
                // Releasing before the last bytes are written lets a client that sends its
                // next request as soon as this one completes find the capacity free.
                if !matches!(frame, Some(Ok(_))) || body.is_end_stream() {
                    this.guard.take();
                }
                Poll::Ready(frame)
            }
            KindProj::Full { data } => Poll::Ready(data.take().map(|d| Ok(Frame::data(d)))),
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.kind {
            Kind::Inner { body } => body.is_end_stream(),
            Kind::Full { data } => data.is_none(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.kind {
            Kind::Inner { body } => body.size_hint(),
            Kind::Full { data } => {
                SizeHint::with_exact(data.as_ref().map_or(0, |d| d.len() as u64))
            }
        }
    }
}
