//! Real upstream applications for the reverse proxy's tests: a small FastAPI app (served by
//! uvicorn) and a small Express 5 app, each on a free loopback port.
//!
//! The proxy's promises are about what reaches the application behind it, and the frameworks
//! differ exactly where an attacker looks: FastAPI decodes `/%6cogin` to `/login` before
//! routing, Express routes `/LOGIN` to `/login`. So the tests run the real frameworks, never an
//! imitation. Both apps serve the same endpoints and count what reached their handlers:
//!
//! - `GET|POST /login?password=...`: a password check (200 for `right`, 401 otherwise);
//!   counted as `login`.
//! - `GET|POST /slow?ms=N`: counted as `slow` on entry, answers 200 after `N` ms (default 300)
//!   and then counts `slow_done`.
//! - anything else: counted as `other`, answers 200 with the path it received.
//! - `GET /__hits`: the counts and every request target received, as JSON (not counted).
//!
//! The app's source is written to a fresh temporary directory; the process is killed on drop
//! (and by a watchdog if the test process dies first). Interpreters: `$SLUICE_UPSTREAM_PYTHON`
//! (else `.tools/venv/bin/python` at the workspace root) with fastapi and uvicorn, and `node`
//! from `PATH` with `express` from `$SLUICE_UPSTREAM_NODE_PATH` (else
//! `.tools/upstreams/node_modules`); `scripts/install-test-deps` installs them.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::servers::{TempDir, free_port, watchdog};

const FASTAPI_APP: &str = r#"
import asyncio
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

app = FastAPI()
hits = {"login": 0, "slow": 0, "slow_done": 0, "other": 0}
targets = []

@app.middleware("http")
async def record(request: Request, call_next):
    if request.url.path != "/__hits":
        raw = request.scope.get("raw_path", b"").decode("latin-1")
        qs = request.scope.get("query_string", b"").decode("latin-1")
        targets.append(raw + ("?" + qs if qs else ""))
    return await call_next(request)

@app.get("/__hits")
async def get_hits():
    return {**hits, "targets": targets}

@app.api_route("/login", methods=["GET", "POST"])
async def login(password: str = ""):
    hits["login"] += 1
    if password == "right":
        return {"ok": True}
    return JSONResponse({"ok": False}, status_code=401)

@app.api_route("/slow", methods=["GET", "POST"])
async def slow(ms: int = 300):
    hits["slow"] += 1
    await asyncio.sleep(ms / 1000)
    hits["slow_done"] += 1
    return {"ok": True}

@app.api_route("/{rest:path}", methods=["GET", "POST", "PUT", "DELETE", "PATCH"])
async def other(request: Request, rest: str):
    hits["other"] += 1
    return {"path": request.url.path}
"#;

const EXPRESS_APP: &str = r#"
const express = require('express');
const app = express();
const hits = { login: 0, slow: 0, slow_done: 0, other: 0 };
const targets = [];

app.use((req, res, next) => {
  if (req.path !== '/__hits') targets.push(req.originalUrl);
  next();
});
app.get('/__hits', (req, res) => res.json({ ...hits, targets }));
app.all('/login', (req, res) => {
  hits.login += 1;
  if (req.query.password === 'right') res.json({ ok: true });
  else res.status(401).json({ ok: false });
});
app.all('/slow', (req, res) => {
  hits.slow += 1;
  const ms = Number(req.query.ms || 300);
  setTimeout(() => { hits.slow_done += 1; res.json({ ok: true }); }, ms);
});
app.all('/{*rest}', (req, res) => {
  hits.other += 1;
  res.json({ path: req.path });
});
const server = app.listen(Number(process.argv[2]), '127.0.0.1');
server.keepAliveTimeout = 60000;
"#;

/// Which framework an [`Upstream`] runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Framework {
    /// FastAPI on uvicorn.
    FastApi,
    /// Express 5 on Node.js.
    Express,
}

/// A running upstream app; killed on drop.
#[derive(Debug)]
pub struct Upstream {
    /// The framework it runs.
    pub framework: Framework,
    /// Its loopback port.
    pub port: u16,
    child: Child,
    watchdog: Option<Child>,
    _dir: TempDir,
}

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn from_env(var: &str, default: &str) -> PathBuf {
    match std::env::var_os(var) {
        Some(v) if !v.is_empty() => PathBuf::from(v),
        _ => workspace_root().join(default),
    }
}

