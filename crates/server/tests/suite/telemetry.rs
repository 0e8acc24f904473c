//! OpenTelemetry trace export against a real OTLP/gRPC receiver: the `opentelemetry-proto`
//! service definitions served by `grpcio` (tests/suite/support/telemetry_receiver.py, in the virtualenv of
//! scripts/install-test-deps), started by each test on a free loopback port and killed on drop.
//! The same process serves a plain HTTP upstream that records the `traceparent` it receives.
//!
//! A request carrying a `traceparent` goes through the decision API, the proxy and the Envoy
//! service; the spans must arrive in the caller's trace with the caller's span as parent, with
//! the decision's attributes and never the credential. Off, nothing is exported; with a dead
//! collector, decisions are what they would be without telemetry.

use crate::support;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::support::{client, start, start_with, temp_dir};
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use serde_json::{Value, json};

const TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const CALLER_SPAN: &str = "00f067aa0ba902b7";
/// An API key; it must appear in no exported byte.
const SECRET: &str = "sk-live-7d1f0c2b9e4a4f6b8c3d5e7f9a1b2c3d";

fn traceparent(span: &str, flags: &str) -> String {
    format!("00-{TRACE}-{span}-{flags}")
}

/// The receiver process: OTLP/gRPC on `grpc_port`, the HTTP upstream on `http_port`.
struct Receiver {
    child: Child,
    dir: PathBuf,
    grpc_port: u16,
    http_port: u16,
}

impl Receiver {
    fn start() -> Receiver {
        let python = match std::env::var_os("SLUICE_UPSTREAM_PYTHON") {
            Some(p) if !p.is_empty() => PathBuf::from(p),
            _ => Path::new(env!("CARGO_MANIFEST_DIR")).join("../../.tools/venv/bin/python"),
        };
        let dir = temp_dir("otlp");
        let script =
            Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/suite/support/telemetry_receiver.py");
        let mut child = Command::new(&python)
            .arg(&script)
            .arg(&dir)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap_or_else(|e| panic!("start {}: {e}", python.display()));
        let mut line = String::new();
        let stdout = child.stdout.take().expect("stdout");
        BufReader::new(stdout)
            .read_line(&mut line)
            .expect("read ports");
        let ports: Vec<u16> = line
            .strip_prefix("PORTS ")
            .unwrap_or_else(|| {
                let _ = child.kill();
                panic!(
                    "the OTLP receiver did not start (needs grpcio and opentelemetry-proto: run \
                     scripts/install-test-deps); it printed {line:?}"
                )
            })
            .split_whitespace()
            .map(|p| p.parse().expect("port"))
            .collect();
        Receiver {
            child,
            dir,
            grpc_port: ports[0],
            http_port: ports[1],
        }
    }

    fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.grpc_port)
    }

    fn lines(&self, file: &str) -> Vec<Value> {
        std::fs::read_to_string(self.dir.join(file))
            .unwrap_or_default()
            .lines()
            .map(|l| serde_json::from_str(l).expect("a JSON line"))
            .collect()
    }

    fn spans(&self) -> Vec<Value> {
        self.lines("spans.jsonl")
    }

    /// Waits (at most 10 s) until `n` spans have arrived.
    async fn wait_spans(&self, n: usize) -> Vec<Value> {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let spans = self.spans();
            if spans.len() >= n {
                return spans;
            }
            assert!(
                Instant::now() < deadline,
                "{n} spans expected, got {}: {spans:#?}",
                spans.len()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    fn raw(&self) -> Vec<u8> {
        std::fs::read(self.dir.join("raw.bin")).unwrap_or_default()
    }

    fn upstream_requests(&self) -> Vec<Value> {
        self.lines("upstream.jsonl")
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn contains(haystack: &[u8], needle: &str) -> bool {
    haystack
        .windows(needle.len())
        .any(|w| w == needle.as_bytes())
}

fn telemetry(endpoint: &str) -> String {
    format!(
        r#"
[telemetry]
enabled = true
endpoint = "{endpoint}"
service_name = "sluice-test"
flush_interval = "50ms"
export_timeout = "2s"
"#
    )
}

const POLICIES: &str = r#"
[policies.per-key]
algorithm = "token-bucket"
capacity = 1
rate = "1/min"
identity = "api-key:x-api-key"

[policies.leased-key]
algorithm = "fixed-window"
limit = 100
window = "1m"
mode = "leased"
"#;

async fn check(url: &str, body: Value, traceparent: Option<&str>) -> Value {
    let mut req = client().post(url).json(&body);
    if let Some(t) = traceparent {
        req = req.header("traceparent", t);
    }
    let res = req.send().await.unwrap();
    assert_eq!(res.status(), 200);
    res.json().await.unwrap()
}

fn attr<'a>(span: &'a Value, key: &str) -> &'a Value {
    &span["attributes"][key]
}

#[tokio::test]
async fn decision_api_spans_join_the_callers_trace_without_the_credential() {
    let rx = Receiver::start();
    let s = start(&format!("{POLICIES}{}", telemetry(&rx.endpoint()))).await;
    let url = s.url("/v1/check");
    let body = json!({"policy": "per-key", "credential": SECRET});
    let first = check(&url, body.clone(), Some(&traceparent(CALLER_SPAN, "01"))).await;
    let second = check(
        &url,
        body.clone(),
        Some(&traceparent("00000000000000a2", "01")),
    )
    .await;
    assert_eq!(
        (first["allowed"].as_bool(), second["allowed"].as_bool()),
        (Some(true), Some(false))
    );
    let leased = json!({"policy": "leased-key", "identity": "user:42"});
    check(&url, leased, None).await;

    let spans = rx.wait_spans(3).await;
    let (a, b, c) = (&spans[0], &spans[1], &spans[2]);
    for (span, parent) in [(a, CALLER_SPAN), (b, "00000000000000a2")] {
        assert_eq!(span["trace_id"], TRACE);
        assert_eq!(span["parent_span_id"], parent);
        assert_eq!(span["name"], "sluice.check");
        assert_eq!(span["kind"], 2, "SPAN_KIND_SERVER");
        assert_eq!(span["scope"], "sluice");
        assert_eq!(span["resource"]["service.name"], "sluice-test");
        assert_eq!(attr(span, "sluice.policy"), "per-key");
        assert_eq!(attr(span, "sluice.algorithm"), "token-bucket");
        assert_eq!(attr(span, "sluice.mode"), "exact");
        assert_eq!(attr(span, "sluice.entry"), "api");
        assert_eq!(attr(span, "http.response.status_code"), 200);
        assert!(
            attr(span, "sluice.store.calls").as_i64().unwrap() >= 1,
            "{span}"
        );
        assert!(attr(span, "sluice.store.latency_us").is_i64(), "{span}");
        assert_ne!(span["span_id"], parent);
    }
    assert_eq!(attr(a, "sluice.verdict"), "allowed");
    assert_eq!(attr(a, "sluice.allowed"), true);
    assert_eq!(attr(b, "sluice.verdict"), "denied");
    assert_eq!(attr(b, "sluice.allowed"), false);
    // No traceparent: a new trace, sluice's span its root.
    assert_ne!(c["trace_id"], TRACE);
    assert_eq!(c["parent_span_id"], "");
    assert_eq!(attr(c, "sluice.mode"), "leased");
    assert_eq!(attr(c, "sluice.policy"), "leased-key");

    // A caller that does not sample its trace: sluice records nothing either.
    check(&url, body, Some(&traceparent("00000000000000a3", "00"))).await;
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert_eq!(rx.spans().len(), 3);

    assert!(!contains(&rx.raw(), SECRET), "the credential was exported");
    s.stop().await;
}

#[tokio::test]
async fn proxy_span_is_the_upstreams_parent() {
    let rx = Receiver::start();
    let toml = format!(
        r#"{POLICIES}
[[routes]]
prefix = "/api"
policies = ["per-key"]
upstream = "http://127.0.0.1:{}"
{}"#,
        rx.http_port,
        telemetry(&rx.endpoint())
    );
    let s = start(&toml).await;
    let res = client()
        .get(s.proxy_url("/api/orders?token=abc"))
        .header("x-api-key", SECRET)
        .header("traceparent", traceparent(CALLER_SPAN, "01"))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 200);
    let spans = rx.wait_spans(1).await;
    let span = &spans[0];
    assert_eq!(span["name"], "sluice.proxy");
    assert_eq!(span["trace_id"], TRACE);
    assert_eq!(span["parent_span_id"], CALLER_SPAN);
    assert_eq!(attr(span, "sluice.policy"), "per-key");
    assert_eq!(attr(span, "sluice.verdict"), "allowed");
    assert_eq!(attr(span, "http.response.status_code"), 200);
    let seen = rx.upstream_requests();
    assert_eq!(seen.len(), 1);
    let expected = format!("00-{TRACE}-{}-01", span["span_id"].as_str().unwrap());
    assert_eq!(
        seen[0]["traceparent"],
        expected.as_str(),
        "the upstream's parent is sluice's span"
    );

    // Denied: the span says so and nothing reaches the upstream.
    let res = client()
        .get(s.proxy_url("/api/orders"))
        .header("x-api-key", SECRET)
        .header("traceparent", traceparent(CALLER_SPAN, "01"))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 429);
    let spans = rx.wait_spans(2).await;
    assert_eq!(attr(&spans[1], "sluice.verdict"), "denied");
    assert_eq!(attr(&spans[1], "http.response.status_code"), 429);
    assert_eq!(rx.upstream_requests().len(), 1);
    let raw = rx.raw();
    assert!(!contains(&raw, SECRET), "the credential was exported");
    assert!(
        !contains(&raw, "token=abc"),
        "the query string was exported"
    );
    s.stop().await;
}

