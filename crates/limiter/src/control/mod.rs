//! The control plane: per-identity exceptions to the policies, changed at runtime.
//!
//! - **Overrides** bind one identity of one policy to other parameters or to a plan of the
//!   configuration. The identity keeps its key (and so its state); only the numbers change.
//! - **Bans** refuse an identity for a while, for every policy or some. They are set by hand
//!   or by a policy's [`BanRule`] after repeated denials, each repeat ban longer.
//! - **Allow and deny lists** hold identities and networks: an allowed identity bypasses the
//!   limits, a denied one is refused outright.
//!
//! Decisions read only the local tables ([`tables`]), so a banned or denied flood costs the
//! store nothing and an idle control plane costs one atomic load per check. Where the tables
//! live depends on the store: on the embedded store they are the truth; on Redis and Valkey
//! (Cluster included) the truth is a few hashes under one hash tag plus a change log
//! ([`redis`]), and every instance reads the log from where it stopped every 250 ms, so a
//! change reaches every instance's next decision within a second and costs each instance
//! O(changes), whatever the size of the tables. A slow or unreachable control plane never
//! touches a check: checks keep deciding from the last snapshot, and
//! [`ControlPlane::snapshot_age`] says how old it is.
//!
//! Every table has a maximum ([`ControlLimits`]); a write beyond it is refused with
//! [`ControlError::Full`]. Entries with an end are removed after it by a periodic sweep, in
//! memory and in the store.

mod clock;
mod config;
mod entries;
pub(crate) mod hook;
pub mod listing;
mod made;
mod networks;
#[cfg(feature = "redis")]
mod redis;
mod store_format;
mod strikes;
mod sweep;
mod tables;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use parking_lot::{Mutex, RwLock};
use sluice_core::{Clock, StoreError, SystemClock};

use clock::Now;
pub(crate) use config::Table;
pub use config::{BanRule, ControlConfig, ControlError, ControlLimits, ListKind};
pub use entries::{BanEntry, ListEntry, OverrideEntry, OverrideTarget};
pub(crate) use hook::Screen;
pub use listing::{ControlListing, ListedBan, ListedEntry, ListedOverride};
use strikes::Strikes;
use sweep::spawn_sweeper;
pub use tables::TableSizes;
use tables::Tables;

/// How often an instance on a shared store reads the changes of the control entries.
pub const POLL_INTERVAL: Duration = Duration::from_millis(250);

/// How often entries that ended are removed.
pub const SWEEP_INTERVAL: Duration = Duration::from_secs(1);

/// The most list entries one [`ControlPlane::list_add_many`] takes.
pub const MAX_BULK: usize = 10_000;

#[derive(Debug, Default)]
struct Configured {
    config: ControlConfig,
}

#[derive(Debug)]
enum Backend {
    /// The tables are the truth (the embedded store, or a store without a control backend).
    Local,
    #[cfg(feature = "redis")]
    Redis(Box<redis::RedisControl>),
}

#[derive(Debug)]
pub(crate) struct Shared {
    clock: Arc<dyn Clock>,
    configured: RwLock<Configured>,
    tables: RwLock<Tables>,
    active: AtomicBool,
    has_ban_rules: AtomicBool,
    /// Incremented by every [`ControlPlane::configure`], so overrides resolved against old
    /// plans are resolved again.
    generation: std::sync::atomic::AtomicU64,
    backend: Backend,
    strikes: Mutex<Strikes>,
    /// The policies overrides make, shared by the identities with the same parameters.
    made: made::MadePolicies,
    /// Automatic bans this instance set.
    automatic_bans: std::sync::atomic::AtomicU64,
    /// Itself, for background tasks that must not keep it alive.
    me: std::sync::OnceLock<std::sync::Weak<Shared>>,
}

/// The control plane of a limiter (see the module docs). Cheap to clone.
#[derive(Debug, Clone)]
pub struct ControlPlane {
    shared: Arc<Shared>,
}

impl ControlPlane {
    /// A control plane whose entries live in this process only.
    pub fn local() -> Self {
        Self::with_backend(Backend::Local, Arc::new(SystemClock))
    }

    /// The same, reading time from `clock` (tests).
    pub fn local_with_clock(clock: Arc<dyn Clock>) -> Self {
        Self::with_backend(Backend::Local, clock)
    }

    /// A control plane kept in the Redis or Valkey behind `store`, under keys of `prefix`;
    /// starts reading changes and sweeping ended entries (needs a Tokio runtime). `store`
    /// should be a connection of its own with a generous timeout ([`connect`] makes one),
    /// so control traffic never shares the checks' connection or timeout.
    #[cfg(feature = "redis")]
    pub fn redis(store: Arc<sluice_redis::RedisStore>, prefix: &str) -> Self {
        let backend = Backend::Redis(Box::new(redis::RedisControl::new(store, prefix)));
        let plane = Self::with_backend(backend, Arc::new(SystemClock));
        redis::spawn_poller(Arc::downgrade(&plane.shared));
        plane
    }

