//! Store selection by URL, the same everywhere a store is chosen (`--store`, config files).
//!
//! | URL | store |
//! |---|---|
//! | `memory` (default) | the embedded store of this process |
//! | `redis://[user:pass@]host:port[/db]` | Redis or Valkey, standalone |
//! | `rediss://...` | the same over TLS |
//! | `redis+cluster://host:port,host:port` | Redis or Valkey Cluster (seed nodes) |
//! | `redis+sentinel://host:port,host:port/<master>` | the master Sentinel reports |
//!
//! Every scheme of `sluice_redis::url::SCHEMES` (`valkey://`, `rediss+cluster://`, ...) is a
//! Redis URL; the list and the redaction of passwords live there only, so the facade cannot
//! disagree with the store about which URLs it takes.

use std::sync::Arc;
use std::time::Duration;

use sluice_core::{Store, StoreError};

/// A parsed store URL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StoreUrl {
    /// The embedded in-memory store.
    Memory,
    /// A Redis/Valkey URL (standalone, TLS or Cluster), handed to the Redis store as is.
    Redis(String),
}

impl std::str::FromStr for StoreUrl {
    type Err = StoreError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let s = s.trim();
        let url = if s.is_empty() || s == "memory" || s.starts_with("memory://") {
            StoreUrl::Memory
        } else if sluice_redis::url::scheme(s).is_some() {
            // Which schemes are Redis URLs is the Redis store's knowledge, asked here.
            StoreUrl::Redis(s.to_string())
        } else {
            return Err(StoreError::Invalid(format!(
                "unknown store URL {:?}: expected memory or one of {}",
                redact(s),
                sluice_redis::url::scheme_list()
            )));
        };
        url.backend_compiled_in()?;
        Ok(url)
    }
}

impl StoreUrl {
    /// The Cargo feature of the `sluice` crate this URL's store needs.
    pub fn feature(&self) -> &'static str {
        match self {
            StoreUrl::Memory => "memory",
            StoreUrl::Redis(_) => "redis",
        }
    }

    /// `Ok` when this build has the store this URL names; else an error naming the feature.
    fn backend_compiled_in(&self) -> Result<(), StoreError> {
        let compiled_in = match self {
            StoreUrl::Memory => cfg!(feature = "memory"),
            StoreUrl::Redis(_) => cfg!(feature = "redis"),
        };
        if compiled_in {
            return Ok(());
        }
        Err(StoreError::Invalid(format!(
            "store URL {self}: this build of sluice has no {} store; enable the `{}` feature of the `sluice` crate",
            self.feature(),
            self.feature()
        )))
    }
}

impl std::fmt::Display for StoreUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StoreUrl::Memory => f.write_str("memory"),
            // Never print a password.
            StoreUrl::Redis(u) => f.write_str(&redact(u)),
        }
    }
}

/// The URL with any password (user info, `pass=` or `password=` query value) replaced by
/// `***`; the Redis store's own function, so there is one redaction rule.
pub use sluice_redis::url::redact;

/// Options for connecting to a store.
#[derive(Debug, Clone)]
pub struct StoreOptions {
    /// Per-call timeout (default 50 ms).
    pub timeout: Duration,
    /// Embedded store: the most keys tracked before eviction (default 1,000,000).
    pub max_keys: usize,
    /// Embedded store: the most bytes it allocates before eviction (default: unbounded).
    pub max_memory: Option<usize>,
    /// Redis and Valkey (standalone): how long the server must answer nothing before a call
    /// that outlived `timeout` counts as the store failing rather than being busy (default
    /// 500 ms); see [`sluice_redis::RedisOptions::unresponsive_after`].
    pub unresponsive_after: Duration,
}

impl Default for StoreOptions {
    fn default() -> Self {
        Self {
            timeout: Duration::from_millis(50),
            max_keys: 1_000_000,
            max_memory: None,
            unresponsive_after: Duration::from_millis(500),
        }
    }
}

impl StoreOptions {
    /// The Redis store's options for these settings.
    #[cfg(feature = "redis")]
    pub fn redis_options(&self) -> sluice_redis::RedisOptions {
        sluice_redis::RedisOptions {
            timeout: self.timeout,
            unresponsive_after: self.unresponsive_after,
            ..Default::default()
        }
    }
}

