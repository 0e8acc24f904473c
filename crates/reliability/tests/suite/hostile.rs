//! Hostile input on every surface of `sluice serve` and the CLI: the HTTP decision API
//! (malformed, oversized, wrong-typed, invalid UTF-8, deeply nested, Unicode edge cases,
//! negative and huge costs, very long identities, unknown policies), Envoy's gRPC service (very
//! many descriptors, huge entries, an empty domain, oversized messages), configuration files
//! (garbage TOML, wrong types, invalid UTF-8, deep nesting: errors name FILE:LINE), CLI flags,
//! and request headers (huge or invalid `X-Forwarded-For`, too many headers, invalid bytes).
//! Each gets a clear 4xx, `INVALID_ARGUMENT` (or `RESOURCE_EXHAUSTED`) or a config error, and
//! the server keeps serving.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use clap::Parser;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use serde_json::{Value, json};
use sluice_reliability::serve::{TestServer, client, start, start_with};
use sluice_server::Config;

const CONFIG: &str = r#"
[policies.api]
algorithm = "token-bucket"
capacity = 3
rate = "1/h"

[policies.leases]
algorithm = "concurrency"
limit = 2
lease = "1m"
"#;

async fn post_raw(
    s: &TestServer,
    body: impl Into<reqwest::Body>,
    content_type: &str,
) -> (u16, String, String) {
    let res = client()
        .post(s.url("/v1/check"))
        .header("content-type", content_type)
        .body(body)
        .send()
        .await
        .expect("the server answers");
    let status = res.status().as_u16();
    let ct = res
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_string();
    (status, ct, res.text().await.unwrap())
}

async fn post(s: &TestServer, body: &Value) -> (u16, Value) {
    let res = client()
        .post(s.url("/v1/check"))
        .json(body)
        .send()
        .await
        .expect("the server answers");
    let status = res.status().as_u16();
    let text = res.text().await.unwrap();
    (
        status,
        serde_json::from_str(&text).unwrap_or(Value::String(text)),
    )
}

/// A 400 problem+json whose detail contains `needle`.
async fn assert_problem(s: &TestServer, body: impl Into<reqwest::Body>, status: u16, needle: &str) {
    let (got, ct, text) = post_raw(s, body, "application/json").await;
    assert_eq!(got, status, "{text}");
    assert_eq!(ct, "application/problem+json", "{text}");
    let v: Value = serde_json::from_str(&text).expect("problem+json is JSON");
    let detail = v["detail"].as_str().unwrap_or("");
    assert!(
        detail.contains(needle),
        "detail {detail:?} should mention {needle:?}"
    );
    assert_eq!(v["status"], status);
}

async fn still_serving(s: &TestServer) {
    let (status, v) = post(
        s,
        &json!({"policy": "api", "identity": format!("alive-{}", rand::random::<u64>())}),
    )
    .await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["allowed"], true);
    assert!(s.is_running());
}

