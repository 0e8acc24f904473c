//! The reverse proxy's paths against real upstream frameworks: every spelling FastAPI serves
//! as `/login` counts against the `/login` route, a `case_insensitive` route counts every case
//! Express routes to its `/login`, and a path with no safe normal form is answered 400 with
//! nothing forwarded. The upstreams count what reached their handlers.

use std::net::SocketAddr;

use crate::support::start;
use sluice_testkit::upstream::Upstream;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// `/login` limited to 3 per 15 minutes per address, everything else to 10,000.
fn config(upstream: &str, case_insensitive: bool) -> String {
    format!(
        r#"
[policies.login]
algorithm = "fixed-window"
limit = 3
window = "15m"
identity = "ip"

[policies.generous]
algorithm = "fixed-window"
limit = 10000
window = "15m"
identity = "ip"

[[routes]]
prefix = "/login"
policies = ["login"]
upstream = "{upstream}"
case_insensitive = {case_insensitive}

[[routes]]
prefix = "/"
policies = ["generous"]
upstream = "{upstream}"
"#
    )
}

/// Sends `method target` exactly as written (no client-side URL clean-up) on a fresh
/// connection; the status code and the body.
async fn send(addr: SocketAddr, method: &str, target: &str) -> (u16, String) {
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    let head = format!(
        "{method} {target} HTTP/1.1\r\nHost: sluice.test\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
    );
    s.write_all(head.as_bytes()).await.unwrap();
    let mut out = Vec::new();
    s.read_to_end(&mut out).await.unwrap();
    let text = String::from_utf8_lossy(&out).into_owned();
    let status = text
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = text
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    (status, body)
}

#[tokio::test]
async fn spellings_fastapi_serves_as_login_count_against_the_login_limit() {
    let up = Upstream::fastapi();
    let s = start(&config(&up.url(), false)).await;
    let proxy = s.addrs.proxy.unwrap();
    let spellings = [
        "/%6cogin",
        "//login",
        "/./login",
        "/%6Cogin",
        "/x/../login",
        "///login",
        "/%6c%6f%67%69%6e",
        "/login/.",
        "/./%6cogin",
        "//%6cogin",
    ];
    let mut statuses = Vec::new();
    for target in spellings {
        statuses.push(
            send(proxy, "POST", &format!("{target}?password=wrong"))
                .await
                .0,
        );
    }
    assert_eq!(&statuses[..3], [401, 401, 401], "{statuses:?}");
    assert!(statuses[3..].iter().all(|&s| s == 429), "{statuses:?}");
    assert_eq!(send(proxy, "POST", "/login?password=wrong").await.0, 429);
    assert_eq!(up.hits("login"), 3, "{}", up.hits_json());
    // FastAPI received exactly the normalized path that was limited, query included.
    let hits = up.hits_json();
    assert_eq!(
        hits.matches("\"/login?password=wrong\"").count(),
        3,
        "{hits}"
    );
    // Other paths are not charged to /login.
    assert_eq!(send(proxy, "GET", "/loginx").await.0, 200);
    s.stop().await;
}

#[tokio::test]
async fn a_case_insensitive_route_counts_every_case_express_routes_to_login() {
    let up = Upstream::express();
    // Without the option, Express still serves /LOGIN and /Login from its /login handler:
    // the reason for the option.
    let s = start(&config(&up.url(), false)).await;
    let proxy = s.addrs.proxy.unwrap();
    for target in ["/LOGIN", "/Login"] {
        for _ in 0..5 {
            assert_eq!(
                send(proxy, "POST", &format!("{target}?password=wrong"))
                    .await
                    .0,
                401
            );
        }
    }
    assert_eq!(up.hits("login"), 10);
    s.stop().await;
    drop(up);

    let up = Upstream::express();
    let s = start(&config(&up.url(), true)).await;
    let proxy = s.addrs.proxy.unwrap();
    let mut statuses = Vec::new();
    for target in ["/LOGIN", "/Login"] {
        for _ in 0..10 {
            statuses.push(
                send(proxy, "POST", &format!("{target}?password=wrong"))
                    .await
                    .0,
            );
        }
    }
    assert_eq!(
        statuses.iter().filter(|&&s| s == 401).count(),
        3,
        "{statuses:?}"
    );
    assert_eq!(
        statuses.iter().filter(|&&s| s == 429).count(),
        17,
        "{statuses:?}"
    );
    assert_eq!(send(proxy, "POST", "/login?password=wrong").await.0, 429);
    assert_eq!(up.hits("login"), 3, "{}", up.hits_json());
    // The case is the client's: Express saw /LOGIN, as sent.
    assert!(up.hits_json().contains("\"/LOGIN?password=wrong\""));
    s.stop().await;
}

#[tokio::test]
async fn ambiguous_paths_get_400_and_reach_no_upstream() {
    for up in [Upstream::fastapi(), Upstream::express()] {
        let s = start(&config(&up.url(), true)).await;
        let proxy = s.addrs.proxy.unwrap();
        for target in [
            "/login%2F",
            "/x%2F..%2Flogin",
            "/x%2f..%2flogin",
            "/login%5C",
            "/x%5C..%5Clogin",
            "/x\\..\\login",
            "/login%00",
            "/%6",
            "/%zzogin",
            "/%2e%2e/login",
            "/x/%2E%2E/login",
            "/%2e/login",
        ] {
            let (status, body) = send(proxy, "POST", target).await;
            assert_eq!(status, 400, "{target}: {body}");
            if !target.contains('\\') {
                // (a raw backslash may already be refused by the HTTP parser)
                assert!(body.contains("\"detail\""), "{target}: {body}");
            }
        }
        assert_eq!(
            (up.hits("login"), up.hits("other")),
            (0, 0),
            "{:?}: {}",
            up.framework,
            up.hits_json()
        );
        assert!(
            up.hits_json().contains("\"targets\":[]"),
            "{}",
            up.hits_json()
        );
        s.stop().await;
    }
}

#[test]
fn a_route_prefix_that_is_not_a_normalized_path_is_a_config_error() {
    for (prefix, says) in [
        ("//login", "write \"/login\""),
        ("/%6cogin", "write \"/login\""),
        ("/a/../login", "write \"/login\""),
        ("/a%2Fb", "encoded slash"),
    ] {
        let toml =
            format!("[[routes]]\nprefix = \"{prefix}\"\nupstream = \"http://127.0.0.1:9\"\n");
        let err = sluice_server::Config::parse(&toml, "sluice.toml", None)
            .unwrap_err()
            .to_string();
        assert!(err.contains("sluice.toml:2: routes[0].prefix"), "{err}");
        assert!(err.contains(says), "{prefix}: {err}");
    }
}
