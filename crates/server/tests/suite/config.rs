//! The configuration file's newer fields (connection discipline, gRPC limits, access tokens,
//! store memory, local fallback, proxy timeouts), their defaults and their error messages.

use std::time::Duration;

use sluice::FailureMode;
use sluice_server::config::{CheckOptions, Config, ListenerOverrides};
use sluice_server::limits::{ConnectionLimits, GrpcLimits};

fn parse(src: &str) -> Config {
    Config::parse(src, "sluice.toml", None).unwrap_or_else(|e| panic!("{e}"))
}

fn errs(src: &str) -> Vec<String> {
    match Config::parse(src, "sluice.toml", None) {
        Ok(_) => panic!("expected errors in:\n{src}"),
        Err(e) => e.0.iter().map(ToString::to_string).collect(),
    }
}

#[test]
fn new_fields_have_protective_defaults() {
    let c = parse("");
    assert_eq!(c.server.connections, ConnectionLimits::default());
    assert_eq!(
        c.server.connections.header_read_timeout,
        Duration::from_secs(10)
    );
    assert_eq!(c.server.grpc_limits, GrpcLimits::default());
    assert_eq!(c.server.admin, None);
    assert_eq!(c.server.api_token, None);
    assert!(!c.server.public_admin_without_token);
    assert_eq!(c.proxy.connect_timeout, Duration::from_secs(5));
    assert_eq!(
        c.proxy.upstream_timeout,
        Some(Duration::from_secs(30)),
        "on by default"
    );
    assert_eq!(c.store.max_memory, 512 * 1024 * 1024);
    assert_eq!(c.store.local_share, 1.0);
    assert_eq!(c.store.failure_mode, FailureMode::Open);
}

#[test]
fn every_new_field_is_read() {
    let c = parse(
        r#"
[server]
admin = "127.0.0.1:9090"
api_token = "api-secret"
public_admin_without_token = true
header_read_timeout = "2s"
body_timeout = "3s"
idle_timeout = "4s"
max_header_bytes = "32KiB"
max_connections = 900
max_connections_per_ip = 20
connection_reserve = 10
min_body_rate = "2KiB"
body_rate_grace = "3s"
max_bodies_per_ip = 8
write_stall_timeout = "7s"
grpc_keepalive_interval = "15s"
grpc_keepalive_timeout = "5s"
grpc_max_concurrent_streams = 64
grpc_request_timeout = "1500ms"

[store]
max_memory = "1GiB"
failure_mode = "local"
local_share = 0.25

[proxy]
connect_timeout = "250ms"
upstream_timeout = "0s"
"#,
    );
    let s = &c.server;
    assert_eq!(s.admin, Some("127.0.0.1:9090".parse().unwrap()));
    assert_eq!(s.api_token.as_deref(), Some("api-secret"));
    assert!(s.public_admin_without_token);
    assert_eq!(
        s.connections,
        ConnectionLimits {
            header_read_timeout: Duration::from_secs(2),
            body_timeout: Duration::from_secs(3),
            idle_timeout: Duration::from_secs(4),
            max_header_bytes: 32 * 1024,
            max_connections: 900,
            max_connections_per_ip: 20,
            reserve: 10,
            min_body_rate: 2048,
            body_rate_grace: Duration::from_secs(3),
            max_bodies_per_ip: 8,
            write_stall_timeout: Duration::from_secs(7),
        }
    );
    assert_eq!(
        s.grpc_limits,
        GrpcLimits {
            keepalive_interval: Duration::from_secs(15),
            keepalive_timeout: Duration::from_secs(5),
            max_concurrent_streams: 64,
            request_timeout: Duration::from_millis(1500),
            threads: None,
        }
    );
    assert_eq!(c.store.max_memory, 1 << 30);
    assert_eq!(c.store.failure_mode, FailureMode::Local);
    assert_eq!(c.store.local_share, 0.25);
    assert_eq!(c.proxy.connect_timeout, Duration::from_millis(250));
    assert_eq!(c.proxy.upstream_timeout, None, "\"0s\" turns it off");
}