#[tokio::test]
async fn api_rejects_malformed_and_wrong_typed_json() {
    let s = start(CONFIG).await;
    let cases: &[(&str, &str)] = &[
        ("", "invalid JSON"),
        ("{", "invalid JSON"),
        ("{\"policy\": \"api\", \"identity\": \"u\"", "invalid JSON"),
        ("nul\u{0}l", "invalid JSON"),
        ("[1,2,3]", "must be a JSON object"),
        ("\"just a string\"", "must be a JSON object"),
        ("null", "must be a JSON object"),
        ("{}", "missing \"policy\""),
        (
            "{\"policy\": 5, \"identity\": \"u\"}",
            "\"policy\" must be a string",
        ),
        (
            "{\"policy\": null, \"identity\": \"u\"}",
            "\"policy\" must be a string",
        ),
        (
            "{\"policies\": \"api\", \"identity\": \"u\"}",
            "must be a list",
        ),
        (
            "{\"policies\": [], \"identity\": \"u\"}",
            "must not be empty",
        ),
        (
            "{\"policies\": [1], \"identity\": \"u\"}",
            "must hold strings",
        ),
        (
            "{\"policies\": [\"api\", \"api\"], \"identity\": \"u\"}",
            "listed twice",
        ),
        (
            "{\"policy\": \"api\", \"policies\": [\"api\"], \"identity\": \"u\"}",
            "not both",
        ),
        ("{\"policy\": \"api\"}", "missing \"identity\""),
        (
            "{\"policy\": \"api\", \"identity\": 42}",
            "\"identity\" must be a string",
        ),
        (
            "{\"policy\": \"api\", \"identity\": {\"a\": 1}}",
            "\"identity\" must be a string",
        ),
        (
            "{\"policy\": \"api\", \"identity\": \"\"}",
            "must not be empty",
        ),
        (
            "{\"policy\": \"api\", \"identity\": \"u\", \"cost\": \"1\"}",
            "\"cost\" must be a non-negative integer",
        ),
        (
            "{\"policy\": \"api\", \"identity\": \"u\", \"cost\": true}",
            "\"cost\" must be a non-negative integer",
        ),
        (
            "{\"policy\": \"api\", \"identity\": \"u\", \"cost\": -1}",
            "must not be negative",
        ),
        (
            "{\"policy\": \"api\", \"identity\": \"u\", \"cost\": -9223372036854775808}",
            "must not be negative",
        ),
        (
            "{\"policy\": \"api\", \"identity\": \"u\", \"cost\": 1.5}",
            "whole number",
        ),
        (
            "{\"policy\": \"api\", \"identity\": \"u\", \"cost\": 1e3}",
            "whole number",
        ),
        (
            "{\"policy\": \"api\", \"identity\": \"u\", \"cost\": 9007199254740993}",
            "at most",
        ),
        (
            "{\"policy\": \"api\", \"identity\": \"u\", \"cost\": 18446744073709551615}",
            "at most",
        ),
        (
            "{\"policy\": \"api\", \"identity\": \"u\", \"cost\": 18446744073709551616}",
            "whole number",
        ),
        (
            "{\"policy\": \"api\", \"identity\": \"u\", \"cost\": 1e400}",
            "invalid JSON",
        ),
        (
            "{\"policy\": \"nope\", \"identity\": \"u\"}",
            "unknown policy \"nope\"",
        ),
        (
            "{\"policy\": \"API\", \"identity\": \"u\"}",
            "unknown policy",
        ),
        (
            "{\"policy\": \"api\", \"identity\": \"u\", \"extra\": 1}",
            "unknown field \"extra\"",
        ),
        (
            "{\"policy\": \"api\", \"identity\": \"\\ud800\"}",
            "invalid JSON",
        ),
    ];
    for (body, needle) in cases {
        assert_problem(&s, body.to_string(), 400, needle).await;
    }
    // Invalid UTF-8, raw and inside a string.
    assert_problem(&s, vec![0xff, 0xfe, b'{', b'}'], 400, "invalid JSON").await;
    let mut bytes = b"{\"policy\": \"api\", \"identity\": \"".to_vec();
    bytes.extend_from_slice(&[0xc3, 0x28, 0xa0, 0xa1]);
    bytes.extend_from_slice(b"\"}");
    assert_problem(&s, bytes, 400, "invalid JSON").await;
    // Deep nesting stops at serde_json's recursion limit instead of the stack.
    let deep = format!("{{\"policy\": {}{}}}", "[".repeat(5000), "]".repeat(5000));
    assert_problem(&s, deep, 400, "invalid JSON").await;
    // Too many policies in one check.
    let many: Vec<String> = (0..17).map(|i| format!("p{i}")).collect();
    assert_problem(
        &s,
        json!({"policies": many, "identity": "u"}).to_string(),
        400,
        "at most 16 policies",
    )
    .await;
    still_serving(&s).await;
    s.stop().await;
}

