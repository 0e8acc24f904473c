#![no_main]
//! `cargo fuzz run forwarded`: see `sluice_reliability::fuzzing::forwarded` for the invariants.

libfuzzer_sys::fuzz_target!(|data: &[u8]| sluice_reliability::fuzzing::forwarded(data));
