//! The per-algorithm flags shared by the tools, and the `--expect` spec syntax
//! (`token-bucket:capacity=10,rate=5/s`).

use clap::Args;
use sluice_core::policy::parse_duration_ms;
use sluice_core::{Algorithm, LeakyMode, Rate};

/// Which algorithm and parameters, as command-line flags.
#[derive(Debug, Clone, Args)]
pub struct PolicyArgs {
    /// token-bucket, gcra, leaky-bucket, fixed-window, sliding-counter, sliding-log, concurrency.
    #[arg(long, short = 'a', default_value = "token-bucket")]
    pub algorithm: String,
    /// Bucket capacity (token-bucket, leaky-bucket).
    #[arg(long)]
    pub capacity: Option<u64>,
    /// Rate such as 5/s, 300/min, 10/2s (token-bucket, leaky-bucket, gcra).
    #[arg(long)]
    pub rate: Option<String>,
    /// Extra requests beyond the steady rate (gcra).
    #[arg(long)]
    pub burst: Option<u64>,
    /// Limit per window, or concurrent leases (fixed-window, sliding-counter, sliding-log, concurrency).
    #[arg(long)]
    pub limit: Option<u64>,
    /// Window such as 10s, 1m, 500ms.
    #[arg(long)]
    pub window: Option<String>,
    /// Leaky bucket mode: policing or shaping.
    #[arg(long, default_value = "policing")]
    pub mode: String,
    /// Concurrency lease timeout.
    #[arg(long, default_value = "30s")]
    pub lease: String,
}

fn need<T>(v: Option<T>, flag: &str, alg: &str) -> Result<T, String> {
    v.ok_or_else(|| format!("{alg} needs --{flag}"))
}

impl PolicyArgs {
    /// The algorithm these flags describe.
    pub fn algorithm(&self) -> Result<Algorithm, String> {
        let a = self.algorithm.as_str();
        let rate = |r: &Option<String>| -> Result<Rate, String> {
            need(r.as_deref(), "rate", a)?
                .parse::<Rate>()
                .map_err(|e| e.to_string())
        };
        let window = || -> Result<u64, String> {
            parse_duration_ms(need(self.window.as_deref(), "window", a)?).map_err(|e| e.to_string())
        };
        let alg = match a {
            "token-bucket" | "tb" => Algorithm::TokenBucket {
                capacity: need(self.capacity, "capacity", a)?,
                rate: rate(&self.rate)?,
            },
            "gcra" => Algorithm::Gcra {
                rate: rate(&self.rate)?,
                burst: self.burst.unwrap_or(0),
            },
            "leaky-bucket" | "lb" => Algorithm::LeakyBucket {
                capacity: need(self.capacity, "capacity", a)?,
                rate: rate(&self.rate)?,
                mode: match self.mode.as_str() {
                    "policing" => LeakyMode::Policing,
                    "shaping" => LeakyMode::Shaping,
                    m => {
                        return Err(format!(
                            "unknown leaky-bucket mode {m:?}: expected policing or shaping"
                        ));
                    }
                },
            },
            "fixed-window" | "fw" => Algorithm::FixedWindow {
                limit: need(self.limit, "limit", a)?,
                window_ms: window()?,
            },
            "sliding-counter" | "sliding-window-counter" => Algorithm::SlidingWindowCounter {
                limit: need(self.limit, "limit", a)?,
                window_ms: window()?,
            },
            "sliding-log" | "sliding-window-log" | "sw" => Algorithm::SlidingWindowLog {
                limit: need(self.limit, "limit", a)?,
                window_ms: window()?,
            },
            "concurrency" => Algorithm::Concurrency {
                limit: need(self.limit, "limit", a)?,
                lease_ms: parse_duration_ms(&self.lease).map_err(|e| e.to_string())?,
            },
            other => {
                return Err(format!(
                    "unknown algorithm {other:?}: expected token-bucket, gcra, leaky-bucket, fixed-window, \
                     sliding-counter, sliding-log or concurrency"
                ));
            }
        };
        alg.validate().map_err(|e| e.to_string())?;
        Ok(alg)
    }
}

/// Parses `token-bucket:capacity=10,rate=5/s` (the `--expect` syntax) into an algorithm.
pub fn parse_spec(spec: &str) -> Result<Algorithm, String> {
    let (alg, params) = spec.split_once(':').unwrap_or((spec, ""));
    let mut args = PolicyArgs {
        algorithm: alg.trim().to_string(),
        capacity: None,
        rate: None,
        burst: None,
        limit: None,
        window: None,
        mode: "policing".into(),
        lease: "30s".into(),
    };
    for kv in params.split(',').filter(|s| !s.trim().is_empty()) {
        let (k, v) = kv
            .split_once('=')
            .ok_or_else(|| format!("expected key=value in {kv:?}"))?;
        let v = v.trim();
        let num = || {
            v.parse::<u64>()
                .map_err(|_| format!("{k} must be a whole number, got {v:?}"))
        };
        match k.trim() {
            "capacity" => args.capacity = Some(num()?),
            "burst" => args.burst = Some(num()?),
            "limit" => args.limit = Some(num()?),
            "rate" => args.rate = Some(v.to_string()),
            "window" => args.window = Some(v.to_string()),
            "mode" => args.mode = v.to_string(),
            "lease" => args.lease = v.to_string(),
            other => return Err(format!("unknown parameter {other:?} in {spec:?}")),
        }
    }
    args.algorithm()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_expect_specs() {
        assert_eq!(
            parse_spec("token-bucket:capacity=10,rate=5/s").unwrap(),
            Algorithm::TokenBucket {
                capacity: 10,
                rate: Rate::per_second(5)
            }
        );
        assert_eq!(
            parse_spec("sliding-log:limit=3,window=10s").unwrap(),
            Algorithm::SlidingWindowLog {
                limit: 3,
                window_ms: 10_000
            }
        );
        assert!(
            parse_spec("token-bucket:capacity=10")
                .unwrap_err()
                .contains("--rate")
        );
        assert!(parse_spec("nope:limit=1").is_err());
    }
}