#[tokio::test]
async fn api_limits_body_size_and_content_type() {
    let s = start(CONFIG).await;
    // Default max_body_bytes is 16 KiB; announced larger bodies are refused before reading.
    let big = format!(
        "{{\"policy\": \"api\", \"identity\": \"{}\"}}",
        "a".repeat(20_000)
    );
    assert_problem(&s, big.clone(), 413, "larger than 16384 bytes").await;
    // Chunked (no Content-Length): refused once 16 KiB have been read.
    let mut req = b"POST /v1/check HTTP/1.1\r\nHost: a\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n".to_vec();
    for _ in 0..64 {
        req.extend_from_slice(b"400\r\n");
        req.extend_from_slice(&[b' '; 1024]);
        req.extend_from_slice(b"\r\n");
    }
    req.extend_from_slice(b"0\r\n\r\n");
    let addr = s.addrs.http;
    let status = tokio::task::spawn_blocking(move || raw_status(addr, &req))
        .await
        .unwrap();
    assert_eq!(status, Some(413), "chunked body over the limit");
    // 1 MiB announced: refused without reading it.
    let (status, _, _) = post_raw(&s, vec![b' '; 1 << 20], "application/json").await;
    assert_eq!(status, 413);
    // Other media types.
    let (status, ct, _) = post_raw(
        &s,
        "policy=api&identity=u",
        "application/x-www-form-urlencoded",
    )
    .await;
    assert_eq!((status, ct.as_str()), (415, "application/problem+json"));
    // Wrong methods and paths.
    let res = client().get(s.url("/v1/check")).send().await.unwrap();
    assert_eq!(res.status(), 405);
    let res = client()
        .get(s.url("/v1/../../etc/passwd"))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 404);
    let res = client()
        .get(s.url(&format!("/{}", "x".repeat(8000))))
        .send()
        .await
        .unwrap();
    assert!(res.status().is_client_error(), "{}", res.status());
    still_serving(&s).await;
    s.stop().await;
}

#[tokio::test]
async fn api_identities_costs_and_unicode_edge_cases() {
    let s = start(CONFIG).await;
    // The longest identity accepted is 512 bytes (before escaping); one more is refused.
    let (status, _) = post(&s, &json!({"policy": "api", "identity": "a".repeat(512)})).await;
    assert_eq!(status, 200);
    assert_problem(
        &s,
        json!({"policy": "api", "identity": "a".repeat(513)}).to_string(),
        400,
        "the most is 512",
    )
    .await;
    // Bytes, not characters: 171 three-byte characters are 513 bytes.
    assert_problem(
        &s,
        json!({"policy": "api", "identity": "€".repeat(171)}).to_string(),
        400,
        "513 bytes",
    )
    .await;
    // Unicode and delimiter edge cases each get their own bucket of 3.
    let ids = [
        "user:42",
        "user:42 ",
        "USER:42",
        "a}",
        "a%7D",
        "{a}",
        "}{",
        "\u{0}",
        "\u{0}\u{0}",
        "%",
        "%25",
        "\u{202e}rtl",
        "e\u{301}",
        "\u{e9}",
        "😀",
        "\u{feff}",
        "\n",
        "\r\n",
        "a b",
        "*",
        "rl:{x}:api",
        "\u{10ffff}",
    ];
    for id in ids {
        for expect in [true, true, true, false] {
            let (status, v) = post(&s, &json!({"policy": "api", "identity": id})).await;
            assert_eq!(status, 200, "{id:?}: {v}");
            assert_eq!(v["allowed"], expect, "{id:?} has its own bucket of 3: {v}");
        }
    }
    // Costs: 0 peeks, more than the capacity can never pass (no Retry-After), the largest
    // exact cost is accepted.
    let id = "cost-cases";
    let (_, v) = post(&s, &json!({"policy": "api", "identity": id, "cost": 0})).await;
    assert_eq!(
        (v["allowed"].as_bool(), v["remaining"].as_u64()),
        (Some(true), Some(3))
    );
    for cost in [4u64, 1 << 40, 1 << 53] {
        let (status, v) = post(&s, &json!({"policy": "api", "identity": id, "cost": cost})).await;
        assert_eq!(status, 200);
        assert_eq!(v["allowed"], false);
        assert_eq!(v["policies"][0]["reason"], "cost_exceeds_limit");
        assert!(
            v["headers"].get("Retry-After").is_none(),
            "retrying cannot help: {v}"
        );
    }
    let (_, v) = post(&s, &json!({"policy": "api", "identity": id, "cost": 3})).await;
    assert_eq!(v["allowed"], true, "huge costs consumed nothing");
    // Lease tokens: garbage and forged tokens are refused.
    for token in [
        "",
        "x",
        "~~",
        "api~rl:{u}:api~1",
        "leases~rl:{u}:api~1",
        "leases~other:{u}:leases~1",
        "%zz~a~b",
        "leases~rl:{u}:leases~1~extra",
    ] {
        let res = client()
            .post(s.url("/v1/release"))
            .json(&json!({"lease": token}))
            .send()
            .await
            .unwrap();
        assert_eq!(res.status(), 400, "token {token:?}");
    }
    let res = client()
        .post(s.url("/v1/release"))
        .json(&json!({"lease": 5}))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 400);
    still_serving(&s).await;
    s.stop().await;
}

