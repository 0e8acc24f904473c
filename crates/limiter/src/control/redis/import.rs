//! Bulk imports of list entries: up to [`super::super::MAX_BULK`] entries, all or nothing,
//! written in scripts of [`IMPORT_CHUNK`] entries so no script holds the Redis long, and
//! undone chunk by chunk when a later chunk fails. Apart from the single-entry writes since
//! it is the one operation whose failure must put things back.

use sluice_core::StoreError;
use sluice_redis::redis::{self, Value};

use super::*;

impl RedisControl {
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
            store_format::encode_expiry(expires),
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
}
