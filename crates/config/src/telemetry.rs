//! `[telemetry]`: OpenTelemetry trace export (OTLP over gRPC) of rate limit decisions.
//!
//! Off unless `enabled = true`, because exporting sends data to another process: an operator
//! opts in, and the default endpoint is the loopback collector (`http://127.0.0.1:4317`), so
//! turning it on never ships spans off the machine by accident. The section is checked like
//! every other one: a bad endpoint, ratio or size names its line.

use std::time::Duration;

use serde::Deserialize;
use toml::Spanned;

use super::error::Checker;
use super::raw::RawDuration;

/// The collector a bare `enabled = true` exports to: a local OpenTelemetry Collector.
pub const DEFAULT_TELEMETRY_ENDPOINT: &str = "http://127.0.0.1:4317";

/// `[telemetry]` as written.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawTelemetry {
    #[serde(default)]
    pub enabled: bool,
    pub endpoint: Option<Spanned<String>>,
    pub service_name: Option<Spanned<String>>,
    pub sample_ratio: Option<Spanned<f64>>,
    pub export_timeout: Option<Spanned<RawDuration>>,
    pub flush_interval: Option<Spanned<RawDuration>>,
    pub queue_size: Option<Spanned<u64>>,
}

/// Trace export settings (`[telemetry]`).
#[derive(Debug, Clone, PartialEq)]
pub struct TelemetryConfig {
    /// Export spans at all (default off).
    pub enabled: bool,
    /// The OTLP/gRPC collector, `http://HOST:PORT`.
    pub endpoint: String,
    /// `service.name` of the exported resource.
    pub service_name: String,
    /// Share of new traces recorded (`0..=1`); a request carrying a `traceparent` follows its
    /// caller's sampled flag instead.
    pub sample_ratio: f64,
    /// Longest wait for one export call (connection included).
    pub export_timeout: Duration,
    /// Longest a finished span waits in the queue before its batch is sent.
    pub flush_interval: Duration,
    /// Most finished spans waiting for export; past it new spans are dropped and counted.
    pub queue_size: usize,
}

impl Default for TelemetryConfig {
    fn default() -> Self {
        Self {
            enabled: false,
            endpoint: DEFAULT_TELEMETRY_ENDPOINT.to_string(),
            service_name: "sluice".to_string(),
            sample_ratio: 1.0,
            export_timeout: Duration::from_secs(5),
            flush_interval: Duration::from_secs(1),
            queue_size: 2048,
        }
    }
}

/// Checks `[telemetry]`.
pub(super) fn check_telemetry(ck: &mut Checker<'_>, t: &RawTelemetry) -> TelemetryConfig {
    let d = TelemetryConfig::default();
    let endpoint = match &t.endpoint {
        None => d.endpoint.clone(),
        Some(e) => match endpoint(e.get_ref()) {
            Ok(()) => e.get_ref().trim_end_matches('/').to_string(),
            Err(msg) => {
                ck.at(e.span(), "telemetry.endpoint", msg);
                d.endpoint.clone()
            }
        },
    };
    let service_name = match &t.service_name {
        None => d.service_name.clone(),
        Some(s) if s.get_ref().trim().is_empty() || s.get_ref().len() > 255 => {
            ck.at(
                s.span(),
                "telemetry.service_name",
                "must be 1 to 255 characters",
            );
            d.service_name.clone()
        }
        Some(s) => s.get_ref().clone(),
    };
    let sample_ratio = match &t.sample_ratio {
        None => d.sample_ratio,
        Some(r) if !(0.0..=1.0).contains(r.get_ref()) => {
            ck.at(
                r.span(),
                "telemetry.sample_ratio",
                "must be between 0 and 1 (the share of new traces recorded)",
            );
            d.sample_ratio
        }
        Some(r) => *r.get_ref(),
    };
    let export_timeout = ck.positive_duration(
        &t.export_timeout,
        "telemetry.export_timeout",
        d.export_timeout,
    );
    let flush_interval = ck.positive_duration(
        &t.flush_interval,
        "telemetry.flush_interval",
        d.flush_interval,
    );
    let queue_size = ck.bounded(
        &t.queue_size,
        "telemetry.queue_size",
        d.queue_size as u64,
        1_000_000,
    ) as usize;
    TelemetryConfig {
        enabled: t.enabled,
        endpoint,
        service_name,
        sample_ratio,
        export_timeout,
        flush_interval,
        queue_size,
    }
}

