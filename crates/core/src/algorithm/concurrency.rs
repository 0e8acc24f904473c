//! TODO(helper): implement per docs/algorithms.md.

use super::{Outcome, Update};
use crate::clock::Timestamp;
use crate::decision::LeaseId;

/// Stored state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct State {}

/// Decides one request.
pub fn decide(_state: Option<&State>, _limit: u64, _lease_ms: u64, _now: Timestamp, _cost: u64, _lease: Option<&LeaseId>) -> Outcome<State> {
    unimplemented!("concurrency")
}

/// Releases a lease.
pub fn release(_state: &State, _now: Timestamp, _lease: &LeaseId) -> (bool, Update<State>) {
    unimplemented!("release")
}
