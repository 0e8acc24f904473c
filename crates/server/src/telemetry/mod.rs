//! OpenTelemetry traces of rate limit decisions, exported over OTLP/gRPC (`[telemetry]`).
//!
//! Each request sluice decides (a `/v1/check` call, an Envoy `ShouldRateLimit` call, a proxied
//! request) becomes one server span, a child of the caller's W3C `traceparent` when it sent
//! one. The proxy passes its own span on to the upstream as the new `traceparent`, so the
//! application's spans hang under sluice's. A span says which policies were checked, the
//! verdict, the algorithm, whether the policy is decided exactly or from a leased slice, and
//! how long the store calls took. It never carries an identity: not the raw credential, not
//! its hashed key, not the request path or query (where tokens hide).
//!
//! What a span holds is collected where every check meets, the limiter's observer
//! ([`Recording`] wraps the statistics observer): during a traced request a task-local record
//! is in scope, and the observer, called inline by the limiter on the same task, adds each
//! decision and store call to it. The handlers only open and close the span.
//!
//! Off by default; off, a request pays one read of an `Option`. On, a decision pays for a
//! random id, a short lock per decision and a `try_send`: export happens in the background
//! ([`export`]) and a slow or dead collector never slows or changes a decision.
//!
//! # Layout
//! - [`traceparent`]: W3C Trace Context parsing and the sampling decision (pure).
//! - `proto`: the OTLP messages sent (prost structs of `opentelemetry-proto`'s fields).
//! - `export`: the bounded queue and the background exporter.

mod export;
mod proto;
pub mod traceparent;

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use http::{HeaderMap, HeaderValue};
use parking_lot::{Mutex, RwLock};
use sluice::{DecisionEvent, DecisionObserver, Outcome, StoreError};
use sluice_config::TelemetryConfig;

use export::Exporter;
use proto::KeyValue;
pub use traceparent::TraceParent;

/// The header of W3C Trace Context.
pub const TRACEPARENT: &str = "traceparent";

/// Where a request came in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Entry {
    /// `POST /v1/check`.
    Api,
    /// Envoy's `ShouldRateLimit`.
    Rls,
    /// The reverse proxy.
    Proxy,
}

impl Entry {
    fn span_name(self) -> &'static str {
        match self {
            Entry::Api => "sluice.check",
            Entry::Rls => "sluice.rls",
            Entry::Proxy => "sluice.proxy",
        }
    }

    fn name(self) -> &'static str {
        match self {
            Entry::Api => "api",
            Entry::Rls => "rls",
            Entry::Proxy => "proxy",
        }
    }
}

/// The tracing of one running server: the exporter of the current `[telemetry]` settings,
/// replaced when a reload changes them.
#[derive(Debug, Default)]
pub struct Telemetry {
    exporter: RwLock<Option<Arc<Exporter>>>,
}

impl Telemetry {
    /// Tracing as `config` says (nothing runs when it is off).
    pub fn new(config: &TelemetryConfig) -> Self {
        let t = Self::default();
        t.configure(config);
        t
    }

    /// Applies the settings of a new configuration. An exporter with the same settings is
    /// kept; a replaced one sends what it has queued and stops.
    pub fn configure(&self, config: &TelemetryConfig) {
        let mut current = self.exporter.write();
        if !config.enabled {
            *current = None;
            return;
        }
        if current.as_ref().is_some_and(|e| &e.config == config) {
            return;
        }
        export::describe();
        *current = Exporter::start(config).map(Arc::new);
        match current.as_ref() {
            Some(_) => {
                tracing::info!(endpoint = %config.endpoint, "exporting decision traces over OTLP")
            }
            None => tracing::warn!(
                "telemetry is enabled but no tokio runtime runs the exporter; no traces are exported"
            ),
        }
    }

    /// Stops exporting: the spans still queued are sent, waiting at most `grace` (the
    /// server's shutdown grace) for the collector.
    pub async fn shutdown(&self, grace: Duration) {
        let Some(exporter) = self.exporter.write().take() else {
            return;
        };
        let task = exporter.take_task();
        // The last sender goes with the exporter: the task sends its batch and ends.
        drop(exporter);
        if let Some(task) = task
            && tokio::time::timeout(grace, task).await.is_err()
        {
            tracing::warn!("trace spans still queued after {grace:?}; not sent");
        }
    }