/// `http://HOST:PORT` (no path): the exporter speaks plain-text gRPC to a collector, usually
/// one on the same host or pod.
fn endpoint(s: &str) -> Result<(), String> {
    let bad = |why: &str| {
        format!(
            "invalid endpoint {s:?}: {why}; expected http://HOST:PORT such as {DEFAULT_TELEMETRY_ENDPOINT}"
        )
    };
    let uri: http::Uri = s.parse().map_err(|_| bad("not a URL"))?;
    match uri.scheme_str() {
        Some("http") => {}
        Some("https") => {
            return Err(bad(
                "TLS is not supported: export to a collector on loopback or a private network",
            ));
        }
        _ => return Err(bad("the scheme must be http")),
    }
    let Some(authority) = uri.authority() else {
        return Err(bad("no host"));
    };
    if authority.port_u16().is_none() {
        return Err(bad("no port (OTLP/gRPC listens on 4317)"));
    }
    if !matches!(uri.path(), "" | "/") || uri.query().is_some() {
        return Err(bad("a gRPC endpoint has no path"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints() {
        assert!(endpoint("http://127.0.0.1:4317").is_ok());
        assert!(endpoint("http://collector.monitoring:4317/").is_ok());
        assert!(
            endpoint("https://127.0.0.1:4317")
                .unwrap_err()
                .contains("TLS")
        );
        assert!(endpoint("127.0.0.1:4317").is_err());
        assert!(endpoint("http://127.0.0.1").unwrap_err().contains("port"));
        assert!(endpoint("http://127.0.0.1:4317/v1/traces").is_err());
    }

    #[test]
    fn off_by_default_with_a_loopback_endpoint() {
        let c = crate::Config::parse("", "sluice.toml", None).unwrap();
        assert_eq!(c.telemetry, TelemetryConfig::default());
        assert!(!c.telemetry.enabled);
        assert_eq!(c.telemetry.endpoint, "http://127.0.0.1:4317");
    }

    #[test]
    fn a_full_section_is_read() {
        let src = "[telemetry]\nenabled = true\nendpoint = \"http://otel:4317/\"\n\
                   service_name = \"edge\"\nsample_ratio = 0.25\nexport_timeout = \"2s\"\n\
                   flush_interval = \"100ms\"\nqueue_size = 64\n";
        let t = crate::Config::parse(src, "sluice.toml", None)
            .unwrap()
            .telemetry;
        assert_eq!(
            t,
            TelemetryConfig {
                enabled: true,
                endpoint: "http://otel:4317".into(),
                service_name: "edge".into(),
                sample_ratio: 0.25,
                export_timeout: Duration::from_secs(2),
                flush_interval: Duration::from_millis(100),
                queue_size: 64,
            }
        );
    }

    #[test]
    fn errors_name_the_line_and_field() {
        let src = "[telemetry]\nenabled = true\nendpoint = \"https://otel:4317\"\n\
                   sample_ratio = 1.5\nqueue_size = 0\nexport_timeout = \"0s\"\n\
                   service_name = \"\"\n";
        let e = crate::Config::parse(src, "sluice.toml", None).unwrap_err();
        let got: Vec<_> = e.0.iter().map(|e| (e.line, e.field.as_str())).collect();
        assert_eq!(
            got,
            [
                (Some(3), "telemetry.endpoint"),
                (Some(4), "telemetry.sample_ratio"),
                (Some(5), "telemetry.queue_size"),
                (Some(6), "telemetry.export_timeout"),
                (Some(7), "telemetry.service_name"),
            ]
        );
        let unknown = crate::Config::parse("[telemetry]\nenable = true\n", "sluice.toml", None)
            .unwrap_err()
            .to_string();
        assert!(unknown.contains("sluice.toml:2"), "{unknown}");
        assert!(unknown.contains("enable"), "{unknown}");
    }
}
