//! The time of one decision. A check that meets no entry with an expiry (the usual case)
//! never reads the clock, so the time is read lazily and once per decision, however many
//! entries of that decision need it.

/// The time of one decision in Unix ms, read from the clock on first use only: a decision
/// that meets no entry with an expiry (the usual case) never reads it.
pub(crate) struct Now<'a> {
    clock: Option<&'a dyn sluice_core::Clock>,
    ms: std::cell::Cell<Option<u64>>,
}

impl<'a> Now<'a> {
    /// Read from `clock` when first needed.
    pub(crate) fn lazy(clock: &'a dyn sluice_core::Clock) -> Self {
        Now {
            clock: Some(clock),
            ms: std::cell::Cell::new(None),
        }
    }

    /// A time already known.
    pub(crate) fn at(ms: u64) -> Now<'static> {
        Now {
            clock: None,
            ms: std::cell::Cell::new(Some(ms)),
        }
    }

    /// The time, Unix ms.
    pub(crate) fn ms(&self) -> u64 {
        if let Some(ms) = self.ms.get() {
            return ms;
        }
        let ms = self.clock.map_or(0, |c| c.now() / 1000);
        self.ms.set(Some(ms));
        ms
    }
}
