//! The HTTP listeners (decision API and proxy) on hyper directly, with an axum router as the
//! service, so each connection carries the limits that `axum::serve` has no setting for.
//!
//! Per connection:
//! - the request head must arrive within `header_read_timeout` (hyper's HTTP/1 timer, which also
//!   runs from the moment the connection opens and while a keep-alive connection waits for its
//!   next request) and fit in `max_header_bytes` (larger heads get hyper's own 431, with no
//!   body since no request exists yet; the buffer goes with the connection);
//! - a request body must arrive within `body_timeout` of its head and, after
//!   `body_rate_grace`, at `min_body_rate` on average, or the request ends with 408
//!   (problem+json, like every answer written here) and the connection closes; under pressure
//!   one address has at most `max_bodies_per_ip` bodies in progress (see [`super::body`]);
//! - a response the client does not read for `write_stall_timeout` ends the connection;
//! - a connection the budget refuses is answered with 503 problem+json, `Retry-After` and
//!   `Connection: close` after its request head is read (at most [`REFUSAL_ANSWERS`] at
//!   once, each within [`REFUSAL_TIME`]); beyond that it is closed;
//! - a connection with no request in flight for `idle_timeout` is closed (HTTP/2 included);
//! - a connection admitted into the reserve answers only the listener's reserved paths, one
//!   request, then closes; other paths get 503;
//! - a connection with no request in flight may be displaced by a newcomer when the budget is
//!   at its cap (see [`super::ConnectionBudget`]): it is shut down gracefully.
//!
//! HTTP/1.1 and HTTP/2 (prior knowledge) are both served, as `axum::serve` did, and the peer
//! address is in each request as axum's `ConnectInfo<SocketAddr>`.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::ConnectInfo;
use bytes::Bytes;
use futures::future::BoxFuture;
use http::header::{CONNECTION, HeaderValue, RETRY_AFTER};
use http::{Request, Response, StatusCode};
use http_body::{Body as HttpBody, Frame, SizeHint};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Semaphore, mpsc, watch};
use tokio::time::Instant;
use tower::ServiceExt;

use super::body::{BodyOutcome, BodyPace, PacedBody, StallGuard};
use super::{
    AcceptBackoff, AddressGroup, Admission, ConnectionBudget, IdleHandle, RejectReason,
    count_rejected,
};
use crate::limits::ConnectionLimits;

/// Which request paths a reserve connection may use on a listener.
pub type ReservedPaths = fn(&str) -> bool;

/// The decision API's reserved paths: health, readiness, metrics and admin.
pub fn api_reserved_paths(path: &str) -> bool {
    matches!(path, "/healthz" | "/readyz" | "/metrics") || path.starts_with("/admin/")
}

/// One HTTP listener: its socket, its router and the limits it applies.
#[derive(Debug)]
pub struct HttpListener {
    /// The `listener` label in metrics (`http`, `proxy`).
    pub name: &'static str,
    /// The bound socket.
    pub socket: TcpListener,
    /// The service for every request.
    pub router: Router,
    /// Timeouts and sizes.
    pub limits: ConnectionLimits,
    /// Paths served on reserve connections; `None`: this listener uses no reserve.
    pub reserved: Option<ReservedPaths>,
    /// The connection budget shared with the other listeners.
    pub budget: Arc<ConnectionBudget>,
}

