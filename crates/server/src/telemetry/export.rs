//! The OTLP/gRPC exporter: finished spans wait in a bounded queue and a background task sends
//! them in batches to `/opentelemetry.proto.collector.trace.v1.TraceService/Export`.
//!
//! A decision never waits for telemetry. Queuing a span is a `try_send`: when the queue is full
//! (a slow or dead collector) the span is dropped and counted, nothing blocks. Each export call
//! is bounded by `telemetry.export_timeout`; a failed batch is dropped and counted rather than
//! retried, so a collector that is down costs a connection attempt per batch and nothing else.
//! Failures are logged at most once per [`WARN_EVERY`], with the count since the last line.

use std::time::{Duration, Instant};

use http::uri::PathAndQuery;
use sluice_config::TelemetryConfig;
use tokio::sync::mpsc;
use tonic::transport::{Channel, Endpoint};

use super::proto::{
    ExportTraceServiceRequest, ExportTraceServiceResponse, InstrumentationScope, KeyValue,
    Resource, ResourceSpans, ScopeSpans, Span,
};

/// Most spans in one export call.
const MAX_BATCH: usize = 512;
/// Least time between two log lines about failed exports.
const WARN_EVERY: Duration = Duration::from_secs(30);
const EXPORT_PATH: &str = "/opentelemetry.proto.collector.trace.v1.TraceService/Export";

/// The sending end of one exporter; dropping it lets the task send what is queued and stop.
#[derive(Debug)]
pub(crate) struct Exporter {
    tx: mpsc::Sender<Span>,
    /// The settings it was started with (a reload that changes them starts a new exporter).
    pub(crate) config: TelemetryConfig,
    /// The export task, awaited on shutdown so the spans still queued are sent.
    task: parking_lot::Mutex<Option<tokio::task::JoinHandle<()>>>,
}

impl Exporter {
    /// Starts the export task on the current tokio runtime; `None` outside one.
    pub(crate) fn start(config: &TelemetryConfig) -> Option<Self> {
        let runtime = tokio::runtime::Handle::try_current().ok()?;
        let endpoint = Endpoint::from_shared(config.endpoint.clone())
            .ok()?
            .connect_timeout(config.export_timeout)
            .timeout(config.export_timeout);
        let (tx, rx) = mpsc::channel(config.queue_size);
        let task = ExportTask {
            rx,
            channel: endpoint.connect_lazy(),
            resource: resource(&config.service_name),
            flush_interval: config.flush_interval,
            export_timeout: config.export_timeout,
            failures_unlogged: 0,
            last_warn: None,
        };
        let task = runtime.spawn(task.run());
        Some(Self {
            tx,
            config: config.clone(),
            task: parking_lot::Mutex::new(Some(task)),
        })
    }

    /// The export task, to await once this exporter is dropped (it then sends what is
    /// queued and ends).
    pub(crate) fn take_task(&self) -> Option<tokio::task::JoinHandle<()>> {
        self.task.lock().take()
    }

    /// Queues a finished span; drops it (counted) when the queue is full.
    pub(crate) fn submit(&self, span: Span) {
        if self.tx.try_send(span).is_err() {
            metrics::counter!("sluice_telemetry_spans_dropped_total", "reason" => "queue_full")
                .increment(1);
        }
    }
}

fn resource(service_name: &str) -> Resource {
    Resource {
        attributes: vec![
            KeyValue::string("service.name", service_name),
            KeyValue::string("service.version", env!("CARGO_PKG_VERSION")),
            KeyValue::string("telemetry.sdk.name", "sluice"),
            KeyValue::string("telemetry.sdk.language", "rust"),
        ],
    }
}

struct ExportTask {
    rx: mpsc::Receiver<Span>,
    channel: Channel,
    resource: Resource,
    flush_interval: Duration,
    export_timeout: Duration,
    failures_unlogged: u64,
    last_warn: Option<Instant>,
}

