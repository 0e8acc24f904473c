//! `allow add --file` and `deny add --file`: a block list read line by line (`#` starts a
//! comment) and sent in calls of [`IMPORT_CHUNK`] entries, the most the server takes per call.
//! Each call is all or nothing on the server; a refused call names the file's lines at fault
//! and stops the import, while earlier calls stay, so the summary says what was added.

use std::io::Write;
use std::process::ExitCode;
use std::time::Duration;

use http::Method;
use serde_json::{Map, Value, json};

use super::AdminArgs;
use super::client::{Call, call, send};

/// Entries per call of a file import (the server's most per call).
pub const IMPORT_CHUNK: usize = 10_000;

/// One call of a file import: the call and the file's line number of each entry.
#[derive(Debug, Clone, PartialEq)]
pub struct ImportCall {
    /// The call (`{"entries": [...], "ttl": ...}`).
    pub call: Call,
    /// The line of each entry, in order.
    pub lines: Vec<usize>,
}

/// Reads a block list: one entry per line, `#` to the end of a line is a comment, blank
/// lines are skipped. Each entry with its line number (from 1).
pub fn read_entries(text: &str) -> Vec<(usize, String)> {
    text.lines()
        .enumerate()
        .filter_map(|(i, line)| {
            let entry = line.split('#').next().unwrap_or("").trim();
            (!entry.is_empty()).then(|| (i + 1, entry.to_string()))
        })
        .collect()
}

/// The calls of `allow|deny add --file`: the file's entries in chunks of [`IMPORT_CHUNK`].
pub fn plan_import(path: &str, text: &str, ttl: Option<&str>) -> Vec<ImportCall> {
    let entries = read_entries(text);
    entries
        .chunks(IMPORT_CHUNK)
        .map(|chunk| {
            let mut m = Map::new();
            m.insert(
                "entries".into(),
                Value::Array(chunk.iter().map(|(_, e)| json!(e)).collect()),
            );
            if let Some(t) = ttl {
                m.insert("ttl".into(), json!(t));
            }
            ImportCall {
                call: call(Method::POST, path, m),
                lines: chunk.iter().map(|(l, _)| *l).collect(),
            }
        })
        .collect()
}

/// Runs a file import; prints a summary to `out`.
pub(super) async fn run_import(
    args: &AdminArgs,
    kind: &str,
    file: &std::path::Path,
    ttl: Option<&str>,
    out: &mut impl Write,
) -> ExitCode {
    let mut err = std::io::stderr();
    let text = match std::fs::read_to_string(file) {
        Ok(t) => t,
        Err(e) => {
            let _ = writeln!(err, "error: cannot read {}: {e}", file.display());
            return ExitCode::from(2);
        }
    };
    let calls = plan_import(&format!("/v1/lists/{kind}"), &text, ttl);
    if calls.is_empty() {
        let _ = writeln!(err, "error: {} holds no entries", file.display());
        return ExitCode::from(2);
    }
    let timeout = Duration::from_secs(args.timeout.max(1));
    let mut added = 0u64;
    for (n, c) in calls.iter().enumerate() {
        let (first, last) = (c.lines[0], c.lines[c.lines.len() - 1]);
        let (status, body) = match send(&args.url, args.token.as_deref(), &c.call, timeout).await {
            Ok(r) => r,
            Err(e) => {
                let _ = writeln!(
                    err,
                    "error: {e} (lines {first}-{last} not imported; {added} entries before them were)"
                );
                return ExitCode::from(2);
            }
        };
        let parsed: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
        if (200..300).contains(&status) {
            added += parsed["added"].as_u64().unwrap_or(0);
            continue;
        }
        let detail = parsed["detail"].as_str().map_or_else(
            || String::from_utf8_lossy(&body).trim().to_string(),
            str::to_string,
        );
        let _ = writeln!(
            err,
            "error: call {} of {} (lines {first}-{last}) answered {status}: {detail}",
            n + 1,
            calls.len()
        );
        for e in parsed["errors"].as_array().into_iter().flatten() {
            let line = e["index"]
                .as_u64()
                .and_then(|i| c.lines.get(i as usize))
                .map_or_else(|| "?".to_string(), ToString::to_string);
            let _ = writeln!(
                err,
                "  {}:{line}: {}: {}",
                file.display(),
                e["entry"],
                e["error"].as_str().unwrap_or_default()
            );
        }
        let _ = writeln!(
            err,
            "nothing of lines {first}-{last} was added; {added} entries of earlier lines were"
        );
        return ExitCode::FAILURE;
    }
    let summary = json!({"list": kind, "added": added, "calls": calls.len(), "file": file.display().to_string()});
    let _ = writeln!(
        out,
        "{}",
        serde_json::to_string_pretty(&summary).unwrap_or_default()
    );
    ExitCode::SUCCESS
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_block_list_file_is_sent_in_chunks_with_its_line_numbers() {
        let mut text = String::from("# a block list\n\n203.0.113.0/24  # office\n");
        for i in 0..IMPORT_CHUNK - 1 {
            text.push_str(&format!("user:{i}\n"));
        }
        text.push_str("   \nip:198.51.100.7\n");
        let calls = plan_import("/v1/lists/deny", &text, Some("1h"));
        assert_eq!(calls.len(), 2);
        let first = calls[0].call.body.as_ref().unwrap();
        assert_eq!(first["entries"][0], "203.0.113.0/24");
        assert_eq!(first["entries"].as_array().unwrap().len(), IMPORT_CHUNK);
        assert_eq!(first["ttl"], "1h");
        assert_eq!(calls[0].lines[0], 3);
        assert_eq!(calls[0].call.path, "/v1/lists/deny");
        let second = calls[1].call.body.as_ref().unwrap();
        assert_eq!(second["entries"], json!(["ip:198.51.100.7"]));
        assert_eq!(calls[1].lines, vec![IMPORT_CHUNK + 4]);
    }
}
