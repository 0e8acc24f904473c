use super::*;
use sluice::{Algorithm, FailureMode, Rate};

fn errs(src: &str) -> Vec<String> {
    match Config::parse(src, "sluice.toml", None) {
        Ok(_) => panic!("expected errors in:\n{src}"),
        Err(e) => e.0.iter().map(|e| e.to_string()).collect(),
    }
}

fn one(src: &str) -> String {
    let e = errs(src);
    assert_eq!(e.len(), 1, "{e:?}");
    e.into_iter().next().unwrap()
}

const GOOD: &str = r#"
shadow = false
identity_hash_key = "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f"

[server]
http = "127.0.0.1:0"
grpc = "127.0.0.1:0"

[store]
url = "memory"
timeout = "50ms"
failure_mode = "closed"

[policies.burst]
algorithm = "token-bucket"
capacity = 10
rate = "5/s"
identity = "api-key:x-api-key"

[policies.daily]
algorithm = "fixed-window"
limit = 1000
window = "1d"
failure_mode = "open"

[policies.uploads]
algorithm = "concurrency"
limit = 2

[[routes]]
prefix = "/api"
methods = ["get", "POST"]
policies = ["burst", "daily"]
upstream = "http://127.0.0.1:8000"

[[routes]]
prefix = "/api/v2/"
policies = ["burst"]
upstream = "http://127.0.0.1:8001/base"

[[envoy.domains]]
domain = "edge"
[[envoy.domains.descriptors]]
key = "remote_address"
rate_limit = { unit = "minute", requests_per_unit = 10 }
"#;

#[test]
fn a_complete_file_parses() {
    let c = Config::parse(GOOD, "sluice.toml", None).unwrap();
    assert_eq!(c.policies.len(), 3);
    let burst = &c.policies["burst"];
    assert_eq!(
        burst.policy.algorithm,
        Algorithm::TokenBucket {
            capacity: 10,
            rate: Rate::per_second(5)
        }
    );
    assert_eq!(
        burst.policy.failure_mode,
        FailureMode::Closed,
        "inherits the store's failure mode"
    );
    assert_eq!(c.policies["daily"].policy.failure_mode, FailureMode::Open);
    assert_eq!(
        c.policies["uploads"].policy.algorithm,
        Algorithm::Concurrency {
            limit: 2,
            lease_ms: 30_000
        }
    );
    assert!(matches!(burst.identity, IdentitySource::ApiKey(_)));
    assert_eq!(c.routes[0].prefix, "/api/v2/", "longest prefix first");
    assert_eq!(
        c.routes[1].methods,
        vec![http::Method::GET, http::Method::POST]
    );
    assert!(c.domains.has("edge"));
    assert_eq!(c.identity_hash_key[1], 1);
}

#[test]
fn the_empty_file_is_the_default() {
    let c = Config::parse("", "x.toml", None).unwrap();
    assert_eq!(c.server.http, DEFAULT_HTTP.parse().unwrap());
    assert_eq!(c.store.url, "memory");
    assert!(c.policies.is_empty());
}

#[test]
fn syntax_errors_name_their_line() {
    let e = one("[store]\nurl = \"memory\n");
    assert!(e.starts_with("sluice.toml:2: "), "{e}");
}

#[test]
fn unknown_fields_name_line_and_field() {
    let e = one("[store]\nurl = \"memory\"\ntimeuot = \"5ms\"\n");
    assert!(
        e.starts_with("sluice.toml:3: store.timeuot: unknown field"),
        "{e}"
    );
    let e = one("[policies.a]\nalgorithm = \"gcra\"\nrate = \"1/s\"\nbrust = 3\n");
    assert!(
        e.starts_with("sluice.toml:4: policies.a.brust: unknown field"),
        "{e}"
    );
}

#[test]
fn wrong_types_name_line_and_field() {
    let e = one("[policies.a]\nalgorithm = \"token-bucket\"\ncapacity = \"ten\"\nrate = \"1/s\"\n");
    assert!(
        e.starts_with("sluice.toml:3: policies.a.capacity: invalid type"),
        "{e}"
    );
    let e = one("[server]\nmax_body_bytes = -1\n");
    assert!(
        e.starts_with("sluice.toml:2: server.max_body_bytes:"),
        "{e}"
    );
}