    fn with_backend(backend: Backend, clock: Arc<dyn Clock>) -> Self {
        let shared = Arc::new(Shared {
            clock,
            configured: RwLock::new(Configured::default()),
            tables: RwLock::new(Tables::default()),
            active: AtomicBool::new(false),
            has_ban_rules: AtomicBool::new(false),
            generation: std::sync::atomic::AtomicU64::new(0),
            backend,
            strikes: Mutex::new(Strikes::default()),
            made: made::MadePolicies::default(),
            automatic_bans: std::sync::atomic::AtomicU64::new(0),
            me: std::sync::OnceLock::new(),
        });
        let _ = shared.me.set(Arc::downgrade(&shared));
        spawn_sweeper(Arc::downgrade(&shared));
        ControlPlane { shared }
    }

    /// Where the entries live: `local` or `redis`.
    pub fn backend(&self) -> &'static str {
        match self.shared.backend {
            Backend::Local => "local",
            #[cfg(feature = "redis")]
            Backend::Redis(_) => "redis",
        }
    }

    /// Installs what the configuration says (plans, ban rules, the file's lists).
    pub fn configure(&self, config: ControlConfig) {
        let mut configured = self.shared.configured.write();
        {
            let mut tables = self.shared.tables.write();
            tables.set_configured(&config.allow, &config.deny, &config.plans);
            // Under the tables' lock, so no override is resolved against the new plans
            // under the old generation's number.
            self.shared.generation.fetch_add(1, Ordering::Relaxed);
        }
        self.shared
            .has_ban_rules
            .store(!config.bans.is_empty(), Ordering::Relaxed);
        *configured = Configured { config };
        drop(configured);
        self.shared.update_active();
    }

    fn now_ms(&self) -> u64 {
        self.shared.now_ms()
    }

    fn expiry(&self, ttl: Option<Duration>) -> Option<u64> {
        ttl.map(|t| self.now_ms().saturating_add(t.as_millis() as u64))
    }

    /// Reads the changes from the store now (a no-op for the local backend): the log since
    /// the last read, or every table when there was no read yet.
    pub async fn refresh(&self) -> Result<(), StoreError> {
        match &self.shared.backend {
            Backend::Local => Ok(()),
            #[cfg(feature = "redis")]
            Backend::Redis(r) => r.sync(&self.shared).await,
        }
    }

    /// The connection of a control plane kept in Redis or Valkey (`None` for a local one):
    /// reservation records ([`crate::reservation`]) live next to the control entries.
    #[cfg(feature = "redis")]
    pub(crate) fn redis_connection(&self) -> Option<Arc<sluice_redis::RedisStore>> {
        match &self.shared.backend {
            Backend::Redis(r) => Some(Arc::clone(r.connection())),
            Backend::Local => None,
        }
    }

    /// How old the snapshot that checks read is: the time since it was last brought up to
    /// date with the store (zero for the local backend, whose tables are the truth; `None`
    /// before the first read).
    pub fn snapshot_age(&self) -> Option<Duration> {
        match &self.shared.backend {
            Backend::Local => Some(Duration::ZERO),
            #[cfg(feature = "redis")]
            Backend::Redis(r) => r.snapshot_age(),
        }
    }

    /// How many runtime entries each table holds in this instance's memory.
    pub fn sizes(&self) -> TableSizes {
        self.shared.tables.read().sizes()
    }

    /// How many times the tables were read from the store in full (0 for the local
    /// backend): once at start, then only when this instance fell behind the change log.
    pub fn full_reads(&self) -> u64 {
        match &self.shared.backend {
            Backend::Local => 0,
            #[cfg(feature = "redis")]
            Backend::Redis(r) => r.full_reads(),
        }
    }

    /// The entries of each table in the store: `overrides`, `bans`, `allow`, `deny` and
    /// the escalation `levels` (`None` for the local backend, whose memory is the store).
    pub async fn store_sizes(&self) -> Result<Option<Vec<(&'static str, u64)>>, StoreError> {
        match &self.shared.backend {
            Backend::Local => Ok(None),
            #[cfg(feature = "redis")]
            Backend::Redis(r) => Ok(Some(r.store_sizes().await?.to_vec())),
        }
    }

    /// The escalation levels the embedded backend remembers (automatic bans).
    pub fn local_levels(&self) -> usize {
        self.shared.strikes.lock().levels.len()
    }

    /// How many automatic bans this instance set (a policy's `ban` rule).
    pub fn automatic_bans(&self) -> u64 {
        self.shared.automatic_bans.load(Ordering::Relaxed)
    }

    /// The table limits in force.
    pub fn limits(&self) -> ControlLimits {
        self.shared.limits()
    }

    /// Refuses adding one runtime entry to `table` of the local backend when it is full.
    fn room_for(&self, table: Table, exists: bool) -> Result<(), ControlError> {
        let max = self.shared.limits().max_of(table);
        let sizes = self.sizes();
        let size = match table {
            Table::Overrides => sizes.overrides,
            Table::Bans => sizes.bans,
            Table::Allow => sizes.allow,
            Table::Deny => sizes.deny,
        } as u64;
        if !exists && size >= max {
            return Err(ControlError::Full {
                table: table.name(),
                max,
            });
        }
        Ok(())
    }

    /// Binds `identity` of `policy` to `target`, for `ttl` or until removed.
    pub async fn set_override(
        &self,
        policy: &str,
        identity: &str,
        target: OverrideTarget,
        ttl: Option<Duration>,
    ) -> Result<OverrideEntry, ControlError> {
        valid_identity(identity)?;
        let entry = OverrideEntry {
            target,
            expires_at_ms: self.expiry(ttl),
        };
        match &self.shared.backend {
            Backend::Local => {
                let exists = self.shared.tables.read().has_override(policy, identity);
                self.room_for(Table::Overrides, exists)?;
                self.shared
                    .tables
                    .write()
                    .set_override(policy, identity, entry.clone());
            }
            #[cfg(feature = "redis")]
            Backend::Redis(r) => {
                r.set_override(&self.shared, policy, identity, &entry)
                    .await?
            }
        }
        self.shared.update_active();
        Ok(entry)
    }

    /// The live override of `identity` for `policy` (read from the store on Redis).
    pub async fn get_override(
        &self,
        policy: &str,
        identity: &str,
    ) -> Result<Option<OverrideEntry>, ControlError> {
        self.refresh().await?;
        let now = self.now_ms();
        Ok(self
            .shared
            .tables
            .read()
            .override_of(policy, identity, &Now::at(now))
            .map(|o| o.entry.clone()))
    }

    /// Removes an override; returns whether there was one.
    pub async fn remove_override(
        &self,
        policy: &str,
        identity: &str,
    ) -> Result<bool, ControlError> {
        let removed = match &self.shared.backend {
            Backend::Local => self.shared.tables.write().remove_override(policy, identity),
            #[cfg(feature = "redis")]
            Backend::Redis(r) => r.remove_override(&self.shared, policy, identity).await?,
        };
        self.shared.update_active();
        Ok(removed)
    }

    /// Bans `identity` for `duration`, from `policies` (`None`: every policy).
    pub async fn ban(
        &self,
        identity: &str,
        duration: Duration,
        policies: Option<Vec<String>>,
    ) -> Result<BanEntry, ControlError> {
        valid_identity(identity)?;
        let policies = policies.map(|mut ps| {
            ps.sort();
            ps.dedup();
            ps
        });
        let ban = BanEntry {
            policies,
            until_ms: self
                .now_ms()
                .saturating_add(duration.as_millis().max(1) as u64),
        };
        match &self.shared.backend {
            Backend::Local => {
                let exists = self
                    .shared
                    .tables
                    .read()
                    .has_ban(identity, ban.policies.as_deref());
                self.room_for(Table::Bans, exists)?;
                self.shared.tables.write().add_ban(identity, ban.clone())
            }
            #[cfg(feature = "redis")]
            Backend::Redis(r) => r.ban(&self.shared, identity, &ban).await?,
        }
        self.shared.update_active();
        Ok(ban)
    }

    /// Lifts every ban of `identity`; returns whether there was one.
    pub async fn unban(&self, identity: &str) -> Result<bool, ControlError> {
        let removed = match &self.shared.backend {
            Backend::Local => self.shared.tables.write().remove_bans(identity),
            #[cfg(feature = "redis")]
            Backend::Redis(r) => r.unban(&self.shared, identity).await?,
        };
        self.shared.update_active();
        Ok(removed)
    }

    /// How long `identity` stays banned for `policy`, ms (0: not banned).
    pub fn ban_left_ms(&self, identity: &str, policy: &str) -> u64 {
        let now = self.now_ms();
        self.shared
            .tables
            .read()
            .ban_left_ms(identity, policy, &Now::at(now))
    }

    /// Adds `entry` to a list, for `ttl` or until removed.
    pub async fn list_add(
        &self,
        kind: ListKind,
        entry: &ListEntry,
        ttl: Option<Duration>,
    ) -> Result<(), ControlError> {
        let expires = self.expiry(ttl);
        match &self.shared.backend {
            Backend::Local => {
                let exists = self.shared.tables.read().has_runtime(kind, entry);
                self.room_for(Table::of(kind), exists)?;
                self.shared.tables.write().list_insert(kind, entry, expires)
            }
            #[cfg(feature = "redis")]
            Backend::Redis(r) => r.list_add(&self.shared, kind, entry, expires).await?,
        }
        self.shared.update_active();
        Ok(())
    }

    /// Adds up to [`MAX_BULK`] entries to a list, for `ttl` or until removed: all or
    /// nothing (a full table refuses the whole call). Returns how many distinct entries
    /// were written.
    pub async fn list_add_many(
        &self,
        kind: ListKind,
        entries: &[ListEntry],
        ttl: Option<Duration>,
    ) -> Result<usize, ControlError> {
        if entries.len() > MAX_BULK {
            return Err(StoreError::Invalid(format!(
                "at most {MAX_BULK} entries per call, not {}",
                entries.len()
            ))
            .into());
        }
        let mut seen = std::collections::HashSet::with_capacity(entries.len());
        let distinct: Vec<ListEntry> = entries
            .iter()
            .map(|e| match e {
                ListEntry::Net(n) => ListEntry::Net(n.trunc()),
                other => other.clone(),
            })
            .filter(|e| seen.insert(e.clone()))
            .collect();
        let expires = self.expiry(ttl);
        match &self.shared.backend {
            Backend::Local => {
                let table = Table::of(kind);
                let max = self.shared.limits().max_of(table);
                let mut tables = self.shared.tables.write();
                let new = distinct
                    .iter()
                    .filter(|e| !tables.has_runtime(kind, e))
                    .count();
                let size = match kind {
                    ListKind::Allow => tables.sizes().allow,
                    ListKind::Deny => tables.sizes().deny,
                };
                if (size + new) as u64 > max {
                    return Err(ControlError::Full {
                        table: table.name(),
                        max,
                    });
                }
                for e in &distinct {
                    tables.list_insert(kind, e, expires);
                }
            }
            #[cfg(feature = "redis")]
            Backend::Redis(r) => {
                r.list_add_many(&self.shared, kind, &distinct, expires)
                    .await?
            }
        }
        self.shared.update_active();
        Ok(distinct.len())
    }

    /// Removes `entry` from a list; returns whether it was there (runtime entries only: the
    /// file's entries stay until the file changes).
    pub async fn list_remove(
        &self,
        kind: ListKind,
        entry: &ListEntry,
    ) -> Result<bool, ControlError> {
        let removed = match &self.shared.backend {
            Backend::Local => self.shared.tables.write().list_remove(kind, entry),
            #[cfg(feature = "redis")]
            Backend::Redis(r) => r.list_remove(&self.shared, kind, entry).await?,
        };
        self.shared.update_active();
        Ok(removed)
    }
}

