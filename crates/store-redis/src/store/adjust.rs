//! Reset, charge and refund on Redis (`Store::reset`, `Store::adjust`): a `DEL`, and one call
//! of `lua/adjust.lua` (the Lua form of `sluice_core::algorithm::adjust`), atomic with respect
//! to checks of the same key because Redis runs one script at a time per shard.

use std::sync::LazyLock;

use redis::Value;
use sluice_core::algorithm::Adjustment;
use sluice_core::{Algorithm, CheckItem, Decision, StoreError};

use super::{Lua, RedisStore, ints, map_err};
use crate::protocol;
use crate::scripts;

/// The adjust script and its SHA1, computed once.
static ADJUST: LazyLock<Lua> = LazyLock::new(|| Lua::new(&scripts::ADJUST));

impl RedisStore {
    /// Deletes `key`'s state (one `DEL` under the per-call timeout); whether it existed.
    pub(super) async fn reset_key(&self, key: &str) -> Result<bool, StoreError> {
        let mut cmd = redis::cmd("DEL");
        cmd.arg(self.server_key(key));
        let ms = self.timeout.as_millis() as u64;
        match tokio::time::timeout(self.timeout, self.conn.query(&cmd)).await {
            Err(_) => Err(StoreError::Timeout(ms)),
            Ok(Err(e)) => Err(map_err(e)),
            Ok(Ok(Value::Int(n))) => Ok(n > 0),
            Ok(Ok(other)) => Err(StoreError::Backend(format!(
                "unexpected DEL reply {other:?}"
            ))),
        }
    }

    /// Charges or refunds `key` with `lua/adjust.lua`; the state afterwards at cost 0.
    pub(super) async fn adjust_key(
        &self,
        key: &str,
        algorithm: &Algorithm,
        adjustment: Adjustment,
    ) -> Result<Decision, StoreError> {
        if algorithm.lease_ms().is_some() {
            return Err(StoreError::Invalid(
                sluice_core::algorithm::AdjustError::Concurrency.to_string(),
            ));
        }
        let cost = adjustment.cost();
        if cost > sluice_core::policy::MAX_EXACT {
            return Err(StoreError::Invalid(
                sluice_core::algorithm::AdjustError::CostTooLarge(cost).to_string(),
            ));
        }
        let keys = [self.server_key(key)];
        let token = if protocol::needs_token(algorithm, cost.max(1)) {
            self.next_id()
        } else {
            String::new()
        };
        let mut args = vec![self.now_arg(), self.pad.clone()];
        protocol::push_item_args(&mut args, algorithm, cost, &token);
        args.push(adjustment.name().to_string());
        let reply = self
            .invoke_timed(&ADJUST, scripts::FN_ADJUST, &keys, &args)
            .await
            .and_then(ints)?;
        let item = CheckItem {
            key,
            algorithm,
            cost: 0,
        };
        let mut decided = protocol::decode(&[item], &[token], &reply)?;
        Ok(decided.decisions.remove(0))
    }
}