    /// Opens the span of one request. `parent` is the caller's `traceparent` header value.
    pub fn start(&self, entry: Entry, parent: Option<&str>) -> Traced {
        let Some(exporter) = self.exporter.read().clone() else {
            return Traced { inner: None };
        };
        let parent = parent.and_then(TraceParent::parse);
        let (trace_id, sampled) = match parent {
            Some(p) => (p.trace_id, p.sampled()),
            None => {
                let id = traceparent::nonzero_u128();
                (
                    id,
                    traceparent::sample_new_trace(id, exporter.config.sample_ratio),
                )
            }
        };
        Traced {
            inner: Some(Box::new(Open {
                exporter,
                entry,
                parent,
                context: TraceParent {
                    trace_id,
                    span_id: traceparent::nonzero_u64(),
                    flags: if sampled {
                        traceparent::FLAG_SAMPLED
                    } else {
                        0
                    },
                },
                start_wall: SystemTime::now(),
                start: Instant::now(),
            })),
        }
    }

    /// [`Telemetry::start`] with the `traceparent` of HTTP request headers.
    pub fn start_http(&self, entry: Entry, headers: &HeaderMap) -> Traced {
        self.start(entry, header_str(headers))
    }
}

fn header_str(headers: &HeaderMap) -> Option<&str> {
    headers.get(TRACEPARENT).and_then(|v| v.to_str().ok())
}

/// The span of one request, open until [`Traced::run`] finishes. Without telemetry it is
/// empty and costs nothing.
#[derive(Debug)]
pub struct Traced {
    inner: Option<Box<Open>>,
}

#[derive(Debug)]
struct Open {
    exporter: Arc<Exporter>,
    entry: Entry,
    parent: Option<TraceParent>,
    /// sluice's span: the caller's trace, a new span id, the sampling decision.
    context: TraceParent,
    start_wall: SystemTime,
    start: Instant,
}

impl Traced {
    /// The `traceparent` to send downstream (sluice's span as the parent), when tracing is on.
    pub fn traceparent(&self) -> Option<HeaderValue> {
        let open = self.inner.as_ref()?;
        HeaderValue::from_str(&open.context.header()).ok()
    }

    /// Replaces the `traceparent` of `headers` with sluice's span, when tracing is on (off,
    /// the caller's header passes unchanged).
    pub fn propagate(&self, headers: &mut HeaderMap) {
        if let Some(v) = self.traceparent() {
            headers.insert(TRACEPARENT, v);
        }
    }

    /// Runs the request's handling with the span open, then queues the span. `status` reads
    /// the answer's status code for the span (HTTP or gRPC, as `entry` says).
    pub async fn run<F: Future>(
        self,
        handling: F,
        status: impl FnOnce(&F::Output) -> Option<i64>,
    ) -> F::Output {
        let Some(open) = self.inner.filter(|o| o.context.sampled()) else {
            return handling.await;
        };
        let record = Arc::new(Mutex::new(Record::default()));
        let out = RECORD.scope(Arc::clone(&record), handling).await;
        let code = status(&out);
        let record = std::mem::take(&mut *record.lock());
        let exporter = Arc::clone(&open.exporter);
        exporter.submit(open.finish(record, code));
        out
    }
}

impl Open {
    fn finish(self, record: Record, status: Option<i64>) -> proto::Span {
        let start_ns = unix_nanos(self.start_wall);
        let end_ns = start_ns + self.start.elapsed().as_nanos() as u64;
        let mut attributes = vec![KeyValue::string("sluice.entry", self.entry.name())];
        attributes.extend(record.attributes());
        let mut error = None;
        match (self.entry, status) {
            (Entry::Rls, Some(code)) => {
                attributes.push(KeyValue::int("rpc.grpc.status_code", code));
                if code != 0 {
                    error = Some(format!("gRPC status {code}"));
                }
            }
            (_, Some(code)) => {
                attributes.push(KeyValue::int("http.response.status_code", code));
                if code >= 500 {
                    error = Some(format!("HTTP status {code}"));
                }
            }
            (_, None) => {}
        }
        if self.entry == Entry::Rls {
            attributes.push(KeyValue::string("rpc.system", "grpc"));
            attributes.push(KeyValue::string(
                "rpc.service",
                "envoy.service.ratelimit.v3.RateLimitService",
            ));
            attributes.push(KeyValue::string("rpc.method", "ShouldRateLimit"));
        }
        let remote = if self.parent.is_some() {
            proto::FLAGS_IS_REMOTE
        } else {
            0
        };
        proto::Span {
            trace_id: self.context.trace_id.to_be_bytes().to_vec(),
            span_id: self.context.span_id.to_be_bytes().to_vec(),
            trace_state: String::new(),
            parent_span_id: self
                .parent
                .map_or_else(Vec::new, |p| p.span_id.to_be_bytes().to_vec()),
            name: self.entry.span_name().to_string(),
            kind: proto::SPAN_KIND_SERVER,
            start_time_unix_nano: start_ns,
            end_time_unix_nano: end_ns.max(start_ns),
            attributes,
            status: error.map(|message| proto::Status {
                message,
                code: proto::STATUS_ERROR,
            }),
            flags: u32::from(self.context.flags) | proto::FLAGS_HAS_IS_REMOTE | remote,
        }
    }
}

