//! TODO(helper): implement per docs/algorithms.md.

use super::Outcome;
use crate::clock::Timestamp;

/// Stored state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct State {}

/// Decides one request.
pub fn decide(_state: Option<&State>, _limit: u64, _window_ms: u64, _now: Timestamp, _cost: u64) -> Outcome<State> {
    unimplemented!("fixed_window")
}