impl Shared {
    fn now_ms(&self) -> u64 {
        self.clock.now() / 1000
    }

    fn update_active(&self) {
        let on = !self.tables.read().is_empty();
        self.active.store(on, Ordering::Relaxed);
    }

    fn limits(&self) -> ControlLimits {
        self.configured.read().config.limits
    }
}

/// Connects to the store named by `url` together with the control plane that belongs to it:
/// kept in the same Redis or Valkey (keys under `prefix`), or in this process for the
/// embedded store.
pub async fn connect(
    url: &crate::StoreUrl,
    options: &crate::StoreOptions,
    prefix: &str,
) -> Result<(Arc<dyn sluice_core::Store>, ControlPlane), StoreError> {
    #[cfg(feature = "redis")]
    if let crate::StoreUrl::Redis(u) = url {
        let store = Arc::new(sluice_redis::connect(u, options.redis_options()).await?);
        // The control plane's own connection, with its own timeout: reading or writing
        // control entries never waits behind checks, and checks never behind them.
        let mut control_options = options.redis_options();
        control_options.timeout = redis::READ_TIMEOUT;
        control_options.unresponsive_after = redis::READ_TIMEOUT;
        control_options.batch = false;
        let own = Arc::new(sluice_redis::connect(u, control_options).await?);
        let control = ControlPlane::redis(own, prefix);
        control.refresh().await?;
        return Ok((store, control));
    }
    let _ = prefix;
    Ok((url.connect(options).await?, ControlPlane::local()))
}

fn valid_identity(identity: &str) -> Result<(), StoreError> {
    if identity.is_empty() || identity.len() > 512 || identity.contains('\n') {
        return Err(StoreError::Invalid(
            "an identity must be 1 to 512 characters on one line".into(),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests;
