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

pub(crate) mod hook;
pub mod listing;
#[cfg(feature = "redis")]
mod redis;
pub mod tables;

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use parking_lot::{Mutex, RwLock};
use sluice_core::{Algorithm, Clock, Policy, StoreError, SystemClock};

pub use listing::{ControlListing, ListedBan, ListedEntry, ListedOverride};
pub use tables::{BanEntry, ListEntry, OverrideEntry, OverrideTarget, TableSizes};
use tables::{Found, Now, Tables};

/// How often an instance on a shared store reads the changes of the control entries.
pub const POLL_INTERVAL: Duration = Duration::from_millis(250);

/// How often entries that ended are removed.
pub const SWEEP_INTERVAL: Duration = Duration::from_secs(1);

/// The most list entries one [`ControlPlane::list_add_many`] takes.
pub const MAX_BULK: usize = 10_000;

/// The most entries of each control table (`[control]` in the server's configuration).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ControlLimits {
    /// Runtime allow-list entries (default 1,000,000).
    pub max_allow: u64,
    /// Runtime deny-list entries (default 2,000,000).
    pub max_deny: u64,
    /// Bans, one per identity and scope, automatic ones included (default 1,000,000).
    pub max_bans: u64,
    /// Overrides, one per policy and identity (default 1,000,000).
    pub max_overrides: u64,
    /// The largest request body the HTTP control endpoints read, in bytes (default 6 MiB:
    /// a bulk import of [`MAX_BULK`] entries fits). The control plane itself ignores it.
    pub max_body_bytes: u64,
}

impl Default for ControlLimits {
    fn default() -> Self {
        ControlLimits {
            max_allow: 1_000_000,
            max_deny: 2_000_000,
            max_bans: 1_000_000,
            max_overrides: 1_000_000,
            max_body_bytes: 6 << 20,
        }
    }
}

impl ControlLimits {
    fn max_of(&self, table: Table) -> u64 {
        match table {
            Table::Overrides => self.max_overrides,
            Table::Bans => self.max_bans,
            Table::Allow => self.max_allow,
            Table::Deny => self.max_deny,
        }
    }
}

/// Why a change was not made.
#[derive(Debug, thiserror::Error)]
pub enum ControlError {
    /// The table holds its most entries already; nothing changed.
    #[error("the {table} table is full: it holds at most {max} entries (control.max_{table})")]
    Full {
        /// `allow`, `deny`, `bans` or `overrides`.
        table: &'static str,
        /// Its most entries.
        max: u64,
    },
    /// The store refused or did not answer, or the request was invalid
    /// ([`StoreError::Invalid`]); nothing changed.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// One control table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Table {
    Overrides,
    Bans,
    Allow,
    Deny,
}

impl Table {
    fn of(kind: ListKind) -> Self {
        match kind {
            ListKind::Allow => Table::Allow,
            ListKind::Deny => Table::Deny,
        }
    }

    /// Its name in messages and in `control.max_*`.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Table::Overrides => "overrides",
            Table::Bans => "bans",
            Table::Allow => "allow",
            Table::Deny => "deny",
        }
    }

    /// Its one-letter code in the store's log and expiry set.
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    fn code(self) -> &'static str {
        match self {
            Table::Overrides => "o",
            Table::Bans => "b",
            Table::Allow => "a",
            Table::Deny => "d",
        }
    }

    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    fn from_code(code: &str) -> Option<Self> {
        Some(match code {
            "o" => Table::Overrides,
            "b" => Table::Bans,
            "a" => Table::Allow,
            "d" => Table::Deny,
            _ => return None,
        })
    }
}

/// A policy's automatic ban: `after` denials within `within_ms` ban the identity for
/// `duration_ms`; each ban while the previous one's level is remembered lasts `multiplier`
/// times longer, at most `max_ms`. The level is forgotten `max_ms` after a ban ends.
#[derive(Debug, Clone, PartialEq)]
pub struct BanRule {
    /// Denials that trigger a ban.
    pub after: u32,
    /// The window the denials are counted in, ms.
    pub within_ms: u64,
    /// The first ban's length, ms.
    pub duration_ms: u64,
    /// Growth of each repeat ban.
    pub multiplier: f64,
    /// The longest ban, ms.
    pub max_ms: u64,
}

