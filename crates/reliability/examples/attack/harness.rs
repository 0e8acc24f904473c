//! The parts every attack shares: a real `sluice serve` child process on free loopback ports
//! (killed when its guard drops, and by a watchdog shell if the driver itself dies), its
//! memory, and a small raw HTTP/1.1 client that can pipeline, so a flood of a million checks
//! is limited by the server and not by the client.

use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};

/// A free loopback port (bound, then released; the OS rarely hands it out again at once).
pub(crate) fn free_port() -> u16 {
    // The kernel may hand a just-released port out again at once; a port is given to one
    // listener of the run only.
    static GIVEN: std::sync::Mutex<Vec<u16>> = std::sync::Mutex::new(Vec::new());
    let mut given = GIVEN.lock().unwrap_or_else(|e| e.into_inner());
    loop {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .expect("bind 127.0.0.1:0");
        if !given.contains(&port) {
            given.push(port);
            return port;
        }
    }
}

/// How a `sluice serve` child is started.
#[derive(Debug, Clone, Default)]
pub(crate) struct Launch {
    /// `prlimit --nofile=N:N`: the child's descriptor limit (soft and hard).
    pub(crate) nofile: Option<u64>,
    /// Extra command-line arguments after `serve --config FILE`.
    pub(crate) args: Vec<String>,
}

/// A running `sluice serve` process; killed (SIGKILL) when dropped.
#[derive(Debug)]
pub(crate) struct Sluice {
    child: Child,
    watchdog: Option<Child>,
    /// The directory holding `sluice.toml` and `sluice.log`.
    pub(crate) dir: PathBuf,
    /// The HTTP listener (decision API, health, admin).
    pub(crate) http: SocketAddr,
    /// The gRPC listener.
    pub(crate) grpc: SocketAddr,
}

/// `[server]` lines for fresh loopback ports; returns them with the chosen addresses.
pub(crate) fn server_section() -> (String, SocketAddr, SocketAddr) {
    let http: SocketAddr = ([127, 0, 0, 1], free_port()).into();
    let grpc: SocketAddr = ([127, 0, 0, 1], free_port()).into();
    let proxy: SocketAddr = ([127, 0, 0, 1], free_port()).into();
    (
        format!("[server]\nhttp = \"{http}\"\ngrpc = \"{grpc}\"\nproxy = \"{proxy}\"\n"),
        http,
        grpc,
    )
}

