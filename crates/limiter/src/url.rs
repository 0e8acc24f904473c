//! Store selection by URL, the same everywhere a store is chosen (`--store`, config files).
//!
//! | URL | store |
//! |---|---|
//! | `memory` (default) | the embedded store of this process |
//! | `redis://[user:pass@]host:port[/db]` | Redis or Valkey, standalone |
//! | `rediss://...` | the same over TLS |
//! | `redis+cluster://host:port,host:port` | Redis or Valkey Cluster (seed nodes) |

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
        if s.is_empty() || s == "memory" || s.starts_with("memory://") {
            return Ok(StoreUrl::Memory);
        }
        let scheme = s.split("://").next().unwrap_or("");
        match scheme {
            "redis" | "rediss" | "redis+cluster" | "rediss+cluster" | "redis-cluster"
            | "valkey" | "valkeys" => Ok(StoreUrl::Redis(s.to_string())),
            _ => Err(StoreError::Invalid(format!(
                "unknown store URL {s:?}: expected memory, redis://, rediss:// or redis+cluster://"
            ))),
        }
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

/// The URL with any password replaced by `***`.
pub fn redact(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(s), Some(at)) if at > s => {
            let creds = &url[s + 3..at];
            match creds.find(':') {
                Some(c) => format!("{}{}:***{}", &url[..s + 3], &creds[..c], &url[at..]),
                None => url.to_string(),
            }
        }
        _ => url.to_string(),
    }
}

/// Options for connecting to a store.
#[derive(Debug, Clone)]
pub struct StoreOptions {
    /// Per-call timeout (default 50 ms).
    pub timeout: Duration,
    /// Embedded store: the most keys tracked before eviction (default 1,000,000).
    pub max_keys: usize,
}

impl Default for StoreOptions {
    fn default() -> Self {
        Self {
            timeout: Duration::from_millis(50),
            max_keys: 1_000_000,
        }
    }
}

impl StoreUrl {
    /// Connects to the store.
    pub async fn connect(&self, options: &StoreOptions) -> Result<Arc<dyn Store>, StoreError> {
        match self {
            StoreUrl::Memory => Ok(Arc::new(
                sluice_memory::MemoryStore::builder()
                    .max_keys(options.max_keys)
                    .build(),
            )),
            StoreUrl::Redis(url) => {
                let options = sluice_redis::RedisOptions {
                    timeout: options.timeout,
                    ..Default::default()
                };
                Ok(Arc::new(sluice_redis::connect(url, options).await?))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
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
}
