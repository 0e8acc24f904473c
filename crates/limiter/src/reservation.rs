//! Reservations: admit a request whose cost is known only after it ran (an LLM call's
//! tokens), without ever over-spending.
//!
//! [`crate::Limiter::reserve`] checks and consumes the declared maximum at once, like a check of
//! that cost, and hands back a [`Reservation`]. Settling it with the real cost
//! ([`Reservation::settle`], or [`crate::Limiter::settle`] by id from any instance sharing the
//! store) gives the difference back, or, when the real cost exceeds the maximum, charges the
//! excess as debt and reports it. A reservation that is never settled (its holder crashed,
//! dropped it, or its ttl ran out) stays spent in full: nothing is ever refunded without a
//! settle. So what is admitted plus what is reserved never exceeds a policy's budget, and
//! what is spent exceeds it only by the reported debt of requests that overran their own
//! maximum.
//!
//! The record of an open reservation (policy, identity, key, parameters, maximum) lives where
//! the control plane keeps its entries: in this process on the embedded store, in Redis or
//! Valkey (one key per reservation, expiring with its ttl) on a shared store, so an instance
//! that did not make a reservation can settle it. Ids are 128 random bits: an id names one
//! record and a settle moves at most that record's maximum on that record's key, so a guessed
//! or replayed id can refund nobody else. Settling is exactly once: the record is taken and
//! replaced by a tombstone in one step (`reservation_take.lua`), and a second settle is told
//! [`SettleError::AlreadySettled`].
//!
//! Nothing is retried on an ambiguous failure: a settle whose refund may or may not have
//! reached the store answers the error and the reservation counts in full (never refunded
//! twice).

use std::collections::HashMap;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use sluice_core::{Algorithm, Decision, StoreError};

use crate::limiter::{Checked, Limiter};

/// The shortest ttl of a reservation.
pub const MIN_TTL: Duration = Duration::from_millis(10);
/// The longest ttl of a reservation (a day).
pub const MAX_TTL: Duration = Duration::from_secs(86_400);
/// The most open reservations (and tombstones) the in-process book holds.
pub const MAX_LOCAL_RECORDS: usize = 1_000_000;

/// The answer of [`Limiter::reserve`].
#[derive(Debug)]
pub struct Reserved {
    /// The check of the maximum cost, as [`Limiter::check`] answers it.
    pub checked: Checked,
    /// The reservation to settle; `None` when the request was denied, or admitted without
    /// consuming anything (failed open, allow-listed, denied by a shadow policy only): there
    /// is then nothing to settle.
    pub reservation: Option<Reservation>,
}

/// An open reservation: `max_cost` units consumed until it is settled with the real cost.
/// Dropping it unsettled leaves them spent (see the module docs).
#[derive(Debug)]
#[must_use = "an unsettled reservation counts in full"]
pub struct Reservation {
    pub(crate) limiter: Limiter,
    pub(crate) id: String,
    pub(crate) max_cost: u64,
    pub(crate) expires: Instant,
}

impl Reservation {
    /// The id that settles it from any instance ([`Limiter::settle`]).
    pub fn id(&self) -> &str {
        &self.id
    }

    /// The maximum it consumed.
    pub fn max_cost(&self) -> u64 {
        self.max_cost
    }

    /// When it counts in full if still unsettled.
    pub fn expires(&self) -> Instant {
        self.expires
    }

    /// Settles it with the real cost: `max_cost - actual` goes back, or `actual - max_cost`
    /// is charged as debt.
    pub async fn settle(self, actual: u64) -> Result<Settled, SettleError> {
        self.limiter.settle(&self.id, actual).await
    }
}

/// What a settle did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settled {
    /// The policy reserved from.
    pub policy: String,
    /// The identity reserved for.
    pub identity: String,
    /// The maximum that was reserved.
    pub max_cost: u64,
    /// The real cost it was settled with.
    pub actual: u64,
    /// Units given back (`max_cost - actual`, 0 when the real cost reached the maximum).
    pub refunded: u64,
    /// Units charged beyond the maximum (`actual - max_cost`, 0 within it): spent past the
    /// budget, paid back by later requests.
    pub debt: u64,
    /// The state afterwards as a check of cost 0 sees it (`None` when nothing moved).
    pub decision: Option<Decision>,
}