const DOMAIN: &str = "domain: edge\ndescriptors:\n  - key: user\n    rate_limit:\n      unit: hour\n      requests_per_unit: 2\n";

fn desc(entries: &[(&str, &str)]) -> RateLimitDescriptor {
    RateLimitDescriptor {
        entries: entries
            .iter()
            .map(|(k, v)| Entry {
                key: k.to_string(),
                value: v.to_string(),
            })
            .collect(),
        ..Default::default()
    }
}

fn rls_request(domain: &str, descriptors: Vec<RateLimitDescriptor>) -> RateLimitRequest {
    RateLimitRequest {
        domain: domain.into(),
        descriptors,
        hits_addend: 0,
    }
}

#[tokio::test]
async fn grpc_rejects_hostile_requests_with_clear_codes() {
    let s = start_with(
        "[envoy]\nfiles = [\"edge.yaml\"]\n",
        &[("edge.yaml", DOMAIN)],
    )
    .await;
    let mut c = RateLimitServiceClient::connect(s.grpc_url()).await.unwrap();

    // Too many descriptors.
    let many: Vec<_> = (0..65)
        .map(|i| desc(&[("user", &format!("u{i}"))]))
        .collect();
    let e = c
        .should_rate_limit(rls_request("edge", many))
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e}");
    assert!(e.message().contains("64"), "{e}");
    // 64 is fine.
    let ok: Vec<_> = (0..64)
        .map(|i| desc(&[("user", &format!("v{i}"))]))
        .collect();
    assert_eq!(
        c.should_rate_limit(rls_request("edge", ok))
            .await
            .unwrap()
            .into_inner()
            .statuses
            .len(),
        64
    );

    // An empty domain names no configuration.
    let e = c
        .should_rate_limit(rls_request("", vec![desc(&[("user", "a")])]))
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e}");

    // Empty descriptors and entries limit nothing but answer.
    let r = c
        .should_rate_limit(rls_request("edge", vec![desc(&[])]))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.overall_code, 1);
    let r = c
        .should_rate_limit(rls_request("edge", vec![]))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.overall_code, 1);

    // Huge entry values: still limited (no bypass by length), and two values that share a long
    // prefix are still two identities.
    let long_a = format!("{}a", "x".repeat(100_000));
    let long_b = format!("{}b", "x".repeat(100_000));
    for expect_ok in [true, true, false] {
        let r = c
            .should_rate_limit(rls_request("edge", vec![desc(&[("user", &long_a)])]))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(
            r.overall_code == 1,
            expect_ok,
            "limit of 2 per long identity"
        );
    }
    let r = c
        .should_rate_limit(rls_request("edge", vec![desc(&[("user", &long_b)])]))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        r.overall_code, 1,
        "a different long value has its own counter"
    );
    // Many entries in one descriptor, unicode and NUL values.
    let entries: Vec<(String, String)> = (0..1000)
        .map(|i| (format!("k{i}"), "v".to_string()))
        .collect();
    let refs: Vec<(&str, &str)> = entries
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    assert!(
        c.should_rate_limit(rls_request("edge", vec![desc(&refs)]))
            .await
            .is_ok()
    );
    for v in ["\u{0}", "😀", "}{", "\u{202e}"] {
        assert!(
            c.should_rate_limit(rls_request("edge", vec![desc(&[("user", v)])]))
                .await
                .is_ok()
        );
    }
    // Huge hits_addend: more than the limit, over limit, nothing crashes.
    let mut req = rls_request("edge", vec![desc(&[("user", "hits")])]);
    req.hits_addend = u32::MAX;
    assert_eq!(
        c.should_rate_limit(req)
            .await
            .unwrap()
            .into_inner()
            .overall_code,
        2
    );
    // A message over tonic's 4 MiB decode limit.
    let huge = "y".repeat(5 << 20);
    let e = c
        .should_rate_limit(rls_request("edge", vec![desc(&[("user", &huge)])]))
        .await
        .unwrap_err();
    assert!(
        matches!(
            e.code(),
            tonic::Code::ResourceExhausted | tonic::Code::OutOfRange
        ),
        "{e}"
    );

    // Still serving.
    let r = c
        .should_rate_limit(rls_request("edge", vec![desc(&[("user", "fine")])]))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.overall_code, 1);
    assert!(s.is_running());
    s.stop().await;
}

