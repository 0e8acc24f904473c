//! The control plane on Redis and Valkey: the entries in hashes, one version counter, all
//! under the hash tag `{PREFIX:control}` so one script can touch them all on a Cluster.
//!
//! | key | field | value |
//! |---|---|---|
//! | `PREFIX:{PREFIX:control}:version` | | incremented by every change |
//! | `...:overrides` | `POLICY\nIDENTITY` | `EXPIRES\nplan:NAME` or `EXPIRES\nparams:JSON` |
//! | `...:bans` | `IDENTITY\n*` or `IDENTITY\nP1,P2` | `UNTIL` |
//! | `...:allow`, `...:deny` | entry | `EXPIRES` |
//! | `...:levels` | `POLICY\nIDENTITY` | `LEVEL:FORGET_AT` |
//! | `...:strikes:POLICY\nIDENTITY` | | denials in the current `within` window (PX) |
//!
//! Times are Unix ms, `0` = never. Each write prunes its hash of expired entries. Instances
//! poll the version every [`super::POLL_INTERVAL`] (one `GET`) and, when it moved, read
//! every hash in one script call.

use std::sync::{Arc, Weak};

use sluice_core::StoreError;
use sluice_redis::RedisStore;
use sluice_redis::redis::{self, Value};

use super::tables::{self, Tables};
use super::{BanEntry, BanRule, ListEntry, ListKind, OverrideEntry, Shared};

/// KEYS: hash, version. ARGV: field, value, now_ms.
/// Sets the field, drops the hash's expired fields, bumps the version.
const PUT: &str = r#"
local now = tonumber(ARGV[3])
local all = redis.call('HGETALL', KEYS[1])
for i = 1, #all, 2 do
  local e = tonumber(string.match(all[i + 1], '^(%d+)'))
  if e and e > 0 and e <= now then redis.call('HDEL', KEYS[1], all[i]) end
end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
return redis.call('INCR', KEYS[2])
"#;

