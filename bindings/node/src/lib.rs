//! `sluice.node`: the sluice engine as a Node.js addon.
#![deny(unsafe_code)]

use napi_derive::napi;

/// The version of the addon.
#[napi]
pub fn version() -> String {
    env!("CARGO_PKG_VERSION").to_string()
}
