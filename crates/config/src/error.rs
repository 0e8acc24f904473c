//! Configuration errors and how they find their place in the file.
//!
//! Every problem is reported as `FILE:LINE: field: message`, so an operator goes straight to
//! the line at fault. Serde gives byte spans; this module turns them into lines and dotted
//! field paths, and collects every semantic error of one pass in a [`Checker`].

use std::fmt;
use std::ops::Range;

/// One problem in a configuration file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    /// The file (as given on the command line, or `<inline>`).
    pub file: String,
    /// The 1-based line, when the problem has a place.
    pub line: Option<usize>,
    /// The field, as a dotted path (`policies.api.rate`); empty when the problem is the file
    /// itself.
    pub field: String,
    /// What is wrong.
    pub message: String,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.line {
            Some(l) => write!(f, "{}:{}: {}: {}", self.file, l, self.field, self.message),
            None if self.field.is_empty() => write!(f, "{}: {}", self.file, self.message),
            None => write!(f, "{}: {}: {}", self.file, self.field, self.message),
        }
    }
}

/// Every problem found in a configuration (never empty).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct ConfigErrors(pub Vec<ConfigError>);

impl fmt::Display for ConfigErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, e) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str("\n")?;
            }
            write!(f, "{e}")?;
        }
        Ok(())
    }
}

/// The 1-based line of a byte offset.
pub fn line_of(src: &str, offset: usize) -> usize {
    let end = offset.min(src.len());
    src.as_bytes()[..end]
        .iter()
        .filter(|&&b| b == b'\n')
        .count()
        + 1
}

/// The table header in force before byte `upto`: `name`, or `name[i]` for the i-th element
/// of an array of tables; empty at the top level.
fn header_before(src: &str, upto: usize) -> String {
    let before = &src[..upto];
    let array_header = |l: &str| {
        l.trim()
            .strip_prefix("[[")
            .and_then(|t| t.split("]]").next())
            .map(|h| h.trim().to_string())
    };
    for l in before.lines().rev() {
        let t = l.trim();
        if let Some(h) = array_header(t) {
            let n = before
                .lines()
                .filter(|l| array_header(l).as_deref() == Some(h.as_str()))
                .count();
            return format!("{h}[{}]", n.saturating_sub(1));
        }
        if let Some(h) = t.strip_prefix('[').and_then(|t| t.split(']').next()) {
            return h.trim().to_string();
        }
    }
    String::new()
}

/// The dotted field at a byte offset of a TOML file: the enclosing table header (with the
/// index of an array of tables) and the key on that line.
pub fn field_at(src: &str, offset: usize) -> String {
    let offset = offset.min(src.len());
    let line_start = src[..offset].rfind('\n').map_or(0, |i| i + 1);
    let line_end = src[offset..].find('\n').map_or(src.len(), |i| offset + i);
    let line = src[line_start..line_end].trim();
    if line.starts_with('[') {
        return header_before(src, line_end);
    }
    let header = header_before(src, line_start);
    let key = line
        .split_once('=')
        .map(|(k, _)| k.trim().trim_matches('"').to_string());
    match (header.is_empty(), key) {
        (true, None) => "-".into(),
        (false, None) => header,
        (true, Some(k)) => k,
        (false, Some(k)) => format!("{header}.{k}"),
    }
}

/// A syntax, type or unknown-field error from the first (serde) pass, placed in the file.
pub(super) fn from_toml(src: &str, file: &str, e: &toml::de::Error) -> ConfigErrors {
    let span = e.span().unwrap_or(0..0);
    let message = e.message().trim().to_string();
    let mut field = if message.starts_with("unknown field")
        || message.starts_with("invalid")
        || message.starts_with("missing field")
        || message.contains("expected")
    {
        field_at(src, span.start)
    } else {
        "-".to_string()
    };
    if let Some(m) = message
        .strip_prefix("missing field `")
        .and_then(|m| m.split('`').next())
    {
        field = if field == "-" {
            m.to_string()
        } else {
            format!("{field}.{m}")
        };
    }
    ConfigErrors(vec![ConfigError {
        file: file.to_string(),
        line: Some(line_of(src, span.start)),
        field,
        message,
    }])
}

/// Collects the semantic errors of one file, each placed at the span of the value at fault.
pub(super) struct Checker<'a> {
    pub(super) src: &'a str,
    pub(super) file: &'a str,
    pub(super) errors: Vec<ConfigError>,
    /// `sluice validate --no-secrets`: an `env:` secret whose variable is unset is not an
    /// error (the file is checked on a machine without the production environment).
    pub(super) skip_env_secrets: bool,
}

impl<'a> Checker<'a> {
    pub(super) fn new(src: &'a str, file: &'a str) -> Self {
        Checker {
            src,
            file,
            errors: Vec::new(),
            skip_env_secrets: false,
        }
    }

    /// Records a problem with the value at `span`.
    pub(super) fn at(
        &mut self,
        span: Range<usize>,
        field: impl Into<String>,
        message: impl Into<String>,
    ) {
        self.errors.push(ConfigError {
            file: self.file.to_string(),
            line: Some(line_of(self.src, span.start)),
            field: field.into(),
            message: message.into(),
        });
    }
}
