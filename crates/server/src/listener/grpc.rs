//! The gRPC listener under the same connection budget as the HTTP listeners, and the tonic limits
//! from `GrpcLimits`.
//!
//! Envoy keeps a few long-lived HTTP/2 connections, so the budget is about strangers: the
//! incoming stream admits connections through [`ConnectionBudget`] (global and per-IP caps) and
//! pauses on accept errors. A connection admitted into the reserve may only call
//! `grpc.health.v1.Health`; other calls get `UNAVAILABLE`. Keep-alive pings close dead peers, the
//! stream cap bounds one connection's work and the per-call timeout bounds each call.
//!
//! The listener runs on threads of its own, each with a single-threaded runtime
//! (`server.grpc_threads`, [`serve_on_threads`]): an Envoy call is small, and on the shared
//! multi-threaded runtime most of its cost beyond the gRPC stack was one worker waking another
//! (futex calls, context switches, cache lines moving between cores).

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use futures::Stream;
use futures::future::{Either, Ready, ready};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tonic::transport::server::Connected;

use super::{AcceptBackoff, Admission, ConnectionBudget, ConnectionPermit, count_rejected};
use crate::limits::GrpcLimits;

/// The `listener` label of the gRPC listener.
pub const LISTENER: &str = "grpc";

/// The path prefix reserve connections may call.
const HEALTH_PREFIX: &str = "/grpc.health.v1.Health/";

/// A tonic server builder with `limits` applied.
pub fn server_builder(limits: &GrpcLimits) -> tonic::transport::Server {
    tonic::transport::Server::builder()
        .http2_keepalive_interval(Some(limits.keepalive_interval))
        .http2_keepalive_timeout(Some(limits.keepalive_timeout))
        .max_concurrent_streams(limits.max_concurrent_streams)
        .timeout(limits.request_timeout)
}

/// The threads `limits` asks for: `threads` itself, or derived from the store: one per two
/// cores (at least one) on the embedded store, none (the shared runtime) on Redis, where every
/// call waits on connection tasks of the shared runtime.
pub fn thread_count(limits: &GrpcLimits, embedded_store: bool) -> usize {
    match limits.threads {
        Some(n) => n as usize,
        None if embedded_store => std::thread::available_parallelism()
            .map_or(1, |n| n.get() / 2)
            .max(1),
        None => 0,
    }
}

fn listener_error(source: std::io::Error) -> crate::ServeError {
    crate::ServeError::Io {
        what: "gRPC listener".into(),
        source,
    }
}

/// Runs `serve` on `listener`: on the calling runtime when `threads` is 0, else on `threads`
/// threads named `sluice-grpc-<n>`, each with its own single-threaded runtime and its own copy
/// of the listening socket, so each accepted connection (and every call on it) stays on the
/// thread that accepted it. Returns when every copy has returned, or at the first error.
pub async fn serve_on_threads<S, F>(
    threads: usize,
    listener: TcpListener,
    serve: S,
) -> Result<(), crate::ServeError>
where
    S: Fn(TcpListener) -> F + Send + Sync + 'static,
    F: Future<Output = Result<(), tonic::transport::Error>> + Send,
{
    if threads == 0 {
        return Ok(serve(listener).await?);
    }
    let socket = listener.into_std().map_err(listener_error)?;
    let serve = Arc::new(serve);
    let mut running = Vec::with_capacity(threads);
    for n in 0..threads {
        let socket = socket.try_clone().map_err(listener_error)?;
        let serve = Arc::clone(&serve);
        let (done, finished) = tokio::sync::oneshot::channel();
        std::thread::Builder::new()
            .name(format!("sluice-grpc-{n}"))
            .spawn(move || {
                let served = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .map_err(listener_error)
                    .and_then(|rt| {
                        rt.block_on(async {
                            let listener = TcpListener::from_std(socket).map_err(listener_error)?;
                            Ok(serve(listener).await?)
                        })
                    });
                let _ = done.send(served);
            })
            .map_err(listener_error)?;
        running.push(async move {
            finished.await.unwrap_or_else(|_| {
                Err(listener_error(std::io::Error::other(
                    "a gRPC listener thread stopped",
                )))
            })
        });
    }
    futures::future::try_join_all(running).await.map(|_| ())
}

