//! Checks shared by every section: durations, addresses, bounded numbers, secrets, failure
//! modes. Each reports through the [`Checker`] and answers a usable fallback, so one pass
//! finds every problem in the file instead of stopping at the first.

use std::net::SocketAddr;
use std::time::Duration;

use sluice::FailureMode;
use sluice::core::policy::parse_duration_ms;
use toml::Spanned;

use super::error::Checker;
use super::raw::{RawBytes, RawDuration};

/// Reads a secret: `env:NAME` takes the value of an environment variable, anything else is
/// the secret itself.
pub(super) fn secret(s: &str) -> Result<String, String> {
    match s.strip_prefix("env:") {
        Some(var) => {
            std::env::var(var).map_err(|_| format!("environment variable {var} is not set"))
        }
        None => Ok(s.to_string()),
    }
}

/// 32 bytes written as 64 hex digits.
pub(super) fn hex32(s: &str) -> Result<[u8; 32], String> {
    let s = s.trim();
    let bad = || {
        "must be 64 hex digits (32 bytes), e.g. the output of `openssl rand -hex 32`".to_string()
    };
    if s.len() != 64 {
        return Err(bad());
    }
    let mut out = [0u8; 32];
    for (i, o) in out.iter_mut().enumerate() {
        *o = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).map_err(|_| bad())?;
    }
    Ok(out)
}

/// `open`, `closed` or `local` ([`FailureMode`]'s own `FromStr`).
pub(super) fn failure_mode(s: &str) -> Result<FailureMode, String> {
    s.parse()
}

/// A duration such as `50ms`, `10s`, `1m`.
pub(super) fn duration(s: &str) -> Result<Duration, String> {
    parse_duration_ms(s)
        .map(Duration::from_millis)
        .map_err(|e| e.to_string())
}

impl Checker<'_> {
    /// A listener address, or `default` when absent.
    pub(super) fn addr(
        &mut self,
        v: &Option<Spanned<String>>,
        field: &str,
        default: &str,
    ) -> SocketAddr {
        let fallback: SocketAddr = default.parse().expect("default address");
        match v {
            None => fallback,
            Some(s) => s.get_ref().parse().unwrap_or_else(|_| {
                self.at(
                    s.span(),
                    field,
                    format!(
                        "invalid address {:?}: expected IP:PORT such as 127.0.0.1:8080",
                        s.get_ref()
                    ),
                );
                fallback
            }),
        }
    }

    /// A number in `1..=max`, or `default` when absent.
    pub(super) fn bounded(
        &mut self,
        v: &Option<Spanned<u64>>,
        field: &str,
        default: u64,
        max: u64,
    ) -> u64 {
        self.in_range(v, field, default, (1, max))
    }

    /// A number in `0..=max` (zero allowed, meaning "derived" or "off" as the field says).
    pub(super) fn count(
        &mut self,
        v: &Option<Spanned<u64>>,
        field: &str,
        default: u64,
        max: u64,
    ) -> u64 {
        self.in_range(v, field, default, (0, max))
    }

    /// A number in `min..=max`, or `default` when absent (or out of range, after the error).
    fn in_range(
        &mut self,
        v: &Option<Spanned<u64>>,
        field: &str,
        default: u64,
        (min, max): (u64, u64),
    ) -> u64 {
        match v {
            None => default,
            Some(n) if !(min..=max).contains(n.get_ref()) => {
                self.at(n.span(), field, format!("must be between {min} and {max}"));
                default
            }
            Some(n) => *n.get_ref(),
        }
    }

    /// A size in bytes in `min..=max`, or `default` when absent.
    pub(super) fn bytes(
        &mut self,
        v: &Option<Spanned<RawBytes>>,
        field: &str,
        default: u64,
        (min, max): (u64, u64),
    ) -> u64 {
        match v {
            None => default,
            Some(n) if n.get_ref().0 < min || n.get_ref().0 > max => {
                self.at(
                    n.span(),
                    field,
                    format!("must be between {min} and {max} bytes"),
                );
                default
            }
            Some(n) => n.get_ref().0,
        }
    }

    /// A duration, or `default` when absent.
    pub(super) fn duration(
        &mut self,
        v: &Option<Spanned<RawDuration>>,
        field: &str,
        default: Duration,
    ) -> Duration {
        match v {
            None => default,
            Some(s) => duration(s.get_ref()).unwrap_or_else(|e| {
                self.at(s.span(), field, e);
                default
            }),
        }
    }

    /// A duration above zero, or `default` when absent.
    pub(super) fn positive_duration(
        &mut self,
        v: &Option<Spanned<RawDuration>>,
        field: &str,
        default: Duration,
    ) -> Duration {
        let d = self.duration(v, field, default);
        match v {
            Some(s) if d.is_zero() => {
                self.at(s.span(), field, "must be above 0");
                default
            }
            _ => d,
        }
    }

    /// Reads a secret; with [`Checker::skip_env_secrets`] an unset `env:NAME` answers a
    /// placeholder naming the variable instead of an error.
    pub(super) fn resolve_secret(&self, s: &str) -> Result<String, String> {
        match (secret(s), s.strip_prefix("env:")) {
            (Err(_), Some(var)) if self.skip_env_secrets => Ok(format!("<unset {var}>")),
            (r, _) => r,
        }
    }

    /// A secret (`env:NAME` or the value itself) that must not be empty when given.
    pub(super) fn secret(
        &mut self,
        v: &Option<Spanned<String>>,
        field: &str,
        omit: &str,
    ) -> Option<String> {
        let t = v.as_ref()?;
        match self.resolve_secret(t.get_ref()) {
            Ok(v) if v.is_empty() => {
                self.at(
                    t.span(),
                    field,
                    format!("must not be empty (omit it to {omit})"),
                );
                None
            }
            Ok(v) => Some(v),
            Err(e) => {
                self.at(t.span(), field, e);
                None
            }
        }
    }
}
