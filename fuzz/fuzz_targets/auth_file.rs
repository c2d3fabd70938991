#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| weir::fuzzing::auth_file(data));
