//! Reservations in front of an upstream whose cost is known only from its answer: an LLM
//! gateway reserves a request's `max_tokens` and settles with the `usage` the response
//! reports (`sluice::reservation`).
//!
//! [`ReserveLayer`] reads the maximum from the request (a field of a JSON body, read whole
//! up to [`MAX_REQUEST_BODY`] and passed on unchanged, or a header), reserves it from one
//! policy, and answers 429 when it does not fit. An admitted request goes on; the response
//! body is wrapped in [`SettleBody`], which passes every frame through as it arrives (never
//! buffering the body) while [`UsageScanner`] reads a copy: the `usage` object of a JSON
//! answer, or of the last event that carries one in a `text/event-stream`. When the body
//! ends the reservation is settled with that usage's field (the whole maximum when there is
//! none). An upstream that failed (5xx, or the proxy's own 502/504 marked
//! [`crate::UpstreamFailed`]) and a client that went away before the end settle the whole
//! maximum: an upstream may have done the work, so nothing is refunded on a guess.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::Body;
use bytes::Bytes;
use http::{HeaderName, Request, Response, StatusCode};
use http_body::{Body as HttpBody, Frame};
use http_body_util::BodyExt;
use sluice::{Limiter, Policy, Reservation};
use tower::{Layer, Service};

use crate::headers::{HeaderOptions, too_many_requests};
use crate::identity::IdentityResolver;

/// The largest request body read to find the maximum in (a larger one is answered 413).
pub const MAX_REQUEST_BODY: usize = 4 << 20;
/// The largest JSON response a copy is kept of to read its usage; beyond it the usage is
/// unknown and the whole maximum is settled.
pub const MAX_JSON_COPY: usize = 4 << 20;
/// The longest line of an event stream read for usage.
pub const MAX_EVENT_LINE: usize = 1 << 20;

/// Where a request declares its maximum cost.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MaxCostFrom {
    /// A top-level field of a JSON request body (`max_tokens`).
    JsonField(String),
    /// A header holding a whole number.
    Header(HeaderName),
}

/// A route's reservation, as configured (`[routes.reserve]`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReserveSpec {
    /// The policy reserved from.
    pub policy: String,
    /// Where the maximum comes from.
    pub from: MaxCostFrom,
    /// The maximum of a request that names none (`None`: such a request is answered 400).
    pub default_max: Option<u64>,
    /// The field of the response's `usage` object that is the real cost (`total_tokens`).
    pub usage_field: String,
    /// When an unsettled reservation counts in full.
    pub ttl: Duration,
}

/// What the response body is, for reading its usage.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Json,
    EventStream,
    Other,
}

/// Reads the usage from a copy of a response body as it passes: pure, fed chunk by chunk.
#[derive(Debug)]
pub struct UsageScanner {
    kind: Kind,
    field: String,
    /// JSON: the body so far. Event stream: the current, unfinished line.
    buf: Vec<u8>,
    /// The JSON body was larger than [`MAX_JSON_COPY`], or a line longer than
    /// [`MAX_EVENT_LINE`] is being skipped.
    overflow: bool,
    /// Event stream: the usage of the last event that had one.
    last: Option<u64>,
}

impl UsageScanner {
    /// A scanner for a body of `content_type`, reading `usage.<field>`.
    pub fn new(content_type: &str, field: &str) -> Self {
        let ct = content_type.trim().to_ascii_lowercase();
        let kind = if ct.starts_with("text/event-stream") {
            Kind::EventStream
        } else if ct.starts_with("application/json") || ct.contains("+json") {
            Kind::Json
        } else {
            Kind::Other
        };
        UsageScanner {
            kind,
            field: field.to_string(),
            buf: Vec::new(),
            overflow: false,
            last: None,
        }
    }