/// Why a settle did nothing.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SettleError {
    /// No such reservation: never made here or on the shared store, or its ttl ended (it
    /// counted in full).
    #[error("no such reservation (its ttl may have ended: it then counted in full)")]
    Unknown,
    /// Settled already; a reservation is settled once.
    #[error("the reservation was settled already")]
    AlreadySettled,
    /// The store failed; the reservation counts in full.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// What a reservation consumed, enough to settle it anywhere.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Record {
    pub(crate) policy: String,
    pub(crate) identity: String,
    pub(crate) key: String,
    /// The parameters the maximum was consumed under (an override's, if any).
    pub(crate) algorithm: Algorithm,
    pub(crate) max_cost: u64,
}

impl Record {
    fn to_json(&self) -> String {
        serde_json::json!({
            "policy": self.policy,
            "identity": self.identity,
            "key": self.key,
            "algorithm": self.algorithm,
            "max_cost": self.max_cost,
        })
        .to_string()
    }

    fn from_json(text: &str) -> Result<Self, StoreError> {
        let bad = || StoreError::Backend(format!("unreadable reservation record: {text}"));
        let v: serde_json::Value = serde_json::from_str(text).map_err(|_| bad())?;
        let s = |name: &str| v.get(name).and_then(|x| x.as_str()).map(str::to_string);
        Ok(Record {
            policy: s("policy").ok_or_else(bad)?,
            identity: s("identity").ok_or_else(bad)?,
            key: s("key").ok_or_else(bad)?,
            algorithm: serde_json::from_value(v.get("algorithm").cloned().ok_or_else(bad)?)
                .map_err(|_| bad())?,
            max_cost: v.get("max_cost").and_then(|x| x.as_u64()).ok_or_else(bad)?,
        })
    }
}

/// What taking a record for settling found.
#[derive(Debug)]
pub(crate) enum Taken {
    Open(Record),
    Settled,
    Unknown,
}

/// A new reservation id: 128 random bits in hex.
pub(crate) fn new_id() -> String {
    format!("{:032x}", rand::random::<u128>())
}