const DOMAIN: &str = r#"
domain: edge
descriptors:
  - key: remote_address
    rate_limit:
      unit: minute
      requests_per_unit: 1
"#;

async fn should_rate_limit(s: &support::TestServer, traceparent: Option<&str>) -> i32 {
    let mut c = RateLimitServiceClient::connect(s.grpc_url()).await.unwrap();
    let mut req = tonic::Request::new(RateLimitRequest {
        domain: "edge".into(),
        descriptors: vec![RateLimitDescriptor {
            entries: vec![Entry {
                key: "remote_address".into(),
                value: "10.0.0.1".into(),
            }],
            limit: None,
            hits_addend: None,
            is_negative_hits: false,
        }],
        hits_addend: 0,
    });
    if let Some(t) = traceparent {
        req.metadata_mut().insert("traceparent", t.parse().unwrap());
    }
    c.should_rate_limit(req)
        .await
        .unwrap()
        .into_inner()
        .overall_code
}

#[tokio::test]
async fn rls_spans_follow_the_traceparent_envoy_sends() {
    let rx = Receiver::start();
    let toml = format!(
        "[envoy]\nfiles = [\"edge.yaml\"]\n{}",
        telemetry(&rx.endpoint())
    );
    let s = start_with(&toml, &[("edge.yaml", DOMAIN)]).await;
    let ok = should_rate_limit(&s, Some(&traceparent(CALLER_SPAN, "01"))).await;
    let over = should_rate_limit(&s, Some(&traceparent("00000000000000b2", "01"))).await;
    assert_eq!((ok, over), (1, 2), "OK then OVER_LIMIT");
    let spans = rx.wait_spans(2).await;
    assert_eq!(spans[0]["name"], "sluice.rls");
    assert_eq!(spans[0]["trace_id"], TRACE);
    assert_eq!(spans[0]["parent_span_id"], CALLER_SPAN);
    assert_eq!(spans[1]["parent_span_id"], "00000000000000b2");
    assert_eq!(attr(&spans[0], "sluice.verdict"), "allowed");
    assert_eq!(attr(&spans[1], "sluice.verdict"), "denied");
    assert_eq!(attr(&spans[0], "rpc.grpc.status_code"), 0);
    assert_eq!(attr(&spans[0], "rpc.method"), "ShouldRateLimit");
    assert!(
        !attr(&spans[0], "sluice.policy")
            .as_str()
            .unwrap()
            .is_empty()
    );
    assert!(
        !contains(&rx.raw(), "10.0.0.1"),
        "the descriptor's identity was exported"
    );
    s.stop().await;
}