impl Upstream {
    /// The FastAPI app. Panics with the remedy when Python, FastAPI or uvicorn is missing.
    pub fn fastapi() -> Upstream {
        let python = from_env("SLUICE_UPSTREAM_PYTHON", ".tools/venv/bin/python");
        assert!(
            python.exists(),
            "{}: no Python with FastAPI: set SLUICE_UPSTREAM_PYTHON or run scripts/install-test-deps",
            python.display()
        );
        let dir = TempDir::new("fastapi");
        std::fs::write(dir.0.join("app.py"), FASTAPI_APP).expect("write app.py");
        let port = free_port(false);
        let mut cmd = Command::new(python);
        cmd.args(["-m", "uvicorn", "app:app", "--host", "127.0.0.1", "--port"])
            .arg(port.to_string())
            .args(["--log-level", "warning", "--no-access-log"])
            .current_dir(&dir.0);
        Self::spawn(Framework::FastApi, cmd, port, dir)
    }

    /// The Express app. Panics with the remedy when Node.js or Express is missing.
    pub fn express() -> Upstream {
        let modules = from_env("SLUICE_UPSTREAM_NODE_PATH", ".tools/upstreams/node_modules");
        assert!(
            modules.join("express").exists(),
            "{}: no express module: set SLUICE_UPSTREAM_NODE_PATH or run scripts/install-test-deps",
            modules.display()
        );
        let dir = TempDir::new("express");
        std::fs::write(dir.0.join("app.js"), EXPRESS_APP).expect("write app.js");
        let port = free_port(false);
        let mut cmd = Command::new("node");
        cmd.arg("app.js")
            .arg(port.to_string())
            .env("NODE_PATH", &modules)
            .current_dir(&dir.0);
        Self::spawn(Framework::Express, cmd, port, dir)
    }

    fn spawn(framework: Framework, mut cmd: Command, port: u16, dir: TempDir) -> Upstream {
        let child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap_or_else(|e| panic!("start the {framework:?} upstream: {e}"));
        let watchdog = watchdog(child.id(), &dir.0);
        let mut up = Upstream {
            framework,
            port,
            child,
            watchdog,
            _dir: dir,
        };
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if up.get("/__hits").is_ok_and(|b| b.contains("targets")) {
                return up;
            }
            if let Ok(Some(status)) = up.child.try_wait() {
                panic!("the {framework:?} upstream exited before it was ready: {status}");
            }
            assert!(
                Instant::now() < deadline,
                "the {framework:?} upstream was not ready within 20 s"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// `http://127.0.0.1:PORT`, for a route's `upstream`.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// The body of `GET path` sent straight to the app (not through the proxy).
    pub fn get(&self, path: &str) -> std::io::Result<String> {
        let mut s = TcpStream::connect_timeout(
            &([127, 0, 0, 1], self.port).into(),
            Duration::from_secs(2),
        )?;
        s.set_read_timeout(Some(Duration::from_secs(5)))?;
        write!(
            s,
            "GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
        )?;
        let mut raw = Vec::new();
        s.read_to_end(&mut raw)?;
        let text = String::from_utf8_lossy(&raw);
        let (head, body) = text
            .split_once("\r\n\r\n")
            .ok_or_else(|| std::io::Error::other("no response head"))?;
        if head
            .to_ascii_lowercase()
            .contains("transfer-encoding: chunked")
        {
            return Ok(dechunk(body));
        }
        Ok(body.to_string())
    }

    /// The app's counts and received targets, as JSON:
    /// `{"login":N,"slow":N,"slow_done":N,"other":N,"targets":[...]}`.
    pub fn hits_json(&self) -> String {
        self.get("/__hits").expect("read the upstream's hits")
    }

    /// One count (`login`, `slow`, `slow_done` or `other`).
    pub fn hits(&self, name: &str) -> u64 {
        let json = self.hits_json();
        let key = format!("\"{name}\":");
        let at = json
            .find(&key)
            .unwrap_or_else(|| panic!("no {name} in {json}"))
            + key.len();
        json[at..]
            .trim_start()
            .chars()
            .take_while(char::is_ascii_digit)
            .collect::<String>()
            .parse()
            .unwrap_or_else(|_| panic!("no count for {name} in {json}"))
    }
}

/// The payload of a chunked body.
fn dechunk(body: &str) -> String {
    let mut out = String::new();
    let mut rest = body;
    while let Some((size, after)) = rest.split_once("\r\n") {
        let Ok(n) = usize::from_str_radix(size.trim(), 16) else {
            break;
        };
        if n == 0 || after.len() < n {
            break;
        }
        out.push_str(&after[..n]);
        rest = after[n..].trim_start_matches("\r\n");
    }
    out
}

impl Drop for Upstream {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if let Some(w) = &mut self.watchdog {
            let _ = w.kill();
            let _ = w.wait();
        }
    }
}