impl ExportTask {
    async fn run(mut self) {
        let mut batch = Vec::with_capacity(MAX_BATCH);
        loop {
            // Wait for a first span, then gather for at most the flush interval.
            let Some(first) = self.rx.recv().await else {
                return;
            };
            batch.push(first);
            let deadline = tokio::time::Instant::now() + self.flush_interval;
            let mut closed = false;
            while batch.len() < MAX_BATCH {
                match tokio::time::timeout_at(deadline, self.rx.recv()).await {
                    Ok(Some(span)) => batch.push(span),
                    Ok(None) => {
                        closed = true;
                        break;
                    }
                    Err(_) => break,
                }
            }
            let spans = std::mem::replace(&mut batch, Vec::with_capacity(MAX_BATCH));
            self.send(spans).await;
            if closed {
                return;
            }
        }
    }

    async fn send(&mut self, spans: Vec<Span>) {
        let n = spans.len() as u64;
        let request = ExportTraceServiceRequest {
            resource_spans: vec![ResourceSpans {
                resource: Some(self.resource.clone()),
                scope_spans: vec![ScopeSpans {
                    scope: Some(InstrumentationScope {
                        name: "sluice".into(),
                        version: env!("CARGO_PKG_VERSION").into(),
                    }),
                    spans,
                }],
            }],
        };
        let call = export(self.channel.clone(), request);
        let result = match tokio::time::timeout(self.export_timeout, call).await {
            Ok(r) => r,
            Err(_) => Err(format!(
                "no answer within {} ms",
                self.export_timeout.as_millis()
            )),
        };
        match result {
            Ok(rejected) => {
                let rejected = rejected.min(n);
                metrics::counter!("sluice_telemetry_spans_exported_total").increment(n - rejected);
                if rejected > 0 {
                    metrics::counter!("sluice_telemetry_spans_dropped_total", "reason" => "rejected")
                        .increment(rejected);
                }
            }
            Err(error) => {
                metrics::counter!("sluice_telemetry_export_failures_total").increment(1);
                metrics::counter!("sluice_telemetry_spans_dropped_total", "reason" => "export_failed")
                    .increment(n);
                self.failures_unlogged += 1;
                if self.last_warn.is_none_or(|t| t.elapsed() >= WARN_EVERY) {
                    tracing::warn!(
                        %error,
                        failed_exports = self.failures_unlogged,
                        "OTLP trace export failed; spans are dropped until the collector answers"
                    );
                    self.last_warn = Some(Instant::now());
                    self.failures_unlogged = 0;
                }
            }
        }
    }
}

/// One `TraceService/Export` call; the number of spans the collector says it rejected.
async fn export(channel: Channel, request: ExportTraceServiceRequest) -> Result<u64, String> {
    let mut grpc = tonic::client::Grpc::new(channel);
    grpc.ready()
        .await
        .map_err(|e| format!("collector not reachable: {e}"))?;
    let codec =
        tonic_prost::ProstCodec::<ExportTraceServiceRequest, ExportTraceServiceResponse>::default();
    let response = grpc
        .unary(
            tonic::Request::new(request),
            PathAndQuery::from_static(EXPORT_PATH),
            codec,
        )
        .await
        .map_err(|s| format!("{:?}: {}", s.code(), s.message()))?;
    Ok(response
        .into_inner()
        .partial_success
        .map_or(0, |p| p.rejected_spans.max(0) as u64))
}

/// Names the metrics the exporter records.
pub(crate) fn describe() {
    metrics::describe_counter!(
        "sluice_telemetry_spans_exported_total",
        "Trace spans the OTLP collector accepted"
    );
    metrics::describe_counter!(
        "sluice_telemetry_spans_dropped_total",
        "Trace spans not exported, by reason (queue_full, export_failed, rejected)"
    );
    metrics::describe_counter!(
        "sluice_telemetry_export_failures_total",
        "OTLP export calls that failed (collector unreachable, timed out or refusing)"
    );
}
