//! The per-algorithm flags shared by the tools, and the `--expect` spec syntax
//! (`token-bucket:capacity=10,rate=5/s`).

use clap::Args;
use sluice_core::algorithm::{AlgorithmKind, Param, ParamError, Params};
use sluice_core::policy::{CalendarPeriod, parse_duration_ms};
use sluice_core::{Algorithm, DecisionMode, LeakyMode, Rate};

/// Which algorithm and parameters, as command-line flags. The names, aliases and the
/// parameters each algorithm takes come from [`sluice_core::algorithm::registry`]: a flag the
/// algorithm does not take is an error, as it is in the config file.
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
    /// Extra requests beyond the steady rate (gcra; default 0).
    #[arg(long)]
    pub burst: Option<u64>,
    /// Limit per window, or concurrent leases (fixed-window, sliding-counter, sliding-log, concurrency).
    #[arg(long)]
    pub limit: Option<u64>,
    /// Window such as 10s, 1m, 500ms (fixed-window, sliding-counter, sliding-log), or a
    /// calendar window "1 day", "1 week", "1 month" in UTC (fixed-window).
    #[arg(long)]
    pub window: Option<String>,
    /// Decision mode: exact (default: one store call per check) or leased (slices of the
    /// quota spent locally; token-bucket, gcra, fixed-window); or the leaky bucket's
    /// policing (default) or shaping.
    #[arg(long)]
    pub mode: Option<String>,
    /// Leased mode: the longest a slice is spent before it goes back (default 1s, at most 1m).
    #[arg(long)]
    pub lease_ttl: Option<String>,
    /// Concurrency lease timeout (default 30s).
    #[arg(long)]
    pub lease: Option<String>,
}

/// True for a `--mode` value that names the decision mode rather than a leaky bucket's.
fn is_decision_mode(mode: &str) -> bool {
    matches!(mode, "exact" | "leased")
}

impl PolicyArgs {
    /// The decision mode of `--mode` and `--lease-ttl`, as `mode`/`lease_ttl` of a
    /// `sluice.toml` policy: exact unless `--mode leased`.
    pub fn decision_mode(&self) -> Result<DecisionMode, String> {
        match (self.mode.as_deref(), &self.lease_ttl) {
            (Some("leased"), ttl) => {
                let ttl_ms = match ttl {
                    None => DecisionMode::DEFAULT_LEASE_TTL_MS,
                    Some(t) => parse_duration_ms(t).map_err(|e| format!("--lease-ttl: {e}"))?,
                };
                Ok(DecisionMode::Leased { ttl_ms })
            }
            (_, Some(_)) => Err("--lease-ttl is only for --mode leased".to_string()),
            _ => Ok(DecisionMode::Exact),
        }
    }

    /// The policy these flags describe, named `name` (decision mode included), validated.
    pub fn policy(&self, name: String) -> Result<sluice_core::Policy, String> {
        let mut policy =
            sluice_core::Policy::new(name, self.algorithm()?).map_err(|e| e.to_string())?;
        policy.mode = self.decision_mode()?;
        policy.validate().map_err(|e| e.to_string())?;
        Ok(policy)
    }

    /// The algorithm these flags describe.
    pub fn algorithm(&self) -> Result<Algorithm, String> {
        let kind: AlgorithmKind = self
            .algorithm
            .parse()
            .map_err(|e: sluice_core::algorithm::UnknownAlgorithm| e.to_string())?;
        if let Some(m) = self.mode.as_deref()
            && !is_decision_mode(m)
            && !kind.takes(Param::Mode)
            && m.parse::<LeakyMode>().is_err()
        {
            return Err(format!(
                "--mode must be exact or leased, not {m:?} (a leaky bucket also takes policing or shaping)"
            ));
        }
        let given = [
            (Param::Capacity, self.capacity.is_some()),
            (Param::Rate, self.rate.is_some()),
            (Param::Burst, self.burst.is_some()),
            (Param::Limit, self.limit.is_some()),
            (Param::Window, self.window.is_some()),
            (
                Param::Mode,
                self.mode.as_deref().is_some_and(|m| !is_decision_mode(m)),
            ),
            (Param::Lease, self.lease.is_some()),
        ];
        for (param, is_given) in given {
            if is_given {
                kind.check_param(param).map_err(|e| e.to_string())?;
            }
        }
        let duration = |v: &Option<String>| -> Result<Option<u64>, String> {
            v.as_deref()
                .map(parse_duration_ms)
                .transpose()
                .map_err(|e| e.to_string())
        };
        let calendar = self.window.as_deref().and_then(CalendarPeriod::parse);
        let params = Params {
            capacity: self.capacity,
            rate: self
                .rate
                .as_deref()
                .map(str::parse::<Rate>)
                .transpose()
                .map_err(|e| e.to_string())?,
            burst: self.burst,
            limit: self.limit,
            // A calendar window ("1 month") stands in as its longest length until built.
            window_ms: match calendar {
                Some(period) => Some(period.max_ms()),
                None => duration(&self.window)?,
            },
            mode: self
                .mode
                .as_deref()
                .filter(|m| !is_decision_mode(m))
                .map(str::parse::<LeakyMode>)
                .transpose()
                .map_err(|e| e.to_string())?,
            lease_ms: duration(&self.lease)?,
        };
        let alg = kind.build(&params).map_err(|errors| match errors[0] {
            ParamError::Needs { algorithm, param } => format!("{algorithm} needs --{param}"),
            e => e.to_string(),
        })?;
        let alg = match calendar {
            Some(period) => alg.on_calendar(period).map_err(|e| e.to_string())?,
            None => alg,
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
        mode: None,
        lease_ttl: None,
        lease: None,
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
            "mode" => args.mode = Some(v.to_string()),
            "lease" => args.lease = Some(v.to_string()),
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
        assert_eq!(
            parse_spec("tb:capacity=2,rate=1/s").unwrap().kind(),
            "token-bucket"
        );
        assert_eq!(
            parse_spec("gcra:rate=1/s,capacity=4").unwrap_err(),
            "gcra takes no capacity (it takes rate, burst)"
        );
        assert_eq!(
            parse_spec("fixed-window:limit=10000,window=1 month").unwrap(),
            Algorithm::CalendarWindow {
                limit: 10_000,
                period: CalendarPeriod::Month
            }
        );
        assert!(
            parse_spec("sliding-log:limit=3,window=1 week")
                .unwrap_err()
                .contains("only for fixed-window")
        );
        assert_eq!(
            parse_spec("concurrency:limit=2").unwrap(),
            Algorithm::Concurrency {
                limit: 2,
                lease_ms: 30_000
            }
        );
    }
}
