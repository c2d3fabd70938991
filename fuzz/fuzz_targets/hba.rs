#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| weir::fuzzing::hba(data));
