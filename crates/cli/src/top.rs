//! `sluice top`: the console's live view in a terminal, for a running `sluice serve`.
//!
//! Every second it reads `GET /v1/stats` (with `--token`, `SLUICE_ADMIN_TOKEN`) and redraws:
//! per policy the decisions of the last second and of the last five minutes by outcome, with
//! a sparkline of the last minute; the store's latency, errors and breaker; the last reload;
//! the heaviest identities by decisions and by denials; and how many bans, overrides and list
//! entries are in force. `q`, `Esc` or Ctrl-C quits and restores the terminal.
//!
//! The frame is built by [`frame`], a pure function of the JSON, so it is tested without a
//! terminal; `--iterations N` (hidden) prints N frames as plain text and exits, for tests and
//! for piping into a log.

use std::io::Write;
use std::process::ExitCode;
use std::time::Duration;

use clap::Args;
use http::Method;
use serde_json::Value;

/// `sluice top`.
#[derive(Debug, Args)]
pub struct TopArgs {
    /// Base URL of the `sluice serve` HTTP listener.
    #[arg(long, env = "SLUICE_URL", default_value = "http://127.0.0.1:8080")]
    pub url: String,
    /// The server's admin_token.
    #[arg(long, env = "SLUICE_ADMIN_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// Milliseconds between refreshes.
    #[arg(long, default_value_t = 1000)]
    pub interval_ms: u64,
    /// Print this many frames as plain text, then exit (no terminal control).
    #[arg(long, hide = true)]
    pub iterations: Option<u64>,
}

/// Reads `/v1/stats` once.
pub async fn fetch(url: &str, token: Option<&str>) -> Result<Value, String> {
    let uri = format!("{}/v1/stats", url.trim_end_matches('/'));
    let call = crate::admin::Call {
        method: Method::GET,
        path: "/v1/stats".into(),
        body: None,
    };
    let (status, body) = crate::admin::send(url, token, &call, Duration::from_secs(5)).await?;
    let v: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    match status {
        200 => Ok(v),
        401 => Err(format!(
            "{uri}: 401, the server wants its admin_token (--token or SLUICE_ADMIN_TOKEN)"
        )),
        s => Err(format!(
            "{uri}: {s} {}",
            v["detail"].as_str().unwrap_or("(no detail)")
        )),
    }
}

const SPARKS: [char; 8] = ['▁', '▂', '▃', '▄', '▅', '▆', '▇', '█'];

/// A sparkline of `values`, one character each.
fn sparkline(values: &[u64]) -> String {
    let max = values.iter().copied().max().unwrap_or(0);
    values
        .iter()
        .map(|&v| {
            if max == 0 || v == 0 {
                ' '
            } else {
                SPARKS[(v.min(max) * 7 / max) as usize]
            }
        })
        .collect()
}

fn num(v: &Value) -> String {
    v.as_u64()
        .map_or_else(|| "-".to_string(), |n| n.to_string())
}

fn millis(v: &Value) -> String {
    v.as_f64()
        .map_or_else(|| "-".to_string(), |ms| format!("{ms:.2}"))
}

fn cut(s: &str, width: usize) -> String {
    if s.chars().count() <= width {
        format!("{s:<width$}")
    } else {
        let mut t: String = s.chars().take(width.saturating_sub(1)).collect();
        t.push('…');
        t
    }
}