    /// Reads one chunk of the body.
    pub fn feed(&mut self, chunk: &[u8]) {
        match self.kind {
            Kind::Other => {}
            Kind::Json => {
                if self.overflow || self.buf.len() + chunk.len() > MAX_JSON_COPY {
                    self.overflow = true;
                    self.buf = Vec::new();
                } else {
                    self.buf.extend_from_slice(chunk);
                }
            }
            Kind::EventStream => {
                let mut rest = chunk;
                while let Some(nl) = rest.iter().position(|&b| b == b'\n') {
                    if !self.overflow {
                        self.buf.extend_from_slice(&rest[..nl]);
                        let line = std::mem::take(&mut self.buf);
                        self.event_line(&line);
                    }
                    self.buf.clear();
                    self.overflow = false;
                    rest = &rest[nl + 1..];
                }
                if !self.overflow {
                    if self.buf.len() + rest.len() > MAX_EVENT_LINE {
                        self.overflow = true;
                        self.buf = Vec::new();
                    } else {
                        self.buf.extend_from_slice(rest);
                    }
                }
            }
        }
    }

    fn event_line(&mut self, line: &[u8]) {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        let Some(data) = line.strip_prefix(b"data:") else {
            return;
        };
        if let Some(cost) = usage_of(data, &self.field) {
            self.last = Some(cost);
        }
    }

    /// The real cost the body reported, once it ended; `None` when it reported none.
    pub fn finish(mut self) -> Option<u64> {
        match self.kind {
            Kind::Other => None,
            Kind::Json if self.overflow => None,
            Kind::Json => usage_of(&self.buf, &self.field),
            Kind::EventStream => {
                if !self.overflow && !self.buf.is_empty() {
                    let line = std::mem::take(&mut self.buf);
                    self.event_line(&line);
                }
                self.last
            }
        }
    }
}

/// `usage.<field>` of a JSON text, when it is a whole number.
fn usage_of(json: &[u8], field: &str) -> Option<u64> {
    let v: serde_json::Value = serde_json::from_slice(json.trim_ascii()).ok()?;
    v.get("usage")?.get(field)?.as_u64()
}

/// Settles `reservation` with `cost` in a task of its own (a body ends, or is dropped, where
/// nothing can be awaited).
fn settle_later(reservation: Reservation, cost: u64) {
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        // No runtime left (shutting down): unsettled, it counts in full at its ttl.
        return;
    };
    runtime.spawn(async move {
        let id = reservation.id().to_string();
        match reservation.settle(cost).await {
            Ok(s) if s.debt > 0 => tracing::info!(
                reservation = %id,
                policy = %s.policy,
                identity = %s.identity,
                max_cost = s.max_cost,
                cost = s.actual,
                debt = s.debt,
                "a request cost more than its declared maximum: the excess was charged as debt"
            ),
            Ok(_) => {}
            Err(e) => tracing::warn!(
                reservation = %id,
                error = %e,
                "a proxied reservation was not settled; it counts in full"
            ),
        }
    });
}

pin_project_lite::pin_project! {
    /// A response body passed through frame by frame while its usage is read; settles the
    /// reservation when it ends (with the usage) or is dropped before (in full).
    pub struct SettleBody {
        #[pin]
        inner: Body,
        scanner: Option<UsageScanner>,
        reservation: Option<Reservation>,
    }

    impl PinnedDrop for SettleBody {
        fn drop(this: Pin<&mut Self>) {
            let this = this.project();
            // The client went away (or the body failed) before the end: settled in full.
            if let Some(r) = this.reservation.take() {
                let max = r.max_cost();
                settle_later(r, max);
            }
        }
    }
}

impl SettleBody {
    /// Wraps `inner`, whose content type is `content_type`, to settle `reservation` with
    /// `usage.<field>`.
    pub fn new(inner: Body, content_type: &str, field: &str, reservation: Reservation) -> Self {
        SettleBody {
            inner,
            scanner: Some(UsageScanner::new(content_type, field)),
            reservation: Some(reservation),
        }
    }
}

