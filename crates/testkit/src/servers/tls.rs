//! TLS fixtures: a throwaway CA and certificates made with `openssl`, and a TLS-only
//! `redis-server` using them.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::{TempDir, free_port, watchdog};

/// A throwaway certificate authority with a server certificate (for `127.0.0.1` and
/// `localhost`) and a client certificate, made with the `openssl` command-line tool in a
/// temporary directory (removed on drop). Keys are PKCS#8 PEM.
#[derive(Debug)]
pub struct TlsFiles {
    dir: TempDir,
}

impl TlsFiles {
    /// Generates the CA and both certificates.
    pub fn generate() -> Self {
        let dir = TempDir::new("tls");
        let ext = dir.0.join("ext.cnf");
        std::fs::write(
            &ext,
            "[server]\nsubjectAltName=IP:127.0.0.1,DNS:localhost\nbasicConstraints=CA:FALSE\n\
             keyUsage=digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth\n\
             [client]\nbasicConstraints=CA:FALSE\nkeyUsage=digitalSignature,keyEncipherment\n\
             extendedKeyUsage=clientAuth\n",
        )
        .expect("write ext.cnf");
        let openssl = |args: &[&str]| {
            let out = Command::new("openssl")
                .args(args)
                .current_dir(&dir.0)
                .output()
                .expect("run openssl");
            assert!(
                out.status.success(),
                "openssl {args:?} failed: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        };
        openssl(&[
            "req",
            "-x509",
            "-new",
            "-nodes",
            "-newkey",
            "rsa:2048",
            "-keyout",
            "ca.key",
            "-out",
            "ca.pem",
            "-days",
            "2",
            "-subj",
            "/CN=sluice test CA",
            "-addext",
            "basicConstraints=critical,CA:TRUE",
            "-addext",
            "keyUsage=critical,keyCertSign,cRLSign",
        ]);
        for (name, section, serial) in [("server", "server", "1001"), ("client", "client", "1002")]
        {
            openssl(&[
                "req",
                "-new",
                "-nodes",
                "-newkey",
                "rsa:2048",
                "-keyout",
                &format!("{name}.key"),
                "-out",
                &format!("{name}.csr"),
                "-subj",
                &format!("/CN=sluice test {name}"),
            ]);
            openssl(&[
                "x509",
                "-req",
                "-in",
                &format!("{name}.csr"),
                "-CA",
                "ca.pem",
                "-CAkey",
                "ca.key",
                "-set_serial",
                serial,
                "-days",
                "2",
                "-out",
                &format!("{name}.pem"),
                "-extfile",
                "ext.cnf",
                "-extensions",
                section,
            ]);
        }
        Self { dir }
    }

    /// A file in the directory (`ca.pem`, `server.pem`, `server.key`, `client.pem`,
    /// `client.key`, `ca.key`).
    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.0.join(name)
    }

    /// The CA certificate.
    pub fn ca(&self) -> PathBuf {
        self.path("ca.pem")
    }
}

/// A `redis-server` that accepts TLS only (`--port 0 --tls-port <free>`), with the server
/// certificate of a [`TlsFiles`]. `auth_clients` is `no`, `optional` or `yes`.
#[derive(Debug)]
pub struct TlsRedisServer {
    port: u16,
    ca: PathBuf,
    child: Option<Child>,
    watchdog: Option<Child>,
    dir: TempDir,
}

impl TlsRedisServer {
    /// Starts the server and waits until it answers `PING` over TLS.
    pub fn start(files: &TlsFiles, auth_clients: &str) -> Self {
        let mut last_err = String::new();
        for _ in 0..5 {
            let dir = TempDir::new("redis-tls");
            let port = free_port(false);
            let log = std::fs::File::create(dir.0.join("server.log")).expect("log file");
            let mut child = Command::new("redis-server")
                .args([
                    "--port",
                    "0",
                    "--bind",
                    "127.0.0.1",
                    "--save",
                    "",
                    "--appendonly",
                    "no",
                ])
                .arg("--dir")
                .arg(&dir.0)
                .arg("--tls-port")
                .arg(port.to_string())
                .arg("--tls-cert-file")
                .arg(files.path("server.pem"))
                .arg("--tls-key-file")
                .arg(files.path("server.key"))
                .arg("--tls-ca-cert-file")
                .arg(files.ca())
                .arg("--tls-auth-clients")
                .arg(auth_clients)
                .stdin(Stdio::null())
                .stdout(log.try_clone().expect("log file"))
                .stderr(log)
                .spawn()
                .expect("spawn redis-server");
            let mut s = Self {
                port,
                ca: files.ca(),
                child: None,
                watchdog: watchdog(child.id(), &dir.0),
                dir,
            };
            let deadline = Instant::now() + Duration::from_secs(10);
            let ok = loop {
                if let Ok(Some(status)) = child.try_wait() {
                    last_err = format!(
                        "exited with {status}: {}",
                        std::fs::read_to_string(s.dir.0.join("server.log")).unwrap_or_default()
                    );
                    break false;
                }
                if s.tls_cli(files, &["PING"]).contains("PONG") {
                    break true;
                }
                if Instant::now() > deadline {
                    last_err = "no PONG over TLS within 10 s".into();
                    break false;
                }
                std::thread::sleep(Duration::from_millis(50));
            };
            if ok {
                s.child = Some(child);
                return s;
            }
            let _ = child.kill();
            let _ = child.wait();
        }
        panic!("could not start a TLS redis-server: {last_err}");
    }

    fn tls_cli(&self, files: &TlsFiles, args: &[&str]) -> String {
        let out = Command::new("redis-cli")
            .args(["--tls", "--cacert"])
            .arg(&self.ca)
            .arg("--cert")
            .arg(files.path("client.pem"))
            .arg("--key")
            .arg(files.path("client.key"))
            .args(["-h", "127.0.0.1", "-p", &self.port.to_string()])
            .args(args)
            .output()
            .expect("run redis-cli");
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Runs `redis-cli --tls` (with the client certificate) against this server.
    pub fn cli(&self, files: &TlsFiles, args: &[&str]) -> String {
        self.tls_cli(files, args)
    }

    /// The TLS port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `rediss://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("rediss://127.0.0.1:{}", self.port)
    }
}

impl Drop for TlsRedisServer {
    fn drop(&mut self) {
        for c in [self.child.take(), self.watchdog.take()]
            .into_iter()
            .flatten()
        {
            let mut c = c;
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}
