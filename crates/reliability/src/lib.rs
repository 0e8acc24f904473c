//! `sluice-reliability`: the harness of the fault, hostile-input and security suites (in
//! `tests/`) and of the soak driver (`examples/soak.rs`, run by `scripts/soak`).
//!
//! Nothing here is a mock: [`serve`] runs the real `sluice serve` entry point
//! (`sluice_server::run`) on `127.0.0.1:0`, the Redis servers come from
//! `sluice_testkit::servers`, [`logs`] captures the real tracing output of a test's runtime, and
//! [`prom`] reads the real `/metrics` text.
//!
//! # Layout
//! - [`fuzzing`]: the fuzz targets' bodies, shared with `fuzz/` and the regression tests.
//! - [`serve`]: start and stop `sluice serve` from configuration text.
//! - [`prom`]: read counters out of Prometheus text.
//! - [`logs`]: a tracing subscriber for one test's runtime that keeps every line for inspection.
//! - [`Tally`]: worst latency and outcome counts of a load run, for the figures in
//!   `docs/reliability.md`.
#![forbid(unsafe_code)]

use std::time::Duration;

pub mod fuzzing;

pub mod serve {
    //! `sluice serve` on loopback ports chosen by the OS (the harness lives in
    //! [`sluice_server::testing`], shared with the server's own tests).

    pub use sluice_server::testing::{TestServer, start, start_with, temp_dir};

    /// An HTTP client that never goes through a proxy from the environment.
    pub fn client() -> reqwest::Client {
        reqwest::Client::builder()
            .no_proxy()
            .build()
            .expect("reqwest client")
    }
}

pub mod prom {
    //! Reading the Prometheus text format.

    /// The value of the sample `name` whose labels include every `(label, value)` in `labels`,
    /// summed over the samples that match (0 when none does).
    pub fn sum(text: &str, name: &str, labels: &[(&str, &str)]) -> f64 {
        samples(text)
            .filter(|s| {
                s.name == name
                    && labels
                        .iter()
                        .all(|(k, v)| s.labels.iter().any(|(a, b)| a == k && b == v))
            })
            .map(|s| s.value)
            .sum()
    }

    /// One sample line.
    #[derive(Debug, Clone, PartialEq)]
    pub struct Sample {
        /// The metric name.
        pub name: String,
        /// Label pairs, unescaped.
        pub labels: Vec<(String, String)>,
        /// The value.
        pub value: f64,
    }

    /// Every sample of `text` (comments skipped).
    pub fn samples(text: &str) -> impl Iterator<Item = Sample> + '_ {
        text.lines()
            .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
            .filter_map(parse_line)
    }

    fn parse_line(line: &str) -> Option<Sample> {
        let (head, value) = line.rsplit_once(' ')?;
        let value: f64 = value.trim().parse().ok()?;
        let (name, labels) = match head.find('{') {
            None => (head.trim().to_string(), Vec::new()),
            Some(i) => {
                let body = head[i + 1..].trim_end().strip_suffix('}')?;
                (head[..i].to_string(), parse_labels(body))
            }
        };
        Some(Sample {
            name,
            labels,
            value,
        })
    }

    fn parse_labels(body: &str) -> Vec<(String, String)> {
        let mut out = Vec::new();
        let b: Vec<char> = body.chars().collect();
        let mut i = 0;
        while i < b.len() {
            let start = i;
            while i < b.len() && b[i] != '=' {
                i += 1;
            }
            let key: String = b[start..i]
                .iter()
                .collect::<String>()
                .trim()
                .trim_start_matches(',')
                .trim()
                .to_string();
            i += 2; // `="`
            let mut val = String::new();
            while i < b.len() && b[i] != '"' {
                if b[i] == '\\' && i + 1 < b.len() {
                    i += 1;
                    val.push(if b[i] == 'n' { '\n' } else { b[i] });
                } else {
                    val.push(b[i]);
                }
                i += 1;
            }
            i += 1; // closing quote
            while i < b.len() && b[i] == ',' {
                i += 1;
            }
            out.push((key, val));
        }
        out
    }

    #[cfg(test)]
    mod tests {
        #[test]
        fn reads_labelled_samples() {
            let t = "# HELP x y\nsluice_store_failures_total{mode=\"open\"} 3\nsluice_store_failures_total{mode=\"closed\"} 2\nup 1\n";
            assert_eq!(super::sum(t, "sluice_store_failures_total", &[]), 5.0);
            assert_eq!(
                super::sum(t, "sluice_store_failures_total", &[("mode", "open")]),
                3.0
            );
            assert_eq!(super::sum(t, "up", &[]), 1.0);
        }
    }
}

pub mod logs {
    //! Tracing events, formatted as the `sluice` binary formats them, kept in memory so tests
    //! can search them (for leaked credentials, for the failure log line).
    //!
    //! The subscriber is scoped to the threads of one test's runtime, not set for the process:
    //! the tests of a test binary share one process, and the others neither land in the buffer
    //! nor pay for formatting every event at TRACE.

    use std::future::Future;
    use std::io::Write;
    use std::sync::Arc;