impl BanRule {
    /// The length of a ban at escalation `level` (0 for the first).
    pub fn duration_at(&self, level: u32) -> u64 {
        let ms = self.duration_ms as f64 * self.multiplier.powi(level.min(64) as i32);
        if ms.is_finite() {
            (ms as u64).clamp(1, self.max_ms.max(1))
        } else {
            self.max_ms.max(1)
        }
    }
}

/// What the configuration contributes: plans, ban rules and the lists written in the file.
#[derive(Debug, Clone, Default)]
pub struct ControlConfig {
    /// Plan name, then policy name, to the parameters of that policy in that plan.
    pub plans: HashMap<String, HashMap<String, Algorithm>>,
    /// Policy name to its automatic ban.
    pub bans: HashMap<String, BanRule>,
    /// Identities and networks that bypass every limit.
    pub allow: Vec<ListEntry>,
    /// Identities and networks refused by every policy.
    pub deny: Vec<ListEntry>,
    /// The most entries of each table.
    pub limits: ControlLimits,
}

/// Which list.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ListKind {
    /// Bypasses limits.
    Allow,
    /// Refused.
    Deny,
}

/// What the control plane says about one policy of a check.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Screen {
    Pass,
    Override(Arc<Policy>),
    Allowed,
    Denied,
    Banned(u64),
}

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

/// Counters of the embedded backend's automatic bans.
#[derive(Debug, Default)]
struct Strikes {
    /// (policy, identity) to (denials, window start ms).
    counts: HashMap<(String, String), (u32, u64)>,
    /// (policy, identity) to (escalation level, forgotten at ms).
    levels: HashMap<(String, String), (u32, u64)>,
}