/// Serves `listener` until `shutdown` resolves, then stops accepting, lets every connection
/// finish its requests in flight (idle ones close at once) and returns.
pub async fn serve(
    listener: HttpListener,
    shutdown: impl Future<Output = ()> + Send,
) -> std::io::Result<()> {
    let HttpListener {
        name,
        socket,
        router,
        limits,
        reserved,
        budget,
    } = listener;
    let limits = Arc::new(limits);
    let (stop_tx, stop_rx) = watch::channel(false);
    // Each connection task holds a sender; when all are gone, every connection has finished.
    let (alive_tx, mut alive_rx) = mpsc::channel::<Infallible>(1);
    let mut backoff = AcceptBackoff::new();
    let refusals = Arc::new(Semaphore::new(REFUSAL_ANSWERS));
    tokio::pin!(shutdown);
    loop {
        let (stream, peer) = tokio::select! {
            biased;
            () = &mut shutdown => break,
            r = socket.accept() => match r {
                Ok(accepted) => accepted,
                Err(e) => {
                    if let Some(pause) = backoff.on_error(name, &e) {
                        tokio::select! {
                            () = &mut shutdown => break,
                            () = tokio::time::sleep(pause) => {}
                        }
                    }
                    continue;
                }
            },
        };
        backoff.reset();
        let (permit, reserve_only) = match budget.admit(name, peer.ip(), reserved.is_some(), true) {
            Admission::Full(p) => (p, false),
            Admission::ReserveOnly(p) => (p, true),
            Admission::Refused(reason) => {
                count_rejected(name, reason);
                if let Ok(slot) = Arc::clone(&refusals).try_acquire_owned() {
                    tokio::spawn(async move {
                        let _ = tokio::time::timeout(REFUSAL_TIME, answer_refused(stream, reason))
                            .await;
                        drop(slot);
                    });
                }
                continue;
            }
        };
        let group = permit.group();
        let conn = Connection {
            name,
            peer,
            router: router.clone(),
            limits: Arc::clone(&limits),
            reserved: if reserve_only { reserved } else { None },
            budget: Arc::clone(&budget),
            group,
            idle: permit
                .idle_handle()
                .cloned()
                .unwrap_or_else(|| Arc::new(IdleHandle::default())),
        };
        let stop = stop_rx.clone();
        let alive = alive_tx.clone();
        tokio::spawn(async move {
            conn.run(stream, stop).await;
            drop(permit);
            drop(alive);
        });
    }
    drop(socket);
    let _ = stop_tx.send(true);
    drop(alive_tx);
    let _ = alive_rx.recv().await;
    Ok(())
}

/// Most refused connections being answered at once; further ones are closed unanswered, so
/// answering refusals cannot itself use up the descriptors the cap protects.
pub const REFUSAL_ANSWERS: usize = 64;

/// Longest time spent answering one refused connection (reading its head, writing the 503).
pub const REFUSAL_TIME: Duration = Duration::from_secs(2);

/// Seconds a refused client is told to wait (`Retry-After`).
const REFUSAL_RETRY_AFTER_S: u64 = 1;

/// The whole answer to a connection the budget refused, as bytes on the wire.
fn refusal_answer(reason: RejectReason) -> Vec<u8> {
    let detail = match reason {
        RejectReason::PerIp => {
            "the server is under connection pressure and this client address holds              server.max_connections_per_ip connections; retry after Retry-After"
        }
        _ => "the server is at its connection limit; retry after Retry-After",
    };
    let body = sluice_http::headers::problem_json(
        StatusCode::SERVICE_UNAVAILABLE,
        detail,
        None,
        Some(REFUSAL_RETRY_AFTER_S * 1000),
    );
    let mut out = format!(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/problem+json\r\n\
         retry-after: {REFUSAL_RETRY_AFTER_S}\r\ncache-control: no-store\r\n\
         connection: close\r\ncontent-length: {}\r\n\r\n",
        body.len()
    )
    .into_bytes();
    out.extend_from_slice(&body);
    out
}

/// Reads the refused connection's request head (so the client takes the answer as the
/// answer to its request), writes the 503 and closes; the caller bounds the time.
async fn answer_refused(mut stream: TcpStream, reason: RejectReason) {
    let _ = stream.set_nodelay(true);
    let mut head = Vec::with_capacity(1024);
    let mut buf = [0u8; 2048];
    // An HTTP/1 head ends with an empty line; give up on it after a bounded amount.
    while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < 16 * 1024 {
        match stream.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => head.extend_from_slice(&buf[..n]),
        }
    }
    if stream.write_all(&refusal_answer(reason)).await.is_err() {
        return;
    }
    let _ = stream.shutdown().await;
    // Drain what the client still sends (a body) until it closes, so the close does not turn
    // into a reset that could discard the answer before the client reads it.
    let mut drained = 0usize;
    while drained < 64 * 1024 {
        match stream.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => drained += n,
        }
    }
}

/// Requests in flight on one connection and when the last one ended.
#[derive(Debug, Clone, Copy)]
struct Activity {
    in_flight: usize,
    idle_since: Instant,
}

