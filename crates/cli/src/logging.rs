//! Log set-up for the binary: which filter applies and whether to colour the output.
//!
//! `SLUICE_LOG` wins when both it and the conventional `RUST_LOG` are set, so an operator can
//! tune sluice without touching other Rust programs in the same environment. Colours are for
//! people at a terminal: log files and journald get plain text.

use std::io::IsTerminal;

/// The filter directives in effect: `SLUICE_LOG`, else `RUST_LOG`, else `info`. Empty values
/// count as unset.
pub fn filter_directives(sluice_log: Option<&str>, rust_log: Option<&str>) -> String {
    [sluice_log, rust_log]
        .into_iter()
        .flatten()
        .map(str::trim)
        .find(|s| !s.is_empty())
        .unwrap_or("info")
        .to_string()
}

/// Installs the global subscriber: logs go to stderr, with ANSI colours only when stderr is a
/// terminal. A filter that does not parse falls back to `info` with a warning.
pub fn init() {
    let sluice_log = std::env::var("SLUICE_LOG").ok();
    let rust_log = std::env::var("RUST_LOG").ok();
    let directives = filter_directives(sluice_log.as_deref(), rust_log.as_deref());
    let (filter, bad) = match tracing_subscriber::EnvFilter::try_new(&directives) {
        Ok(f) => (f, None),
        Err(e) => (tracing_subscriber::EnvFilter::new("info"), Some(e)),
    };
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr)
        .init();
    if let Some(e) = bad {
        tracing::warn!("ignoring the log filter {directives:?}: {e}; logging at info");
    }
}

#[cfg(test)]
mod tests {
    use super::filter_directives;

    #[test]
    fn sluice_log_wins_then_rust_log_then_info() {
        assert_eq!(filter_directives(Some("debug"), Some("warn")), "debug");
        assert_eq!(filter_directives(None, Some("warn")), "warn");
        assert_eq!(filter_directives(Some(" "), Some("warn")), "warn");
        assert_eq!(filter_directives(None, None), "info");
    }
}