#[tokio::test]
async fn telemetry_off_exports_nothing_and_forwards_the_callers_traceparent() {
    let rx = Receiver::start();
    let toml = format!(
        r#"{POLICIES}
[telemetry]
enabled = false
endpoint = "{}"

[[routes]]
prefix = "/api"
policies = ["per-key"]
upstream = "http://127.0.0.1:{}"
"#,
        rx.endpoint(),
        rx.http_port
    );
    let s = start(&toml).await;
    let incoming = traceparent(CALLER_SPAN, "01");
    check(
        &s.url("/v1/check"),
        json!({"policy": "per-key", "credential": SECRET}),
        Some(&incoming),
    )
    .await;
    let res = client()
        .get(s.proxy_url("/api/x"))
        .header("x-api-key", "another-key")
        .header("traceparent", &incoming)
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 200);
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(rx.spans().is_empty());
    assert_eq!(rx.upstream_requests()[0]["traceparent"], incoming.as_str());
    s.stop().await;
}

#[tokio::test]
async fn a_dead_collector_changes_no_decision() {
    // A port nothing listens on.
    let dead = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let toml = format!(
        r#"
[policies.three]
algorithm = "fixed-window"
limit = 3
window = "1m"
{}"#,
        telemetry(&format!("http://{dead}"))
    );
    let s = start(&toml).await;
    let url = s.url("/v1/check");
    let mut allowed = Vec::new();
    for i in 0..6 {
        let span = format!("{:016x}", i + 1);
        let answer = check(
            &url,
            json!({"policy": "three", "identity": "user:1"}),
            Some(&traceparent(&span, "01")),
        )
        .await;
        allowed.push(answer["allowed"].as_bool().unwrap());
    }
    assert_eq!(allowed, [true, true, true, false, false, false]);
    // The failed exports are counted.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let metrics = client()
            .get(s.url("/metrics"))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        if metrics.contains("sluice_telemetry_export_failures_total") {
            assert!(
                metrics.contains("sluice_telemetry_spans_dropped_total{reason=\"export_failed\"}")
            );
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no export failure counted:\n{metrics}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    s.stop().await;
}

#[tokio::test]
async fn spans_still_queued_are_sent_on_shutdown() {
    let rx = Receiver::start();
    // A flush interval far beyond the test: only the shutdown can send the span in time.
    let toml = format!(
        "{POLICIES}{}",
        telemetry(&rx.endpoint()).replace("\"50ms\"", "\"60s\"")
    );
    let s = start(&toml).await;
    check(
        &s.url("/v1/check"),
        json!({"policy": "leased-key", "identity": "user:7"}),
        Some(&traceparent(CALLER_SPAN, "01")),
    )
    .await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(rx.spans().is_empty(), "sent before the flush interval");
    s.stop().await;
    let spans = rx.wait_spans(1).await;
    assert_eq!(spans[0]["parent_span_id"], CALLER_SPAN);
}

#[tokio::test]
async fn a_stalled_collector_fills_the_queue_and_never_slows_a_decision() {
    // A collector that accepts connections (the kernel's backlog) and never answers.
    let stalled = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = stalled.local_addr().unwrap();
    let toml = format!(
        r#"
[server]
shutdown_grace = "1s"

[policies.many]
algorithm = "fixed-window"
limit = 1000
window = "1m"

[telemetry]
enabled = true
endpoint = "http://{addr}"
flush_interval = "10ms"
export_timeout = "3s"
queue_size = 2
"#
    );
    let s = start(&toml).await;
    let url = s.url("/v1/check");
    for i in 0..30 {
        let sent = Instant::now();
        let answer = check(
            &url,
            json!({"policy": "many", "identity": "user:1"}),
            Some(&traceparent(&format!("{:016x}", i + 1), "01")),
        )
        .await;
        assert_eq!(answer["allowed"], true);
        // Waiting on the queue would take the export timeout (3 s).
        assert!(
            sent.elapsed() < Duration::from_millis(1500),
            "check {i} took {:?}",
            sent.elapsed()
        );
    }
    let metrics = client()
        .get(s.url("/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let dropped: f64 = metrics
        .lines()
        .find(|l| l.starts_with("sluice_telemetry_spans_dropped_total{reason=\"queue_full\"}"))
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
        .unwrap_or_else(|| panic!("no queue_full drops counted:\n{metrics}"));
    // 30 spans, at most 2 queued and one batch in the stalled export at a time.
    assert!(dropped >= 10.0, "{dropped} dropped");
    s.stop().await;
    drop(stalled);
}
