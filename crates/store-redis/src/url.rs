//! Store URLs.
//!
//! | form | meaning |
//! |---|---|
//! | `redis://[user:pass@]host:port[/db]` (or `valkey://`) | standalone Redis or Valkey |
//! | `rediss://...` (or `valkeys://`) | the same over TLS (OpenSSL through `native-tls`) |
//! | `redis+cluster://[user:pass@]host:port,host:port` (or `redis-cluster://`) | a Cluster, from seed nodes |
//! | `rediss+cluster://...` | a Cluster over TLS |
//! | `redis+sentinel://[user:pass@]host:port,host:port/<master>[/db]` | the master named `<master>`, found through Sentinel |
//!
//! Query options (removed before the URL reaches the client): `mode=eval` (default) or
//! `mode=functions`; `timeout_ms=N`; `namespace=TEXT`; TLS: `ca=/path/ca.pem` (trust this CA
//! instead of the system store), `cert=/path/client.pem&key=/path/client.key` (a client
//! certificate, for servers with `tls-auth-clients yes`). The fragment `#insecure` (the `redis`
//! crate's own) turns certificate verification off.
//!
//! This module is the one place that knows which schemes are Redis URLs ([`SCHEMES`],
//! [`scheme`]) and how to print a URL without its password ([`redact`]): the `sluice` facade
//! asks it before choosing a store, so a scheme accepted here is accepted everywhere.

#[cfg(feature = "client")]
use crate::{RedisOptions, ScriptMode};
#[cfg(feature = "client")]
use sluice_core::StoreError;
#[cfg(feature = "client")]
use std::time::Duration;

/// What a Redis URL connects to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Topology {
    /// One server.
    Standalone,
    /// A Cluster, from seed nodes.
    Cluster,
    /// The master that Sentinel reports for a name.
    Sentinel,
}

/// One accepted URL scheme.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Scheme {
    /// The scheme as written before `://` (matched without regard to case).
    pub name: &'static str,
    /// What it connects to.
    pub topology: Topology,
    /// Whether the connection (to the master, for Sentinel) uses TLS.
    pub tls: bool,
}

const fn scheme_entry(name: &'static str, topology: Topology, tls: bool) -> Scheme {
    Scheme {
        name,
        topology,
        tls,
    }
}

/// Every scheme this store accepts, the primary spelling of each kind first.
pub const SCHEMES: &[Scheme] = &[
    scheme_entry("redis", Topology::Standalone, false),
    scheme_entry("rediss", Topology::Standalone, true),
    scheme_entry("valkey", Topology::Standalone, false),
    scheme_entry("valkeys", Topology::Standalone, true),
    scheme_entry("redis+cluster", Topology::Cluster, false),
    scheme_entry("rediss+cluster", Topology::Cluster, true),
    scheme_entry("redis-cluster", Topology::Cluster, false),
    scheme_entry("rediss-cluster", Topology::Cluster, true),
    scheme_entry("valkey+cluster", Topology::Cluster, false),
    scheme_entry("valkeys+cluster", Topology::Cluster, true),
    scheme_entry("redis+sentinel", Topology::Sentinel, false),
    scheme_entry("rediss+sentinel", Topology::Sentinel, true),
    scheme_entry("redis-sentinel", Topology::Sentinel, false),
    scheme_entry("rediss-sentinel", Topology::Sentinel, true),
    scheme_entry("valkey+sentinel", Topology::Sentinel, false),
    scheme_entry("valkeys+sentinel", Topology::Sentinel, true),
];

/// The scheme of `url` if it is one of [`SCHEMES`] (`None` for anything else, including a
/// text without `://`).
pub fn scheme(url: &str) -> Option<Scheme> {
    let (name, _) = url.trim().split_once("://")?;
    SCHEMES
        .iter()
        .find(|s| s.name.eq_ignore_ascii_case(name))
        .copied()
}

/// Every accepted scheme as `redis://, rediss://, ...`, for error messages.
pub fn scheme_list() -> String {
    SCHEMES
        .iter()
        .map(|s| format!("{}://", s.name))
        .collect::<Vec<_>>()
        .join(", ")
}

