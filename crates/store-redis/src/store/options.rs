//! The options a [`super::RedisStore`] is connected with, and their builder.

use super::{RedisStore, connect};
use sluice_core::{Clock, StoreError};
use std::sync::Arc;
use std::time::Duration;

/// How the logic is installed on the server.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum ScriptMode {
    /// `EVALSHA`, falling back to `EVAL` (which also caches the script) on `NOSCRIPT`.
    #[default]
    Eval,
    /// A function library loaded with `FUNCTION LOAD REPLACE` and called with `FCALL`; it
    /// persists and replicates with the data. Reloaded if a server answers that it is missing.
    Functions,
}

/// Options of [`RedisStore`].
#[derive(Debug, Clone)]
pub struct RedisOptions {
    /// The longest a call may take before [`StoreError::Timeout`] (default 50 ms).
    pub timeout: Duration,
    /// The longest the initial connection may take (default 2 s).
    pub connect_timeout: Duration,
    /// Scripts or functions.
    pub mode: ScriptMode,
    /// A clock to take `now` from instead of the server's `TIME` (tests, simulations). The
    /// store then passes `now` to the scripts explicitly.
    pub clock: Option<Arc<dyn Clock>>,
    /// Text put in front of every key name (no `{` or `}`, so slots are unchanged); lets
    /// several independent users share one server (e.g. tests).
    pub namespace: Option<String>,
    /// Extra TTL (ms) on every write. `None`: 0 with the server clock; 10 minutes with an
    /// injected clock, because Redis expires keys on its own clock, not the injected one.
    pub ttl_pad_ms: Option<u64>,
    /// Send concurrent one-limit checks together in one script call (default true; only
    /// standalone servers in script mode with the server clock; see `src/batch.rs`).
    pub batch: bool,
    /// The longest a call may wait in sluice's own queue (the batching queue, or for a free
    /// in-flight slot) before it is answered [`StoreError::Overloaded`] (default 1 s). This
    /// wait is not part of `timeout`: a busy sluice is not a failing store.
    pub queue_wait: Duration,
    /// How long a standalone server must stay silent, while calls wait on it, before a call
    /// that outlived its timeout counts as the store failing (default 500 ms, never below
    /// `timeout`). A server that answered any call within this window is alive but busy: the
    /// timed-out call is answered [`StoreError::Overloaded`], which is denied, so a flood
    /// that slows the server down cannot make it fail open. Only after this much silence
    /// does the policy's failure mode apply.
    pub unresponsive_after: Duration,
}

/// The default [`RedisOptions::unresponsive_after`].
pub const DEFAULT_UNRESPONSIVE_AFTER: Duration = Duration::from_millis(500);

impl Default for RedisOptions {
    fn default() -> Self {
        Self {
            timeout: Duration::from_millis(50),
            connect_timeout: Duration::from_secs(2),
            mode: ScriptMode::Eval,
            clock: None,
            namespace: None,
            ttl_pad_ms: None,
            batch: true,
            queue_wait: Duration::from_secs(1),
            unresponsive_after: DEFAULT_UNRESPONSIVE_AFTER,
        }
    }
}

/// Builds a [`RedisStore`].
#[derive(Debug, Clone)]
pub struct RedisStoreBuilder {
    pub(super) url: String,
    pub(super) options: RedisOptions,
}

impl RedisStoreBuilder {
    /// The per-call timeout.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.options.timeout = timeout;
        self
    }
    /// The initial connection timeout.
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.options.connect_timeout = timeout;
        self
    }
    /// Scripts (`EVALSHA`) or functions (`FCALL`).
    pub fn mode(mut self, mode: ScriptMode) -> Self {
        self.options.mode = mode;
        self
    }
    /// Takes `now` from `clock` instead of the server's `TIME`.
    pub fn clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.options.clock = Some(clock);
        self
    }
    /// Prefixes every key name.
    pub fn namespace(mut self, namespace: impl Into<String>) -> Self {
        self.options.namespace = Some(namespace.into());
        self
    }
    /// Extra TTL on every write.
    pub fn ttl_pad_ms(mut self, ms: u64) -> Self {
        self.options.ttl_pad_ms = Some(ms);
        self
    }
    /// Batch concurrent one-limit checks into one script call (default on).
    pub fn batch(mut self, on: bool) -> Self {
        self.options.batch = on;
        self
    }
    /// The longest a call may wait in sluice's own queue (default 1 s).
    pub fn queue_wait(mut self, wait: Duration) -> Self {
        self.options.queue_wait = wait;
        self
    }
    /// How long the server must be silent before a timed-out call is a store failure
    /// rather than overload (default 500 ms; see [`RedisOptions::unresponsive_after`]).
    pub fn unresponsive_after(mut self, window: Duration) -> Self {
        self.options.unresponsive_after = window;
        self
    }
    /// Connects.
    pub async fn connect(self) -> Result<RedisStore, StoreError> {
        connect(&self.url, self.options).await
    }
}
