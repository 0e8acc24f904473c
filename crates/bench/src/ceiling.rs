//! `sluice-bench ceiling`: `redis-benchmark` running sluice's own script for one algorithm on
//! random keys — the throughput ceiling a client of that script can reach on this server —
//! reported as one JSON line in the `EXTRA_CLIENTS` form, so it lands in the same run and
//! table as the anchors (its `allowed` is unknown and reported as 0).

use std::process::Command;

use serde_json::json;

/// What to run.
#[derive(Debug, Clone)]
pub struct CeilingConfig {
    /// The server's port on 127.0.0.1.
    pub port: u16,
    /// Algorithm CLI name.
    pub algorithm: String,
    /// `-c`.
    pub clients: u32,
    /// `-P`.
    pub pipeline: u32,
    /// `-n`.
    pub requests: u64,
    /// `-r`: random keys out of this many.
    pub keyspace: u64,
    /// Instead of sluice's script: this Lua file called as the seed guide's token bucket
    /// (`KEYS[1]`, ARGV capacity 10, rate 5, cost 1), for a same-pipelining comparison.
    pub guide: Option<std::path::PathBuf>,
}

/// The script and its ARGV (after `numkeys` and the key) for an algorithm, with the
/// like-for-like parameters of [`crate::bench_algorithm`]; `None` for the algorithms whose
/// entries need a unique token per call (sliding log, concurrency).
pub fn script_and_args(algorithm: &str) -> Option<(&'static str, Vec<String>)> {
    let (alg, code) = crate::bench_algorithm(algorithm).ok()?;
    if alg.stores_member(1) {
        return None;
    }
    let name = alg.kind();
    // The item: its Lua code, cost 1, then the parameters the store encodes.
    let params = alg.store_params().map(|p| p.to_string());
    let item = [code.to_string(), "1".to_string()]
        .into_iter()
        .chain(params);
    let src = sluice_redis::scripts()
        .into_iter()
        .find(|(n, _)| *n == name)?
        .1;
    // now "" (server TIME), pad 0, the item, token "".
    let mut args = vec![String::new(), "0".to_string()];
    args.extend(item);
    args.push(String::new());
    Some((src, args))
}

/// Loads the script, runs redis-benchmark, returns the JSON summary.
pub fn run(cfg: &CeilingConfig) -> Result<serde_json::Value, String> {
    let url = format!("redis://127.0.0.1:{}/0", cfg.port);
    let guide_src;
    let (src, args, what) = match &cfg.guide {
        Some(path) => {
            guide_src =
                std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
            (
                guide_src.as_str(),
                vec!["10".into(), "5".into(), "1".into()],
                "the guide's token_bucket.lua".to_string(),
            )
        }
        None => {
            let (src, args) = script_and_args(&cfg.algorithm).ok_or_else(|| {
                format!(
                    "no redis-benchmark form for {} (its entries need unique tokens)",
                    cfg.algorithm
                )
            })?;
            (src, args, format!("sluice {}", cfg.algorithm))
        }
    };
    let mut conn = crate::redis_info::connect(&url)?;
    let sha: String = redis::cmd("SCRIPT")
        .arg("LOAD")
        .arg(src)
        .query(&mut conn)
        .map_err(|e| e.to_string())?;
    let out = Command::new("redis-benchmark")
        .args(["-h", "127.0.0.1", "-p", &cfg.port.to_string()])
        .args([
            "-c",
            &cfg.clients.to_string(),
            "-P",
            &cfg.pipeline.to_string(),
        ])
        .args([
            "-n",
            &cfg.requests.to_string(),
            "-r",
            &cfg.keyspace.to_string(),
            "--csv",
        ])
        .args(["EVALSHA", &sha, "1", "rl:{user:__rand_int__}:bench"])
        .args(&args)
        .output()
        .map_err(|e| format!("redis-benchmark: {e}"))?;
    let csv = String::from_utf8_lossy(&out.stdout);
    let row = parse_csv(&csv).ok_or_else(|| format!("unexpected redis-benchmark output: {csv}"))?;
    Ok(json!({
        "name": format!("redis-benchmark -c {} -P {} EVALSHA {what}", cfg.clients, cfg.pipeline),
        "decisions_per_s": row.rps,
        "decisions": cfg.requests,
        "allowed": 0,
        "errors": 0,
        "p50_us": row.p50_ms * 1000.0,
        "p99_us": row.p99_ms * 1000.0,
        "decisions_incl_warmup": cfg.requests,
        "lib": format!("redis-benchmark ({what})"),
        "pipeline": cfg.pipeline,
    }))
}

/// One redis-benchmark CSV result row.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CsvRow {
    /// Requests per second.
    pub rps: f64,
    /// Median latency, ms.
    pub p50_ms: f64,
    /// 99th percentile latency, ms.
    pub p99_ms: f64,
}

/// Parses redis-benchmark's `--csv` output (header + one row).
pub fn parse_csv(csv: &str) -> Option<CsvRow> {
    let mut lines = csv.lines().filter(|l| !l.trim().is_empty());
    let header: Vec<String> = lines
        .next()?
        .split(',')
        .map(|s| s.trim_matches('"').to_string())
        .collect();
    let row: Vec<String> = lines
        .next()?
        .split("\",\"")
        .map(|s| s.trim_matches('"').to_string())
        .collect();
    let col = |name: &str| {
        header
            .iter()
            .position(|h| h == name)
            .and_then(|i| row.get(i)?.parse::<f64>().ok())
    };
    Some(CsvRow {
        rps: col("rps")?,
        p50_ms: col("p50_latency_ms")?,
        p99_ms: col("p99_latency_ms")?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_redis_benchmark_csv() {
        let csv = "\"test\",\"rps\",\"avg_latency_ms\",\"min_latency_ms\",\"p50_latency_ms\",\"p95_latency_ms\",\"p99_latency_ms\",\"max_latency_ms\"\n\"EVALSHA a,b\",\"81234.50\",\"0.5\",\"0.1\",\"0.463\",\"0.8\",\"1.023\",\"3.1\"\n";
        let r = parse_csv(csv).unwrap();
        assert_eq!(
            r,
            CsvRow {
                rps: 81234.5,
                p50_ms: 0.463,
                p99_ms: 1.023
            }
        );
    }

    #[test]
    fn scripts_exist_for_the_token_free_algorithms() {
        for a in [
            "token-bucket",
            "gcra",
            "leaky-bucket",
            "fixed-window",
            "sliding-counter",
        ] {
            assert!(script_and_args(a).is_some(), "{a}");
        }
        assert!(script_and_args("sliding-log").is_none());
        assert!(script_and_args("concurrency").is_none());
        // Server time, pad, then the item: code, cost, parameters; then no token.
        let (_, args) = script_and_args("tb").unwrap();
        assert_eq!(args, ["", "0", "tb", "1", "10", "1", "200", "0", ""]);
        let (_, args) = script_and_args("sliding-window-counter").unwrap();
        assert_eq!(args, ["", "0", "swc", "1", "10", "2000", "0", "0", ""]);
        // GCRA at 5/s: its emission interval in µs, then the burst.
        let (_, args) = script_and_args("gcra").unwrap();
        assert_eq!(args, ["", "0", "gcra", "1", "200000", "9", "0", "0", ""]);
    }
}
