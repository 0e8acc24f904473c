//! The control plane on Redis and Valkey: the entries in hashes, every change in a log, all
//! under the hash tag `{PREFIX:control}` so one script can touch them all on a Cluster.
//!
//! | key | field | value |
//! |---|---|---|
//! | `PREFIX:{PREFIX:control}:overrides` | `POLICY\nIDENTITY` | `EXPIRES\nplan:NAME` or `EXPIRES\nparams:JSON` |
//! | `...:bans` | `IDENTITY\n*` or `IDENTITY\nP1,P2` | `UNTIL` |
//! | `...:allow`, `...:deny` | entry | `EXPIRES` |
//! | `...:levels` | `POLICY\nIDENTITY` | `LEVEL:FORGET_AT` |
//! | `...:log` | a stream: `t` = table code (`o`, `b`, `a`, `d`), then `+FIELD` = value or `-FIELD` | |
//! | `...:expiry` | a sorted set: `CODE\nFIELD` scored by its end | |
//! | `...:bans_of:IDENTITY` | a set of the identity's ban fields | |
//! | `...:strikes:POLICY\nIDENTITY` | | denials in the current `within` window (PX) |
//!
//! Times are Unix ms, `0` = never. Why this shape: every write is one script of O(1) work
//! (set the field, queue its end, append to the log, capped with `MAXLEN ~`), so no write
//! grows with the table. A bulk import runs as scripts of [`IMPORT_CHUNK`] entries (about a
//! millisecond of Redis time each), never one long script that checks sharing the Redis would
//! wait behind; it stays all or nothing by undoing its written chunks when a later one fails.
//! Every instance reads the log from its last id every
//! [`super::POLL_INTERVAL`], so a change costs each instance O(changes); it reads the tables
//! in full (chunked `HSCAN`, never one long script) only at start and when the log was
//! trimmed past its last id. A periodic sweep removes entries that ended, in small batches,
//! and logs the removals. All of it runs on the control plane's own connection with its own
//! timeout ([`READ_TIMEOUT`]), never inside a check's store timeout; checks read only the
//! last snapshot in memory.

use std::sync::Arc;
use std::time::{Duration, Instant};

use sluice_core::StoreError;
use sluice_redis::RedisStore;
use sluice_redis::redis::{self, Value};

mod import;
mod sync;

pub(crate) use sync::spawn_poller;
use sync::{apply, first_int, text};

use super::store_format;
use super::tables::Tables;
use super::{BanEntry, BanRule, ControlError, ListEntry, ListKind, OverrideEntry, Shared, Table};

const PUT: &str = include_str!("lua/put.lua");
const PUT_MANY: &str = include_str!("lua/put_many.lua");
const UNDO_MANY: &str = include_str!("lua/undo_many.lua");
const DELETE: &str = include_str!("lua/delete.lua");
const UNBAN: &str = include_str!("lua/unban.lua");
const SWEEP: &str = include_str!("lua/sweep.lua");
const STRIKE: &str = include_str!("lua/strike.lua");

/// The longest one call of the control plane may take (its own connection).
pub(crate) const READ_TIMEOUT: Duration = Duration::from_secs(2);

/// The change log keeps about this many records (`XADD MAXLEN ~`). An instance further
/// behind reads the tables in full.
const LOG_LENGTH: &str = "100000";

/// Log records read per call (a record holds up to 100 changes): replies stay small, so
/// reading them never holds up the connection's other calls.
const LOG_BATCH: usize = 20;

/// Hash fields read per `HSCAN` call of a full read.
const SCAN_BATCH: &str = "5000";

/// Ended entries removed per sweep call (each call is a short script).
const SWEEP_BATCH: usize = 500;
/// Entries per script of a bulk import (and per read of what they held before): short
/// enough that checks sharing the Redis never wait behind an import (about 1-2 ms of
/// Redis time each where one 10,000-entry script took 25-80 ms).
pub(crate) const IMPORT_CHUNK: usize = 250;

#[derive(Debug)]
pub(crate) struct RedisControl {
    /// The control plane's own connection.
    store: Arc<RedisStore>,
    overrides: String,
    bans: String,
    allow: String,
    deny: String,
    levels: String,
    log: String,
    expiry: String,
    bans_of: String,
    strikes: String,
    /// The id of the last log record applied; `None` until the first full read.
    last_id: tokio::sync::Mutex<Option<String>>,
    /// When the snapshot was last known to be up to date with the store.
    synced_at: parking_lot::Mutex<Option<Instant>>,
    /// Full reads so far (the first, and each time the log was trimmed past this instance).
    full_reads: std::sync::atomic::AtomicU64,
}