struct Connection {
    name: &'static str,
    peer: SocketAddr,
    router: Router,
    limits: Arc<ConnectionLimits>,
    /// `Some`: a reserve connection, limited to these paths.
    reserved: Option<ReservedPaths>,
    /// The budget (pressure, bodies in progress) and the client's place in it.
    budget: Arc<ConnectionBudget>,
    group: AddressGroup,
    /// Requests in flight, as the budget sees them; told when the connection is displaced.
    idle: Arc<IdleHandle>,
}

impl Connection {
    async fn run(self, stream: TcpStream, mut stop: watch::Receiver<bool>) {
        let _ = stream.set_nodelay(true);
        let name = self.name;
        let limits = Arc::clone(&self.limits);
        let reserve_only = self.reserved.is_some();
        let (activity_tx, activity_rx) = watch::channel(Activity {
            in_flight: 0,
            idle_since: Instant::now(),
        });
        let service = ConnService {
            name,
            peer: self.peer,
            router: self.router,
            reserved: self.reserved,
            pace: BodyPace {
                timeout: limits.body_timeout,
                min_rate: limits.min_body_rate,
                grace: limits.body_rate_grace,
            },
            budget: self.budget,
            group: self.group,
            activity: Arc::new(Tracker {
                activity: activity_tx,
                idle: Arc::clone(&self.idle),
            }),
        };

        let mut builder = auto::Builder::new(TokioExecutor::new());
        builder
            .http1()
            .timer(TokioTimer::new())
            .header_read_timeout(limits.header_read_timeout)
            .max_buf_size(limits.max_header_bytes.max(MIN_HYPER_BUF))
            .keep_alive(!reserve_only);
        builder
            .http2()
            .timer(TokioTimer::new())
            .max_header_list_size(u32::try_from(limits.max_header_bytes).unwrap_or(u32::MAX))
            .enable_connect_protocol();
        let io = TokioIo::new(StallGuard::new(stream, limits.write_stall_timeout));
        let conn = builder.serve_connection_with_upgrades(io, service);
        tokio::pin!(conn);
        let idle = idle_for(activity_rx, limits.idle_timeout);
        tokio::pin!(idle);
        let mut closing = false;
        loop {
            tokio::select! {
                r = conn.as_mut() => {
                    if let Err(e) = r
                        && let Some(reason) = rejection_of(&*e)
                    {
                        count_rejected(name, reason);
                    }
                    return;
                }
                () = &mut idle, if !closing => {
                    count_rejected(name, RejectReason::Idle);
                    conn.as_mut().graceful_shutdown();
                    closing = true;
                }
                () = self.idle.displaced(), if !closing => {
                    count_rejected(name, RejectReason::Displaced);
                    conn.as_mut().graceful_shutdown();
                    closing = true;
                }
                r = stop.wait_for(|s| *s), if !closing => {
                    let _ = r;
                    conn.as_mut().graceful_shutdown();
                    closing = true;
                }
            }
        }
    }
}

/// hyper refuses a `max_buf_size` below 8 KiB.
const MIN_HYPER_BUF: usize = 8192;

/// Resolves once the connection has had no request in flight for `timeout`.
async fn idle_for(mut rx: watch::Receiver<Activity>, timeout: Duration) {
    loop {
        let now = *rx.borrow_and_update();
        if now.in_flight > 0 {
            if rx.changed().await.is_err() {
                return std::future::pending().await;
            }
            continue;
        }
        tokio::select! {
            r = rx.changed() => {
                if r.is_err() {
                    return std::future::pending().await;
                }
            }
            () = tokio::time::sleep_until(now.idle_since + timeout) => return,
        }
    }
}

