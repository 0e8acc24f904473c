//! `INFO commandstats`, `INFO memory` and `MEMORY USAGE` on the benchmark's own server.

use std::collections::BTreeMap;

/// Calls and CPU of one command since the last `CONFIG RESETSTAT`.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct CommandStat {
    /// Calls.
    pub calls: u64,
    /// Total µs of server CPU.
    pub usec: u64,
    /// µs per call.
    pub usec_per_call: f64,
}

/// A synchronous connection to `url` (loopback only).
pub fn connect(url: &str) -> Result<redis::Connection, String> {
    crate::require_loopback(url)?;
    redis::Client::open(url)
        .and_then(|c| c.get_connection())
        .map_err(|e| e.to_string())
}

/// Parses `INFO commandstats` into `command -> stat` (`evalsha`, `eval`, `get`...).
pub fn parse_commandstats(info: &str) -> BTreeMap<String, CommandStat> {
    let mut out = BTreeMap::new();
    for line in info.lines() {
        let Some(rest) = line.strip_prefix("cmdstat_") else {
            continue;
        };
        let Some((name, fields)) = rest.split_once(':') else {
            continue;
        };
        let mut s = CommandStat::default();
        for kv in fields.split(',') {
            match kv.split_once('=') {
                Some(("calls", v)) => s.calls = v.trim().parse().unwrap_or(0),
                Some(("usec", v)) => s.usec = v.trim().parse().unwrap_or(0),
                Some(("usec_per_call", v)) => s.usec_per_call = v.trim().parse().unwrap_or(0.0),
                _ => {}
            }
        }
        out.insert(name.to_string(), s);
    }
    out
}

/// The server's command statistics now.
pub fn commandstats(conn: &mut redis::Connection) -> Result<BTreeMap<String, CommandStat>, String> {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query(conn)
        .map_err(|e| e.to_string())?;
    Ok(parse_commandstats(&info))
}

/// Script calls (`EVALSHA` + `EVAL` + `FCALL`) so far.
pub fn script_calls(stats: &BTreeMap<String, CommandStat>) -> u64 {
    ["evalsha", "eval", "fcall"]
        .iter()
        .filter_map(|c| stats.get(*c))
        .map(|s| s.calls)
        .sum()
}

/// One numeric field of `INFO <section>`.
pub fn info_field(conn: &mut redis::Connection, section: &str, field: &str) -> Result<f64, String> {
    let info: String = redis::cmd("INFO")
        .arg(section)
        .query(conn)
        .map_err(|e| e.to_string())?;
    info.lines()
        .find_map(|l| l.strip_prefix(field).and_then(|r| r.strip_prefix(':')))
        .and_then(|v| v.trim().parse().ok())
        .ok_or_else(|| format!("no {field} in INFO {section}"))
}

/// `CONFIG RESETSTAT`.
pub fn reset_stats(conn: &mut redis::Connection) -> Result<(), String> {
    redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query::<()>(conn)
        .map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_commandstats() {
        let s = parse_commandstats(
            "# Commandstats\r\ncmdstat_evalsha:calls=10,usec=70,usec_per_call=7.00,rejected_calls=0,failed_calls=0\r\ncmdstat_get:calls=3,usec=1,usec_per_call=0.33\r\n",
        );
        assert_eq!(
            s["evalsha"],
            CommandStat {
                calls: 10,
                usec: 70,
                usec_per_call: 7.0
            }
        );
        assert_eq!(script_calls(&s), 10);
    }
}