fn temp_dir(tag: &str) -> PathBuf {
    use std::sync::atomic::{AtomicU32, Ordering};
    static N: AtomicU32 = AtomicU32::new(0);
    let dir = std::env::temp_dir().join(format!(
        "sluice-attack-{tag}-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("create temp dir");
    dir
}

/// A shell that SIGKILLs `pid` once the driver is gone (ctrl-c, SIGKILL, abort).
fn watchdog(pid: u32) -> Option<Child> {
    let parent = std::process::id();
    let script = format!(
        "while kill -0 {parent} 2>/dev/null && kill -0 {pid} 2>/dev/null; do sleep 1; done; kill -9 {pid} 2>/dev/null"
    );
    Command::new("sh")
        .arg("-c")
        .arg(script)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .ok()
}

impl Sluice {
    /// Writes `toml` (which must contain the `[server]` section from [`server_section`]) and
    /// starts `bin serve --config FILE`. Waits up to 15 s for `/healthz`; `Err` carries the
    /// log when the process exits or never answers.
    pub(crate) async fn start(
        bin: &Path,
        toml: &str,
        http: SocketAddr,
        grpc: SocketAddr,
        launch: &Launch,
    ) -> Result<Sluice, String> {
        let dir = temp_dir("srv");
        let file = dir.join("sluice.toml");
        std::fs::write(&file, toml).expect("write config");
        let log = std::fs::File::create(dir.join("sluice.log")).expect("create log");
        let mut cmd = match launch.nofile {
            Some(n) => {
                let mut c = Command::new("prlimit");
                c.arg(format!("--nofile={n}:{n}")).arg("--").arg(bin);
                c
            }
            None => Command::new(bin),
        };
        cmd.arg("serve")
            .arg("--config")
            .arg(&file)
            .args(&launch.args)
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("clone log"))
            .stderr(log);
        let child = cmd.spawn().map_err(|e| format!("spawn {bin:?}: {e}"))?;
        let mut s = Sluice {
            watchdog: watchdog(child.id()),
            child,
            dir,
            http,
            grpc,
        };
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            if let Ok(Some(status)) = s.child.try_wait() {
                return Err(format!("exited with {status}: {}", s.log_tail()));
            }
            if let Ok(r) = get(http, "/healthz", Duration::from_millis(500)).await
                && r.status == 200
            {
                return Ok(s);
            }
            if Instant::now() > deadline {
                return Err(format!("no /healthz within 15 s: {}", s.log_tail()));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// The process id (the same after `prlimit`, which execs the server).
    pub(crate) fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The configuration file.
    pub(crate) fn config_file(&self) -> PathBuf {
        self.dir.join("sluice.toml")
    }

    /// Resident memory now, in MB.
    pub(crate) fn rss_mb(&self) -> f64 {
        proc_status_mb(self.pid(), "VmRSS:")
    }

    /// Peak resident memory so far, in MB.
    pub(crate) fn peak_rss_mb(&self) -> f64 {
        proc_status_mb(self.pid(), "VmHWM:")
    }

    /// Whether the process still runs.
    pub(crate) fn is_running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// The last lines the server logged (for a figure that says why it stopped).
    pub(crate) fn log_tail(&self) -> String {
        let log = std::fs::read_to_string(self.dir.join("sluice.log")).unwrap_or_default();
        let lines: Vec<&str> = log.lines().filter(|l| !l.trim().is_empty()).collect();
        lines[lines.len().saturating_sub(3)..].join(" | ")
    }
}

impl Drop for Sluice {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if let Some(mut w) = self.watchdog.take() {
            let _ = w.kill();
            let _ = w.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn proc_status_mb(pid: u32, field: &str) -> f64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .map_or(0.0, |kb| kb / 1024.0)
}

/// Connects to `addr` from the source address `from` (port chosen by the kernel), or from the
/// kernel's choice when `None`. All of 127.0.0.0/8 is loopback on Linux, so an attack can come
/// from 127.0.0.2 while the probes come from 127.0.0.1: the server tells them apart exactly as
/// it would tell one abusive client from everyone else.
pub(crate) async fn connect_from(
    from: Option<IpAddr>,
    addr: SocketAddr,
) -> std::io::Result<TcpStream> {
    let Some(ip) = from else {
        return TcpStream::connect(addr).await;
    };
    let socket = match ip {
        IpAddr::V4(_) => TcpSocket::new_v4()?,
        IpAddr::V6(_) => TcpSocket::new_v6()?,
    };
    socket.bind(SocketAddr::new(ip, 0))?;
    socket.connect(addr).await
}

/// The `n`th of the attack's loopback source addresses, 127.0.0.2 upwards (`n` < 250).
pub(crate) fn attacker_ip(n: usize) -> IpAddr {
    assert!(n < 250, "loopback source addresses run out at 127.0.0.251");
    IpAddr::from([127, 0, 0, 2 + n as u8])
}

/// The sum of a counter's samples in a server's `/metrics` whose labels include every one of
/// `labels` (`key="value"`); 0 when absent or unreadable.
pub(crate) async fn counter_sum(s: &Sluice, name: &str, labels: &[&str]) -> u64 {
    let Ok(r) = get(s.http, "/metrics", Duration::from_secs(5)).await else {
        return 0;
    };
    String::from_utf8_lossy(&r.body)
        .lines()
        .filter(|l| l.starts_with(name) && l[name.len()..].starts_with([' ', '{']))
        .filter(|l| labels.iter().all(|want| l.contains(want)))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>() as u64
}

/// One HTTP answer.
#[derive(Debug, Clone)]
pub(crate) struct Answer {
    pub(crate) status: u16,
    pub(crate) body: Vec<u8>,
}

impl Answer {
    /// The body as JSON (`Null` when it is not JSON).
    pub(crate) fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).unwrap_or(serde_json::Value::Null)
    }
}

/// The bytes of a request with an optional JSON body and extra header lines.
pub(crate) fn request(
    method: &str,
    path: &str,
    body: Option<&str>,
    headers: &[(&str, &str)],
) -> Vec<u8> {
    let mut r = format!("{method} {path} HTTP/1.1\r\nhost: 127.0.0.1\r\n");
    for (k, v) in headers {
        r.push_str(&format!("{k}: {v}\r\n"));
    }
    match body {
        Some(b) => r.push_str(&format!(
            "content-type: application/json\r\ncontent-length: {}\r\n\r\n{b}",
            b.len()
        )),
        None => r.push_str("content-length: 0\r\n\r\n"),
    }
    r.into_bytes()
}

/// A keep-alive HTTP/1.1 connection that writes requests back to back and reads the answers
/// in order (pipelining).
pub(crate) struct Conn {
    stream: TcpStream,
    buf: Vec<u8>,
}

impl Conn {
    pub(crate) async fn open(addr: SocketAddr, timeout: Duration) -> std::io::Result<Conn> {
        Self::open_from(None, addr, timeout).await
    }

    /// Opens a connection from the loopback source address `from` (`None`: the kernel's choice,
    /// 127.0.0.1 for a loopback target).
    pub(crate) async fn open_from(
        from: Option<IpAddr>,
        addr: SocketAddr,
        timeout: Duration,
    ) -> std::io::Result<Conn> {
        let stream = tokio::time::timeout(timeout, connect_from(from, addr))
            .await
            .map_err(|_| {
                std::io::Error::new(std::io::ErrorKind::TimedOut, "connect timed out")
            })??;
        stream.set_nodelay(true)?;
        Ok(Conn {
            stream,
            buf: Vec::with_capacity(16 * 1024),
        })
    }

    /// Sends every request in `batch`, then reads as many answers, all within `timeout`.
    pub(crate) async fn exchange(
        &mut self,
        batch: &[Vec<u8>],
        timeout: Duration,
    ) -> std::io::Result<Vec<Answer>> {
        let work = async {
            let all: Vec<u8> = batch.concat();
            self.stream.write_all(&all).await?;
            let mut out = Vec::with_capacity(batch.len());
            while out.len() < batch.len() {
                out.push(self.read_answer().await?);
            }
            Ok(out)
        };
        tokio::time::timeout(timeout, work)
            .await
            .map_err(|_| std::io::Error::new(std::io::ErrorKind::TimedOut, "answer timed out"))?
    }

    async fn fill(&mut self) -> std::io::Result<()> {
        let mut chunk = [0u8; 16 * 1024];
        let n = self.stream.read(&mut chunk).await?;
        if n == 0 {
            return Err(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                "connection closed",
            ));
        }
        self.buf.extend_from_slice(&chunk[..n]);
        Ok(())
    }

    async fn read_answer(&mut self) -> std::io::Result<Answer> {
        let head_end = loop {
            if let Some(i) = self.buf.windows(4).position(|w| w == b"\r\n\r\n") {
                break i + 4;
            }
            self.fill().await?;
        };
        let head = String::from_utf8_lossy(&self.buf[..head_end]).to_ascii_lowercase();
        let status = head
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .unwrap_or(0);
        let len: usize = head
            .lines()
            .find_map(|l| l.strip_prefix("content-length:"))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0);
        while self.buf.len() < head_end + len {
            self.fill().await?;
        }
        let body = self.buf[head_end..head_end + len].to_vec();
        self.buf.drain(..head_end + len);
        Ok(Answer { status, body })
    }
}