impl HttpBody for SettleBody {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let mut this = self.project();
        let polled = this.inner.as_mut().poll_frame(cx);
        let ended = match &polled {
            Poll::Ready(Some(Ok(frame))) => {
                if let (Some(data), Some(scanner)) = (frame.data_ref(), this.scanner.as_mut()) {
                    scanner.feed(data);
                }
                // A body of known length ends with its last byte: the caller may never poll
                // for the end, so it is settled now.
                this.inner.is_end_stream()
            }
            Poll::Ready(None) => true,
            // A failed body: the drop settles it in full.
            Poll::Ready(Some(Err(_))) | Poll::Pending => false,
        };
        if ended && let Some(r) = this.reservation.take() {
            let cost = this
                .scanner
                .take()
                .and_then(UsageScanner::finish)
                .unwrap_or(r.max_cost());
            settle_later(r, cost);
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        // Ended only once settled, so the end is always seen by `poll_frame`.
        self.reservation.is_none() && self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

/// Reserves each request's maximum from one policy and settles it from the response (see
/// the module docs).
#[derive(Clone, Debug)]
pub struct ReserveLayer {
    inner: Arc<Shared>,
}

#[derive(Debug)]
struct Shared {
    limiter: Limiter,
    policy: Arc<Policy>,
    spec: ReserveSpec,
    identities: IdentityResolver,
    headers: HeaderOptions,
}

impl ReserveLayer {
    /// Reserves from `policy` as `spec` says, for the identity `identities` finds.
    pub fn new(
        limiter: Limiter,
        policy: Arc<Policy>,
        spec: ReserveSpec,
        identities: IdentityResolver,
        headers: HeaderOptions,
    ) -> Self {
        ReserveLayer {
            inner: Arc::new(Shared {
                limiter,
                policy,
                spec,
                identities,
                headers,
            }),
        }
    }
}

impl<S> Layer<S> for ReserveLayer {
    type Service = ReserveService<S>;
    fn layer(&self, inner: S) -> Self::Service {
        ReserveService {
            shared: Arc::clone(&self.inner),
            inner,
        }
    }
}

/// The service of [`ReserveLayer`].
#[derive(Clone, Debug)]
pub struct ReserveService<S> {
    shared: Arc<Shared>,
    inner: S,
}

fn problem(status: StatusCode, detail: &str) -> Response<Body> {
    crate::headers::problem(status, detail).map(Body::from)
}

/// The maximum a request declares, and the request to pass on (its body read whole when the
/// maximum is in it).
async fn max_cost_of(
    spec: &ReserveSpec,
    req: Request<Body>,
) -> Result<(Option<u64>, Request<Body>), Response<Body>> {
    let bad = |detail: String| problem(StatusCode::BAD_REQUEST, &detail);
    match &spec.from {
        MaxCostFrom::Header(name) => {
            let max = match req.headers().get(name) {
                None => None,
                Some(v) => Some(
                    v.to_str()
                        .ok()
                        .and_then(|s| s.trim().parse::<u64>().ok())
                        .ok_or_else(|| {
                            bad(format!("the {name} header must be a non-negative integer"))
                        })?,
                ),
            };
            Ok((max, req))
        }
        MaxCostFrom::JsonField(field) => {
            let (parts, body) = req.into_parts();
            let bytes = match http_body_util::Limited::new(body, MAX_REQUEST_BODY)
                .collect()
                .await
            {
                Ok(c) => c.to_bytes(),
                Err(e)
                    if e.downcast_ref::<http_body_util::LengthLimitError>()
                        .is_some() =>
                {
                    return Err(problem(
                        StatusCode::PAYLOAD_TOO_LARGE,
                        &format!(
                            "request body larger than {MAX_REQUEST_BODY} bytes, the most read for \"{field}\""
                        ),
                    ));
                }
                Err(e) => return Err(bad(format!("could not read the body: {e}"))),
            };
            let max = match serde_json::from_slice::<serde_json::Value>(&bytes) {
                Ok(v) => match v.get(field) {
                    None | Some(serde_json::Value::Null) => None,
                    Some(n) => Some(n.as_u64().ok_or_else(|| {
                        bad(format!("\"{field}\" must be a non-negative integer"))
                    })?),
                },
                Err(_) => None,
            };
            Ok((max, Request::from_parts(parts, Body::from(bytes))))
        }
    }
}

impl<S> Service<Request<Body>> for ReserveService<S>
where
    S: Service<Request<Body>, Response = Response<Body>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
{
    type Response = Response<Body>;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Response<Body>, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<Body>) -> Self::Future {
        let shared = Arc::clone(&self.shared);
        // The service that was polled ready serves this request; a fresh clone waits.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        Box::pin(async move {
            let spec = &shared.spec;
            let (max, req) = match max_cost_of(spec, req).await {
                Ok(x) => x,
                Err(res) => return Ok(res),
            };
            let Some(max) = max.or(spec.default_max) else {
                let from = match &spec.from {
                    MaxCostFrom::JsonField(f) => format!("the JSON field \"{f}\""),
                    MaxCostFrom::Header(h) => format!("the {h} header"),
                };
                return Ok(problem(
                    StatusCode::BAD_REQUEST,
                    &format!("this route reserves the request's maximum cost: give it in {from}"),
                ));
            };
            let (parts, body) = req.into_parts();
            let identity = shared.identities.resolve(&parts);
            let req = Request::from_parts(parts, body);
            let reserved = match shared
                .limiter
                .reserve(&identity, &shared.policy, max, spec.ttl)
                .await
            {
                Ok(r) => r,
                Err(e) => {
                    let status = crate::headers::store_error_status(&e);
                    return Ok(problem(status, &format!("could not reserve: {e}")));
                }
            };
            if !reserved.checked.allowed {
                return Ok(too_many_requests(&reserved.checked, &shared.headers).map(Body::from));
            }
            let res = inner.call(req).await?;
            let Some(reservation) = reserved.reservation else {
                // Admitted without consuming (failed open, allow-listed): nothing to settle.
                return Ok(res);
            };
            let failed = res.status().is_server_error()
                || res.extensions().get::<crate::UpstreamFailed>().is_some();
            if failed {
                let max = reservation.max_cost();
                settle_later(reservation, max);
                return Ok(res);
            }
            let content_type = res
                .headers()
                .get(http::header::CONTENT_TYPE)
                .and_then(|v| v.to_str().ok())
                .unwrap_or("")
                .to_string();
            Ok(res.map(|body| {
                Body::new(SettleBody::new(
                    body,
                    &content_type,
                    &spec.usage_field,
                    reservation,
                ))
            }))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_usage_of_a_json_answer_is_read_across_chunks() {
        let mut s = UsageScanner::new("application/json; charset=utf-8", "total_tokens");
        let body =
            br#"{"id":"x","usage":{"prompt_tokens":5,"completion_tokens":7,"total_tokens":12}}"#;
        for chunk in body.chunks(7) {
            s.feed(chunk);
        }
        assert_eq!(s.finish(), Some(12));
    }

    #[test]
    fn the_last_event_with_usage_counts_in_a_stream() {
        let mut s = UsageScanner::new("text/event-stream", "completion_tokens");
        let stream = "data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}]}\n\n\
                      data: {\"usage\":{\"completion_tokens\":3}}\r\n\r\n\
                      data: {\"choices\":[],\"usage\":{\"completion_tokens\":42}}\n\n\
                      data: [DONE]\n\n";
        for chunk in stream.as_bytes().chunks(5) {
            s.feed(chunk);
        }
        assert_eq!(s.finish(), Some(42));
    }

    #[test]
    fn no_usage_is_none() {
        let mut s = UsageScanner::new("text/plain", "total_tokens");
        s.feed(br#"{"usage":{"total_tokens":1}}"#);
        assert_eq!(s.finish(), None);
        let mut s = UsageScanner::new("application/json", "total_tokens");
        s.feed(b"{\"usage\":");
        assert_eq!(s.finish(), None);
        let mut s = UsageScanner::new("text/event-stream", "total_tokens");
        s.feed(&vec![b'x'; MAX_EVENT_LINE + 10]);
        s.feed(b"\ndata: {\"usage\":{\"total_tokens\":9}}");
        assert_eq!(s.finish(), Some(9));
    }
}
