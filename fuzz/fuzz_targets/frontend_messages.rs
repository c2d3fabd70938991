#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| weir::fuzzing::frontend_messages(data));
