//! Plain commands on the store's connection, for small data kept next to the limiter state
//! (the limiter's control plane: overrides, bans, allow and deny lists). They share the
//! store's connection, reconnection, Cluster routing and per-call timeout; the caller names
//! full keys (see [`RedisStore::server_key`] for the namespace).

use super::{RedisStore, map_err};
use redis::Value;
use sluice_core::StoreError;

impl RedisStore {
    /// Sends one command (routed by its first key on a Cluster) under the per-call timeout.
    pub async fn command(&self, cmd: &redis::Cmd) -> Result<Value, StoreError> {
        match tokio::time::timeout(self.timeout, self.conn.query(cmd)).await {
            Ok(reply) => reply.map_err(map_err),
            Err(_) => {
                self.conn.suspect();
                Err(StoreError::Timeout(self.timeout.as_millis() as u64))
            }
        }
    }
}