/// One record of the log: its id, table and changes (`None`: removed).
struct Record {
    id: String,
    table: Option<Table>,
    changes: Vec<(String, Option<String>)>,
}

impl RedisControl {
    pub(crate) fn new(store: Arc<RedisStore>, prefix: &str) -> Self {
        let key = |name: &str| store.server_key(&format!("{prefix}:{{{prefix}:control}}:{name}"));
        RedisControl {
            overrides: key("overrides"),
            bans: key("bans"),
            allow: key("allow"),
            deny: key("deny"),
            levels: key("levels"),
            log: key("log"),
            expiry: key("expiry"),
            bans_of: key("bans_of:"),
            strikes: key("strikes:"),
            store,
            last_id: tokio::sync::Mutex::new(None),
            synced_at: parking_lot::Mutex::new(None),
            full_reads: std::sync::atomic::AtomicU64::new(0),
        }
    }

    fn hash(&self, table: Table) -> &str {
        match table {
            Table::Overrides => &self.overrides,
            Table::Bans => &self.bans,
            Table::Allow => &self.allow,
            Table::Deny => &self.deny,
        }
    }

    fn ban_index(&self, identity: &str) -> String {
        format!("{}{identity}", self.bans_of)
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

    /// The control plane's own connection (reservation records share it).
    pub(crate) fn connection(&self) -> &Arc<RedisStore> {
        &self.store
    }

    /// How long ago the snapshot was last brought up to date with the store.
    pub(crate) fn snapshot_age(&self) -> Option<Duration> {
        self.synced_at.lock().map(|t| t.elapsed())
    }

    /// How many times the tables were read in full.
    pub(crate) fn full_reads(&self) -> u64 {
        self.full_reads.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Sets one entry; applies it to this instance's tables at once.
    async fn put(
        &self,
        shared: &Shared,
        table: Table,
        field: String,
        value: String,
        ends: Option<u64>,
        index: Option<String>,
    ) -> Result<(), ControlError> {
        let max = shared.limits().max_of(table);
        let index = index.unwrap_or_else(|| self.expiry.clone());
        let keys = [self.hash(table), &self.log, &self.expiry, &index];
        let args = [
            table.code().to_string(),
            field.clone(),
            value.clone(),
            ends.unwrap_or(0).to_string(),
            max.to_string(),
            LOG_LENGTH.to_string(),
        ];
        let reply = self.eval(PUT, &keys, &args).await?;
        if first_int(&reply) == Some(0) {
            return Err(ControlError::Full {
                table: table.name(),
                max,
            });
        }
        apply(&mut shared.tables.write(), table, &field, Some(&value));
        shared.update_active();
        Ok(())
    }

    async fn delete(
        &self,
        shared: &Shared,
        table: Table,
        field: String,
        index: Option<String>,
    ) -> Result<bool, ControlError> {
        let index = index.unwrap_or_else(|| self.expiry.clone());
        let keys = [self.hash(table), &self.log, &self.expiry, &index];
        let args = [table.code().to_string(), field.clone(), LOG_LENGTH.into()];
        let n = self.eval(DELETE, &keys, &args).await?;
        apply(&mut shared.tables.write(), table, &field, None);
        shared.update_active();
        Ok(matches!(n, Value::Int(n) if n > 0))
    }

    pub(crate) async fn set_override(
        &self,
        shared: &Shared,
        policy: &str,
        identity: &str,
        entry: &OverrideEntry,
    ) -> Result<(), ControlError> {
        let field = store_format::pair_field(policy, identity);
        let value = store_format::encode_override(entry);
        self.put(
            shared,
            Table::Overrides,
            field,
            value,
            entry.expires_at_ms,
            None,
        )
        .await
    }

    pub(crate) async fn remove_override(
        &self,
        shared: &Shared,
        policy: &str,
        identity: &str,
    ) -> Result<bool, ControlError> {
        let field = store_format::pair_field(policy, identity);
        self.delete(shared, Table::Overrides, field, None).await
    }

    pub(crate) async fn ban(
        &self,
        shared: &Shared,
        identity: &str,
        ban: &BanEntry,
    ) -> Result<(), ControlError> {
        let field = store_format::ban_field(identity, ban.policies.as_deref());
        let index = Some(self.ban_index(identity));
        let until = ban.until_ms;
        self.put(
            shared,
            Table::Bans,
            field,
            until.to_string(),
            Some(until),
            index,
        )
        .await
    }

    pub(crate) async fn unban(
        &self,
        shared: &Shared,
        identity: &str,
    ) -> Result<bool, ControlError> {
        let index = self.ban_index(identity);
        let known = shared.tables.read().ban_fields(identity);
        let keys = [self.bans.as_str(), &self.log, &self.expiry, index.as_str()];
        let mut args = vec![LOG_LENGTH.to_string()];
        args.extend(known);
        let n = self.eval(UNBAN, &keys, &args).await?;
        shared.tables.write().remove_bans(identity);
        shared.update_active();
        Ok(matches!(n, Value::Int(n) if n > 0))
    }

    pub(crate) async fn list_add(
        &self,
        shared: &Shared,
        kind: ListKind,
        entry: &ListEntry,
        expires: Option<u64>,
    ) -> Result<(), ControlError> {
        let value = store_format::encode_expiry(expires);
        self.put(shared, Table::of(kind), entry.text(), value, expires, None)
            .await
    }

    pub(crate) async fn list_remove(
        &self,
        shared: &Shared,
        kind: ListKind,
        entry: &ListEntry,
    ) -> Result<bool, ControlError> {
        self.delete(shared, Table::of(kind), entry.text(), None)
            .await
    }

    /// Counts a denial in the store, in the background; a resulting ban goes into the local
    /// tables at once (other instances read it from the log).
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
            let pair = store_format::pair_field(&policy, &identity);
            let scope = [policy.clone()];
            let ban_field = store_format::ban_field(&identity, Some(&scope));
            let strikes = format!("{}{pair}", me.strikes);
            let index = me.ban_index(&identity);
            let args = [
                pair,
                ban_field,
                rule.after.to_string(),
                rule.within_ms.to_string(),
                rule.duration_ms.to_string(),
                rule.multiplier.to_string(),
                rule.max_ms.to_string(),
                now.to_string(),
                shared.limits().max_bans.to_string(),
                LOG_LENGTH.to_string(),
            ];
            let keys = [
                strikes.as_str(),
                &me.levels,
                &me.bans,
                &me.log,
                &me.expiry,
                &index,
            ];
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
                    shared
                        .automatic_bans
                        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    metrics::counter!("sluice_bans_total", "policy" => policy, "source" => "automatic")
                        .increment(1);
                }
                Ok(Value::Int(-1)) => {
                    tracing::warn!(policy, "automatic ban not set: the bans table is full (control.max_bans)");
                }
                Ok(_) => {}
                Err(e) => tracing::debug!(error = %e, "ban strike not recorded"),
            }
        });
    }

    /// Removes entries that ended from the store (logging the removals), a batch per call,
    /// at most `rounds` calls; how many were due.
    pub(crate) async fn sweep(&self, shared: &Shared, rounds: usize) -> Result<usize, StoreError> {
        let mut total = 0;
        for _ in 0..rounds {
            let keys = [
                self.expiry.as_str(),
                &self.log,
                &self.overrides,
                &self.bans,
                &self.allow,
                &self.deny,
                &self.levels,
            ];
            let args = [
                shared.now_ms().to_string(),
                SWEEP_BATCH.to_string(),
                LOG_LENGTH.to_string(),
                self.bans_of.clone(),
            ];
            let n = match self.eval(SWEEP, &keys, &args).await? {
                Value::Int(n) => n as usize,
                _ => 0,
            };
            total += n;
            if n < SWEEP_BATCH {
                break;
            }
        }
        Ok(total)
    }

    /// The number of entries of each table in the store (`HLEN`), levels included.
    pub(crate) async fn store_sizes(&self) -> Result<[(&'static str, u64); 5], StoreError> {
        let mut out = [
            ("overrides", 0),
            ("bans", 0),
            ("allow", 0),
            ("deny", 0),
            ("levels", 0),
        ];
        let keys = [
            &self.overrides,
            &self.bans,
            &self.allow,
            &self.deny,
            &self.levels,
        ];
        for (slot, key) in out.iter_mut().zip(keys) {
            let mut cmd = redis::cmd("HLEN");
            cmd.arg(key);
            if let Value::Int(n) = self.store.command(&cmd).await? {
                slot.1 = n as u64;
            }
        }
        Ok(out)
    }
}
