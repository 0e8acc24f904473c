//! Whether an algorithm's parameters are usable: positive, and small enough that every store
//! computes with them exactly (the Redis scripts hold numbers in Lua doubles, exact below
//! 2^53). Apart from the registry so the bounds of each algorithm read in one place.

use crate::policy::{Algorithm, MAX_EXACT, PolicyError};

impl Algorithm {
    /// Checks the parameters are positive and small enough for exact integer arithmetic on
    /// every store.
    pub fn validate(&self) -> Result<(), PolicyError> {
        let positive = |what: &str, v: u64| {
            if v == 0 {
                Err(PolicyError::Invalid(format!("{what} must be at least 1")))
            } else {
                Ok(())
            }
        };
        // Durations are held in milliseconds; a zero one says so in the unit people write.
        let positive_ms = |what: &str, v: u64| {
            if v == 0 {
                Err(PolicyError::Invalid(format!(
                    "{what} must be at least 1ms (got 0)"
                )))
            } else {
                Ok(())
            }
        };
        let exact = |what: &str, v: u128| {
            if v > MAX_EXACT as u128 {
                Err(PolicyError::Invalid(format!(
                    "{what} is too large for exact arithmetic (max 2^53)"
                )))
            } else {
                Ok(())
            }
        };
        match *self {
            Algorithm::TokenBucket { capacity, rate }
            | Algorithm::LeakyBucket { capacity, rate, .. } => {
                positive("capacity", capacity)?;
                positive("rate", rate.amount)?;
                positive_ms("rate period", rate.per_ms)?;
                let r = rate.reduced();
                exact(
                    "capacity x rate period",
                    capacity as u128 * r.per_ms as u128,
                )?;
                exact("rate", r.amount as u128)
            }
            Algorithm::Gcra { rate, burst } => {
                positive("rate", rate.amount)?;
                positive_ms("rate period", rate.per_ms)?;
                if rate.per_ms as u128 * 1000 / (rate.amount as u128) == 0 {
                    return Err(PolicyError::Invalid(
                        "gcra rate must be at most 1 per microsecond".into(),
                    ));
                }
                exact(
                    "(burst + 1) x emission interval",
                    (burst as u128 + 1) * rate.per_ms as u128 * 1000,
                )
            }
            Algorithm::FixedWindow { limit, window_ms }
            | Algorithm::SlidingWindowCounter { limit, window_ms }
            | Algorithm::SlidingWindowLog { limit, window_ms } => {
                positive("limit", limit)?;
                positive_ms("window", window_ms)?;
                exact("limit x window", limit as u128 * window_ms as u128)
            }
            Algorithm::CalendarWindow { limit, period } => {
                positive("limit", limit)?;
                exact("limit x window", limit as u128 * period.max_ms() as u128)
            }
            Algorithm::Concurrency { limit, lease_ms } => {
                positive("limit", limit)?;
                positive_ms("lease timeout", lease_ms)
            }
        }
    }
}
