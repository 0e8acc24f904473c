//! What the connection tests share: a `sluice serve` in the test process on 127.0.0.1:0 with
//! chosen connection limits, and a plain HTTP/1.1 client on a raw socket, so that every
//! transport error (a close without an answer) is seen as one rather than retried away.

#![allow(dead_code)]

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use sluice_server::limits::ConnectionLimits;
use sluice_server::{BoundAddrs, Config, Listeners};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};
use tokio::sync::oneshot;

/// One policy generous enough that every check in these tests is admitted.
pub(crate) const CONFIG: &str = r#"
[policies.burst]
algorithm = "token-bucket"
capacity = 1000000
rate = "1000000/s"
"#;

/// A check against [`CONFIG`].
pub(crate) const CHECK: &str = r#"{"policy":"burst","identity":"user:1"}"#;

/// Whose turn it is at the connection counters. `sluice_connections_rejected_total` lives in
/// the one Prometheus recorder of the process, which every server the suite starts shares, and
/// a test that attacks a server's connection limits adds to it. So the tests that do take
/// turns (each holds [`turn`] for its whole run) and count the rejections of their own server
/// as the difference from what `/metrics` showed once it started ([`rejected`] of both).
static CONNECTION_COUNTERS: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// This test's turn at the connection counters, until the guard drops.
pub(crate) async fn turn() -> tokio::sync::MutexGuard<'static, ()> {
    CONNECTION_COUNTERS.lock().await
}

/// A running server; [`Server::stop`] stops it and checks that it stopped cleanly.
pub(crate) struct Server {
    pub(crate) addrs: BoundAddrs,
    stop: Option<oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<Result<(), sluice_server::ServeError>>,
    /// The temporary directory of the configuration file, removed by `stop`.
    dir: std::path::PathBuf,
}

/// A server with `connections` as its connection limits (`None`: the configured defaults).
pub(crate) async fn serve(connections: Option<ConnectionLimits>) -> Server {
    let dir = sluice_server::testing::temp_dir("conn-fair");
    let file = dir.join("sluice.toml");
    std::fs::write(&file, CONFIG).unwrap();
    let mut config = Config::load(&file).unwrap();
    let any: SocketAddr = "127.0.0.1:0".parse().unwrap();
    config.server.http = any;
    config.server.grpc = any;
    if let Some(c) = connections {
        config.server.connections = c;
    }
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
    pub(crate) async fn stop(mut self) {
        let _ = self.stop.take().unwrap().send(());
        tokio::time::timeout(Duration::from_secs(20), self.task)
            .await
            .expect("server stops within 20 s")
            .unwrap()
            .expect("server ran cleanly");
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A TCP connection to `to` from the loopback address `from`.
pub(crate) async fn connect_from(from: IpAddr, to: SocketAddr) -> std::io::Result<TcpStream> {
    let socket = if from.is_ipv4() {
        TcpSocket::new_v4()?
    } else {
        TcpSocket::new_v6()?
    };
    socket.bind(SocketAddr::new(from, 0))?;
    let s = socket.connect(to).await?;
    s.set_nodelay(true)?;
    Ok(s)
}

/// One HTTP/1.1 answer.
#[derive(Debug)]
pub(crate) struct Answer {
    pub(crate) status: u16,
    /// The head, lowercased.
    pub(crate) head: String,
    pub(crate) body: String,
}

/// Sends one request on `s` (kept alive unless `close`) and reads its answer; an error is a
/// transport error: the connection closed or failed without a complete answer.
pub(crate) async fn request(
    s: &mut TcpStream,
    method: &str,
    path: &str,
    body: &str,
    close: bool,
) -> std::io::Result<Answer> {
    let req = format!(
        "{method} {path} HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\n{}\r\n{body}",
        body.len(),
        if close { "Connection: close\r\n" } else { "" },
    );
    s.write_all(req.as_bytes()).await?;
    read_answer(s).await
}

/// Reads one answer (head, then a `content-length` body) from `s`.
pub(crate) async fn read_answer(s: &mut TcpStream) -> std::io::Result<Answer> {
    let eof = || {
        std::io::Error::new(
            std::io::ErrorKind::UnexpectedEof,
            "closed without an answer",
        )
    };
    let mut buf = Vec::with_capacity(1024);
    let mut chunk = [0u8; 4096];
    let head_end = loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
        let n = s.read(&mut chunk).await?;
        if n == 0 {
            return Err(eof());
        }
        buf.extend_from_slice(&chunk[..n]);
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).to_ascii_lowercase();
    let status = head
        .get(9..12)
        .and_then(|s| s.parse().ok())
        .ok_or_else(eof)?;
    let len: usize = head
        .lines()
        .find_map(|l| l.strip_prefix("content-length:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0);
    while buf.len() < head_end + len {
        let n = s.read(&mut chunk).await?;
        if n == 0 {
            return Err(eof());
        }
        buf.extend_from_slice(&chunk[..n]);
    }
    Ok(Answer {
        status,
        head,
        body: String::from_utf8_lossy(&buf[head_end..head_end + len]).into_owned(),
    })
}

/// The Prometheus text of the server's `/metrics`, fetched on a fresh connection.
pub(crate) async fn metrics_text(addr: SocketAddr) -> String {
    reqwest::Client::builder()
        .no_proxy()
        .build()
        .unwrap()
        .get(format!("http://{addr}/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap()
}

/// The value of the metric series `series` (name and labels, exactly), or 0.
pub(crate) fn metric(text: &str, series: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.trim().parse().ok())
        .unwrap_or(0.0)
}

/// `sluice_connections_rejected_total` of the HTTP listener for `reason` in the Prometheus
/// text `text`, or 0.
pub(crate) fn rejected(text: &str, reason: &str) -> f64 {
    metric(
        text,
        &format!(r#"sluice_connections_rejected_total{{listener="http",reason="{reason}"}}"#),
    )
}
