//! `[envoy]`: the domains of Envoy's rate limit service, inline (`[[envoy.domains]]`) or in
//! envoyproxy/ratelimit YAML files (`files`), compiled into one descriptor table.

use std::path::{Path, PathBuf};

use super::error::{Checker, ConfigError};
use super::raw::RawConfig;
use crate::envoy::{DomainFile, Domains};

/// The checked `[envoy]` section.
pub(super) struct EnvoySection {
    pub domains: Domains,
    /// The YAML files, watched for changes.
    pub files: Vec<PathBuf>,
    /// Errors inside the YAML files (they carry their own file and line).
    pub yaml_errors: Vec<ConfigError>,
}

/// Checks `[envoy]`; `dir` resolves relative file paths.
pub(super) fn check_envoy(
    ck: &mut Checker<'_>,
    raw: &RawConfig,
    dir: Option<&Path>,
) -> EnvoySection {
    let mut domain_files: Vec<DomainFile> = Vec::new();
    for d in &raw.envoy.domains {
        domain_files.push(d.get_ref().clone());
    }
    let mut yaml_errors = Vec::new();
    let mut files = Vec::new();
    for f in &raw.envoy.files {
        let rel = Path::new(f.get_ref());
        let path = match dir {
            Some(d) if rel.is_relative() => d.join(rel),
            _ => rel.to_path_buf(),
        };
        files.push(path.clone());
        match std::fs::read_to_string(&path) {
            Err(e) => ck.at(f.span(), "envoy.files", format!("{}: {e}", path.display())),
            Ok(text) => match load_domain_yaml(&text, &path.display().to_string()) {
                Ok(d) => domain_files.push(d),
                Err(e) => yaml_errors.push(e),
            },
        }
    }
    let domains = match Domains::compile(&domain_files, raw.shadow) {
        Ok(d) => d,
        Err(e) => {
            let span = raw
                .envoy
                .domains
                .first()
                .map(|d| d.span())
                .or_else(|| raw.envoy.files.first().map(|f| f.span()))
                .unwrap_or(0..0);
            ck.at(span, "envoy.domains", e);
            Domains::default()
        }
    };
    EnvoySection {
        domains,
        files,
        yaml_errors,
    }
}

/// Parses one envoyproxy/ratelimit YAML file; errors carry the YAML line.
pub fn load_domain_yaml(text: &str, file: &str) -> Result<DomainFile, ConfigError> {
    serde_yaml::from_str::<DomainFile>(text).map_err(|e| {
        let line = e.location().map(|l| l.line());
        let mut msg = e.to_string();
        if let Some(i) = msg.rfind(" at line ") {
            msg.truncate(i);
        }
        // serde_yaml prefixes the path: `descriptors[0].rate_limit: message`.
        let (mut field, mut message) = match msg.split_once(": ") {
            Some((path, m)) if !path.contains(' ') => (path.to_string(), m.to_string()),
            _ => ("domain".to_string(), msg),
        };
        // A `rate_limit` check names its field first (`rate_limit.mode: ...`): the path gets it.
        if let Some((name, m)) = message.split_once(": ")
            && !name.is_empty()
            && name
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b == b'_' || b == b'.')
        {
            field = format!("{field}.{name}");
            message = m.to_string();
        }
        ConfigError {
            file: file.to_string(),
            line,
            field,
            message,
        }
    })
}