/// One request on a fresh connection.
pub(crate) async fn send(
    addr: SocketAddr,
    req: Vec<u8>,
    timeout: Duration,
) -> std::io::Result<Answer> {
    let mut c = Conn::open(addr, timeout).await?;
    let mut a = c.exchange(&[req], timeout).await?;
    Ok(a.remove(0))
}

/// `GET path` on a fresh connection.
pub(crate) async fn get(
    addr: SocketAddr,
    path: &str,
    timeout: Duration,
) -> std::io::Result<Answer> {
    send(addr, request("GET", path, None, &[]), timeout).await
}

/// `POST /v1/check` with `body` on a fresh connection.
pub(crate) async fn check(
    addr: SocketAddr,
    body: &str,
    timeout: Duration,
) -> std::io::Result<Answer> {
    send(addr, request("POST", "/v1/check", Some(body), &[]), timeout).await
}

/// Whether the gRPC listener answers an HTTP/2 connection preface with its SETTINGS frame.
pub(crate) async fn grpc_answers(addr: SocketAddr, timeout: Duration) -> bool {
    let work = async {
        let mut s = TcpStream::connect(addr).await?;
        // Preface, then an empty SETTINGS frame (length 0, type 4, flags 0, stream 0).
        s.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00")
            .await?;
        let mut head = [0u8; 9];
        s.read_exact(&mut head).await?;
        Ok::<bool, std::io::Error>(head[3] == 4)
    };
    matches!(tokio::time::timeout(timeout, work).await, Ok(Ok(true)))
}