/// True for text that can be an id (32 lower-case hex digits).
pub(crate) fn valid_id(id: &str) -> bool {
    id.len() == 32
        && id
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// Where reservation records live.
#[derive(Debug)]
pub(crate) enum Book {
    /// In this process (the embedded store, or a store without a shared control plane).
    Local(Mutex<LocalBook>),
    /// In Redis or Valkey, on the control plane's connection.
    #[cfg(feature = "redis")]
    Redis {
        store: std::sync::Arc<sluice_redis::RedisStore>,
        prefix: String,
    },
}

#[derive(Debug, Default)]
pub(crate) struct LocalBook {
    /// Id to the record (`None`: settled) and its end.
    records: HashMap<String, (Option<Record>, Instant)>,
    /// The size at which ended records are swept next.
    sweep_at: usize,
}

const TAKE: &str = include_str!("reservation_take.lua");

impl Book {
    /// The book of a limiter whose control plane is `control`, keys under `prefix`.
    pub(crate) fn for_control(control: &crate::ControlPlane, prefix: &str) -> Self {
        #[cfg(feature = "redis")]
        if let Some(store) = control.redis_connection() {
            return Book::Redis {
                store,
                prefix: prefix.to_string(),
            };
        }
        let _ = (control, prefix);
        Book::Local(Mutex::new(LocalBook::default()))
    }

    /// Stores an open reservation's record for `ttl`.
    pub(crate) async fn put(
        &self,
        id: &str,
        record: &Record,
        ttl: Duration,
    ) -> Result<(), StoreError> {
        match self {
            Book::Local(book) => {
                let mut book = book.lock();
                let now = Instant::now();
                if book.records.len() >= book.sweep_at {
                    book.records.retain(|_, (_, end)| *end > now);
                    book.sweep_at = (book.records.len() * 2).max(1024);
                }
                if book.records.len() >= MAX_LOCAL_RECORDS {
                    return Err(StoreError::Overloaded(format!(
                        "{MAX_LOCAL_RECORDS} reservations are open"
                    )));
                }
                book.records
                    .insert(id.to_string(), (Some(record.clone()), now + ttl));
                Ok(())
            }
            #[cfg(feature = "redis")]
            Book::Redis { store, prefix } => {
                let mut cmd = sluice_redis::redis::cmd("SET");
                cmd.arg(Self::redis_key(store, prefix, id))
                    .arg(record.to_json())
                    .arg("PX")
                    .arg(ttl.as_millis().max(1) as u64)
                    .arg("NX");
                match store.command(&cmd).await? {
                    sluice_redis::redis::Value::Nil => {
                        Err(StoreError::Backend("reservation id taken".into()))
                    }
                    _ => Ok(()),
                }
            }
        }
    }

    /// Takes a record for settling, leaving a tombstone for the rest of its ttl.
    pub(crate) async fn take(&self, id: &str) -> Result<Taken, StoreError> {
        match self {
            Book::Local(book) => {
                let mut book = book.lock();
                let now = Instant::now();
                match book.records.get_mut(id) {
                    Some((_, end)) if *end <= now => {
                        book.records.remove(id);
                        Ok(Taken::Unknown)
                    }
                    Some((record, _)) => Ok(record.take().map_or(Taken::Settled, Taken::Open)),
                    None => Ok(Taken::Unknown),
                }
            }
            #[cfg(feature = "redis")]
            Book::Redis { store, prefix } => {
                use sluice_redis::redis::Value;
                let mut cmd = sluice_redis::redis::cmd("EVAL");
                cmd.arg(TAKE).arg(1).arg(Self::redis_key(store, prefix, id));
                let text = match store.command(&cmd).await? {
                    Value::Nil => return Ok(Taken::Unknown),
                    Value::BulkString(b) => String::from_utf8_lossy(&b).into_owned(),
                    Value::SimpleString(s) => s,
                    Value::Okay => "OK".into(),
                    other => {
                        return Err(StoreError::Backend(format!(
                            "unexpected reply to a reservation settle: {other:?}"
                        )));
                    }
                };
                if text == "settled" {
                    return Ok(Taken::Settled);
                }
                Record::from_json(&text).map(Taken::Open)
            }
        }
    }

    #[cfg(feature = "redis")]
    fn redis_key(store: &sluice_redis::RedisStore, prefix: &str, id: &str) -> String {
        store.server_key(&format!("{prefix}:reservation:{id}"))
    }
}

#[cfg(not(feature = "redis"))]
const _: &str = TAKE;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_random_and_valid() {
        let (a, b) = (new_id(), new_id());
        assert_ne!(a, b);
        assert!(valid_id(&a) && valid_id(&b));
        assert!(!valid_id("settled"));
        assert!(!valid_id(&a.to_uppercase()));
    }

    #[test]
    fn a_record_reads_back_as_written() {
        let r = Record {
            policy: "tokens".into(),
            identity: "team-a".into(),
            key: "rl:{tokens:team-a}".into(),
            algorithm: Algorithm::FixedWindow {
                limit: 1000,
                window_ms: 60_000,
            },
            max_cost: 500,
        };
        assert_eq!(Record::from_json(&r.to_json()).unwrap(), r);
    }

    #[tokio::test]
    async fn the_local_book_settles_once() {
        let book = Book::Local(Mutex::new(LocalBook::default()));
        let r = Record {
            policy: "p".into(),
            identity: "i".into(),
            key: "k".into(),
            algorithm: Algorithm::FixedWindow {
                limit: 10,
                window_ms: 1000,
            },
            max_cost: 5,
        };
        book.put("a", &r, Duration::from_secs(60)).await.unwrap();
        assert!(matches!(book.take("a").await.unwrap(), Taken::Open(x) if x == r));
        assert!(matches!(book.take("a").await.unwrap(), Taken::Settled));
        assert!(matches!(book.take("b").await.unwrap(), Taken::Unknown));
        book.put("c", &r, Duration::from_millis(1)).await.unwrap();
        tokio::time::sleep(Duration::from_millis(5)).await;
        assert!(matches!(book.take("c").await.unwrap(), Taken::Unknown));
    }
}