/// The lines of one frame for the report `s` of `url`, at most `width` columns wide.
pub fn frame(url: &str, s: &Value, width: usize) -> Vec<String> {
    let width = width.max(60);
    let mut out = Vec::new();
    out.push(cut(
        &format!(
            "sluice top  {url}  generation {}  store {}  breaker {}  up {} s",
            num(&s["generation"]),
            s["store"]["kind"].as_str().unwrap_or("?"),
            s["store"]["breaker"].as_str().unwrap_or("?"),
            num(&s["uptime_s"]),
        ),
        width,
    ));
    out.push(String::new());
    out.push(cut(
        &format!(
            "{:<16} {:>6} {:>9} {:>8} {:>7} {:>7} {:>7} {:>7} {:>7} {:>7}  last 60 s",
            "POLICY",
            "DEC/S",
            "DECISIONS",
            "ALLOWED",
            "DENIED",
            "SHADOW",
            "F-OPEN",
            "F-CLOSE",
            "P50 ms",
            "P99 ms"
        ),
        width,
    ));
    for p in s["policies"].as_array().into_iter().flatten() {
        let t = &p["totals"];
        let recent: Vec<u64> = p["series"]["decisions"]
            .as_array()
            .map(|a| {
                a.iter()
                    .rev()
                    .take(60)
                    .rev()
                    .filter_map(Value::as_u64)
                    .collect()
            })
            .unwrap_or_default();
        let room = width.saturating_sub(100).min(60);
        let spark = sparkline(&recent[recent.len().saturating_sub(room)..]);
        out.push(cut(
            &format!(
                "{:<16} {:>6} {:>9} {:>8} {:>7} {:>7} {:>7} {:>7} {:>7} {:>7}  {spark}",
                cut(p["policy"].as_str().unwrap_or("?"), 16),
                num(&p["decisions_per_s"]),
                num(&t["decisions"]),
                num(&t["allowed"]),
                num(&t["denied"]),
                num(&t["shadow_denied"]),
                num(&t["failed_open"]),
                num(&t["failed_closed"]),
                millis(&p["latency_ms"]["p50"]),
                millis(&p["latency_ms"]["p99"]),
            ),
            width,
        ));
    }
    out.push(String::new());
    let st = &s["store"];
    out.push(cut(
        &format!(
            "store  p50 {} ms  p99 {} ms  calls {}  errors {}  (last {} s)",
            millis(&st["latency_ms"]["p50"]),
            millis(&st["latency_ms"]["p99"]),
            num(&st["calls"]),
            num(&st["errors"]),
            num(&st["window_s"]),
        ),
        width,
    ));
    let r = &s["last_reload"];
    out.push(cut(
        &if r.is_null() {
            "reload none since start".to_string()
        } else if r["ok"] == true {
            format!(
                "reload ok ({}), generation {}",
                r["trigger"].as_str().unwrap_or("?"),
                num(&r["generation"])
            )
        } else {
            let errors: Vec<&str> = r["errors"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(Value::as_str)
                .collect();
            format!(
                "reload FAILED ({}): {}",
                r["trigger"].as_str().unwrap_or("?"),
                errors.join("; ")
            )
        },
        width,
    ));
    let c = &s["control"];
    let len = |k: &str| c[k].as_array().map_or(0, Vec::len);
    out.push(cut(
        &format!(
            "control ({})  bans {}  overrides {}  list entries {}",
            c["backend"].as_str().unwrap_or("?"),
            len("bans"),
            len("overrides"),
            len("lists")
        ),
        width,
    ));
    out.push(String::new());
    let half = (width / 2).saturating_sub(1);
    out.push(cut(
        &format!("{}TOP BY DENIALS", cut("TOP BY DECISIONS", half + 2)),
        width,
    ));
    let list = |k: &str| s["top"][k].as_array().cloned().unwrap_or_default();
    let (d, x) = (list("decisions"), list("denials"));
    let row = |v: Option<&Value>| {
        v.map_or_else(String::new, |c| {
            let count = format!("{} ±{}", num(&c["count"]), num(&c["error"]));
            let id_width = half.saturating_sub(count.len() + 1);
            format!(
                "{} {count}",
                cut(c["identity"].as_str().unwrap_or("?"), id_width)
            )
        })
    };
    for i in 0..d.len().max(x.len()).min(10) {
        out.push(cut(
            &format!("{}  {}", cut(&row(d.get(i)), half), row(x.get(i))),
            width,
        ));
    }
    if d.is_empty() && x.is_empty() {
        out.push("(no decisions yet)".to_string());
    }
    out
}

/// Runs `sluice top`.
pub async fn run(args: &TopArgs, out: &mut impl Write) -> ExitCode {
    let interval = Duration::from_millis(args.interval_ms.max(100));
    if let Some(n) = args.iterations {
        for i in 0..n {
            match fetch(&args.url, args.token.as_deref()).await {
                Ok(s) => {
                    for line in frame(&args.url, &s, 132) {
                        let _ = writeln!(out, "{}", line.trim_end());
                    }
                    let _ = writeln!(out);
                }
                Err(e) => {
                    let _ = writeln!(std::io::stderr(), "error: {e}");
                    return ExitCode::FAILURE;
                }
            }
            if i + 1 < n {
                tokio::time::sleep(interval).await;
            }
        }
        return ExitCode::SUCCESS;
    }
    match interactive(args, interval).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            let _ = writeln!(std::io::stderr(), "error: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Raw mode and the alternate screen, restored on drop (also on an error or a panic).
struct Screen;

impl Screen {
    fn enter() -> std::io::Result<Screen> {
        crossterm::terminal::enable_raw_mode()?;
        let screen = Screen;
        crossterm::execute!(
            std::io::stdout(),
            crossterm::terminal::EnterAlternateScreen,
            crossterm::cursor::Hide
        )?;
        Ok(screen)
    }
}

impl Drop for Screen {
    fn drop(&mut self) {
        let _ = crossterm::execute!(
            std::io::stdout(),
            crossterm::cursor::Show,
            crossterm::terminal::LeaveAlternateScreen
        );
        let _ = crossterm::terminal::disable_raw_mode();
    }
}

/// True for `q`, `Esc` and Ctrl-C (which raw mode delivers as a key, not a signal).
fn quits(ev: &crossterm::event::Event) -> bool {
    use crossterm::event::{Event, KeyCode, KeyEventKind, KeyModifiers};
    match ev {
        Event::Key(k) if k.kind != KeyEventKind::Release => {
            matches!(k.code, KeyCode::Char('q') | KeyCode::Esc)
                || (k.code == KeyCode::Char('c') && k.modifiers.contains(KeyModifiers::CONTROL))
        }
        _ => false,
    }
}

async fn interactive(args: &TopArgs, interval: Duration) -> Result<(), String> {
    // Fail before taking over the terminal when the server cannot be read at all.
    let mut last = fetch(&args.url, args.token.as_deref()).await;
    if let Err(e) = &last {
        return Err(e.clone());
    }
    let _screen = Screen::enter().map_err(|e| format!("cannot set up the terminal: {e}"))?;
    let (quit_tx, mut quit_rx) = tokio::sync::oneshot::channel::<()>();
    // Keys are read on a blocking thread; it ends at the first quitting key.
    std::thread::spawn(move || {
        loop {
            match crossterm::event::read() {
                Ok(ev) if quits(&ev) => {
                    let _ = quit_tx.send(());
                    return;
                }
                Ok(_) => {}
                Err(_) => return,
            }
        }
    });
    loop {
        draw(&args.url, &last).map_err(|e| format!("drawing: {e}"))?;
        tokio::select! {
            _ = &mut quit_rx => return Ok(()),
            () = tokio::time::sleep(interval) => {}
        }
        last = fetch(&args.url, args.token.as_deref()).await;
    }
}

fn draw(url: &str, last: &Result<Value, String>) -> std::io::Result<()> {
    use crossterm::{cursor, queue, terminal};
    let (cols, rows) = terminal::size().unwrap_or((100, 30));
    let mut lines = match last {
        Ok(s) => frame(url, s, cols as usize),
        Err(e) => vec![
            format!("sluice top  {url}"),
            String::new(),
            format!("error: {e}"),
        ],
    };
    lines.truncate((rows as usize).saturating_sub(1));
    lines.push("q or Ctrl-C quits".to_string());
    let mut out = std::io::stdout().lock();
    queue!(
        out,
        cursor::MoveTo(0, 0),
        terminal::Clear(terminal::ClearType::All)
    )?;
    for (i, line) in lines.iter().enumerate() {
        queue!(out, cursor::MoveTo(0, i as u16))?;
        write!(out, "{line}")?;
    }
    out.flush()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_frame_shows_the_numbers() {
        let s = serde_json::json!({
            "generation": 3, "uptime_s": 12,
            "store": {"kind": "memory", "breaker": "closed", "calls": 9, "errors": 0, "window_s": 60,
                      "latency_ms": {"p50": 0.05, "p99": 0.25}},
            "policies": [{"policy": "api", "decisions_per_s": 4,
                "totals": {"decisions": 9, "allowed": 6, "denied": 3, "shadow_denied": 0, "failed_open": 0, "failed_closed": 0},
                "series": {"decisions": [0, 1, 4, 4]}, "latency_ms": {"p50": 0.1, "p99": 0.5}}],
            "top": {"decisions": [{"identity": "user:heavy", "count": 7, "error": 0}],
                    "denials": [{"identity": "user:heavy", "count": 3, "error": 1}]},
            "last_reload": {"ok": false, "trigger": "admin", "errors": ["sluice.toml:3: limit: bad"]},
            "control": {"backend": "local", "bans": [{}], "overrides": [], "lists": [{}, {}]},
        });
        let text = frame("http://127.0.0.1:8080", &s, 132).join("\n");
        assert!(text.contains("generation 3"), "{text}");
        assert!(text.contains("api "), "{text}");
        assert!(text.contains("  9        6       3"), "{text}");
        let words = text.split_whitespace().collect::<Vec<_>>().join(" ");
        assert!(words.contains("user:heavy 7 ±0 user:heavy 3 ±1"), "{text}");
        assert!(
            text.contains("reload FAILED (admin): sluice.toml:3: limit: bad"),
            "{text}"
        );
        assert!(
            text.contains("bans 1  overrides 0  list entries 2"),
            "{text}"
        );
        assert!(text.contains("▂██"), "{text}");
        for line in frame("http://127.0.0.1:8080", &s, 80) {
            assert!(line.chars().count() <= 80, "{line}");
        }
    }

    #[test]
    fn sparklines_scale_to_the_peak() {
        assert_eq!(sparkline(&[0, 1, 2, 4, 8]), " ▁▂▄█");
        assert_eq!(sparkline(&[0, 0]), "  ");
    }
}