fn config_errors(src: &str) -> String {
    match Config::parse(src, "hostile.toml", None) {
        Ok(_) => panic!("accepted:\n{src}"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn config_errors_name_file_and_line() {
    let cases: &[(&str, &str, &str)] = &[
        ("garbage", "hostile.toml:1:", ""),
        ("\u{0}\u{1}\u{2} not toml [[[", "hostile.toml:1:", ""),
        (
            "[policies.a]\nalgorithm = \"token-bucket\"\ncapacity = \"ten\"\nrate = \"5/s\"\n",
            "hostile.toml:3:",
            "capacity",
        ),
        (
            "[policies.a]\nalgorithm = \"token-bucket\"\ncapacity = -1\nrate = \"5/s\"\n",
            "hostile.toml:3:",
            "",
        ),
        (
            "[policies.a]\nalgorithm = \"token-bucket\"\ncapacity = 1e30\nrate = \"5/s\"\n",
            "hostile.toml:3:",
            "",
        ),
        (
            "[policies.a]\nalgorithm = \"token-bucket\"\ncapacity = 18446744073709551616\nrate = \"5/s\"\n",
            "hostile.toml:3:",
            "",
        ),
        (
            "[policies.a]\nalgorithm = \"token-bucket\"\ncapacity = 9007199254740993\nrate = \"5/s\"\n",
            "hostile.toml:2:",
            "2^53",
        ),
        (
            "[policies.a]\nalgorithm = \"token-bucket\"\ncapacity = 5\nrate = \"5/parsec\"\n",
            "hostile.toml:4:",
            "policies.a.rate",
        ),
        (
            "[policies.a]\nalgorithm = \"quantum\"\n",
            "hostile.toml:2:",
            "quantum",
        ),
        (
            "[policies.\"a b\"]\nalgorithm = \"token-bucket\"\n",
            "hostile.toml:1:",
            "policies.a b",
        ),
        (
            "[server]\nhttp = \"not an address\"\n",
            "hostile.toml:2:",
            "server.http",
        ),
        (
            "[server]\nmax_body_bytes = 0\n",
            "hostile.toml:2:",
            "server.max_body_bytes",
        ),
        (
            "[server]\nmax_body_bytes = 99999999999\n",
            "hostile.toml:2:",
            "server.max_body_bytes",
        ),
        (
            "[store]\nurl = \"mysql://x\"\n",
            "hostile.toml:2:",
            "store.url",
        ),
        (
            "[store]\ntimeout = \"forever\"\n",
            "hostile.toml:2:",
            "store.timeout",
        ),
        (
            "[store]\nkey_prefix = \"a{b}\"\n",
            "hostile.toml:2:",
            "store.key_prefix",
        ),
        ("unknown_top = 1\n", "hostile.toml:1:", "unknown field"),
        (
            "\n\n[proxy]\ntrusted_proxies = [\"10.0.0.0/33\"]\n",
            "hostile.toml:4:",
            "proxy.trusted_proxies",
        ),
        ("admin_token = \"\"\n", "hostile.toml:1:", "admin_token"),
        (
            "identity_hash_key = \"zz\"\n",
            "hostile.toml:1:",
            "identity_hash_key",
        ),
        (
            "[[routes]]\nprefix = \"nope\"\nupstream = \"ftp://x\"\n",
            "hostile.toml:2:",
            "routes[0].prefix",
        ),
    ];
    for (src, place, needle) in cases {
        let e = config_errors(src);
        assert!(
            e.starts_with(place),
            "{src:?}: error {e:?} should start with {place:?}"
        );
        assert!(
            e.contains(needle),
            "{src:?}: error {e:?} should mention {needle:?}"
        );
    }
}

#[test]
fn config_survives_deep_nesting_and_huge_files() {
    // Deeply nested arrays and inline tables: an error, not a stack overflow (the test thread
    // has the default 2 MiB stack).
    for deep in [
        format!("a = {}{}", "[".repeat(100_000), "]".repeat(100_000)),
        format!("a = {}{}", "{b=".repeat(50_000), "}".repeat(50_000)),
        format!("{}=1", "a.".repeat(50_000)),
    ] {
        let e = config_errors(&deep);
        assert!(e.starts_with("hostile.toml:"), "{}", &e[..e.len().min(200)]);
    }
    // A huge file of many policies is read, checked and refused on the first bad one's line.
    let mut src = String::new();
    for i in 0..5_000 {
        src.push_str(&format!(
            "[policies.p{i}]\nalgorithm = \"fixed-window\"\nlimit = 5\nwindow = \"1m\"\n"
        ));
    }
    src.push_str("[policies.bad]\nalgorithm = \"fixed-window\"\nlimit = 0\nwindow = \"1m\"\n");
    let e = config_errors(&src);
    assert!(e.starts_with("hostile.toml:20002:"), "{e}");
}

#[test]
fn config_file_problems_name_the_file() {
    let dir = sluice_reliability::serve::temp_dir("cfg");
    let bad_utf8 = dir.join("bad.toml");
    std::fs::write(
        &bad_utf8,
        [b'a', b' ', b'=', b' ', b'"', 0xff, 0xfe, b'"', b'\n'],
    )
    .unwrap();
    let e = Config::load(&bad_utf8).unwrap_err().to_string();
    assert!(e.starts_with(&bad_utf8.display().to_string()), "{e}");
    let missing = dir.join("missing.toml");
    let e = Config::load(&missing).unwrap_err().to_string();
    assert!(e.starts_with(&missing.display().to_string()), "{e}");
    // A broken Envoy YAML file: the error names the YAML file and its line.
    std::fs::write(
        dir.join("edge.yaml"),
        "domain: edge\ndescriptors:\n  - key: [unclosed\n",
    )
    .unwrap();
    let cfg = dir.join("sluice.toml");
    std::fs::write(&cfg, "[envoy]\nfiles = [\"edge.yaml\"]\n").unwrap();
    let e = Config::load(&cfg).unwrap_err().to_string();
    assert!(e.contains("edge.yaml:"), "{e}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// The `sluice` command line, as the binary declares it.
#[derive(Debug, Parser)]
#[command(name = "sluice")]
enum Cli {
    Serve(sluice_server::cli::ServeArgs),
    Validate(sluice_server::cli::ValidateArgs),
    Check(sluice_cli::check::CheckArgs),
    Keyslot(sluice_cli::keyslot::KeyslotArgs),
}

#[tokio::test]
async fn cli_flags_are_refused_with_clear_errors() {
    use std::ffi::OsString;
    use std::os::unix::ffi::OsStringExt;
    let refused: &[&[&str]] = &[
        &["sluice", "serve", "--http", "nonsense"],
        &["sluice", "serve", "--http", "127.0.0.1:99999"],
        &["sluice", "serve", "--grpc", ""],
        &["sluice", "serve", "--unknown"],
        &["sluice", "check", "u", "--count", "-1"],
        &["sluice", "check", "u", "--count", "18446744073709551616"],
        &["sluice", "check", "u", "--cost", "1.5"],
        &["sluice", "check", "u", "--capacity", "ten"],
        &["sluice", "keyslot", "--identity", "u"],
        &["sluice", "validate"],
    ];
    for args in refused {
        let e = Cli::try_parse_from(*args).expect_err(&format!("{args:?} accepted"));
        assert!(!e.to_string().is_empty());
    }
    // Invalid UTF-8 in an argument.
    let args = vec![
        OsString::from("sluice"),
        OsString::from("check"),
        OsString::from_vec(vec![0xff, 0xfe]),
    ];
    assert!(Cli::try_parse_from(args).is_err());

    // Values clap accepts but the tools refuse, with a message and no panic.
    let run_check = |args: &[&str]| {
        let Cli::Check(c) = Cli::try_parse_from(args).unwrap() else {
            unreachable!()
        };
        c
    };
    let cases: &[(&[&str], &str)] = &[
        (
            &["sluice", "check", "u", "--capacity", "0", "--rate", "5/s"],
            "capacity",
        ),
        (
            &[
                "sluice",
                "check",
                "u",
                "--capacity",
                "5",
                "--rate",
                "5/parsec",
            ],
            "rate",
        ),
        (
            &[
                "sluice",
                "check",
                "u",
                "--capacity",
                "9007199254740993",
                "--rate",
                "5/s",
            ],
            "2^53",
        ),
        (&["sluice", "check", "u", "--capacity", "5"], "rate"),
        (&["sluice", "check", "u", "-a", "quantum"], "quantum"),
        (
            &[
                "sluice",
                "check",
                "u",
                "--capacity",
                "5",
                "--rate",
                "5/s",
                "--store",
                "mysql://x",
            ],
            "store",
        ),
        (
            &[
                "sluice",
                "check",
                "u",
                "--capacity",
                "5",
                "--rate",
                "5/s",
                "--timeout",
                "soon",
            ],
            "duration",
        ),
        (
            &[
                "sluice",
                "check",
                "u",
                "--capacity",
                "5",
                "--rate",
                "5/s",
                "--name",
                "a b",
            ],
            "name",
        ),
    ];
    for (args, needle) in cases {
        let mut out = Vec::new();
        let e = sluice_cli::check::run(&run_check(args), &mut out)
            .await
            .expect_err(&format!("{args:?} ran"));
        assert!(
            e.to_lowercase().contains(needle),
            "{args:?}: {e:?} should mention {needle:?}"
        );
    }
    // A hostile identity is just an identity.
    let long = "}{\u{0}".repeat(100);
    let mut out = Vec::new();
    sluice_cli::check::run(
        &run_check(&[
            "sluice",
            "check",
            &long,
            "--capacity",
            "5",
            "--rate",
            "5/s",
            "--json",
        ]),
        &mut out,
    )
    .await
    .unwrap();
    assert!(String::from_utf8(out).unwrap().contains("\"allowed\":true"));
    // A hostile key for keyslot.
    let Cli::Keyslot(k) =
        Cli::try_parse_from(["sluice", "keyslot", "{", "}", "{}", "", "{{}}"]).unwrap()
    else {
        unreachable!()
    };
    assert_eq!(sluice_cli::keyslot::run(&k).unwrap().len(), 5);
}

const PROXY_CONFIG: &str = r#"
[policies.api]
algorithm = "token-bucket"
capacity = 3
rate = "1/h"

[policies.per-ip]
algorithm = "token-bucket"
capacity = 1000
rate = "1/h"
identity = "ip"

[proxy]
trusted_proxies = ["127.0.0.1"]

[[routes]]
prefix = "/"
policies = ["per-ip"]
upstream = "http://UPSTREAM"
"#;

/// An upstream answering 200 with the `X-Forwarded-For` it received.
async fn upstream() -> SocketAddr {
    let app = axum::Router::new().fallback(|req: axum::extract::Request| async move {
        req.headers()
            .get("x-forwarded-for")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_string()
    });
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(l, app).await });
    addr
}

/// Sends raw bytes and returns the status code of the answer (None: the connection was closed
/// without one).
fn raw_status(addr: SocketAddr, request: &[u8]) -> Option<u16> {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let _ = s.write_all(request);
    let mut buf = vec![0u8; 4096];
    let n = s.read(&mut buf).ok()?;
    let head = String::from_utf8_lossy(&buf[..n]);
    head.strip_prefix("HTTP/1.1 ")?.get(..3)?.parse().ok()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_headers_hostile_forwarding_and_sizes() {
    let up = upstream().await;
    let s = start(&PROXY_CONFIG.replace("UPSTREAM", &up.to_string())).await;
    let proxy = s.addrs.proxy.unwrap();
    let get = |xff: String| {
        let url = s.proxy_url("/x");
        async move {
            client()
                .get(url)
                .header("x-forwarded-for", xff)
                .send()
                .await
                .unwrap()
        }
    };
    // 1,000 hops (about 14 KB, inside the 16 KiB head limit), garbage hops, an empty value:
    // answered. 10,000 hops (about 150 KB) exceed `max_header_bytes`: 431, never a crash.
    let hops = |n: usize| {
        (0..n)
            .map(|i| format!("10.{}.{}.{}", i / 65536, (i / 256) % 256, i % 256))
            .collect::<Vec<_>>()
            .join(", ")
    };
    assert_eq!(get(hops(1_000)).await.status(), 200);
    assert_eq!(get(hops(10_000)).await.status(), 431);
    for xff in [
        "",
        ",,,,",
        "unknown",
        "999.999.999.999",
        "[::1",
        "\"quoted\"",
        "1.2.3.4:99999",
        "_hidden, 1.2.3.4",
    ] {
        let res = get(xff.to_string()).await;
        assert_eq!(res.status(), 200, "XFF {xff:?}");
    }
    // Invalid bytes in a header value (obs-text is legal HTTP but not UTF-8; control bytes are not).
    let req = "GET /x HTTP/1.1\r\nHost: a\r\nX-Forwarded-For: \u{ff}\u{fe}1.2.3.4\r\nConnection: close\r\n\r\n";
    let status = raw_status(proxy, req.as_bytes());
    assert!(matches!(status, Some(200) | Some(400)), "{status:?}");
    let mut req = b"GET /x HTTP/1.1\r\nHost: a\r\nX-Forwarded-For: 1.2.3.4".to_vec();
    req.extend_from_slice(&[0x00, 0x01, 0x7f]);
    req.extend_from_slice(b"\r\nConnection: close\r\n\r\n");
    assert_eq!(
        raw_status(proxy, &req),
        Some(400),
        "control bytes in a header"
    );
    let req = b"GET /x HTTP/1.1\r\nHost: a\r\nBad Name: 1\r\nConnection: close\r\n\r\n";
    assert_eq!(
        raw_status(proxy, req),
        Some(400),
        "a space in a header name"
    );
    // A 1 MiB header and 200 headers: over hyper's limits, refused with 431.
    let req = format!(
        "GET /x HTTP/1.1\r\nHost: a\r\nX-Forwarded-For: {}\r\nConnection: close\r\n\r\n",
        "1".repeat(1 << 20)
    );
    assert_eq!(raw_status(proxy, req.as_bytes()), Some(431), "1 MiB header");
    let mut req = String::from("GET /x HTTP/1.1\r\nHost: a\r\n");
    for i in 0..200 {
        req.push_str(&format!("X-H{i}: v\r\n"));
    }
    req.push_str("Connection: close\r\n\r\n");
    assert_eq!(raw_status(proxy, req.as_bytes()), Some(431), "200 headers");
    // The same limits on the decision API listener.
    let req = format!(
        "POST /v1/check HTTP/1.1\r\nHost: a\r\nX-Big: {}\r\nConnection: close\r\n\r\n",
        "1".repeat(1 << 20)
    );
    assert_eq!(raw_status(s.addrs.http, req.as_bytes()), Some(431));
    // Still serving.
    assert_eq!(get("1.2.3.4".into()).await.status(), 200);
    still_serving(&s).await;
    s.stop().await;
}
