#![no_main]
//! `cargo fuzz run algorithms`: see `sluice_reliability::fuzzing::algorithms` for the invariants.

libfuzzer_sys::fuzz_target!(|data: &[u8]| sluice_reliability::fuzzing::algorithms(data));