    use parking_lot::Mutex;
    use tracing::Dispatch;

    #[derive(Clone, Default)]
    struct Buffer(Arc<Mutex<Vec<u8>>>);

    impl Write for Buffer {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    /// A buffer and the subscriber that writes every event of the threads it runs on to it.
    #[derive(Clone)]
    pub struct Capture {
        buffer: Buffer,
        dispatch: Dispatch,
    }

    impl std::fmt::Debug for Capture {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.debug_struct("Capture")
                .field("bytes", &self.buffer.0.lock().len())
                .finish()
        }
    }

    impl Default for Capture {
        fn default() -> Self {
            Self::new()
        }
    }

    impl Capture {
        /// An empty capture: TRACE for sluice crates, so nothing logged at any level escapes
        /// a scan of [`Capture::text`].
        pub fn new() -> Self {
            let buffer = Buffer::default();
            let writer = buffer.clone();
            let filter = tracing_subscriber::EnvFilter::new(
                "trace,h2=info,hyper=info,tower=info,tonic=info,reqwest=info",
            );
            let sub = tracing_subscriber::fmt()
                .with_env_filter(filter)
                .with_ansi(false)
                .with_writer(move || writer.clone())
                .finish();
            Self {
                buffer,
                dispatch: Dispatch::new(sub),
            }
        }

        /// Runs `body` to completion on a new multi-thread runtime with `workers` workers,
        /// every thread of which (the calling one, the workers, the blocking pool) logs here.
        pub fn block_on<F: Future>(&self, workers: usize, body: F) -> F::Output {
            let dispatch = self.dispatch.clone();
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(workers)
                .enable_all()
                .on_thread_start(move || {
                    // The runtime's threads end with it, and the default with them.
                    std::mem::forget(tracing::dispatcher::set_default(&dispatch));
                })
                .build()
                .expect("tokio runtime");
            let _default = tracing::dispatcher::set_default(&self.dispatch);
            runtime.block_on(body)
        }

        /// Everything logged so far.
        pub fn text(&self) -> String {
            String::from_utf8_lossy(&self.buffer.0.lock()).into_owned()
        }
    }
}

/// Latency and outcomes of the requests of one phase of a fault run.
#[derive(Debug, Clone, Default)]
pub struct Tally {
    /// Requests made.
    pub requests: u64,
    /// Admitted.
    pub allowed: u64,
    /// Denied by the limit.
    pub denied: u64,
    /// Admitted because the store failed and the policy fails open.
    pub failed_open: u64,
    /// Denied because the store failed and the policy fails closed.
    pub failed_closed: u64,
    /// The slowest answer.
    pub worst: Duration,
}

impl Tally {
    /// Records one answer.
    pub fn add(&mut self, took: Duration, outcome: Outcome) {
        self.requests += 1;
        self.worst = self.worst.max(took);
        match outcome {
            Outcome::Allowed => self.allowed += 1,
            Outcome::Denied => self.denied += 1,
            Outcome::FailedOpen => self.failed_open += 1,
            Outcome::FailedClosed => self.failed_closed += 1,
        }
    }

    /// Adds another tally into this one.
    pub fn merge(&mut self, other: &Tally) {
        self.requests += other.requests;
        self.allowed += other.allowed;
        self.denied += other.denied;
        self.failed_open += other.failed_open;
        self.failed_closed += other.failed_closed;
        self.worst = self.worst.max(other.worst);
    }

    /// One line for test output and the figures in the docs.
    pub fn line(&self, what: &str) -> String {
        format!(
            "{what}: {} requests, {} allowed, {} denied, {} failed open, {} failed closed, worst {:.1} ms",
            self.requests,
            self.allowed,
            self.denied,
            self.failed_open,
            self.failed_closed,
            self.worst.as_secs_f64() * 1000.0
        )
    }
}

/// How one request ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Admitted by the store.
    Allowed,
    /// Denied by the store.
    Denied,
    /// Admitted because the store failed.
    FailedOpen,
    /// Denied because the store failed.
    FailedClosed,
}

impl Outcome {
    /// The outcome of a facade check.
    pub fn of(c: &sluice::Checked) -> Self {
        match (&c.verdict, c.allowed) {
            (sluice::Verdict::FailedOpen(_), _) => Outcome::FailedOpen,
            (sluice::Verdict::FailedClosed(_), _) => Outcome::FailedClosed,
            (sluice::Verdict::Decided, true) => Outcome::Allowed,
            (sluice::Verdict::Decided, false) => Outcome::Denied,
        }
    }
}

/// Appends one line to the results file named by `$SLUICE_RELIABILITY_RESULTS` (if set), so a
/// run can collect the figures that `docs/reliability.md` quotes. Always prints it too.
pub fn record(line: &str) {
    eprintln!("[reliability] {line}");
    if let Ok(path) = std::env::var("SLUICE_RELIABILITY_RESULTS")
        && !path.is_empty()
        && let Ok(mut f) = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
    {
        use std::io::Write as _;
        let _ = writeln!(f, "{line}");
    }
}
