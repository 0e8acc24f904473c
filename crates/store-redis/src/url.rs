//! Store URLs.
//!
//! | form | meaning |
//! |---|---|
//! | `redis://[user:pass@]host:port[/db]` (or `valkey://`) | standalone Redis or Valkey |
//! | `rediss://...` (or `valkeys://`) | the same over TLS (needs a TLS build of the client; see `docs/redis.md`) |
//! | `redis+cluster://[user:pass@]host:port,host:port` (or `redis-cluster://`) | a Cluster, from seed nodes |
//!
//! Query options (removed before the URL reaches the client): `mode=eval` (default) or
//! `mode=functions`; `timeout_ms=N`; `namespace=TEXT`.

use crate::{RedisOptions, ScriptMode};
use sluice_core::StoreError;
use std::time::Duration;

/// A parsed store URL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ParsedUrl {
    /// One URL for a standalone server, the seed nodes for a Cluster.
    pub(crate) nodes: Vec<String>,
    pub(crate) cluster: bool,
    pub(crate) tls: bool,
}

fn invalid(msg: impl Into<String>) -> StoreError {
    StoreError::Invalid(msg.into())
}

/// Parses `url`, applying its query options to `options`.
pub(crate) fn parse(url: &str, options: &mut RedisOptions) -> Result<ParsedUrl, StoreError> {
    let (scheme, rest) = url
        .split_once("://")
        .ok_or_else(|| invalid(format!("not a Redis URL: {}", redact(url))))?;
    let (cluster, tls) = match scheme.to_ascii_lowercase().as_str() {
        "redis" | "valkey" => (false, false),
        "rediss" | "valkeys" => (false, true),
        "redis+cluster" | "redis-cluster" | "valkey+cluster" => (true, false),
        "rediss+cluster" | "rediss-cluster" | "valkeys+cluster" => (true, true),
        other => return Err(invalid(format!("unknown Redis URL scheme {other:?}"))),
    };
    let (rest, query) = match rest.split_once('?') {
        Some((r, q)) => (r, Some(q)),
        None => (rest, None),
    };
    let mut passthrough = Vec::new();
    for pair in query
        .into_iter()
        .flat_map(|q| q.split('&'))
        .filter(|p| !p.is_empty())
    {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        match k {
            "mode" => {
                options.mode = match v {
                    "eval" | "evalsha" | "scripts" => ScriptMode::Eval,
                    "functions" | "function" | "fcall" => ScriptMode::Functions,
                    _ => {
                        return Err(invalid(format!(
                            "unknown mode {v:?}: expected eval or functions"
                        )));
                    }
                }
            }
            "timeout_ms" => {
                let ms: u64 = v
                    .parse()
                    .map_err(|_| invalid(format!("bad timeout_ms {v:?}")))?;
                options.timeout = Duration::from_millis(ms.max(1));
            }
            "namespace" => options.namespace = Some(v.to_string()),
            _ => passthrough.push(pair),
        }
    }
    let scheme_out = if tls { "rediss" } else { "redis" };
    let query_out = if passthrough.is_empty() {
        String::new()
    } else {
        format!("?{}", passthrough.join("&"))
    };
    if !cluster {
        return Ok(ParsedUrl {
            nodes: vec![format!("{scheme_out}://{rest}{query_out}")],
            cluster,
            tls,
        });
    }
    // Cluster: `[user:pass@]h:p,h:p[/db]`; the credentials apply to every node.
    let (auth, hosts) = match rest.rfind('@') {
        Some(i) => (Some(&rest[..i]), &rest[i + 1..]),
        None => (None, rest),
    };
    let hosts = hosts.split('/').next().unwrap_or("");
    let nodes: Vec<String> = hosts
        .split(',')
        .map(str::trim)
        .filter(|h| !h.is_empty())
        .map(|h| match auth {
            Some(a) => format!("{scheme_out}://{a}@{h}{query_out}"),
            None => format!("{scheme_out}://{h}{query_out}"),
        })
        .collect();
    if nodes.is_empty() {
        return Err(invalid("a cluster URL needs at least one host:port"));
    }
    Ok(ParsedUrl {
        nodes,
        cluster,
        tls,
    })
}

/// The URL with its password replaced by `***`, for errors and logs.
pub fn redact(url: &str) -> String {
    if let Some((scheme, rest)) = url.split_once("://")
        && let Some(at) = rest.rfind('@')
    {
        let (auth, tail) = rest.split_at(at);
        if let Some((user, _)) = auth.split_once(':') {
            return format!("{scheme}://{user}:***{tail}");
        }
    }
    url.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn standalone_and_cluster_forms() {
        let mut o = RedisOptions::default();
        let p = parse(
            "redis://u:pw@127.0.0.1:6379/2?mode=functions&timeout_ms=20",
            &mut o,
        )
        .unwrap();
        assert_eq!(p.nodes, vec!["redis://u:pw@127.0.0.1:6379/2".to_string()]);
        assert!(!p.cluster);
        assert_eq!(o.mode, ScriptMode::Functions);
        assert_eq!(o.timeout, Duration::from_millis(20));

        let mut o = RedisOptions::default();
        let p = parse("redis+cluster://a:b@h1:1,h2:2", &mut o).unwrap();
        assert!(p.cluster);
        assert_eq!(
            p.nodes,
            vec![
                "redis://a:b@h1:1".to_string(),
                "redis://a:b@h2:2".to_string()
            ]
        );
        let p = parse("redis-cluster://h1:1", &mut o).unwrap();
        assert_eq!(p.nodes, vec!["redis://h1:1".to_string()]);
        assert!(parse("http://x", &mut o).is_err());
        assert!(parse("redis://h:1?mode=bogus", &mut o).is_err());
        assert!(parse("valkeys://h:1", &mut o).unwrap().tls);
    }

    #[test]
    fn redacts_passwords() {
        assert_eq!(
            redact("redis://user:secret@h:1/0"),
            "redis://user:***@h:1/0"
        );
        assert_eq!(redact("redis://h:1"), "redis://h:1");
    }
}
