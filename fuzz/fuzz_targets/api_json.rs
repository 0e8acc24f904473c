#![no_main]
//! `cargo fuzz run api_json`: see `sluice_reliability::fuzzing::api_json` for the invariants.

libfuzzer_sys::fuzz_target!(|data: &[u8]| sluice_reliability::fuzzing::api_json(data));
