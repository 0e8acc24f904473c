//! TODO(helper): implement per docs/algorithms.md.

use super::Outcome;
use crate::clock::Timestamp;

/// Stored state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct State {}

/// Decides one request.
pub fn decide(_state: Option<&State>, _capacity: u64, _rate: crate::policy::Rate, _mode: crate::policy::LeakyMode, _now: Timestamp, _cost: u64) -> Outcome<State> {
    unimplemented!("leaky bucket")
}