/// The rejection a connection error stands for, if any.
fn rejection_of(e: &(dyn std::error::Error + 'static)) -> Option<RejectReason> {
    let mut cur = Some(e);
    while let Some(err) = cur {
        if let Some(h) = err.downcast_ref::<hyper::Error>()
            && (h.is_timeout() || h.is_parse_too_large())
        {
            return Some(RejectReason::HeaderTimeout);
        }
        if let Some(io) = err.downcast_ref::<std::io::Error>()
            && io.kind() == std::io::ErrorKind::TimedOut
        {
            return Some(RejectReason::WriteStall);
        }
        cur = err.source();
    }
    None
}

/// The per-connection service: peer address in, body deadline, reserve filter, activity.
#[derive(Clone)]
struct ConnService {
    name: &'static str,
    peer: SocketAddr,
    router: Router,
    reserved: Option<ReservedPaths>,
    pace: BodyPace,
    budget: Arc<ConnectionBudget>,
    group: AddressGroup,
    activity: Arc<Tracker>,
}

/// Where a connection's requests are counted: its own idle timer and the budget's view.
struct Tracker {
    activity: watch::Sender<Activity>,
    idle: Arc<IdleHandle>,
}

impl hyper::service::Service<Request<Incoming>> for ConnService {
    type Response = Response<Body>;
    type Error = Infallible;
    type Future = BoxFuture<'static, Result<Response<Body>, Infallible>>;

    fn call(&self, req: Request<Incoming>) -> Self::Future {
        let in_flight = InFlight::start(Arc::clone(&self.activity));
        if let Some(allowed) = self.reserved
            && !allowed(req.uri().path())
        {
            count_rejected(self.name, RejectReason::ReserveOnly);
            let res = closing(crate::api::problem(
                StatusCode::SERVICE_UNAVAILABLE,
                "the server is at its connection limit; only health, metrics and admin paths are served",
            ));
            return Box::pin(std::future::ready(Ok(res)));
        }
        // A body still to come holds one of its address's slots until it ends.
        let slot = if req.body().is_end_stream() {
            None
        } else {
            match self
                .budget
                .bodies()
                .start(self.group, self.budget.under_pressure())
            {
                Some(slot) => Some(slot),
                None => {
                    count_rejected(self.name, RejectReason::BodiesPerIp);
                    let mut res = closing(crate::api::problem(
                        StatusCode::SERVICE_UNAVAILABLE,
                        "the server is under connection pressure and this client address has \
                         server.max_bodies_per_ip request bodies in progress; retry after \
                         Retry-After",
                    ));
                    res.headers_mut()
                        .insert(RETRY_AFTER, HeaderValue::from(REFUSAL_RETRY_AFTER_S));
                    return Box::pin(std::future::ready(Ok(res)));
                }
            }
        };
        let outcome = BodyOutcome::default();
        let pace = self.pace;
        let mut req = req.map(|b| Body::new(PacedBody::new(b, pace, outcome.clone(), slot)));
        req.extensions_mut().insert(ConnectInfo(self.peer));
        let router = self.router.clone();
        let name = self.name;
        Box::pin(async move {
            let res = match router.oneshot(req).await {
                Ok(r) => r,
                Err(never) => match never {},
            };
            let res = if outcome.timed_out() {
                count_rejected(name, RejectReason::BodyTimeout);
                closing(crate::api::problem(
                    StatusCode::REQUEST_TIMEOUT,
                    "the request body did not arrive within server.body_timeout",
                ))
            } else if outcome.too_slow() {
                count_rejected(name, RejectReason::BodyTooSlow);
                closing(crate::api::problem(
                    StatusCode::REQUEST_TIMEOUT,
                    "the request body arrived slower than server.min_body_rate",
                ))
            } else {
                res
            };
            Ok(res.map(|b| {
                Body::new(TrackedBody {
                    inner: b,
                    _in_flight: in_flight,
                })
            }))
        })
    }
}

/// `res` with `Connection: close`, so the connection ends after it.
fn closing(mut res: Response<Body>) -> Response<Body> {
    res.headers_mut()
        .insert(CONNECTION, HeaderValue::from_static("close"));
    res
}

/// One request in flight on a connection, from its head to the end of its response body.
struct InFlight(Arc<Tracker>);

impl InFlight {
    fn start(tracker: Arc<Tracker>) -> Self {
        tracker.idle.request_started();
        tracker.activity.send_modify(|a| a.in_flight += 1);
        Self(tracker)
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.activity.send_modify(|a| {
            a.in_flight = a.in_flight.saturating_sub(1);
            a.idle_since = Instant::now();
        });
        self.0.idle.request_ended();
    }
}

/// A response body that keeps its request counted as in flight until it is sent or dropped.
struct TrackedBody {
    inner: Body,
    _in_flight: InFlight,
}

impl HttpBody for TrackedBody {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        Pin::new(&mut self.get_mut().inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reserved_paths_are_health_metrics_and_admin() {
        for p in ["/healthz", "/readyz", "/metrics", "/admin/reload"] {
            assert!(api_reserved_paths(p), "{p}");
        }
        for p in ["/v1/check", "/v1/release", "/", "/admin", "/healthzz"] {
            assert!(!api_reserved_paths(p), "{p}");
        }
    }
}