/// The most identities whose denials (and escalation levels) the embedded backend counts
/// at once.
const MAX_STRIKE_ENTRIES: usize = 100_000;

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
    made: tables::MadePolicies,
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
            made: tables::MadePolicies::default(),
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

    /// True when some entry or list could change a decision.
    pub(crate) fn active(&self) -> bool {
        self.shared.active.load(Ordering::Relaxed)
    }

    /// What the control plane says about `identity` under `policy`. Order: deny list, allow
    /// list, ban, override.
    pub(crate) fn screen(&self, identity: &str, policy: &Arc<Policy>, now_ms: u64) -> Screen {
        self.screen_lazy(identity, policy, &Now::at(now_ms))
    }

    /// [`Self::screen`] at a time read only if an entry needs it.
    pub(crate) fn screen_lazy(
        &self,
        identity: &str,
        policy: &Arc<Policy>,
        now: &Now<'_>,
    ) -> Screen {
        let tables = self.shared.tables.read();
        match tables.screen(identity, &policy.name, now) {
            Found::Pass => Screen::Pass,
            Found::Denied => Screen::Denied,
            Found::Allowed => Screen::Allowed,
            Found::Banned(left) => Screen::Banned(left),
            // An override made for another algorithm (the policy changed since) is ignored.
            Found::Override(o, Some(a)) if a.kind() == policy.algorithm.kind() => {
                let generation = self.shared.generation.load(Ordering::Relaxed);
                Screen::Override(o.resolve(policy, generation, a, &self.shared.made))
            }
            Found::Override(..) => Screen::Pass,
        }
    }

    /// The time of one decision, read from the clock only if an entry needs it.
    pub(crate) fn now(&self) -> Now<'_> {
        Now::lazy(&*self.shared.clock)
    }

    /// The clock of the entries, Unix ms.
    pub(crate) fn clock_ms(&self) -> u64 {
        self.now_ms()
    }

    /// Counts a denial of `identity` by `policy` towards the policy's automatic ban.
    pub(crate) fn note_denial(&self, identity: &str, policy: &str) {
        if !self.shared.has_ban_rules.load(Ordering::Relaxed) {
            return;
        }
        let Some(rule) = self
            .shared
            .configured
            .read()
            .config
            .bans
            .get(policy)
            .cloned()
        else {
            return;
        };
        let now = self.now_ms();
        if self
            .shared
            .tables
            .read()
            .ban_left_ms(identity, policy, &Now::at(now))
            > 0
        {
            return;
        }
        match &self.shared.backend {
            Backend::Local => {
                if let Some(ban) = self.local_strike(identity, policy, &rule, now) {
                    self.shared.tables.write().add_ban(identity, ban);
                    self.shared.automatic_bans.fetch_add(1, Ordering::Relaxed);
                    self.shared.update_active();
                    metrics::counter!("sluice_bans_total", "policy" => policy.to_string(), "source" => "automatic")
                        .increment(1);
                }
            }
            #[cfg(feature = "redis")]
            Backend::Redis(r) => r.strike(&self.shared, identity, policy, rule, now),
        }
    }

    fn local_strike(
        &self,
        identity: &str,
        policy: &str,
        rule: &BanRule,
        now: u64,
    ) -> Option<BanEntry> {
        let mut s = self.shared.strikes.lock();
        if s.counts.len() >= MAX_STRIKE_ENTRIES {
            s.counts
                .retain(|_, (_, start)| now < start.saturating_add(rule.within_ms));
            if s.counts.len() >= MAX_STRIKE_ENTRIES {
                return None;
            }
        }
        let key = (policy.to_string(), identity.to_string());
        let count = s.counts.entry(key.clone()).or_insert((0, now));
        if now >= count.1.saturating_add(rule.within_ms) {
            *count = (0, now);
        }
        count.0 += 1;
        if count.0 < rule.after {
            return None;
        }
        s.counts.remove(&key);
        let level = match s.levels.get(&key) {
            Some(&(level, forget_at)) if forget_at > now => level,
            _ => 0,
        };
        let until = now.saturating_add(rule.duration_at(level));
        if s.levels.len() >= MAX_STRIKE_ENTRIES && !s.levels.contains_key(&key) {
            s.levels.retain(|_, (_, forget_at)| *forget_at > now);
        }
        if s.levels.len() < MAX_STRIKE_ENTRIES || s.levels.contains_key(&key) {
            s.levels
                .insert(key, (level + 1, until.saturating_add(rule.max_ms)));
        }
        Some(BanEntry {
            policies: Some(vec![policy.to_string()]),
            until_ms: until,
        })
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

    /// Removes what ended from memory (and the store's tables on Redis): the tables in
    /// batches, each under a short write lock, then the embedded backend's strike counters
    /// and escalation levels.
    async fn sweep(&self) {
        #[cfg(feature = "redis")]
        if let Backend::Redis(r) = &self.backend
            && let Err(e) = r.sweep(self, 20).await
        {
            tracing::debug!(error = %e, "control plane: ended entries not swept this time");
        }
        let now = self.now_ms();
        let mut removed = 0;
        loop {
            let n = self.tables.write().sweep(now, 512);
            removed += n;
            if n < 512 {
                break;
            }
            tokio::task::yield_now().await;
        }
        if removed > 0 {
            self.update_active();
        }
        let rules = self.configured.read().config.bans.clone();
        let mut s = self.strikes.lock();
        s.levels.retain(|_, (_, forget_at)| *forget_at > now);
        s.counts.retain(|(policy, _), (_, start)| {
            rules
                .get(policy)
                .is_some_and(|r| now < start.saturating_add(r.within_ms))
        });
    }
}

/// Sweeps ended entries every [`SWEEP_INTERVAL`] until the control plane is dropped (only
/// inside a Tokio runtime; without one, ended entries stay in memory, inert, until removed).
fn spawn_sweeper(weak: std::sync::Weak<Shared>) {
    let Ok(handle) = tokio::runtime::Handle::try_current() else {
        return;
    };
    handle.spawn(async move {
        loop {
            tokio::time::sleep(SWEEP_INTERVAL).await;
            let Some(shared) = weak.upgrade() else { return };
            shared.sweep().await;
        }
    });
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