#[test]
fn sizes_take_integers_and_units() {
    assert_eq!(
        parse("[store]\nmax_memory = 268435456\n").store.max_memory,
        256 << 20
    );
    assert_eq!(
        parse("[store]\nmax_memory = \"256MiB\"\n").store.max_memory,
        256 << 20
    );
    assert_eq!(
        parse("[store]\nmax_memory = \"100MB\"\n").store.max_memory,
        100_000_000
    );
    let e = errs("[store]\nmax_memory = \"lots\"\n");
    assert!(
        e[0].starts_with("sluice.toml:2: store.max_memory: invalid size \"lots\""),
        "{e:?}"
    );
    let e = errs("[store]\nmax_memory = -1\n");
    assert!(
        e[0].starts_with("sluice.toml:2: store.max_memory: invalid size -1"),
        "{e:?}"
    );
    let e = errs("[store]\nmax_memory = \"1KiB\"\n");
    assert!(
        e[0].starts_with("sluice.toml:2: store.max_memory: must be between 1048576 and"),
        "{e:?}"
    );
}

#[test]
fn bad_values_name_line_and_field() {
    let src = "\
api_token = \"x\"
[server]
admin = \"localhost:9090\"
header_read_timeout = \"0s\"
body_timeout = \"soon\"
max_header_bytes = 100
max_connections = 50
connection_reserve = 50
grpc_max_concurrent_streams = 0
api_token = \"env:SLUICE_TEST_SURELY_UNSET_API_TOKEN\"
[store]
local_share = 1.5
failure_mode = \"maybe\"
[proxy]
connect_timeout = \"0ms\"
";
    let e = Config::parse(src, "sluice.toml", None);
    // `api_token` at the top level is not a field: it lives in [server].
    let e: Vec<String> = e.unwrap_err().0.iter().map(ToString::to_string).collect();
    assert!(
        e[0].starts_with("sluice.toml:1: api_token: unknown field"),
        "{e:?}"
    );

    let e = errs(&src.replacen("api_token = \"x\"\n", "\n", 1));
    let want = [
        "sluice.toml:3: server.admin: invalid address \"localhost:9090\"",
        "sluice.toml:4: server.header_read_timeout: must be above 0",
        "sluice.toml:5: server.body_timeout: invalid duration \"soon\"",
        "sluice.toml:6: server.max_header_bytes: must be between 8192 and 1048576 bytes",
        "sluice.toml:8: server.connection_reserve: must be below server.max_connections (50)",
        "sluice.toml:9: server.grpc_max_concurrent_streams: must be between 1 and",
        "sluice.toml:10: server.api_token: environment variable SLUICE_TEST_SURELY_UNSET_API_TOKEN is not set",
        "sluice.toml:12: store.local_share: must be above 0 and at most 1",
        "sluice.toml:13: store.failure_mode: unknown failure mode \"maybe\": expected open, closed or local",
        "sluice.toml:15: proxy.connect_timeout: must be above 0",
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
fn a_number_where_a_duration_belongs_gets_a_hint() {
    for (src, field, line) in [
        ("[store]\ntimeout = 50\n", "store.timeout", 2),
        ("[server]\nidle_timeout = 50\n", "server.idle_timeout", 2),
        (
            "[proxy]\nupstream_timeout = 50\n",
            "proxy.upstream_timeout",
            2,
        ),
        (
            "[policies.a]\nalgorithm = \"fixed-window\"\nlimit = 1\nwindow = 50\n",
            "policies.a.window",
            4,
        ),
    ] {
        let e = errs(src);
        assert_eq!(e.len(), 1, "{e:?}");
        assert!(
            e[0].starts_with(&format!("sluice.toml:{line}: {field}: ")),
            "{e:?}"
        );
        assert!(
            e[0].contains("expected a duration string such as \"50ms\""),
            "{e:?}"
        );
    }
}

#[test]
fn a_missing_file_is_named() {
    let path = std::env::temp_dir().join("sluice-surely-missing-dir/sluice.toml");
    let e = Config::load(&path).unwrap_err().to_string();
    assert!(
        e.starts_with(&format!(
            "{}: cannot read the configuration file: ",
            path.display()
        )),
        "{e}"
    );
    assert!(!e.contains(": -: "), "{e}");
}

#[test]
fn no_secrets_mode_checks_the_file_without_its_environment() {
    let src = "admin_token = \"env:SLUICE_TEST_UNSET_ADMIN\"\nidentity_hash_key = \"env:SLUICE_TEST_UNSET_KEY\"\n[server]\napi_token = \"env:SLUICE_TEST_UNSET_API\"\n";
    let e = errs(src);
    assert_eq!(
        e.len(),
        3,
        "normally every unset secret is an error: {e:#?}"
    );
    let lenient = CheckOptions {
        skip_env_secrets: true,
    };
    let c = Config::parse_with(src, "sluice.toml", None, lenient).unwrap();
    assert!(c.admin_token.is_some() && c.server.api_token.is_some());
    // Everything else is still checked.
    let e = Config::parse_with(
        &format!("{src}max_connections = -3\n"),
        "sluice.toml",
        None,
        lenient,
    )
    .unwrap_err();
    assert!(e.to_string().contains("server.max_connections"), "{e}");
    // A literal secret that is wrong is still wrong.
    let e = Config::parse_with(
        "identity_hash_key = \"short\"\n",
        "sluice.toml",
        None,
        lenient,
    )
    .unwrap_err();
    assert!(e.to_string().contains("must be 64 hex digits"), "{e}");
}

#[test]
fn validate_counts_with_proper_plurals() {
    let path = std::path::Path::new("sluice.toml");
    let one = parse("[policies.a]\nalgorithm = \"gcra\"\nrate = \"1/s\"\n");
    let s = sluice_server::cli::summary(path, &one);
    assert_eq!(
        s,
        "sluice.toml: ok (1 policy, 0 routes, 0 Envoy domains, store memory)"
    );
    let two = parse(
        "[policies.a]\nalgorithm = \"gcra\"\nrate = \"1/s\"\n[policies.b]\nalgorithm = \"gcra\"\nrate = \"1/s\"\n[[routes]]\nprefix = \"/\"\npolicies = [\"a\"]\nupstream = \"http://127.0.0.1:9\"\n",
    );
    let s = sluice_server::cli::summary(path, &two);
    assert_eq!(
        s,
        "sluice.toml: ok (2 policies, 1 route, 0 Envoy domains, store memory)"
    );
}

#[test]
fn reload_compares_listeners_with_flags_applied() {
    use sluice_server::reload::listener_changes;
    let flags = ListenerOverrides {
        http: Some("127.0.0.1:18080".parse().unwrap()),
        ..ListenerOverrides::default()
    };
    let mut running = parse("[server]\nhttp = \"127.0.0.1:8080\"\n");
    running.override_listeners(flags);
    // The file is unchanged: the flag still wins, so nothing changed.
    let mut same = parse("[server]\nhttp = \"127.0.0.1:8080\"\n");
    same.override_listeners(running.listener_overrides);
    assert!(listener_changes(&running, &same).is_empty());
    // Without the override the comparison would have reported a change (the old warning).
    assert_eq!(
        listener_changes(&running, &parse("[server]\nhttp = \"127.0.0.1:8080\"\n")).len(),
        1
    );
    // A listener no flag overrides does change.
    let mut moved = parse("[server]\nhttp = \"127.0.0.1:8080\"\ngrpc = \"127.0.0.1:9999\"\n");
    moved.override_listeners(running.listener_overrides);
    let changes = listener_changes(&running, &moved);
    assert_eq!(changes.len(), 1, "{changes:?}");
    assert!(changes[0].starts_with("server.grpc"), "{changes:?}");
}

#[test]
fn refusals_name_their_reason() {
    use sluice_server::reload::refusal;
    let running = parse("[policies.a]\nalgorithm = \"gcra\"\nrate = \"1/s\"\n");
    assert!(refusal("", &running, &parse("")).unwrap().contains("empty"));
    let src = "[store]\nurl = \"memory\"\n";
    let r = refusal(src, &running, &parse(src)).unwrap();
    assert!(r.contains("no policies and no Envoy domains"), "{r}");
    assert!(r.contains("1 policy and 0 domains"), "{r}");
    // A server that runs without policies may reload another file without them.
    assert!(refusal(src, &parse(src), &parse(src)).is_none());
    // Envoy domains alone are limits too.
    let envoy = "[[envoy.domains]]\ndomain = \"edge\"\n[[envoy.domains.descriptors]]\nkey = \"k\"\nrate_limit = { unit = \"second\", requests_per_unit = 1 }\n";
    assert!(refusal(envoy, &running, &parse(envoy)).is_none());
}

#[test]
fn admin_endpoints_on_a_public_address_need_a_token_or_an_override() {
    use sluice_server::cli::{ServeArgs, load};
    let dir = std::env::temp_dir().join(format!("sluice-exposure-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let write = |name: &str, text: &str| {
        let p = dir.join(name);
        std::fs::write(&p, text).unwrap();
        p
    };
    let args = |config: std::path::PathBuf, http: Option<&str>| ServeArgs {
        config: Some(config),
        http: http.map(|a| a.parse().unwrap()),
        grpc: None,
        proxy: None,
        admin: None,
    };
    let open = write("open.toml", "");
    assert!(
        load(&args(open.clone(), None)).is_ok(),
        "loopback by default"
    );
    let e = load(&args(open.clone(), Some("0.0.0.0:8080")))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("server.http: the endpoints that change limits")
            && e.contains("would be served on 0.0.0.0:8080"),
        "{e}"
    );
    assert!(e.contains("public_admin_without_token"), "{e}");
    let token = write("token.toml", "admin_token = \"t\"\n");
    assert!(load(&args(token, Some("0.0.0.0:8080"))).is_ok());
    let loopback_admin = write("admin.toml", "[server]\nadmin = \"127.0.0.1:9090\"\n");
    assert!(
        load(&args(loopback_admin, Some("0.0.0.0:8080"))).is_ok(),
        "admin kept on loopback"
    );
    let public_admin = write("public.toml", "[server]\nadmin = \"0.0.0.0:9090\"\n");
    let e = load(&args(public_admin, None)).unwrap_err().to_string();
    assert!(
        e.contains("server.admin: the endpoints that change limits")
            && e.contains("would be served on 0.0.0.0:9090"),
        "{e}"
    );
    let overridden = write(
        "override.toml",
        "[server]\npublic_admin_without_token = true\n",
    );
    assert!(
        load(&args(overridden, Some("0.0.0.0:8080"))).is_ok(),
        "explicit override"
    );
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn unresponsive_after_defaults_to_half_a_second_and_is_never_below_the_timeout() {
    let c = parse("");
    assert_eq!(c.store.unresponsive_after, Duration::from_millis(500));
    let c = parse("[store]\ntimeout = \"2s\"\n");
    assert_eq!(
        c.store.unresponsive_after,
        Duration::from_secs(2),
        "unset, it follows a longer timeout"
    );
    let c = parse("[store]\nunresponsive_after = \"50ms\"\n");
    assert_eq!(
        c.store.unresponsive_after,
        Duration::from_millis(50),
        "equal to the timeout: fail as soon as a call times out"
    );
    let e = errs("[store]\ntimeout = \"100ms\"\nunresponsive_after = \"60ms\"\n");
    assert_eq!(e.len(), 1, "{e:?}");
    assert!(
        e[0].contains(":3: store.unresponsive_after: must be at least store.timeout (100 ms)"),
        "{e:?}"
    );
}

#[test]
fn grpc_threads_is_kept_and_bounded() {
    assert_eq!(
        parse("").server.grpc_limits.threads,
        None,
        "derived from the store"
    );
    let c = parse("[server]\ngrpc_threads = 0\n");
    assert_eq!(c.server.grpc_limits.threads, Some(0));
    let e = errs("[server]\ngrpc_threads = 257\n");
    assert!(
        e[0].starts_with("sluice.toml:2: server.grpc_threads: must be between 0 and 256"),
        "{e:?}"
    );
}
