//! Reading the store into this instance's tables: the change log from the last record
//! applied (every [`super::super::POLL_INTERVAL`]), or every table in chunks at start and
//! when the log was trimmed past this instance. Apart from the writes, since checks depend
//! only on this side: a slow store delays it, never them.

use std::sync::Weak;

use sluice_core::StoreError;
use sluice_redis::redis::{self, Value};

use super::*;

impl RedisControl {
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
}

/// Whether a stored value names an end at or before `now`.
pub(super) fn ended(table: Table, value: &str, now: u64) -> bool {
    let digits: &str = match table {
        Table::Bans => value,
        _ => value.split('\n').next().unwrap_or(""),
    };
    digits.parse::<u64>().is_ok_and(|t| t > 0 && t <= now)
}

/// Applies one change of `table` to the tables (`None`: removed). Malformed values are
/// skipped.
pub(super) fn apply(t: &mut Tables, table: Table, field: &str, value: Option<&str>) {
    match (table, value) {
        (Table::Overrides, Some(v)) => {
            if let Some((policy, identity, entry)) = store_format::decode_override(field, v) {
                t.set_override(&policy, &identity, entry);
            }
        }
        (Table::Overrides, None) => {
            if let Some((policy, identity)) = field.split_once('\n') {
                t.remove_override(policy, identity);
            }
        }
        (Table::Bans, Some(v)) => {
            if let Some((identity, ban)) = store_format::decode_ban(field, v) {
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
            match v.map(store_format::decode_expiry) {
                Some(Some(expires)) => t.list_insert(kind, &entry, expires),
                Some(None) => {}
                None => {
                    t.list_remove(kind, &entry);
                }
            }
        }
    }
}

pub(super) fn first_int(v: &Value) -> Option<i64> {
    match v {
        Value::Array(items) => match items.first() {
            Some(Value::Int(n)) => Some(*n),
            _ => None,
        },
        _ => None,
    }
}

pub(super) fn text(v: &Value) -> Option<String> {
    match v {
        Value::BulkString(b) => Some(String::from_utf8_lossy(b).into_owned()),
        Value::SimpleString(s) => Some(s.clone()),
        Value::Int(n) => Some(n.to_string()),
        _ => None,
    }
}

pub(super) fn pairs(v: &Value) -> Vec<(String, String)> {
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
pub(super) fn parse_records(v: &Value) -> Result<Vec<Record>, StoreError> {
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

/// Reads the log every [`super::super::POLL_INTERVAL`] until the control plane is dropped. A
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
            let super::super::Backend::Redis(me) = &shared.backend else {
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
            tokio::time::sleep(super::super::POLL_INTERVAL).await;
        }
    });
}
