//! `sluice serve`: the limiter as a standalone service.
#![forbid(unsafe_code)]

pub mod config;
pub mod descriptors;
