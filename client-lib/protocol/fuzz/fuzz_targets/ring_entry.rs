//! `ring_entry`: the body is `gpushare_protocol::fuzzing::ring_entry` (stable `cargo test` replays the
//! checked-in corpus through it too).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| gpushare_protocol::fuzzing::ring_entry(data));
