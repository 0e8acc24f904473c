//! Work in progress.
#![forbid(unsafe_code)]

pub mod servers;

pub mod conformance;
