//! `sluice probe URL`: one HTTP GET, exit 0 on a 2xx answer. The container image has no shell
//! and no curl, so its health check runs the binary itself against its own `/healthz`.
//!
//! Plain `http://` only (the probe targets the instance's own listener), HTTP/1.1 with
//! `Connection: close`, bounded by one timeout for connect, write and read.

use std::io::{Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::time::Duration;

/// The arguments of `sluice probe`.
#[derive(Debug, clap::Args)]
pub struct ProbeArgs {
    /// The URL to GET, e.g. http://127.0.0.1:8080/healthz.
    pub url: String,
    /// The longest the whole probe may take.
    #[arg(long, default_value = "2s", value_parser = humantime::parse_duration)]
    pub timeout: Duration,
}

/// GETs `args.url`; `Ok(status)` for a 2xx answer, otherwise what went wrong.
pub fn run(args: &ProbeArgs) -> Result<u16, String> {
    let rest = args
        .url
        .strip_prefix("http://")
        .ok_or_else(|| format!("{}: only http:// URLs can be probed", args.url))?;
    let (authority, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, "/"),
    };
    let addr = authority
        .to_socket_addrs()
        .map_err(|e| format!("{authority}: {e}"))?
        .next()
        .ok_or_else(|| format!("{authority}: no address"))?;
    let mut stream =
        TcpStream::connect_timeout(&addr, args.timeout).map_err(|e| format!("{addr}: {e}"))?;
    stream
        .set_read_timeout(Some(args.timeout))
        .and_then(|()| stream.set_write_timeout(Some(args.timeout)))
        .map_err(|e| e.to_string())?;
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: {authority}\r\nConnection: close\r\nUser-Agent: sluice-probe\r\n\r\n"
    )
    .map_err(|e| format!("{addr}: {e}"))?;
    let mut head = [0u8; 64];
    let n = stream.read(&mut head).map_err(|e| format!("{addr}: {e}"))?;
    let line = String::from_utf8_lossy(&head[..n]);
    let status: u16 = line
        .strip_prefix("HTTP/1.1 ")
        .or_else(|| line.strip_prefix("HTTP/1.0 "))
        .and_then(|s| s.get(..3))
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| format!("{addr}: not an HTTP answer"))?;
    if (200..300).contains(&status) {
        Ok(status)
    } else {
        Err(format!("{} answered {status}", args.url))
    }
}
