//! `sluice-http`: rate limiting for HTTP services.
#![forbid(unsafe_code)]

pub mod headers;
pub mod identity;
