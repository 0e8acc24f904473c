//! Connection discipline against real listeners on loopback: slow heads, idle keep-alive,
//! oversized heads, stalled bodies, the global cap with its health reserve, the per-IP cap and
//! the gRPC limits. Each limit is set small in code so each attack runs in about a second.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use sluice_server::limits::{ConnectionLimits, GrpcLimits};
use sluice_server::{BoundAddrs, Config, Listeners};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::oneshot;

use crate::support::listener::{metrics_text, rejected, turn};

const CONFIG: &str = r#"
[policies.burst]
algorithm = "token-bucket"
capacity = 1000
rate = "1/min"
"#;

const CHECK: &str = r#"{"policy":"burst","identity":"user:1"}"#;

/// A server on 127.0.0.1:0 with the given limits; stopped (and checked to stop cleanly) by
/// [`Server::stop`].
struct Server {
    addrs: BoundAddrs,
    stop: Option<oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<Result<(), sluice_server::ServeError>>,
    /// The temporary directory of the configuration file, removed by `stop`.
    dir: std::path::PathBuf,
}

/// Limits that stay out of the way; each test lowers the one it exercises.
fn relaxed() -> ConnectionLimits {
    ConnectionLimits {
        header_read_timeout: Duration::from_secs(20),
        body_timeout: Duration::from_secs(20),
        idle_timeout: Duration::from_secs(20),
        max_header_bytes: 16 * 1024,
        max_connections: 1000,
        max_connections_per_ip: 0,
        reserve: 16,
        ..ConnectionLimits::default()
    }
}

async fn serve(connections: ConnectionLimits, grpc: GrpcLimits) -> Server {
    let dir = sluice_server::testing::temp_dir("conn");
    let file = dir.join("sluice.toml");
    std::fs::write(&file, CONFIG).unwrap();
    let mut config = Config::load(&file).unwrap();
    let any: SocketAddr = "127.0.0.1:0".parse().unwrap();
    config.server.http = any;
    config.server.grpc = any;
    config.server.connections = connections;
    config.server.grpc_limits = grpc;
    let listeners = Listeners::bind(&config).await.unwrap();
    let addrs = listeners.addrs();
    let (tx, rx) = oneshot::channel::<()>();
    let task = tokio::spawn(sluice_server::run(config, listeners, async move {
        let _ = rx.await;
    }));
    Server {
        addrs,
        stop: Some(tx),
        task,
        dir,
    }
}

