#![no_main]
//! `cargo fuzz run headers`: see `sluice_reliability::fuzzing::headers` for the invariants.

libfuzzer_sys::fuzz_target!(|data: &[u8]| sluice_reliability::fuzzing::headers(data));
