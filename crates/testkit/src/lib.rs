//! Work in progress.
#![forbid(unsafe_code)]
