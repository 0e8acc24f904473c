//! The part of `opentelemetry-proto` the exporter sends: `ExportTraceServiceRequest` down to
//! `Span` and attribute values, as prost messages with the public proto's field numbers
//! (`opentelemetry/proto/{collector/trace,trace,common,resource}/v1/*.proto`). Fields sluice
//! never fills (events, links, dropped counts, schema URLs) are left out; a receiver reads
//! their absence as the proto default.

/// `opentelemetry.proto.collector.trace.v1.ExportTraceServiceRequest`.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct ExportTraceServiceRequest {
    #[prost(message, repeated, tag = "1")]
    pub(crate) resource_spans: Vec<ResourceSpans>,
}

/// `opentelemetry.proto.collector.trace.v1.ExportTraceServiceResponse`.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct ExportTraceServiceResponse {
    #[prost(message, optional, tag = "1")]
    pub(crate) partial_success: Option<ExportTracePartialSuccess>,
}

/// `opentelemetry.proto.collector.trace.v1.ExportTracePartialSuccess`.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct ExportTracePartialSuccess {
    #[prost(int64, tag = "1")]
    pub(crate) rejected_spans: i64,
    #[prost(string, tag = "2")]
    pub(crate) error_message: String,
}

/// `opentelemetry.proto.trace.v1.ResourceSpans`.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct ResourceSpans {
    #[prost(message, optional, tag = "1")]
    pub(crate) resource: Option<Resource>,
    #[prost(message, repeated, tag = "2")]
    pub(crate) scope_spans: Vec<ScopeSpans>,
}

/// `opentelemetry.proto.resource.v1.Resource`.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct Resource {
    #[prost(message, repeated, tag = "1")]
    pub(crate) attributes: Vec<KeyValue>,
}

/// `opentelemetry.proto.trace.v1.ScopeSpans`.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct ScopeSpans {
    #[prost(message, optional, tag = "1")]
    pub(crate) scope: Option<InstrumentationScope>,
    #[prost(message, repeated, tag = "2")]
    pub(crate) spans: Vec<Span>,
}

/// `opentelemetry.proto.common.v1.InstrumentationScope`.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct InstrumentationScope {
    #[prost(string, tag = "1")]
    pub(crate) name: String,
    #[prost(string, tag = "2")]
    pub(crate) version: String,
}

/// `opentelemetry.proto.trace.v1.Span`.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct Span {
    #[prost(bytes = "vec", tag = "1")]
    pub(crate) trace_id: Vec<u8>,
    #[prost(bytes = "vec", tag = "2")]
    pub(crate) span_id: Vec<u8>,
    #[prost(string, tag = "3")]
    pub(crate) trace_state: String,
    /// Empty for a root span.
    #[prost(bytes = "vec", tag = "4")]
    pub(crate) parent_span_id: Vec<u8>,
    #[prost(string, tag = "5")]
    pub(crate) name: String,
    /// `Span.SpanKind` (an enum on the wire, a varint like this).
    #[prost(int32, tag = "6")]
    pub(crate) kind: i32,
    #[prost(fixed64, tag = "7")]
    pub(crate) start_time_unix_nano: u64,
    #[prost(fixed64, tag = "8")]
    pub(crate) end_time_unix_nano: u64,
    #[prost(message, repeated, tag = "9")]
    pub(crate) attributes: Vec<KeyValue>,
    #[prost(message, optional, tag = "15")]
    pub(crate) status: Option<Status>,
    /// W3C trace flags in bits 0-7; bits 8-9 say whether the parent is remote.
    #[prost(fixed32, tag = "16")]
    pub(crate) flags: u32,
}

/// `SPAN_KIND_SERVER`: sluice answering a request.
pub(crate) const SPAN_KIND_SERVER: i32 = 2;
/// `SPAN_FLAGS_CONTEXT_HAS_IS_REMOTE_MASK`.
pub(crate) const FLAGS_HAS_IS_REMOTE: u32 = 0x100;
/// `SPAN_FLAGS_CONTEXT_IS_REMOTE_MASK`.
pub(crate) const FLAGS_IS_REMOTE: u32 = 0x200;

/// `opentelemetry.proto.trace.v1.Status`.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct Status {
    #[prost(string, tag = "2")]
    pub(crate) message: String,
    /// `STATUS_CODE_UNSET` 0, `_OK` 1, `_ERROR` 2.
    #[prost(int32, tag = "3")]
    pub(crate) code: i32,
}

/// `STATUS_CODE_ERROR`.
pub(crate) const STATUS_ERROR: i32 = 2;

/// `opentelemetry.proto.common.v1.KeyValue`.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct KeyValue {
    #[prost(string, tag = "1")]
    pub(crate) key: String,
    #[prost(message, optional, tag = "2")]
    pub(crate) value: Option<AnyValue>,
}

/// `opentelemetry.proto.common.v1.AnyValue` (the scalar cases).
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct AnyValue {
    #[prost(oneof = "Value", tags = "1, 2, 3")]
    pub(crate) value: Option<Value>,
}

/// The `value` oneof of [`AnyValue`].
#[derive(Clone, PartialEq, prost::Oneof)]
pub(crate) enum Value {
    #[prost(string, tag = "1")]
    StringValue(String),
    #[prost(bool, tag = "2")]
    BoolValue(bool),
    #[prost(int64, tag = "3")]
    IntValue(i64),
}

impl KeyValue {
    /// A string attribute.
    pub(crate) fn string(key: &str, value: impl Into<String>) -> Self {
        Self::of(key, Value::StringValue(value.into()))
    }

    /// An integer attribute.
    pub(crate) fn int(key: &str, value: i64) -> Self {
        Self::of(key, Value::IntValue(value))
    }

    /// A boolean attribute.
    pub(crate) fn bool(key: &str, value: bool) -> Self {
        Self::of(key, Value::BoolValue(value))
    }

    fn of(key: &str, value: Value) -> Self {
        Self {
            key: key.to_string(),
            value: Some(AnyValue { value: Some(value) }),
        }
    }
}
