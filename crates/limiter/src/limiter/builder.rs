//! The settings of a [`Limiter`] and the one place they become one: defaults, the store's
//! deny-cache mode, the leased-mode table and the control plane are all resolved in
//! [`LimiterBuilder::build`].

use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::{Duration, Instant};

use sluice_core::{KeyScheme, Store};

use super::{DENY_CACHE_CAPACITY, Inner, Limiter, leased_ops};
use crate::breaker::{BreakerConfig, CircuitBreaker};
use crate::control::ControlPlane;
use crate::deny_cache::{DenyCache, DenyCacheMode};
use crate::leased::LeaseTable;
use crate::local::{LocalFallback, LocalShare};

/// Settings of a [`Limiter`].
#[derive(Debug)]
pub struct LimiterBuilder {
    store: Arc<dyn Store>,
    keys: KeyScheme,
    timeout: Duration,
    breaker: BreakerConfig,
    global_shadow: bool,
    log_interval: Duration,
    deny_cache: DenyCacheMode,
    local_share: LocalShare,
    control: Option<ControlPlane>,
    clock: Option<Arc<dyn sluice_core::Clock>>,
}

impl LimiterBuilder {
    /// The clock leased-mode slices live by (default: monotonic, from the build); tests that
    /// drive the store's clock by hand pass the same clock here.
    pub fn clock(mut self, clock: Arc<dyn sluice_core::Clock>) -> Self {
        self.clock = Some(clock);
        self
    }
    /// The share of each policy's limit this instance grants on its own while the store is
    /// unreachable, for policies with [`FailureMode::Local`] (default: the whole limit).
    pub fn local_share(mut self, share: LocalShare) -> Self {
        self.local_share = share;
        self
    }
    /// Which denials are remembered locally so repeated requests skip the store until their
    /// retry time (default [`DenyCacheMode::Auto`]: exact algorithms, remote stores only).
    pub fn deny_cache(mut self, mode: DenyCacheMode) -> Self {
        self.deny_cache = mode;
        self
    }
    /// Where overrides, bans and lists live (default: in this process only; see
    /// [`crate::control`]).
    pub fn control(mut self, control: ControlPlane) -> Self {
        self.control = Some(control);
        self
    }
    /// The key scheme (default prefix `rl`).
    pub fn key_scheme(mut self, keys: KeyScheme) -> Self {
        self.keys = keys;
        self
    }
    /// The per-call timeout (default 50 ms).
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }
    /// Circuit breaker settings.
    pub fn breaker(mut self, breaker: BreakerConfig) -> Self {
        self.breaker = breaker;
        self
    }
    /// Treat every policy as shadow: compute and count, never deny.
    pub fn global_shadow(mut self, on: bool) -> Self {
        self.global_shadow = on;
        self
    }
    /// The shortest interval between two log lines about store failures (default 10 s).
    pub fn failure_log_interval(mut self, every: Duration) -> Self {
        self.log_interval = every;
        self
    }
    /// Builds the limiter.
    pub fn build(self) -> Limiter {
        let deny_mode = self.deny_cache.resolve(self.store.kind());
        let clock = self
            .clock
            .unwrap_or_else(|| Arc::new(leased_ops::MonotonicClock::new()));
        let leases = LeaseTable::new(
            Arc::clone(&self.store),
            clock,
            self.timeout.as_micros() as u64,
        );
        let control = self.control.unwrap_or_else(ControlPlane::local);
        let reservations = crate::reservation::Book::for_control(&control, self.keys.prefix());
        Limiter {
            inner: Arc::new(Inner {
                leases,
                reservations,
                sweeper: std::sync::OnceLock::new(),
                store: self.store,
                keys: self.keys,
                timeout: self.timeout,
                breaker: CircuitBreaker::new(self.breaker),
                global_shadow: self.global_shadow,
                log_interval_ms: self.log_interval.as_millis() as u64,
                last_log_ms: AtomicU64::new(0),
                started: Instant::now(),
                deny_mode,
                deny_cache: (deny_mode != DenyCacheMode::Off)
                    .then(|| DenyCache::new(DENY_CACHE_CAPACITY)),
                local: LocalFallback::new(self.local_share),
                control,
                observer: std::sync::OnceLock::new(),
            }),
        }
    }
}

impl Limiter {
    /// A limiter on `store` with default settings; see [`LimiterBuilder`].
    pub fn builder(store: Arc<dyn Store>) -> LimiterBuilder {
        LimiterBuilder {
            store,
            keys: KeyScheme::default(),
            timeout: Duration::from_millis(50),
            breaker: BreakerConfig::default(),
            global_shadow: false,
            log_interval: Duration::from_secs(10),
            deny_cache: DenyCacheMode::Auto,
            local_share: LocalShare::WHOLE,
            control: None,
            clock: None,
        }
    }
}
