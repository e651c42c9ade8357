//! `shm_layout`: the body is `gpushare_protocol::fuzzing::shm_layout` (stable `cargo test` replays the
//! checked-in corpus through it too).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| gpushare_protocol::fuzzing::shm_layout(data));
