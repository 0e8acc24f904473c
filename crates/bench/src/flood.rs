//! `sluice-bench flood`: a denied-path flood — CONC loops hammering a few identities far over
//! their limit — with the deny cache off and on, counting the Redis script calls per request
//! from `INFO commandstats` on the benchmark's own server.

use serde_json::json;
use sluice::DenyCacheMode;

use crate::redis_info::{commandstats, connect, script_calls};
use crate::redis_load::{self, LoadConfig};

/// Runs the flood once per mode in `modes`; one JSON object per mode.
pub fn run(base: &LoadConfig, modes: &[DenyCacheMode]) -> Result<Vec<serde_json::Value>, String> {
    let mut conn = connect(&base.url)?;
    let mut out = Vec::new();
    for &mode in modes {
        let _: () = redis::cmd("FLUSHALL")
            .query(&mut conn)
            .map_err(|e| e.to_string())?;
        let before = script_calls(&commandstats(&mut conn)?);
        let mut summary = redis_load::run(LoadConfig {
            deny_cache: mode,
            ..base.clone()
        })?;
        let stats = commandstats(&mut conn)?;
        let calls = script_calls(&stats) - before;
        let requests = summary["decisions_incl_warmup"].as_u64().unwrap_or(0);
        let obj = summary.as_object_mut().ok_or("summary is not an object")?;
        obj.insert("redis_script_calls".into(), json!(calls));
        obj.insert(
            "redis_calls_per_request".into(),
            json!(calls as f64 / requests.max(1) as f64),
        );
        obj.insert(
            "evalsha_usec_per_call".into(),
            json!(stats.get("evalsha").map(|s| s.usec_per_call)),
        );
        out.push(summary);
    }
    Ok(out)
}