#[test]
fn missing_fields_name_the_table() {
    let e = one("\n[policies.a]\ncapacity = 3\n");
    assert!(
        e.starts_with("sluice.toml:2: policies.a.algorithm: missing field"),
        "{e}"
    );
    let e = one("[[routes]]\nprefix = \"/\"\n");
    assert!(
        e.starts_with("sluice.toml:1: routes[0].upstream: missing field"),
        "{e}"
    );
}

#[test]
fn semantic_errors_name_their_line() {
    let src = "\
[policies.a]
algorithm = \"token-bucket\"
capacity = 10
rate = \"5/x\"

[policies.b]
algorithm = \"leaky-buckets\"

[policies.c]
algorithm = \"fixed-window\"
limit = 3

[policies.d]
algorithm = \"gcra\"
rate = \"1/s\"
capacity = 4
failure_mode = \"sometimes\"
shards = 0
identity = \"cookie\"

[store]
url = \"mysql://x\"
timeout = \"fast\"
";
    let e = errs(src);
    let want = [
        "sluice.toml:4: policies.a.rate: invalid rate",
        "sluice.toml:7: policies.b.algorithm: unknown algorithm \"leaky-buckets\"",
        "sluice.toml:9: policies.c.window: fixed-window needs window",
        "sluice.toml:16: policies.d.capacity: gcra takes no capacity",
        "sluice.toml:17: policies.d.failure_mode: unknown failure mode",
        "sluice.toml:18: policies.d.shards: must be between 1 and 1024",
        "sluice.toml:19: policies.d.identity: unknown identity source",
        "sluice.toml:22: store.url: invalid request: unknown store URL",
        "sluice.toml:23: store.timeout: invalid duration",
    ];
    assert_eq!(e.len(), want.len(), "{e:#?}");
    for (got, want) in e.iter().zip(want) {
        assert!(
            got.starts_with(want),
            "{got}\n  does not start with\n{want}"
        );
    }
}

#[test]
fn algorithm_limits_are_checked() {
    let e = one("[policies.a]\nalgorithm = \"token-bucket\"\ncapacity = 0\nrate = \"1/s\"\n");
    assert!(
        e.starts_with("sluice.toml:2: policies.a.algorithm: capacity must be at least 1"),
        "{e}"
    );
    let e = one("[policies.\"bad name\"]\nalgorithm = \"gcra\"\nrate = \"1/s\"\n");
    assert!(e.starts_with("sluice.toml:1: policies.bad name:"), "{e}");
}