/// A parsed store URL.
#[cfg(feature = "client")]
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ParsedUrl {
    /// One URL for a standalone server, the seed nodes for a Cluster.
    pub(crate) nodes: Vec<String>,
    pub(crate) cluster: bool,
    pub(crate) tls: bool,
    /// `?ca=`: a PEM file of CA certificates to trust instead of the system store.
    pub(crate) ca: Option<String>,
    /// `?cert=` and `?key=`: a client certificate and its (PKCS#8 PEM) key.
    pub(crate) client_cert: Option<(String, String)>,
    /// Sentinel: the master's name; `nodes` are then the sentinels, and `node_url` the URL
    /// whose credentials and database apply to the master.
    pub(crate) sentinel: Option<SentinelTarget>,
}

/// Where a `redis+sentinel://` URL points.
#[cfg(feature = "client")]
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SentinelTarget {
    /// The master's name, as configured in the sentinels (`sentinel monitor <name> ...`).
    pub(crate) master: String,
    /// `redis[s]://[user:pass@]<first sentinel>/<db>`: carries the credentials and database
    /// to use on the master (its address is replaced by what the sentinels report).
    pub(crate) node_url: String,
}

#[cfg(feature = "client")]
fn invalid(msg: impl Into<String>) -> StoreError {
    StoreError::Invalid(msg.into())
}

#[cfg(feature = "client")]
/// Parses `url`, applying its query options to `options`.
pub(crate) fn parse(url: &str, options: &mut RedisOptions) -> Result<ParsedUrl, StoreError> {
    let (url, fragment) = match url.split_once('#') {
        Some((u, f)) => (u, format!("#{f}")),
        None => (url, String::new()),
    };
    if !fragment.is_empty() && fragment != "#insecure" {
        return Err(invalid(format!(
            "unknown URL fragment {fragment:?}: only #insecure is supported"
        )));
    }
    let (scheme_name, rest) = url
        .split_once("://")
        .ok_or_else(|| invalid(format!("not a Redis URL: {}", redact(url))))?;
    let Some(Scheme { topology, tls, .. }) = scheme(url) else {
        return Err(invalid(format!(
            "unknown Redis URL scheme {scheme_name:?}: expected one of {}",
            scheme_list()
        )));
    };
    let cluster = topology == Topology::Cluster;
    let sentinel = topology == Topology::Sentinel;
    let (rest, query) = match rest.split_once('?') {
        Some((r, q)) => (r, Some(q)),
        None => (rest, None),
    };
    let mut passthrough = Vec::new();
    let (mut ca, mut cert, mut key) = (None, None, None);
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
            "ca" | "tls_ca" => ca = Some(v.to_string()),
            "cert" | "tls_cert" => cert = Some(v.to_string()),
            "key" | "tls_key" => key = Some(v.to_string()),
            _ => passthrough.push(pair),
        }
    }
    if (ca.is_some() || cert.is_some() || key.is_some()) && !tls {
        return Err(invalid(
            "ca=, cert= and key= need a TLS URL (rediss://, rediss+cluster://, rediss+sentinel://)",
        ));
    }
    let client_cert = match (cert, key) {
        (Some(c), Some(k)) => Some((c, k)),
        (None, None) => None,
        _ => return Err(invalid("cert= and key= go together")),
    };
    let scheme_out = if tls { "rediss" } else { "redis" };
    let query_out = if passthrough.is_empty() {
        String::new()
    } else {
        format!("?{}", passthrough.join("&"))
    };
    if !cluster && !sentinel {
        return Ok(ParsedUrl {
            nodes: vec![format!("{scheme_out}://{rest}{query_out}{fragment}")],
            cluster,
            tls,
            ca,
            client_cert,
            sentinel: None,
        });
    }
    // Cluster: `[user:pass@]h:p,h:p[/db]`; the credentials apply to every node.
    // Sentinel: `[user:pass@]h:p,h:p/<master>[/db]`; the credentials and db apply to the master.
    let (auth, hosts) = match rest.rfind('@') {
        Some(i) => (Some(&rest[..i]), &rest[i + 1..]),
        None => (None, rest),
    };
    let mut path = hosts.split('/');
    let hosts: Vec<&str> = path
        .next()
        .unwrap_or("")
        .split(',')
        .map(str::trim)
        .filter(|h| !h.is_empty())
        .collect();
    if hosts.is_empty() {
        return Err(invalid(format!(
            "a {} URL needs at least one host:port",
            if cluster { "cluster" } else { "sentinel" }
        )));
    }
    if cluster {
        let nodes = hosts
            .iter()
            .map(|h| match auth {
                Some(a) => format!("{scheme_out}://{a}@{h}{query_out}{fragment}"),
                None => format!("{scheme_out}://{h}{query_out}{fragment}"),
            })
            .collect();
        return Ok(ParsedUrl {
            nodes,
            cluster,
            tls,
            ca,
            client_cert,
            sentinel: None,
        });
    }
    let master = path.next().unwrap_or("").to_string();
    if master.is_empty() {
        return Err(invalid(
            "a sentinel URL needs the master name: redis+sentinel://host:port,host:port/<master>[/db]",
        ));
    }
    let db = match path.next() {
        None | Some("") => 0,
        Some(d) => d
            .parse::<u32>()
            .map_err(|_| invalid(format!("bad database index {d:?}")))?,
    };
    // The sentinels themselves are reached in clear text without credentials (the common
    // setup); TLS, credentials and db apply to the master.
    let nodes = hosts.iter().map(|h| format!("redis://{h}")).collect();
    let node_url = match auth {
        Some(a) => format!("{scheme_out}://{a}@{}/{db}{query_out}{fragment}", hosts[0]),
        None => format!("{scheme_out}://{}/{db}{query_out}{fragment}", hosts[0]),
    };
    Ok(ParsedUrl {
        nodes,
        cluster,
        tls,
        ca,
        client_cert,
        sentinel: Some(SentinelTarget { master, node_url }),
    })
}