impl Server {
    async fn stop(mut self) {
        let _ = self.stop.take().unwrap().send(());
        tokio::time::timeout(Duration::from_secs(15), self.task)
            .await
            .expect("server stops within 15 s")
            .unwrap()
            .expect("server ran cleanly");
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Sends one request on a fresh connection and returns the status, or `None` when the
/// connection was closed or timed out without an answer.
async fn status_of(addr: SocketAddr, method: &str, path: &str, body: &str) -> Option<u16> {
    answer_of(addr, method, path, body)
        .await?
        .get(9..12)?
        .parse()
        .ok()
}

/// The whole answer (head and body) to one request on a fresh connection.
async fn answer_of(addr: SocketAddr, method: &str, path: &str, body: &str) -> Option<String> {
    let fut = async {
        let mut s = TcpStream::connect(addr).await.ok()?;
        let req = format!(
            "{method} {path} HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        );
        s.write_all(req.as_bytes()).await.ok()?;
        let mut out = Vec::new();
        let _ = s.read_to_end(&mut out).await;
        Some(String::from_utf8_lossy(&out).into_owned())
    };
    tokio::time::timeout(Duration::from_secs(5), fut)
        .await
        .ok()
        .flatten()
}

/// Reads until the peer closes; returns how long that took, or `None` if it stayed open for
/// `within`. Bytes the server sends first (an error response) are returned too.
async fn closed_within(s: &mut TcpStream, within: Duration) -> Option<(Duration, String)> {
    let start = Instant::now();
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    let deadline = tokio::time::Instant::now() + within;
    loop {
        match tokio::time::timeout_at(deadline, s.read(&mut buf)).await {
            Err(_) => return None,
            Ok(Ok(0)) | Ok(Err(_)) => {
                return Some((start.elapsed(), String::from_utf8_lossy(&out).into()));
            }
            Ok(Ok(n)) => out.extend_from_slice(&buf[..n]),
        }
    }
}

/// Opens `n` connections that send nothing.
async fn hold(addr: SocketAddr, n: usize) -> Vec<TcpStream> {
    let mut held = Vec::with_capacity(n);
    for _ in 0..n {
        held.push(TcpStream::connect(addr).await.unwrap());
    }
    // Let the accept loop take them all before the caller measures anything.
    tokio::time::sleep(Duration::from_millis(300)).await;
    held
}

#[tokio::test]
async fn slowloris_heads_are_closed_after_the_header_read_timeout() {
    let _turn = turn().await;
    let s = serve(
        ConnectionLimits {
            header_read_timeout: Duration::from_millis(300),
            ..relaxed()
        },
        GrpcLimits::default(),
    )
    .await;
    let before = metrics_text(s.addrs.http).await;
    // Ten partial heads, and one that trickles a header line every 100 ms.
    let opened = Instant::now();
    let mut partial = Vec::new();
    for _ in 0..10 {
        let mut c = TcpStream::connect(s.addrs.http).await.unwrap();
        c.write_all(b"GET /healthz HTTP/1.1\r\nHost: t\r\n")
            .await
            .unwrap();
        partial.push(c);
    }
    let mut trickle = TcpStream::connect(s.addrs.http).await.unwrap();
    trickle
        .write_all(b"GET /healthz HTTP/1.1\r\n")
        .await
        .unwrap();
    let trickler = tokio::spawn(async move {
        let start = Instant::now();
        for i in 0..30 {
            if trickle
                .write_all(format!("X-Slow-{i}: 1\r\n").as_bytes())
                .await
                .is_err()
            {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        // The server's close shows up as an EOF once the writes stop being accepted.
        closed_within(&mut trickle, Duration::from_secs(1))
            .await
            .map(|_| start.elapsed())
    });
    for c in &mut partial {
        closed_within(c, Duration::from_secs(3))
            .await
            .expect("a partial head is closed within 3 s");
    }
    let took = opened.elapsed();
    assert!(
        took >= Duration::from_millis(250),
        "closed too early: {took:?}"
    );
    let took = trickler
        .await
        .unwrap()
        .expect("the trickling head is closed");
    assert!(took < Duration::from_secs(3), "trickle held {took:?}");
    assert_eq!(
        status_of(s.addrs.http, "GET", "/healthz", "").await,
        Some(200)
    );
    let after = metrics_text(s.addrs.http).await;
    let counted = rejected(&after, "header_timeout") - rejected(&before, "header_timeout");
    assert!(
        counted >= 1.0,
        "no header_timeout rejection counted:\n{after}"
    );
    s.stop().await;
}

#[tokio::test]
async fn idle_keep_alive_connections_are_closed_after_the_idle_timeout() {
    let _turn = turn().await;
    let s = serve(
        ConnectionLimits {
            idle_timeout: Duration::from_millis(300),
            ..relaxed()
        },
        GrpcLimits::default(),
    )
    .await;
    let before = metrics_text(s.addrs.http).await;
    let mut c = TcpStream::connect(s.addrs.http).await.unwrap();
    c.write_all(b"GET /healthz HTTP/1.1\r\nHost: t\r\n\r\n")
        .await
        .unwrap();
    let mut buf = [0u8; 1024];
    let n = c.read(&mut buf).await.unwrap();
    assert!(buf[..n].starts_with(b"HTTP/1.1 200"), "{:?}", &buf[..n]);
    let (took, _) = closed_within(&mut c, Duration::from_secs(3))
        .await
        .expect("an idle keep-alive connection is closed within 3 s");
    assert!(
        took >= Duration::from_millis(200),
        "closed too early: {took:?}"
    );
    let after = metrics_text(s.addrs.http).await;
    let counted = rejected(&after, "idle") - rejected(&before, "idle");
    assert!(counted >= 1.0, "no idle rejection counted:\n{after}");
    s.stop().await;
}

#[tokio::test]
async fn an_oversized_head_is_refused_and_the_server_stays_healthy() {
    let _turn = turn().await;
    let s = serve(relaxed(), GrpcLimits::default()).await;
    for _ in 0..20 {
        let mut c = TcpStream::connect(s.addrs.http).await.unwrap();
        let big = "a".repeat(64 * 1024);
        let head = format!("GET /healthz HTTP/1.1\r\nHost: t\r\nX-Big: {big}\r\n\r\n");
        // The server may close before it has read everything; that is a refusal too.
        let _ = c.write_all(head.as_bytes()).await;
        let (_, answer) = closed_within(&mut c, Duration::from_secs(3))
            .await
            .expect("an oversized head ends the connection");
        assert!(
            answer.is_empty() || answer.starts_with("HTTP/1.1 431"),
            "answer to a 64 KiB head: {:?}",
            answer.lines().next()
        );
    }
    assert_eq!(
        status_of(s.addrs.http, "GET", "/healthz", "").await,
        Some(200)
    );
    assert_eq!(
        status_of(s.addrs.http, "POST", "/v1/check", CHECK).await,
        Some(200)
    );
    s.stop().await;
}

#[tokio::test]
async fn a_stalled_body_ends_with_408() {
    let _turn = turn().await;
    let s = serve(
        ConnectionLimits {
            body_timeout: Duration::from_millis(300),
            ..relaxed()
        },
        GrpcLimits::default(),
    )
    .await;
    let before = metrics_text(s.addrs.http).await;
    let mut c = TcpStream::connect(s.addrs.http).await.unwrap();
    c.write_all(
        b"POST /v1/check HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"pol",
    )
    .await
    .unwrap();
    let (took, answer) = closed_within(&mut c, Duration::from_secs(3))
        .await
        .expect("a stalled body ends the request within 3 s");
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer:?}");
    assert!(answer.contains("application/problem+json"), "{answer:?}");
    assert!(
        took >= Duration::from_millis(200),
        "ended too early: {took:?}"
    );
    // A body that arrives in time is served.
    assert_eq!(
        status_of(s.addrs.http, "POST", "/v1/check", CHECK).await,
        Some(200)
    );
    let after = metrics_text(s.addrs.http).await;
    let counted = rejected(&after, "body_timeout") - rejected(&before, "body_timeout");
    assert!(
        counted >= 1.0,
        "no body_timeout rejection counted:\n{after}"
    );
    s.stop().await;
}

/// Opens `n` connections, each in the middle of a request: a `/v1/check` head whose body
/// never comes (so each holds a request in flight until `body_timeout`).
async fn hold_busy(addr: SocketAddr, n: usize) -> Vec<TcpStream> {
    let mut held = Vec::with_capacity(n);
    for _ in 0..n {
        let mut s = TcpStream::connect(addr).await.unwrap();
        s.write_all(
            b"POST /v1/check HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{",
        )
        .await
        .unwrap();
        held.push(s);
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    held
}

/// Waits (up to 10 s) until the server has admitted the connections held at `addr` into all
/// of its normal slots: a decision on a fresh connection is then answered from the reserve,
/// with 503. The listeners accept on runtimes of their own, so a fixed pause after connecting
/// does not say that the server has counted them yet.
async fn until_normal_slots_are_held(addr: SocketAddr) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let answer = answer_of(addr, "POST", "/v1/check", CHECK).await;
        if answer
            .as_deref()
            .is_some_and(|a| a.starts_with("HTTP/1.1 503"))
        {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the held connections never filled the normal slots: {answer:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Opens `n` connections that send nothing, from `addresses` loopback addresses
/// (127.0.0.2 and up) in turn, as a few clients behind the per-IP cap would.
async fn hold_from(addr: SocketAddr, n: usize, addresses: u8) -> Vec<TcpStream> {
    let mut held = Vec::with_capacity(n);
    for i in 0..n {
        let from: SocketAddr = format!("127.0.0.{}:0", 2 + (i % usize::from(addresses)))
            .parse()
            .unwrap();
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket.bind(from).unwrap();
        held.push(socket.connect(addr).await.unwrap());
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    held
}

/// How many of `held` the server has closed (EOF or reset), without blocking.
fn closed_count(held: &mut [TcpStream]) -> usize {
    let mut buf = [0u8; 64];
    held.iter_mut()
        .filter(|s| match s.try_read(&mut buf) {
            Ok(0) => true,
            Ok(_) => false,
            Err(e) => e.kind() != std::io::ErrorKind::WouldBlock,
        })
        .count()
}

#[tokio::test]
async fn at_the_connection_cap_health_still_answers_and_checks_resume_after() {
    let _turn = turn().await;
    let s = serve(
        ConnectionLimits {
            max_connections: 40,
            reserve: 30,
            // One address holds the cap with bodies in progress, beyond the per-address cap.
            max_bodies_per_ip: 0,
            ..relaxed()
        },
        GrpcLimits::default(),
    )
    .await;
    let before = metrics_text(s.addrs.http).await;
    // The cap is held by connections doing work (requests in flight): nothing to displace.
    let held = hold_busy(s.addrs.http, 40).await;
    assert_eq!(
        status_of(s.addrs.http, "GET", "/healthz", "").await,
        Some(200)
    );
    assert_eq!(
        status_of(s.addrs.http, "GET", "/readyz", "").await,
        Some(200)
    );
    // Beyond the cap, decisions wait for a normal connection, told so in problem+json.
    let answer = answer_of(s.addrs.http, "POST", "/v1/check", CHECK)
        .await
        .unwrap();
    assert!(answer.starts_with("HTTP/1.1 503"), "{answer:?}");
    assert!(
        answer.contains("content-type: application/problem+json"),
        "{answer:?}"
    );
    assert!(answer.contains("\"status\":503"), "{answer:?}");
    drop(held);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        status_of(s.addrs.http, "POST", "/v1/check", CHECK).await,
        Some(200)
    );
    let after = metrics_text(s.addrs.http).await;
    let counted = rejected(&after, "reserve_only") - rejected(&before, "reserve_only");
    assert!(
        counted >= 1.0,
        "no reserve_only rejection counted:\n{after}"
    );
    let open = r#"sluice_connections_open{listener="http"}"#;
    assert!(after.contains(open), "{open} missing from /metrics");
    s.stop().await;
}

/// Idle sockets from several addresses, each under the per-IP cap, fill the cap and the
/// reserve (the finding: 1,100 sockets from 5 addresses switched off /healthz, /v1/check and
/// gRPC until they timed out). Idle connections are displaced by newcomers, so health and
/// decisions keep answering, and the attacker's sockets are closed one per newcomer.
#[tokio::test]
async fn idle_sockets_from_several_addresses_cannot_hold_the_cap_or_the_reserve() {
    let _turn = turn().await;
    let s = serve(
        ConnectionLimits {
            max_connections: 40,
            reserve: 10,
            max_connections_per_ip: 12,
            ..relaxed()
        },
        GrpcLimits::default(),
    )
    .await;
    let before = metrics_text(s.addrs.http).await;
    // 5 addresses x 12 = 60 idle sockets: more than the cap and the reserve together.
    let mut held = hold_from(s.addrs.http, 60, 5).await;
    for _ in 0..3 {
        assert_eq!(
            status_of(s.addrs.http, "GET", "/healthz", "").await,
            Some(200),
            "health answers although idle sockets hold the cap and the reserve"
        );
        assert_eq!(
            status_of(s.addrs.http, "POST", "/v1/check", CHECK).await,
            Some(200),
            "a decision is served: an idle socket made room"
        );
    }
    // gRPC: an HTTP/2 preface is answered with SETTINGS (an idle HTTP socket made room).
    assert!(
        !grpc_settings(s.addrs.grpc).await.is_empty(),
        "the gRPC port answers"
    );
    tokio::time::sleep(Duration::from_millis(200)).await;
    let closed = closed_count(&mut held);
    assert!(
        closed >= 7,
        "each newcomer displaced one idle socket: {closed} of 60 closed"
    );
    let after = metrics_text(s.addrs.http).await;
    let counted = rejected(&after, "displaced") - rejected(&before, "displaced");
    assert!(counted >= 1.0, "no displaced rejection counted:\n{after}");
    s.stop().await;
}

#[tokio::test]
async fn the_per_ip_cap_refuses_extra_connections_under_pressure() {
    let _turn = turn().await;
    let s = serve(
        ConnectionLimits {
            max_connections: 8,
            max_connections_per_ip: 5,
            ..relaxed()
        },
        GrpcLimits::default(),
    )
    .await;
    let before = metrics_text(s.addrs.http).await;
    let mut held = hold(s.addrs.http, 5).await;
    // A sixth connection from another address: 6 of 8 is under pressure.
    let _other = hold_from(s.addrs.http, 1, 1).await;
    let answer = answer_of(s.addrs.http, "GET", "/healthz", "")
        .await
        .unwrap();
    assert!(
        answer.starts_with("HTTP/1.1 503") && answer.contains("retry-after: 1"),
        "the sixth connection from one address is answered, then closed: {answer:?}"
    );
    held.pop();
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(
        status_of(s.addrs.http, "GET", "/healthz", "").await,
        Some(200)
    );
    let after = metrics_text(s.addrs.http).await;
    let counted = rejected(&after, "per_ip") - rejected(&before, "per_ip");
    assert!(counted >= 1.0, "no per_ip rejection counted:\n{after}");
    s.stop().await;
}

/// The SETTINGS the gRPC listener sends to a fresh HTTP/2 connection, as (id, value) pairs.
async fn grpc_settings(addr: SocketAddr) -> Vec<(u16, u32)> {
    let mut c = TcpStream::connect(addr).await.unwrap();
    c.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
        .await
        .unwrap();
    c.write_all(&[0, 0, 0, 4, 0, 0, 0, 0, 0]).await.unwrap();
    let read = async {
        let mut head = [0u8; 9];
        c.read_exact(&mut head).await.unwrap();
        assert_eq!(head[3], 4, "first frame is SETTINGS");
        let len = u32::from_be_bytes([0, head[0], head[1], head[2]]) as usize;
        let mut payload = vec![0u8; len];
        c.read_exact(&mut payload).await.unwrap();
        payload
            .chunks(6)
            .map(|p| {
                (
                    u16::from_be_bytes([p[0], p[1]]),
                    u32::from_be_bytes([p[2], p[3], p[4], p[5]]),
                )
            })
            .collect()
    };
    tokio::time::timeout(Duration::from_secs(3), read)
        .await
        .unwrap()
}

#[tokio::test]
async fn grpc_advertises_its_stream_cap_and_answers_health_while_http_is_saturated() {
    let _turn = turn().await;
    let s = serve(
        ConnectionLimits {
            max_connections: 20,
            reserve: 5,
            ..relaxed()
        },
        GrpcLimits {
            max_concurrent_streams: 7,
            ..GrpcLimits::default()
        },
    )
    .await;
    // HTTP connections doing work (requests in flight) hold the cap: nothing to displace.
    let held = hold_busy(s.addrs.http, 20).await;
    until_normal_slots_are_held(s.addrs.http).await;
    let url = format!("http://{}", s.addrs.grpc);
    let channel = tonic::transport::Endpoint::from_shared(url)
        .unwrap()
        .connect_timeout(Duration::from_secs(2))
        .timeout(Duration::from_secs(3))
        .connect()
        .await
        .unwrap();
    let mut health = tonic_health::pb::health_client::HealthClient::new(channel.clone());
    let answer = health
        .check(tonic_health::pb::HealthCheckRequest {
            service: String::new(),
        })
        .await
        .expect("health answers on a reserve connection")
        .into_inner();
    assert_eq!(
        answer.status(),
        tonic_health::pb::health_check_response::ServingStatus::Serving
    );
    // The same reserve connection refuses rate limit calls.
    use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
    use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
    let err = RateLimitServiceClient::new(channel)
        .should_rate_limit(RateLimitRequest {
            domain: "edge".into(),
            ..Default::default()
        })
        .await
        .expect_err("rate limit calls are refused on a reserve connection");
    assert_eq!(err.code(), tonic::Code::Unavailable, "{err}");
    drop(held);
    // The stream cap, asked last: a connection opened before the hold could still be
    // counted (its close not yet seen by the listener's thread) while the cap fills.
    const MAX_CONCURRENT_STREAMS: u16 = 3;
    assert!(
        grpc_settings(s.addrs.grpc)
            .await
            .contains(&(MAX_CONCURRENT_STREAMS, 7))
    );
    s.stop().await;
}