#[test]
fn route_errors_name_their_line() {
    let src = "\
[policies.p]
algorithm = \"gcra\"
rate = \"1/s\"

[[routes]]
prefix = \"api\"
policies = [\"p\", \"nope\"]
upstream = \"ftp://x\"
methods = [\"GE T\"]
";
    let e = errs(src);
    assert_eq!(e.len(), 4, "{e:#?}");
    assert!(e[0].starts_with("sluice.toml:6: routes[0].prefix: must start with /"));
    assert!(e[1].starts_with("sluice.toml:7: routes[0].policies: unknown policy \"nope\""));
    assert!(e[2].starts_with("sluice.toml:8: routes[0].upstream: invalid upstream"));
    assert!(e[3].starts_with("sluice.toml:9: routes[0].methods: invalid method"));
}

#[test]
fn server_and_secret_errors_name_their_line() {
    let src = "admin_token = \"env:SLUICE_TEST_SURELY_UNSET_VAR\"\nidentity_hash_key = \"short\"\n[server]\nhttp = \"localhost\"\nmax_policies_per_check = 0\n[proxy]\ntrusted_proxies = [\"10.0.0.0/99\"]\n";
    let e = errs(src);
    assert_eq!(e.len(), 5, "{e:#?}");
    assert!(e[0].starts_with("sluice.toml:1: admin_token: environment variable"));
    assert!(e[1].starts_with("sluice.toml:2: identity_hash_key: must be 64 hex digits"));
    assert!(e[2].starts_with("sluice.toml:4: server.http: invalid address"));
    assert!(e[3].starts_with("sluice.toml:5: server.max_policies_per_check: must be between"));
    assert!(e[4].starts_with("sluice.toml:7: proxy.trusted_proxies: invalid network"));
}

#[test]
fn inline_envoy_errors_name_their_line() {
    let src = "\
[[envoy.domains]]
domain = \"edge\"
[[envoy.domains.descriptors]]
key = \"k\"
rate_limit = { unit = \"fortnight\", requests_per_unit = 1 }
";
    let e = one(src);
    assert!(
        e.contains("sluice.toml:5:") || e.contains("sluice.toml:3:"),
        "{e}"
    );
    assert!(e.contains("fortnight"), "{e}");
    let dup = "[[envoy.domains]]\ndomain = \"a\"\n[[envoy.domains]]\ndomain = \"a\"\n";
    let e = one(dup);
    assert!(
        e.starts_with("sluice.toml:1: envoy.domains: duplicate domain"),
        "{e}"
    );
}

#[test]
fn yaml_files_load_with_lines() {
    let dir = std::env::temp_dir().join(format!("sluice-config-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("good.yaml"), "domain: edge\ndescriptors:\n  - key: remote_address\n    rate_limit:\n      unit: second\n      requests_per_unit: 5\n").unwrap();
    std::fs::write(dir.join("bad.yaml"), "domain: other\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: second\n      requests_per_unit: many\n").unwrap();
    let c = Config::parse("[envoy]\nfiles = [\"good.yaml\"]\n", "s.toml", Some(&dir)).unwrap();
    assert!(c.domains.has("edge"));
    let e = Config::parse(
        "[envoy]\nfiles = [\"good.yaml\", \"bad.yaml\", \"missing.yaml\"]\n",
        "s.toml",
        Some(&dir),
    )
    .unwrap_err();
    let lines: Vec<String> = e.0.iter().map(|e| e.to_string()).collect();
    assert_eq!(lines.len(), 2, "{lines:#?}");
    assert!(
        lines.iter().any(|l| l.ends_with(
            "bad.yaml:6: descriptors[0].rate_limit.requests_per_unit: invalid type: string \"many\", expected u32"
        ) || l.contains("bad.yaml:6:")),
        "{lines:#?}"
    );
    assert!(
        lines
            .iter()
            .any(|l| l.starts_with("s.toml:2: envoy.files:") && l.contains("missing.yaml")),
        "{lines:#?}"
    );
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn field_paths() {
    let src = "a = 1\n[x]\nb = 2\n[[r]]\nc = 3\n[[r]]\nd = 4\n";
    assert_eq!(field_at(src, 0), "a");
    assert_eq!(field_at(src, src.find("b =").unwrap()), "x.b");
    assert_eq!(field_at(src, src.find("c =").unwrap()), "r[0].c");
    assert_eq!(field_at(src, src.find("d =").unwrap()), "r[1].d");
}

#[test]
fn proxy_settings_are_typed_once() {
    let c = Config::parse(
        "legacy_headers = true\n[proxy]\ntrusted_proxies = [\"10.0.0.0/8\", \"192.168.1.7\"]\n[policies.a]\nalgorithm = \"gcra\"\nrate = \"1/s\"\nidentity = \"bearer\"\n[policies.b]\nalgorithm = \"gcra\"\nrate = \"1/s\"\n",
        "sluice.toml",
        None,
    )
    .unwrap();
    assert_eq!(
        c.proxy.trusted_proxies,
        sluice_http::TrustedProxies::cidrs(&["10.0.0.0/8", "192.168.1.7/32"]).unwrap()
    );
    assert!(c.headers.legacy && c.headers.ratelimit);
    assert!(matches!(
        c.policies["a"].layer_identity,
        Some(sluice_http::IdentitySource::Bearer)
    ));
    assert!(
        c.policies["b"].layer_identity.is_none(),
        "ip: the layer's own fallback"
    );
    let d = Config::parse("", "sluice.toml", None).unwrap();
    assert!(!d.headers.legacy);
    assert_eq!(
        d.proxy.trusted_proxies,
        sluice_http::TrustedProxies::Cidrs(vec![])
    );
}