#[cfg(feature = "client")]
/// The password of `url` (user info, or a `pass=` / `password=` query value), if any, so
/// error messages can be scrubbed of it.
pub(crate) fn password(url: &str) -> Option<String> {
    let (_, rest) = url.split_once("://")?;
    if let Some(at) = rest.rfind('@')
        && let Some((_, pw)) = rest[..at].split_once(':')
        && !pw.is_empty()
    {
        return Some(pw.to_string());
    }
    let (_, q) = rest.split_once('?')?;
    q.split(['&', '#'])
        .filter_map(|p| p.split_once('='))
        .find(|(k, v)| matches!(*k, "pass" | "password") && !v.is_empty())
        .map(|(_, v)| v.to_string())
}

#[cfg(feature = "client")]
/// Percent-decodes `s` (as the client does with a URL's password).
pub(crate) fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%'
            && i + 2 < b.len()
            && b[i + 1].is_ascii_hexdigit()
            && b[i + 2].is_ascii_hexdigit()
            && let Ok(v) = u8::from_str_radix(&s[i + 1..i + 3], 16)
        {
            out.push(v);
            i += 3;
            continue;
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The URL with its password replaced by `***`, for errors and logs.
pub fn redact(url: &str) -> String {
    if let Some((scheme, rest)) = url.split_once("://")
        && let Some(at) = rest.rfind('@')
    {
        let (auth, tail) = rest.split_at(at);
        if let Some((user, _)) = auth.split_once(':') {
            return redact_query(&format!("{scheme}://{user}:***{tail}"));
        }
    }
    redact_query(url)
}

/// `pass=` / `password=` query values replaced by `***`.
fn redact_query(url: &str) -> String {
    let Some((head, q)) = url.split_once('?') else {
        return url.to_string();
    };
    let q: Vec<String> = q
        .split('&')
        .map(|p| match p.split_once('=') {
            Some((k @ ("pass" | "password"), _)) => format!("{k}=***"),
            _ => p.to_string(),
        })
        .collect();
    format!("{head}?{}", q.join("&"))
}

#[cfg(all(test, feature = "client"))]
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
    fn tls_and_sentinel_forms() {
        let mut o = RedisOptions::default();
        let p = parse(
            "rediss://u:pw@h:1/2?ca=/x/ca.pem&cert=/x/c.pem&key=/x/c.key&protocol=resp3",
            &mut o,
        )
        .unwrap();
        assert!(p.tls && !p.cluster && p.sentinel.is_none());
        assert_eq!(
            p.nodes,
            vec!["rediss://u:pw@h:1/2?protocol=resp3".to_string()]
        );
        assert_eq!(p.ca.as_deref(), Some("/x/ca.pem"));
        assert_eq!(
            p.client_cert,
            Some(("/x/c.pem".to_string(), "/x/c.key".to_string()))
        );
        let p = parse("rediss://h:1/?namespace=n#insecure", &mut o).unwrap();
        assert_eq!(p.nodes, vec!["rediss://h:1/#insecure".to_string()]);
        assert_eq!(o.namespace.as_deref(), Some("n"));
        let p = parse("rediss+cluster://h1:1,h2:2#insecure", &mut o).unwrap();
        assert_eq!(
            p.nodes,
            vec![
                "rediss://h1:1#insecure".to_string(),
                "rediss://h2:2#insecure".to_string()
            ]
        );
        assert!(parse("redis://h:1#other", &mut o).is_err());
        assert!(parse("redis://h:1?ca=/x", &mut o).is_err());
        assert!(parse("rediss://h:1?cert=/x", &mut o).is_err());

        let p = parse(
            "redis+sentinel://u:pw@s1:1,s2:2/mymaster/3?timeout_ms=9",
            &mut o,
        )
        .unwrap();
        assert_eq!(
            p.nodes,
            vec!["redis://s1:1".to_string(), "redis://s2:2".to_string()]
        );
        assert_eq!(
            p.sentinel,
            Some(SentinelTarget {
                master: "mymaster".into(),
                node_url: "redis://u:pw@s1:1/3".into()
            })
        );
        assert_eq!(o.timeout, Duration::from_millis(9));
        let p = parse("rediss+sentinel://s1:1/m", &mut o).unwrap();
        assert_eq!(p.sentinel.unwrap().node_url, "rediss://s1:1/0");
        assert!(parse("redis+sentinel://s1:1", &mut o).is_err());
        assert!(parse("redis+sentinel://s1:1/m/x", &mut o).is_err());
    }

    #[test]
    fn finds_passwords_to_scrub() {
        assert_eq!(password("redis://u:p%40ss@h:1").as_deref(), Some("p%40ss"));
        assert_eq!(percent_decode("p%40ss%zz%4"), "p@ss%zz%4");
        assert_eq!(password("redis://:pw@h:1").as_deref(), Some("pw"));
        assert_eq!(password("redis://u@h:1"), None);
        assert_eq!(password("redis://h:1?pass=pw&db=1").as_deref(), Some("pw"));
        assert_eq!(
            redact("redis://h:1?db=1&pass=pw"),
            "redis://h:1?db=1&pass=***"
        );
    }

    #[test]
    fn redacts_passwords() {
        assert_eq!(
            redact("redis://user:secret@h:1/0"),
            "redis://user:***@h:1/0"
        );
        assert_eq!(redact("redis://h:1"), "redis://h:1");
        assert_eq!(
            redact("redis://h:1/0?password=secret&protocol=resp3"),
            "redis://h:1/0?password=***&protocol=resp3"
        );
        assert_eq!(
            redact("redis+sentinel://u:secret@s1:1,s2:2/m?password=other"),
            "redis+sentinel://u:***@s1:1,s2:2/m?password=***"
        );
    }

    #[test]
    fn every_listed_scheme_parses_and_nothing_else() {
        for s in SCHEMES {
            let url = match s.topology {
                Topology::Sentinel => format!("{}://s1:1,s2:2/m", s.name.to_uppercase()),
                _ => format!("{}://h1:1", s.name.to_uppercase()),
            };
            let p = parse(&url, &mut RedisOptions::default()).unwrap();
            assert_eq!(p.tls, s.tls, "{url}");
            assert_eq!(p.cluster, s.topology == Topology::Cluster, "{url}");
            assert_eq!(
                p.sentinel.is_some(),
                s.topology == Topology::Sentinel,
                "{url}"
            );
            assert_eq!(scheme(&url), Some(*s));
        }
        assert_eq!(scheme("memory"), None);
        assert_eq!(scheme("redis+foo://h:1"), None);
        let err = parse("redis+foo://h:1", &mut RedisOptions::default()).unwrap_err();
        assert!(err.to_string().contains("valkey://"), "{err}");
        assert!(err.to_string().contains("rediss+sentinel://"), "{err}");
    }
}
