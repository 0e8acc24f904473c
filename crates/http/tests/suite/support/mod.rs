//! Shared test plumbing: serve on 127.0.0.1:0 with axum, speak real HTTP/1.1 with hyper.
#![allow(dead_code, unreachable_pub)]

use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, Request, StatusCode};
use http_body_util::{BodyExt, Empty};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

/// Serves `app` on a free loopback port with the socket peer available to the layer.
pub async fn serve(app: axum::Router) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        axum::serve(
            listener,
            app.into_make_service_with_connect_info::<SocketAddr>(),
        )
        .await
        .unwrap();
    });
    addr
}

/// A complete response.
#[derive(Debug)]
pub struct Reply {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Bytes,
}

impl Reply {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).map(|v| v.to_str().unwrap())
    }
    pub fn text(&self) -> &str {
        std::str::from_utf8(&self.body).unwrap()
    }
}

fn request(path: &str, headers: &[(&str, &str)]) -> Request<Empty<Bytes>> {
    let mut b = Request::get(path).header("host", "sluice.test");
    for (n, v) in headers {
        b = b.header(*n, *v);
    }
    b.body(Empty::new()).unwrap()
}

/// An open response whose body has not been read; dropping it closes the connection.
pub struct Open {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Incoming,
    conn: JoinHandle<()>,
}

impl Open {
    /// Closes the TCP connection mid-response.
    pub fn disconnect(self) {
        self.conn.abort();
        drop(self.body);
    }
}

/// Sends a GET on a fresh connection and returns once the response head arrived.
pub async fn open(addr: SocketAddr, path: &str, headers: &[(&str, &str)]) -> Result<Open, String> {
    let stream = TcpStream::connect(addr).await.map_err(|e| e.to_string())?;
    let (mut send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|e| e.to_string())?;
    let conn = tokio::spawn(async move {
        let _ = conn.await;
    });
    let res = tokio::time::timeout(
        Duration::from_secs(5),
        send.send_request(request(path, headers)),
    )
    .await
    .map_err(|_| "timed out".to_string())?
    .map_err(|e| e.to_string())?;
    let (parts, body) = res.into_parts();
    Ok(Open {
        status: parts.status,
        headers: parts.headers,
        body,
        conn,
    })
}

/// Sends a GET and reads the whole response (5 s at most).
pub async fn try_get(
    addr: SocketAddr,
    path: &str,
    headers: &[(&str, &str)],
) -> Result<Reply, String> {
    let o = open(addr, path, headers).await?;
    let body = tokio::time::timeout(Duration::from_secs(5), o.body.collect())
        .await
        .map_err(|_| "body timed out".to_string())?
        .map_err(|e| e.to_string())?
        .to_bytes();
    Ok(Reply {
        status: o.status,
        headers: o.headers,
        body,
    })
}

pub async fn get(addr: SocketAddr, path: &str, headers: &[(&str, &str)]) -> Reply {
    try_get(addr, path, headers).await.unwrap()
}

/// Polls `path` until it answers 200, at most `tries` times 20 ms apart; the statuses seen.
pub async fn until_ok(
    addr: SocketAddr,
    path: &str,
    headers: &[(&str, &str)],
    tries: usize,
) -> Vec<u16> {
    let mut seen = Vec::new();
    for _ in 0..tries {
        let r = get(addr, path, headers).await;
        seen.push(r.status.as_u16());
        if r.status == StatusCode::OK {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    seen
}
