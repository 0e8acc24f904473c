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

use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use sluice_core::StoreError;
use sluice_redis::RedisStore;
use sluice_redis::redis::{self, Value};

use super::tables::{self, Tables};
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
        let field = tables::pair_field(policy, identity);
        let value = tables::encode_override(entry);
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
        let field = tables::pair_field(policy, identity);
        self.delete(shared, Table::Overrides, field, None).await
    }

    pub(crate) async fn ban(
        &self,
        shared: &Shared,
        identity: &str,
        ban: &BanEntry,
    ) -> Result<(), ControlError> {
        let field = tables::ban_field(identity, ban.policies.as_deref());
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
        let value = tables::encode_expiry(expires);
        self.put(shared, Table::of(kind), entry.text(), value, expires, None)
            .await
    }

    /// Adds distinct entries to a list, all or nothing, in scripts of [`IMPORT_CHUNK`]
    /// entries: reads what the entries held before (and the table's size) to refuse at once
    /// when the table has no room, writes chunk by chunk, and when a chunk fails (the store,
    /// or a table another writer filled meanwhile) puts back what the written chunks
    /// changed before answering the error.
    pub(crate) async fn list_add_many(
        &self,
        shared: &Shared,
        kind: ListKind,
        entries: &[ListEntry],
        expires: Option<u64>,
    ) -> Result<(), ControlError> {
        let table = Table::of(kind);
        let max = shared.limits().max_of(table);
        let keys = [self.hash(table), &self.log, &self.expiry];
        let fields: Vec<String> = entries.iter().map(ListEntry::text).collect();
        let before = self.values_before(keys[0], &fields).await?;
        let size = match self
            .read_again_on_timeout(redis::cmd("HLEN").arg(keys[0]))
            .await?
        {
            Value::Int(n) => n.max(0) as u64,
            other => {
                return Err(StoreError::Backend(format!("HLEN answered {other:?}")).into());
            }
        };
        let new = before.iter().filter(|v| v.is_none()).count() as u64;
        if size + new > max {
            return Err(ControlError::Full {
                table: table.name(),
                max,
            });
        }
        let head = [
            table.code().to_string(),
            max.to_string(),
            LOG_LENGTH.to_string(),
            tables::encode_expiry(expires),
            expires.unwrap_or(0).to_string(),
        ];
        let mut sent = 0;
        for chunk in fields.chunks(IMPORT_CHUNK) {
            let mut args = Vec::with_capacity(head.len() + chunk.len());
            args.extend(head.iter().cloned());
            args.extend(chunk.iter().cloned());
            // A chunk writes the same values however often it runs, so one whose answer
            // was lost to a timeout is sent again (twice at most).
            sent += chunk.len();
            let failure = match self.eval_again_on_timeout(PUT_MANY, &keys, &args).await {
                Ok(reply) if first_int(&reply) == Some(0) => ControlError::Full {
                    table: table.name(),
                    max,
                },
                Ok(_) => continue,
                Err(e) => ControlError::Store(e),
            };
            if let Err(e) = self.undo(table, &fields[..sent], &before[..sent]).await {
                tracing::error!(
                    table = table.name(),
                    error = %e,
                    "a failed bulk import could not be undone: part of it stays in the table"
                );
            }
            return Err(failure);
        }
        // In chunks, so checks never wait long for the tables.
        for chunk in entries.chunks(1000) {
            let mut t = shared.tables.write();
            for e in chunk {
                t.list_insert(kind, e, expires);
            }
        }
        shared.update_active();
        Ok(())
    }

    /// The value each field holds in `hash` (`None`: absent), read in chunks.
    async fn values_before(
        &self,
        hash: &str,
        fields: &[String],
    ) -> Result<Vec<Option<String>>, StoreError> {
        let mut values = Vec::with_capacity(fields.len());
        for chunk in fields.chunks(IMPORT_CHUNK) {
            let mut cmd = redis::cmd("HMGET");
            cmd.arg(hash);
            for f in chunk {
                cmd.arg(f.as_str());
            }
            match self.read_again_on_timeout(&cmd).await? {
                Value::Array(items) if items.len() == chunk.len() => {
                    values.extend(items.iter().map(text));
                }
                other => {
                    return Err(StoreError::Backend(format!("HMGET answered {other:?}")));
                }
            }
        }
        Ok(values)
    }

    /// Puts back what `fields` held before a bulk import (`before`), in chunks; each undo
    /// is the same whichever number of times it runs, so a timed-out one is sent again.
    async fn undo(
        &self,
        table: Table,
        fields: &[String],
        before: &[Option<String>],
    ) -> Result<(), StoreError> {
        let keys = [self.hash(table), &self.log, &self.expiry];
        for (fields, before) in fields.chunks(IMPORT_CHUNK).zip(before.chunks(IMPORT_CHUNK)) {
            let removed: Vec<&String> = fields
                .iter()
                .zip(before)
                .filter(|(_, b)| b.is_none())
                .map(|(f, _)| f)
                .collect();
            let mut args = vec![
                table.code().to_string(),
                LOG_LENGTH.to_string(),
                removed.len().to_string(),
            ];
            args.extend(removed.into_iter().cloned());
            for (f, b) in fields.iter().zip(before) {
                if let Some(b) = b {
                    args.push(f.clone());
                    args.push(b.clone());
                }
            }
            self.eval_again_on_timeout(UNDO_MANY, &keys, &args).await?;
        }
        Ok(())
    }

    /// [`Self::eval`], sent again (twice at most) when its answer was lost to a timeout:
    /// only for scripts that do the same however often they run.
    async fn eval_again_on_timeout(
        &self,
        script: &str,
        keys: &[&str],
        args: &[String],
    ) -> Result<Value, StoreError> {
        let mut attempt = 0;
        loop {
            match self.eval(script, keys, args).await {
                Err(StoreError::Timeout(_)) if attempt < 2 => attempt += 1,
                other => return other,
            }
        }
    }

    /// A read (`HLEN`, `HMGET`) sent again (twice at most) when its answer was lost to a
    /// timeout, as the import's scripts are: a bulk import must not fail on one slow reply.
    async fn read_again_on_timeout(&self, cmd: &redis::Cmd) -> Result<Value, StoreError> {
        let mut attempt = 0;
        loop {
            match self.store.command(cmd).await {
                Err(StoreError::Timeout(_)) if attempt < 2 => attempt += 1,
                other => return other,
            }
        }
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
            let pair = tables::pair_field(&policy, &identity);
            let scope = [policy.clone()];
            let ban_field = tables::ban_field(&identity, Some(&scope));
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

    /// Brings the tables up to date: the log records since the last one applied, or a full
    /// read when there was none yet or the log no longer holds it.
    pub(crate) async fn sync(&self, shared: &Shared) -> Result<(), StoreError> {
        let mut last = self.last_id.lock().await;
        if last.is_none() {
            self.full_read(shared, &mut last).await?;
        }
        let mut full_reads = 0;
        loop {
            match self.catch_up(shared, &mut last).await? {
                true => break,
                false if full_reads < 3 => {
                    full_reads += 1;
                    tracing::info!(
                        "control plane: the change log was trimmed past this instance's last read; reading the tables in full"
                    );
                    self.full_read(shared, &mut last).await?;
                }
                false => {
                    return Err(StoreError::Backend(
                        "the control plane's change log moves faster than it can be read".into(),
                    ));
                }
            }
        }
        *self.synced_at.lock() = Some(Instant::now());
        Ok(())
    }

    /// Applies the log from `last`; false when the log was trimmed past it.
    async fn catch_up(
        &self,
        shared: &Shared,
        last: &mut Option<String>,
    ) -> Result<bool, StoreError> {
        loop {
            let from = last.clone().unwrap_or_else(|| "0-0".into());
            let mut cmd = redis::cmd("XRANGE");
            cmd.arg(&self.log)
                .arg(&from)
                .arg("+")
                .arg("COUNT")
                .arg(LOG_BATCH);
            let records = parse_records(&self.store.command(&cmd).await?)?;
            let fresh = if from == "0-0" {
                &records[..]
            } else {
                match records.first() {
                    Some(r) if r.id == from => &records[1..],
                    _ => return Ok(false),
                }
            };
            for r in fresh {
                let Some(table) = r.table else { continue };
                {
                    let mut t = shared.tables.write();
                    for (field, value) in &r.changes {
                        apply(&mut t, table, field, value.as_deref());
                    }
                }
                tokio::task::yield_now().await;
            }
            if !fresh.is_empty() {
                shared.update_active();
            }
            if let Some(r) = records.last() {
                *last = Some(r.id.clone());
            }
            if records.len() < LOG_BATCH {
                return Ok(true);
            }
        }
    }

    /// Reads every table in chunks and replaces the local tables; `last` becomes the log's
    /// newest record as it was before the read (records after it are applied next, twice
    /// at worst, which changes nothing).
    async fn full_read(
        &self,
        shared: &Shared,
        last: &mut Option<String>,
    ) -> Result<(), StoreError> {
        let mut cmd = redis::cmd("XREVRANGE");
        cmd.arg(&self.log).arg("+").arg("-").arg("COUNT").arg(1);
        let top = parse_records(&self.store.command(&cmd).await?)?
            .into_iter()
            .next()
            .map_or_else(|| "0-0".to_string(), |r| r.id);
        let now = shared.now_ms();
        let mut fresh = Tables::default();
        for table in [Table::Overrides, Table::Bans, Table::Allow, Table::Deny] {
            let mut cursor = "0".to_string();
            loop {
                let mut cmd = redis::cmd("HSCAN");
                cmd.arg(self.hash(table))
                    .arg(&cursor)
                    .arg("COUNT")
                    .arg(SCAN_BATCH);
                let reply = self.store.command(&cmd).await?;
                let Value::Array(parts) = reply else {
                    return Err(StoreError::Backend("unexpected HSCAN reply".into()));
                };
                let (Some(next), Some(items)) = (parts.first().and_then(text), parts.get(1)) else {
                    return Err(StoreError::Backend("unexpected HSCAN reply".into()));
                };
                for (field, value) in pairs(items) {
                    if !ended(table, &value, now) {
                        apply(&mut fresh, table, &field, Some(&value));
                    }
                }
                if next == "0" {
                    break;
                }
                cursor = next;
            }
        }
        {
            let configured = shared.configured.read();
            let c = &configured.config;
            fresh.install_configured(&c.allow, &c.deny, &c.plans);
            let old = std::mem::replace(&mut *shared.tables.write(), fresh);
            drop(configured);
            // Freed outside the locks (a large table takes a while to free).
            drop(old);
        }
        *last = Some(top);
        self.full_reads
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        shared.update_active();
        Ok(())
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

/// Whether a stored value names an end at or before `now`.
fn ended(table: Table, value: &str, now: u64) -> bool {
    let digits: &str = match table {
        Table::Bans => value,
        _ => value.split('\n').next().unwrap_or(""),
    };
    digits.parse::<u64>().is_ok_and(|t| t > 0 && t <= now)
}

/// Applies one change of `table` to the tables (`None`: removed). Malformed values are
/// skipped.
fn apply(t: &mut Tables, table: Table, field: &str, value: Option<&str>) {
    match (table, value) {
        (Table::Overrides, Some(v)) => {
            if let Some((policy, identity, entry)) = tables::decode_override(field, v) {
                t.set_override(&policy, &identity, entry);
            }
        }
        (Table::Overrides, None) => {
            if let Some((policy, identity)) = field.split_once('\n') {
                t.remove_override(policy, identity);
            }
        }
        (Table::Bans, Some(v)) => {
            if let Some((identity, ban)) = tables::decode_ban(field, v) {
                t.add_ban(&identity, ban);
            }
        }
        (Table::Bans, None) => {
            if let Some((identity, scope)) = field.split_once('\n') {
                let policies: Option<Vec<String>> =
                    (scope != "*").then(|| scope.split(',').map(str::to_string).collect());
                t.remove_ban(identity, policies.as_deref());
            }
        }
        (Table::Allow | Table::Deny, v) => {
            let kind = if table == Table::Allow {
                ListKind::Allow
            } else {
                ListKind::Deny
            };
            let Ok(entry) = ListEntry::parse(field) else {
                return;
            };
            match v.map(tables::decode_expiry) {
                Some(Some(expires)) => t.list_insert(kind, &entry, expires),
                Some(None) => {}
                None => {
                    t.list_remove(kind, &entry);
                }
            }
        }
    }
}

fn first_int(v: &Value) -> Option<i64> {
    match v {
        Value::Array(items) => match items.first() {
            Some(Value::Int(n)) => Some(*n),
            _ => None,
        },
        _ => None,
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
    match v {
        Value::Array(items) => items
            .chunks_exact(2)
            .filter_map(|c| Some((text(&c[0])?, text(&c[1])?)))
            .collect(),
        Value::Map(items) => items
            .iter()
            .filter_map(|(k, v)| Some((text(k)?, text(v)?)))
            .collect(),
        _ => Vec::new(),
    }
}

/// Reads an `XRANGE`/`XREVRANGE` reply.
fn parse_records(v: &Value) -> Result<Vec<Record>, StoreError> {
    let Value::Array(items) = v else {
        return Err(StoreError::Backend(format!("unexpected log reply {v:?}")));
    };
    let mut out = Vec::with_capacity(items.len());
    for item in items {
        let Value::Array(parts) = item else {
            return Err(StoreError::Backend("unexpected log record".into()));
        };
        let (Some(id), Some(fields)) = (parts.first().and_then(text), parts.get(1)) else {
            return Err(StoreError::Backend("unexpected log record".into()));
        };
        let mut table = None;
        let mut changes = Vec::new();
        for (name, value) in pairs(fields) {
            if name == "t" {
                table = Table::from_code(&value);
            } else if let Some(field) = name.strip_prefix('+') {
                changes.push((field.to_string(), Some(value)));
            } else if let Some(field) = name.strip_prefix('-') {
                changes.push((field.to_string(), None));
            }
        }
        out.push(Record { id, table, changes });
    }
    Ok(out)
}

/// Reads the log every [`super::POLL_INTERVAL`] until the control plane is dropped. A
/// failing store keeps the last tables (logged at most once a minute); the snapshot's age
/// is published as `sluice_control_snapshot_age_seconds`.
pub(crate) fn spawn_poller(weak: Weak<Shared>) {
    let Ok(handle) = tokio::runtime::Handle::try_current() else {
        tracing::warn!(
            "control plane built outside a Tokio runtime: changes from other instances are not picked up"
        );
        return;
    };
    handle.spawn(async move {
        let mut last_warn: Option<Instant> = None;
        loop {
            let Some(shared) = weak.upgrade() else { return };
            let super::Backend::Redis(me) = &shared.backend else {
                return;
            };
            let result = me.sync(&shared).await;
            if let Err(e) = result
                && last_warn.is_none_or(|t| t.elapsed() >= Duration::from_secs(60))
            {
                last_warn = Some(Instant::now());
                tracing::warn!(error = %e, "control plane: could not read overrides, bans and lists; keeping the last ones");
            }
            if let Some(age) = me.snapshot_age() {
                metrics::gauge!("sluice_control_snapshot_age_seconds").set(age.as_secs_f64());
            }
            drop(shared);
            tokio::time::sleep(super::POLL_INTERVAL).await;
        }
    });
}