/// Outcome counts of a flood of `/v1/check` requests.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct FloodCount {
    pub(crate) sent: u64,
    pub(crate) ok: u64,
    pub(crate) other_status: u64,
    pub(crate) errors: u64,
}

/// Sends `total` checks built by `body(i)` over `conns` keep-alive connections, `depth`
/// pipelined per round trip; stops early at `deadline`. Reconnects after an error (at most
/// 1,000 errors in all).
pub(crate) async fn flood<F>(
    addr: SocketAddr,
    total: u64,
    conns: usize,
    depth: usize,
    deadline: Instant,
    body: F,
) -> FloodCount
where
    F: Fn(u64) -> String + Send + Sync + 'static,
{
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU64, Ordering};
    let next = Arc::new(AtomicU64::new(0));
    let body = Arc::new(body);
    let mut tasks = Vec::new();
    for _ in 0..conns {
        let (next, body) = (Arc::clone(&next), Arc::clone(&body));
        tasks.push(tokio::spawn(async move {
            let mut c = FloodCount::default();
            let mut conn: Option<Conn> = None;
            while Instant::now() < deadline && c.errors < 1_000 / conns as u64 + 1 {
                let start = next.fetch_add(depth as u64, Ordering::Relaxed);
                if start >= total {
                    break;
                }
                let end = (start + depth as u64).min(total);
                let batch: Vec<Vec<u8>> = (start..end)
                    .map(|i| request("POST", "/v1/check", Some(&body(i)), &[]))
                    .collect();
                if conn.is_none() {
                    conn = Conn::open(addr, Duration::from_secs(5)).await.ok();
                }
                let Some(cn) = conn.as_mut() else {
                    c.errors += 1;
                    continue;
                };
                c.sent += batch.len() as u64;
                match cn.exchange(&batch, Duration::from_secs(30)).await {
                    Ok(answers) => {
                        for a in answers {
                            if a.status == 200 {
                                c.ok += 1;
                            } else {
                                c.other_status += 1;
                            }
                        }
                    }
                    Err(_) => {
                        c.errors += 1;
                        conn = None;
                    }
                }
            }
            c
        }));
    }
    let mut sum = FloodCount::default();
    for t in tasks {
        if let Ok(c) = t.await {
            sum.sent += c.sent;
            sum.ok += c.ok;
            sum.other_status += c.other_status;
            sum.errors += c.errors;
        }
    }
    sum
}
