#![no_main]
//! `cargo fuzz run config`: see `sluice_reliability::fuzzing::config` for the invariants.

libfuzzer_sys::fuzz_target!(|data: &[u8]| sluice_reliability::fuzzing::config(data));
