//! The gRPC listener under the same connection budget as the HTTP listeners, and the tonic limits
//! from `GrpcLimits`.
//!
//! Envoy keeps a few long-lived HTTP/2 connections, so the budget is about strangers: the
//! incoming stream admits connections through [`ConnectionBudget`] (global and per-IP caps) and
//! pauses on accept errors. A connection admitted into the reserve may only call
//! `grpc.health.v1.Health`; other calls get `UNAVAILABLE`. Keep-alive pings close dead peers, the
//! stream cap bounds one connection's work and the per-call timeout bounds each call.

use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use futures::Stream;
use futures::future::BoxFuture;
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
    type Future = BoxFuture<'static, Result<Self::Response, S::Error>>;

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
            return Box::pin(std::future::ready(Ok(status.into_http())));
        }
        Box::pin(self.inner.call(req))
    }
}
