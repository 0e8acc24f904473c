//! Removing what ended: list entries, bans and overrides with an end, and the embedded
//! backend's strike counters, once a second in small batches, so no sweep holds the tables'
//! lock for long and a table with millions of ended entries drains without a pause.

#[cfg(feature = "redis")]
use super::Backend;
use super::{SWEEP_INTERVAL, Shared};

impl Shared {
    /// Removes what ended from memory (and the store's tables on Redis): the tables in
    /// batches, each under a short write lock, then the embedded backend's strike counters
    /// and escalation levels.
    pub(super) async fn sweep(&self) {
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
pub(super) fn spawn_sweeper(weak: std::sync::Weak<Shared>) {
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