/// KEYS: hash, version. ARGV: field, mode (`exact` or `prefix`).
/// Deletes the field (or every field starting with it); bumps the version if any went.
const DELETE: &str = r#"
local n = 0
if ARGV[2] == 'prefix' then
  local fields = redis.call('HKEYS', KEYS[1])
  for _, f in ipairs(fields) do
    if string.sub(f, 1, #ARGV[1]) == ARGV[1] then n = n + redis.call('HDEL', KEYS[1], f) end
  end
else
  n = redis.call('HDEL', KEYS[1], ARGV[1])
end
if n > 0 then redis.call('INCR', KEYS[2]) end
return n
"#;

/// KEYS: version, overrides, bans, allow, deny. Returns the version and each hash.
const LOAD: &str = r#"
return {
  tonumber(redis.call('GET', KEYS[1]) or '0'),
  redis.call('HGETALL', KEYS[2]),
  redis.call('HGETALL', KEYS[3]),
  redis.call('HGETALL', KEYS[4]),
  redis.call('HGETALL', KEYS[5]),
}
"#;

/// KEYS: strikes, levels, bans, version. ARGV: pair field, ban field, after, within_ms,
/// duration_ms, multiplier, max_ms, now_ms.
/// Counts one denial; at `after`, bans for the escalated duration and returns its end.
/// A denial while the ban exists is not counted (another instance's late denials).
const STRIKE: &str = r#"
local now = tonumber(ARGV[8])
local ban = tonumber(redis.call('HGET', KEYS[3], ARGV[2]) or '0')
if ban > now then return 0 end
local n = redis.call('INCR', KEYS[1])
if n == 1 then redis.call('PEXPIRE', KEYS[1], ARGV[4]) end
if n < tonumber(ARGV[3]) then return 0 end
redis.call('DEL', KEYS[1])
local level = 0
local raw = redis.call('HGET', KEYS[2], ARGV[1])
if raw then
  local l, forget = string.match(raw, '^(%d+):(%d+)$')
  if l and tonumber(forget) > now then level = tonumber(l) end
end
local max = tonumber(ARGV[7])
local d = tonumber(ARGV[5]) * (tonumber(ARGV[6]) ^ level)
if d > max then d = max end
if d < 1 then d = 1 end
d = math.floor(d)
local untl = now + d
redis.call('HSET', KEYS[2], ARGV[1], (level + 1) .. ':' .. (untl + max))
redis.call('HSET', KEYS[3], ARGV[2], untl)
redis.call('INCR', KEYS[4])
return untl
"#;

#[derive(Debug)]
pub(crate) struct RedisControl {
    store: Arc<RedisStore>,
    version: String,
    overrides: String,
    bans: String,
    allow: String,
    deny: String,
    levels: String,
    strikes: String,
    /// The version the tables were last loaded at.
    loaded: parking_lot::Mutex<Option<i64>>,
}

impl RedisControl {
    pub(crate) fn new(store: Arc<RedisStore>, prefix: &str) -> Self {
        let key = |name: &str| store.server_key(&format!("{prefix}:{{{prefix}:control}}:{name}"));
        RedisControl {
            version: key("version"),
            overrides: key("overrides"),
            bans: key("bans"),
            allow: key("allow"),
            deny: key("deny"),
            levels: key("levels"),
            strikes: key("strikes:"),
            store,
            loaded: parking_lot::Mutex::new(None),
        }
    }

    async fn eval(
        &self,
        script: &str,
        keys: &[&str],
        args: &[String],
    ) -> Result<Value, StoreError> {
        let mut cmd = redis::cmd("EVAL");
        cmd.arg(script).arg(keys.len());
        for k in keys {
            cmd.arg(*k);
        }
        for a in args {
            cmd.arg(a.as_str());
        }
        self.store.command(&cmd).await
    }

    async fn put(
        &self,
        shared: &Shared,
        hash: &str,
        field: String,
        value: String,
    ) -> Result<(), StoreError> {
        let now = shared.now_ms().to_string();
        self.eval(PUT, &[hash, &self.version], &[field, value, now])
            .await?;
        self.reload(shared).await
    }

    async fn delete(
        &self,
        shared: &Shared,
        hash: &str,
        field: String,
        prefix: bool,
    ) -> Result<bool, StoreError> {
        let mode = if prefix { "prefix" } else { "exact" };
        let n = self
            .eval(DELETE, &[hash, &self.version], &[field, mode.into()])
            .await?;
        self.reload(shared).await?;
        Ok(matches!(n, Value::Int(n) if n > 0))
    }

    pub(crate) async fn set_override(
        &self,
        shared: &Shared,
        policy: &str,
        identity: &str,
        entry: &OverrideEntry,
    ) -> Result<(), StoreError> {
        let field = tables::pair_field(policy, identity);
        self.put(
            shared,
            &self.overrides,
            field,
            tables::encode_override(entry),
        )
        .await
    }

    pub(crate) async fn remove_override(
        &self,
        shared: &Shared,
        policy: &str,
        identity: &str,
    ) -> Result<bool, StoreError> {
        self.delete(
            shared,
            &self.overrides,
            tables::pair_field(policy, identity),
            false,
        )
        .await
    }

    pub(crate) async fn ban(
        &self,
        shared: &Shared,
        identity: &str,
        ban: &BanEntry,
    ) -> Result<(), StoreError> {
        let field = tables::ban_field(identity, ban.policies.as_deref());
        self.put(shared, &self.bans, field, ban.until_ms.to_string())
            .await
    }

    pub(crate) async fn unban(&self, shared: &Shared, identity: &str) -> Result<bool, StoreError> {
        self.delete(shared, &self.bans, format!("{identity}\n"), true)
            .await
    }

    fn list_key(&self, kind: ListKind) -> &str {
        match kind {
            ListKind::Allow => &self.allow,
            ListKind::Deny => &self.deny,
        }
    }

    pub(crate) async fn list_add(
        &self,
        shared: &Shared,
        kind: ListKind,
        entry: &ListEntry,
        expires: Option<u64>,
    ) -> Result<(), StoreError> {
        let value = tables::encode_expiry(expires);
        self.put(shared, self.list_key(kind), entry.text(), value)
            .await
    }

    pub(crate) async fn list_remove(
        &self,
        shared: &Shared,
        kind: ListKind,
        entry: &ListEntry,
    ) -> Result<bool, StoreError> {
        self.delete(shared, self.list_key(kind), entry.text(), false)
            .await
    }

    /// Counts a denial in the store, in the background; a resulting ban goes into the local
    /// tables at once (other instances see it at their next poll).
    pub(crate) fn strike(
        &self,
        shared: &Shared,
        identity: &str,
        policy: &str,
        rule: BanRule,
        now: u64,
    ) {
        let Ok(handle) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let weak = shared.me.get().cloned().unwrap_or_default();
        let (identity, policy) = (identity.to_string(), policy.to_string());
        handle.spawn(async move {
            let Some(shared) = weak.upgrade() else { return };
            let super::Backend::Redis(me) = &shared.backend else {
                return;
            };
            let pair = tables::pair_field(&policy, &identity);
            let scope = [policy.clone()];
            let ban_field = tables::ban_field(&identity, Some(&scope));
            let strikes = format!("{}{pair}", me.strikes);
            let args = [
                pair,
                ban_field,
                rule.after.to_string(),
                rule.within_ms.to_string(),
                rule.duration_ms.to_string(),
                rule.multiplier.to_string(),
                rule.max_ms.to_string(),
                now.to_string(),
            ];
            let keys = [strikes.as_str(), &me.levels, &me.bans, &me.version];
            match me.eval(STRIKE, &keys, &args).await {
                Ok(Value::Int(until)) if until > 0 => {
                    shared.tables.write().add_ban(
                        &identity,
                        BanEntry {
                            policies: Some(scope.to_vec()),
                            until_ms: until as u64,
                        },
                    );
                    shared.update_active();
                    metrics::counter!("sluice_bans_total", "policy" => policy, "source" => "automatic")
                        .increment(1);
                }
                Ok(_) => {}
                Err(e) => tracing::debug!(error = %e, "ban strike not recorded"),
            }
        });
    }

    /// Reads every hash and replaces the local tables.
    pub(crate) async fn reload(&self, shared: &Shared) -> Result<(), StoreError> {
        let keys = [
            self.version.as_str(),
            &self.overrides,
            &self.bans,
            &self.allow,
            &self.deny,
        ];
        let reply = self.eval(LOAD, &keys, &[]).await?;
        let (version, tables) = parse_load(reply)?;
        let mut tables = tables;
        let mut current = shared.tables.write();
        tables.adopt_configured(&current);
        *current = tables;
        drop(current);
        *self.loaded.lock() = Some(version);
        shared.update_active();
        Ok(())
    }

    async fn version(&self) -> Result<i64, StoreError> {
        let mut cmd = redis::cmd("GET");
        cmd.arg(&self.version);
        match self.store.command(&cmd).await? {
            Value::Nil => Ok(0),
            Value::BulkString(b) => Ok(String::from_utf8_lossy(&b).parse().unwrap_or(-1)),
            Value::Int(n) => Ok(n),
            other => Err(StoreError::Backend(format!("unexpected version {other:?}"))),
        }
    }
}

fn text(v: &Value) -> Option<String> {
    match v {
        Value::BulkString(b) => Some(String::from_utf8_lossy(b).into_owned()),
        Value::SimpleString(s) => Some(s.clone()),
        Value::Int(n) => Some(n.to_string()),
        _ => None,
    }
}

fn pairs(v: &Value) -> Vec<(String, String)> {
    let Value::Array(items) = v else {
        return Vec::new();
    };
    items
        .chunks_exact(2)
        .filter_map(|c| Some((text(&c[0])?, text(&c[1])?)))
        .collect()
}

fn parse_load(reply: Value) -> Result<(i64, Tables), StoreError> {
    let Value::Array(parts) = reply else {
        return Err(StoreError::Backend(format!(
            "unexpected control reply {reply:?}"
        )));
    };
    if parts.len() != 5 {
        return Err(StoreError::Backend(
            "unexpected control reply length".into(),
        ));
    }
    let version = match &parts[0] {
        Value::Int(n) => *n,
        other => return Err(StoreError::Backend(format!("unexpected version {other:?}"))),
    };
    let mut t = Tables::default();
    for (field, value) in pairs(&parts[1]) {
        if let Some((policy, identity, entry)) = tables::decode_override(&field, &value) {
            t.set_override(&policy, &identity, entry);
        }
    }
    for (field, value) in pairs(&parts[2]) {
        if let Some((identity, ban)) = tables::decode_ban(&field, &value) {
            t.add_ban(&identity, ban);
        }
    }
    for (kind, part) in [(ListKind::Allow, &parts[3]), (ListKind::Deny, &parts[4])] {
        for (field, value) in pairs(part) {
            if let (Ok(entry), Some(expires)) =
                (ListEntry::parse(&field), tables::decode_expiry(&value))
            {
                t.list_insert(kind, &entry, expires);
            }
        }
    }
    Ok((version, t))
}

/// Polls the version every [`super::POLL_INTERVAL`] and reloads when it moved, until the
/// control plane is dropped. A failing store keeps the last tables (logged at most once a
/// minute).
pub(crate) fn spawn_poller(weak: Weak<Shared>) {
    let Ok(handle) = tokio::runtime::Handle::try_current() else {
        tracing::warn!(
            "control plane built outside a Tokio runtime: changes from other instances are not picked up"
        );
        return;
    };
    handle.spawn(async move {
        let mut last_warn: Option<std::time::Instant> = None;
        loop {
            let Some(shared) = weak.upgrade() else { return };
            let super::Backend::Redis(me) = &shared.backend else {
                return;
            };
            let result = match me.version().await {
                Ok(v) if Some(v) == *me.loaded.lock() => Ok(()),
                Ok(_) => me.reload(&shared).await,
                Err(e) => Err(e),
            };
            if let Err(e) = result
                && last_warn.is_none_or(|t| t.elapsed() >= std::time::Duration::from_secs(60))
            {
                last_warn = Some(std::time::Instant::now());
                tracing::warn!(error = %e, "control plane: could not read overrides, bans and lists; keeping the last ones");
            }
            drop(shared);
            tokio::time::sleep(super::POLL_INTERVAL).await;
        }
    });
}
