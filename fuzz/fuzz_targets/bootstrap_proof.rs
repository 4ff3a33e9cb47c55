#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| oxccl_fuzz::run("bootstrap_proof", data));
