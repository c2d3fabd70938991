#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| weir::fuzzing::split_verdict(data));