fn unix_nanos(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

tokio::task_local! {
    /// The record of the traced request running on this task, if any.
    static RECORD: Arc<Mutex<Record>>;
}

/// What the limiter did for one traced request.
#[derive(Debug, Default)]
struct Record {
    /// `(policy, outcome, algorithm, leased)` per policy checked, in order.
    policies: Vec<(String, Outcome, &'static str, bool)>,
    /// Whether every check let the request through.
    allowed: Option<bool>,
    decide_time: Duration,
    store_calls: u32,
    store_errors: u32,
    store_time: Duration,
}

impl Record {
    fn decision(&mut self, event: &DecisionEvent<'_>) {
        for limit in &event.checked.limits {
            let p = &limit.policy;
            self.policies.push((
                p.name.clone(),
                event.outcome(limit),
                p.algorithm.kind(),
                !p.mode.is_exact(),
            ));
        }
        self.allowed = Some(self.allowed.unwrap_or(true) && event.checked.allowed);
        self.decide_time += event.elapsed;
    }

    /// The span attributes: policy names, one verdict, algorithms and modes (each distinct
    /// value once, comma-separated, in the order checked), store figures.
    fn attributes(&self) -> Vec<KeyValue> {
        if self.policies.is_empty() {
            return Vec::new();
        }
        let distinct = |values: Vec<&str>| {
            let mut seen: Vec<&str> = Vec::new();
            for v in values {
                if !seen.contains(&v) {
                    seen.push(v);
                }
            }
            seen.join(",")
        };
        let policies = distinct(self.policies.iter().map(|p| p.0.as_str()).collect());
        let algorithms = distinct(self.policies.iter().map(|p| p.2).collect());
        let modes = distinct(
            self.policies
                .iter()
                .map(|p| if p.3 { "leased" } else { "exact" })
                .collect(),
        );
        let mut out = vec![
            KeyValue::string("sluice.policy", policies),
            KeyValue::string("sluice.verdict", self.verdict().name()),
            KeyValue::string("sluice.algorithm", algorithms),
            KeyValue::string("sluice.mode", modes),
            KeyValue::int(
                "sluice.decision.duration_us",
                self.decide_time.as_micros() as i64,
            ),
            KeyValue::int("sluice.store.calls", i64::from(self.store_calls)),
            KeyValue::int(
                "sluice.store.latency_us",
                self.store_time.as_micros() as i64,
            ),
        ];
        if let Some(allowed) = self.allowed {
            out.push(KeyValue::bool("sluice.allowed", allowed));
        }
        if self.store_errors > 0 {
            out.push(KeyValue::int(
                "sluice.store.errors",
                i64::from(self.store_errors),
            ));
        }
        out
    }

    /// The request's verdict: the most severe outcome among its policies.
    fn verdict(&self) -> Outcome {
        let severity = |o: Outcome| match o {
            Outcome::Allowed => 0,
            Outcome::ShadowDenied => 1,
            Outcome::FailedOpen => 2,
            Outcome::Denied => 3,
            Outcome::FailedClosed => 4,
        };
        self.policies
            .iter()
            .map(|p| p.1)
            .max_by_key(|&o| severity(o))
            .unwrap_or(Outcome::Allowed)
    }
}

/// The limiter's observer in `sluice serve`: the statistics observer, plus the record of the
/// traced request on the calling task (when there is one).
#[derive(Debug)]
pub struct Recording(pub Arc<dyn DecisionObserver>);

impl DecisionObserver for Recording {
    fn decision(&self, event: &DecisionEvent<'_>) {
        self.0.decision(event);
        let _ = RECORD.try_with(|r| r.lock().decision(event));
    }

    fn store_call(&self, policies: &[&str], elapsed: Duration, error: Option<&StoreError>) {
        self.0.store_call(policies, elapsed, error);
        let _ = RECORD.try_with(|r| {
            let mut r = r.lock();
            r.store_calls += 1;
            r.store_time += elapsed;
            if error.is_some() {
                r.store_errors += 1;
            }
        });
    }
}
