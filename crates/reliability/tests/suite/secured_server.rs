//! The `sluice serve` every security test runs against: a configuration with an admin token,
//! a password-protected Redis and one policy per kind of credential, its upstream and its
//! `/metrics`. Shared by `security` and by the `metric_cardinality` binary (which counts series
//! of the process-wide recorder, so it runs in a process of its own).

use std::net::SocketAddr;

use sluice_reliability::serve::{TestServer, client};
use sluice_testkit::servers::{RedisServer, ServerKind};

pub(crate) const ADMIN: &str = "adm1n-t0ken-9f3e2d";
pub(crate) const REDIS_PASSWORD: &str = "r3dis-pa55-77c1a0";

pub(crate) fn config(port: u16, upstream: SocketAddr, trusted: &str) -> String {
    format!(
        r#"
admin_token = "{ADMIN}"

[store]
url = "redis://:{REDIS_PASSWORD}@127.0.0.1:{port}"
timeout = "50ms"

[policies.by-key]
algorithm = "token-bucket"
capacity = 2
rate = "1/h"
identity = "api-key:x-api-key"

[policies.by-bearer]
algorithm = "fixed-window"
limit = 2
window = "1h"
identity = "bearer"

[policies.by-ip]
algorithm = "token-bucket"
capacity = 3
rate = "1/h"
identity = "ip"

[policies.api]
algorithm = "sliding-log"
limit = 5
window = "1h"

[policies.other]
algorithm = "gcra"
rate = "1/s"
burst = 5

[proxy]
trusted_proxies = [{trusted}]

[[routes]]
prefix = "/key"
policies = ["by-key"]
upstream = "http://{upstream}"

[[routes]]
prefix = "/bearer"
policies = ["by-bearer"]
upstream = "http://{upstream}"

[[routes]]
prefix = "/ip"
policies = ["by-ip"]
upstream = "http://{upstream}"
"#
    )
}

pub(crate) async fn upstream() -> SocketAddr {
    let app = axum::Router::new().fallback(|| async { "ok" });
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(l, app).await });
    addr
}

pub(crate) fn redis_with_password() -> RedisServer {
    // The password is on the command line, so a restart comes back with it at once.
    RedisServer::start_with_args(ServerKind::Redis, &["--requirepass", REDIS_PASSWORD])
}

pub(crate) async fn metrics(s: &TestServer) -> String {
    let res = client()
        .get(s.url("/metrics"))
        .bearer_auth(ADMIN)
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 200);
    res.text().await.unwrap()
}