/// One accepted gRPC connection, holding its place in the budget until it closes.
#[derive(Debug)]
pub struct GrpcConnection {
    stream: TcpStream,
    info: GrpcConnectInfo,
    _permit: ConnectionPermit,
}

/// What each gRPC request knows about its connection (a request extension).
#[derive(Debug, Clone, Copy)]
pub struct GrpcConnectInfo {
    /// The client's address.
    pub remote_addr: SocketAddr,
    /// Admitted into the reserve: health checks only.
    pub reserve_only: bool,
}

impl Connected for GrpcConnection {
    type ConnectInfo = GrpcConnectInfo;

    fn connect_info(&self) -> GrpcConnectInfo {
        self.info
    }
}

impl AsyncRead for GrpcConnection {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_read(cx, buf)
    }
}

impl AsyncWrite for GrpcConnection {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.get_mut().stream).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.get_mut().stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }
}

/// The connections of `listener` that the budget admits; refused ones are closed at once and
/// accept errors pause the stream instead of ending it.
pub fn incoming(
    listener: TcpListener,
    budget: Arc<ConnectionBudget>,
) -> impl Stream<Item = std::io::Result<GrpcConnection>> + Send {
    let state = (listener, budget, AcceptBackoff::new());
    futures::stream::unfold(state, |(listener, budget, mut backoff)| async move {
        loop {
            let (stream, peer) = match listener.accept().await {
                Ok(accepted) => accepted,
                Err(e) => {
                    if let Some(pause) = backoff.on_error(LISTENER, &e) {
                        tokio::time::sleep(pause).await;
                    }
                    continue;
                }
            };
            backoff.reset();
            let (permit, reserve_only) = match budget.admit(LISTENER, peer.ip(), true, false) {
                Admission::Full(p) => (p, false),
                Admission::ReserveOnly(p) => (p, true),
                Admission::Refused(reason) => {
                    count_rejected(LISTENER, reason);
                    continue;
                }
            };
            // Without TCP_NODELAY small replies wait on Nagle + delayed ACK (p99 ~44 ms).
            let _ = stream.set_nodelay(true);
            let conn = GrpcConnection {
                stream,
                info: GrpcConnectInfo {
                    remote_addr: peer,
                    reserve_only,
                },
                _permit: permit,
            };
            return Some((Ok(conn), (listener, budget, backoff)));
        }
    })
}

/// The layer that keeps reserve connections to health checks.
#[derive(Debug, Clone, Copy, Default)]
pub struct ReserveGateLayer;

impl<S> tower::Layer<S> for ReserveGateLayer {
    type Service = ReserveGate<S>;

    fn layer(&self, inner: S) -> ReserveGate<S> {
        ReserveGate { inner }
    }
}

/// Answers `UNAVAILABLE` to calls other than health checks on reserve connections.
#[derive(Debug, Clone)]
pub struct ReserveGate<S> {
    inner: S,
}

impl<S, B> tower::Service<http::Request<B>> for ReserveGate<S>
where
    S: tower::Service<http::Request<B>, Response = http::Response<tonic::body::Body>>,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = S::Error;
    // No box per call: the refusal is ready at once, every other call is the inner future.
    type Future = Either<Ready<Result<Self::Response, S::Error>>, S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        let reserve_only = req
            .extensions()
            .get::<GrpcConnectInfo>()
            .is_some_and(|i| i.reserve_only);
        if reserve_only && !req.uri().path().starts_with(HEALTH_PREFIX) {
            count_rejected(LISTENER, super::RejectReason::ReserveOnly);
            let status = tonic::Status::unavailable(
                "the server is at its connection limit; only health checks are served",
            );
            return Either::Left(ready(Ok(status.into_http())));
        }
        Either::Right(self.inner.call(req))
    }
}