impl StoreUrl {
    /// Connects to the store.
    pub async fn connect(&self, options: &StoreOptions) -> Result<Arc<dyn Store>, StoreError> {
        self.backend_compiled_in()?;
        match self {
            #[cfg(feature = "memory")]
            StoreUrl::Memory => {
                let mut builder = sluice_memory::MemoryStore::builder().max_keys(options.max_keys);
                if let Some(bytes) = options.max_memory {
                    builder = builder.max_memory(bytes);
                }
                Ok(Arc::new(builder.build()))
            }
            #[cfg(feature = "redis")]
            StoreUrl::Redis(url) => Ok(Arc::new(
                sluice_redis::connect(url, options.redis_options()).await?,
            )),
            // Unreachable: `backend_compiled_in` refused it above.
            #[allow(unreachable_patterns)]
            _ => {
                let _ = options;
                Err(StoreError::Invalid(format!(
                    "store URL {self}: not compiled in"
                )))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    #[cfg(all(feature = "memory", feature = "redis"))]
    fn parses_and_redacts() {
        assert_eq!("memory".parse::<StoreUrl>().unwrap(), StoreUrl::Memory);
        assert!(matches!(
            "redis://127.0.0.1:6379".parse::<StoreUrl>().unwrap(),
            StoreUrl::Redis(_)
        ));
        assert!("mysql://x".parse::<StoreUrl>().is_err());
        assert_eq!(
            redact("redis://user:secret@h:1/0"),
            "redis://user:***@h:1/0"
        );
        assert_eq!(redact("redis://h:1"), "redis://h:1");
    }

    #[test]
    #[cfg(feature = "redis")]
    fn accepts_every_scheme_the_redis_store_accepts() {
        for url in [
            "redis+sentinel://127.0.0.1:26379,127.0.0.1:26380/mymaster/0",
            "rediss+sentinel://s1:1/m",
            "valkey+sentinel://s1:1/m",
            "valkey://h:1",
            "valkeys+cluster://h:1,h:2",
            "rediss+cluster://h:1,h:2",
        ] {
            assert_eq!(
                url.parse::<StoreUrl>().unwrap(),
                StoreUrl::Redis(url.to_string())
            );
        }
        for s in sluice_redis::url::SCHEMES {
            let url = format!("{}://h:1/m", s.name);
            assert!(url.parse::<StoreUrl>().is_ok(), "{url}");
        }
    }

    #[test]
    fn the_error_lists_every_scheme_and_hides_the_password() {
        let err = "mysql://u:secret@h:1?password=other"
            .parse::<StoreUrl>()
            .unwrap_err()
            .to_string();
        for scheme in [
            "redis://",
            "rediss://",
            "valkey://",
            "redis+cluster://",
            "rediss+cluster://",
            "redis+sentinel://",
        ] {
            assert!(err.contains(scheme), "{scheme} missing from {err}");
        }
        assert!(err.contains("memory"), "{err}");
        assert!(!err.contains("secret") && !err.contains("other"), "{err}");
    }

    #[test]
    #[cfg(not(feature = "redis"))]
    fn a_url_of_a_disabled_backend_names_the_feature() {
        let err = "redis+sentinel://u:pw@s1:1/m"
            .parse::<StoreUrl>()
            .unwrap_err()
            .to_string();
        assert!(err.contains("enable the `redis` feature"), "{err}");
        assert!(err.contains("u:***@") && !err.contains("pw@"), "{err}");
        // An unknown scheme is still called unknown, not a missing feature.
        let err = "mysql://x".parse::<StoreUrl>().unwrap_err().to_string();
        assert!(err.contains("unknown store URL"), "{err}");
    }

    #[test]
    #[cfg(not(feature = "memory"))]
    fn memory_without_its_feature_names_the_feature() {
        let err = "memory".parse::<StoreUrl>().unwrap_err().to_string();
        assert!(err.contains("enable the `memory` feature"), "{err}");
    }

    #[test]
    fn redact_hides_a_password_in_the_query() {
        assert_eq!(
            redact("redis://h:1/0?password=secret"),
            "redis://h:1/0?password=***"
        );
        assert_eq!(
            StoreUrl::Redis("redis://u:pw@h:1?pass=pw2".into()).to_string(),
            "redis://u:***@h:1?pass=***"
        );
    }
}
