//! Bodies of the fuzz targets in `client-lib/protocol/fuzz/`, and their seed corpus.
//!
//! Not part of the API: compiled only for this crate's tests and with the `fuzzing` feature
//! (which the fuzz crate turns on), never into production builds. Each body takes the fuzzer's
//! bytes and panics on any broken property, so that libFuzzer reports it; none hides a failure.
//! The fuzz crate calls these from its `fuzz_targets/*.rs` (nightly, `cargo fuzz`), and the unit
//! tests (`tests.rs`) replay the checked-in corpus (`fuzz/corpus/<target>/*`) through the same
//! bodies on stable `cargo test`.
//!
//! The seed corpus is generated from [`seeds()`]:
//! `cargo test -p gpushare-protocol --lib fuzzing::tests::write_seed_corpus -- --ignored`.

use std::fmt::Debug;

use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::command::{Access, Command, Kernel, MAX_LAUNCH_PARAMS, Operand};
use crate::control::{self, BrokerMessage, ClientMessage, Hello, Welcome};
use crate::error::ErrorCode;
use crate::ring::{
    CompletionEntry, MAX_ARENA_SIZE, MAX_RING_ENTRIES, PAGE, RegionHeader, ShmLayout,
    SubmissionEntry,
};

// The seed corpus and the sample messages and commands it encodes.
mod commands;
pub(crate) mod messages;
mod seeds;
#[cfg(test)]
mod tests;

pub use commands::commands;
pub use messages::{broker_messages, client_messages};
pub use seeds::seeds;

/// A fuzz target's body: takes the fuzzer's bytes, panics on a broken property.
pub type Body = fn(&[u8]);

/// Every fuzz target: its name (the file under `fuzz/fuzz_targets/` and the folder under
/// `fuzz/corpus/`) and its body.
pub const TARGETS: [(&str, Body); 3] = [
    ("control_decode", control_decode),
    ("ring_entry", ring_entry),
    ("shm_layout", shm_layout),
];

// ---------------------------------------------------------------------------------------------
// control_decode

/// Arbitrary bytes decoded as each control message type. Whatever decodes must re-encode,
/// decode again to an equal value, and re-encode to the same bytes.
pub fn control_decode(data: &[u8]) {
    control_round_trip::<Hello>(data);
    control_round_trip::<ClientMessage>(data);
    control_round_trip::<BrokerMessage>(data);
    control_round_trip::<Welcome>(data);
}

fn control_round_trip<T>(data: &[u8])
where
    T: Serialize + DeserializeOwned + PartialEq + Debug,
{
    let Ok(msg) = control::decode::<T>(data) else {
        return;
    };
    let type_name = std::any::type_name::<T>();
    let bytes = control::encode(&msg)
        .unwrap_or_else(|e| panic!("decoded {type_name} {msg:?} does not re-encode: {e}"));
    // bincode's own encoding is the shortest; the input may have used longer varints.
    assert!(
        bytes.len() <= data.len(),
        "{type_name} re-encodes longer ({} bytes) than the {} it was decoded from",
        bytes.len(),
        data.len()
    );
    let again = control::decode::<T>(&bytes)
        .unwrap_or_else(|e| panic!("re-encoded {type_name} {msg:?} does not decode: {e}"));
    let bytes_again = control::encode(&again)
        .unwrap_or_else(|e| panic!("{type_name} {again:?} does not re-encode: {e}"));
    assert_eq!(bytes_again, bytes, "{type_name} encoding is not stable");
    // A NaN in a float field makes the value unequal to itself: then only the encodings
    // (compared above) can be compared.
    if reflexive(&msg) {
        assert_eq!(again, msg, "{type_name} changed in a round trip");
    }
}

/// Whether `v == v`: false for values that hold a NaN.
#[allow(clippy::eq_op)]
fn reflexive<T: PartialEq>(v: &T) -> bool {
    v == v
}

// ---------------------------------------------------------------------------------------------
// ring_entry

/// The first 64 bytes (zero-padded) as a submission entry, through [`Command::decode`] and
/// [`Kernel::operands`]. A command that decodes must re-encode with the same user tag to an
/// entry that decodes to the same command; operand sizes must be exact or refused.
pub fn ring_entry(data: &[u8]) {
    let entry: SubmissionEntry = zerocopy::transmute!(padded::<64>(data));
    let cmd = match Command::decode(&entry) {
        Ok(cmd) => cmd,
        Err(code) => {
            assert!(
                matches!(
                    code,
                    ErrorCode::InvalidCommand
                        | ErrorCode::InvalidArgument
                        | ErrorCode::InvalidHandle
                ),
                "decode failed with an undocumented code {code:?} for {entry:?}"
            );
            if entry.flags != 0 {
                assert_eq!(code, ErrorCode::InvalidCommand, "set flags: {entry:?}");
            }
            return;
        }
    };
    assert_eq!(
        entry.flags, 0,
        "an entry with reserved flags decoded: {entry:?}"
    );

    let re = cmd.encode(entry.user_tag);
    assert_eq!(re.user_tag, entry.user_tag, "user tag lost: {cmd:?}");
    assert_eq!(re.opcode, entry.opcode, "opcode changed: {cmd:?}");
    assert_eq!(re.flags, 0, "encode set flags: {cmd:?}");
    let carried = match cmd {
        Command::StreamDestroy { stream } | Command::StreamSync { stream } => Some(stream),
        _ => cmd.stream(),
    };
    if let Some(stream) = carried {
        assert_eq!(stream, entry.stream, "stream changed: {cmd:?}");
        assert_eq!(re.stream, entry.stream, "stream not re-encoded: {cmd:?}");
    }
    let back = Command::decode(&re)
        .unwrap_or_else(|code| panic!("re-encoded {cmd:?} does not decode: {code:?}"));
    // NaN payloads in kernel arguments compare unequal: compare the encodings as well.
    assert_eq!(
        back.encode(entry.user_tag),
        re,
        "encoding of {cmd:?} is not stable"
    );
    if reflexive(&cmd) {
        assert_eq!(back, cmd, "command changed in a round trip");
    }

    match cmd {
        Command::Launch { kernel, .. } => check_operands(&kernel),
        Command::LaunchModule { launch, .. } => {
            assert!(launch.params_len <= MAX_LAUNCH_PARAMS, "{launch:?}");
            assert!(
                !launch.grid.contains(&0) && !launch.block.contains(&0),
                "{launch:?}"
            );
        }
        _ => {}
    }
}

/// [`Kernel::operands`] against sizes computed in `u128`: it must give exactly these, or refuse
/// with `InvalidArgument` when one does not fit in `u64`.
fn check_operands(kernel: &Kernel) {
    use Access::*;
    let f32s = |n: u64| n as u128 * 4;
    let prod = |a: u32, b: u32| a as u128 * b as u128;
    let c_access = |beta: f32| if beta == 0.0 { Write } else { ReadWrite };
    let expected: Vec<(u64, u128, Access)> = match *kernel {
        Kernel::FillF32 { dst, n, .. } => vec![(dst, f32s(n), Write)],
        Kernel::AxpyF32 { x, y, n, .. } => vec![(x, f32s(n), Read), (y, f32s(n), ReadWrite)],
        Kernel::VecAddF32 { a, b, c, n } => {
            vec![(a, f32s(n), Read), (b, f32s(n), Read), (c, f32s(n), Write)]
        }
        Kernel::ReduceSumF32 { x, out, n } => vec![(x, f32s(n), Read), (out, 4, Write)],
        Kernel::GemmF32 {
            a,
            b,
            c,
            m,
            n,
            k,
            beta,
            ..
        } => vec![
            (a, prod(m, k) * 4, Read),
            (b, prod(k, n) * 4, Read),
            (c, prod(m, n) * 4, c_access(beta)),
        ],
        Kernel::GemmBf16 {
            a,
            b,
            c,
            m,
            n,
            k,
            beta,
            ..
        } => vec![
            (a, prod(m, k) * 2, Read),
            (b, prod(k, n) * 2, Read),
            (c, prod(m, n) * 4, c_access(beta)),
        ],
        Kernel::Spin { .. } | Kernel::Fault { .. } => vec![],
    };
    let fits = expected
        .iter()
        .all(|&(_, bytes, _)| bytes <= u64::MAX as u128);
    match kernel.operands() {
        Ok(ops) => {
            assert!(
                fits,
                "{kernel:?}: operands {ops:?} although a size overflows u64"
            );
            let want: Vec<Operand> = expected
                .iter()
                .map(|&(ptr, bytes, access)| Operand {
                    ptr,
                    bytes: bytes as u64,
                    access,
                })
                .collect();
            assert_eq!(ops, want, "{kernel:?}: wrong operands");
        }
        Err(code) => {
            assert_eq!(code, ErrorCode::InvalidArgument, "{kernel:?}");
            assert!(
                !fits,
                "{kernel:?}: operands refused although every size fits"
            );
        }
    }
}

// ---------------------------------------------------------------------------------------------
// shm_layout

/// The first 32 bytes (zero-padded) as a region header whose geometry goes through
/// [`ShmLayout::validate`]; the rest as `(offset, len)` pairs of little-endian `u64` for
/// [`ShmLayout::arena_range`]. A layout that validates must be a region whose parts are
/// page-aligned, in order and disjoint, with power-of-two rings; every range `arena_range`
/// grants must lie inside the arena, and it must refuse every other.
pub fn shm_layout(data: &[u8]) {
    let header: RegionHeader = zerocopy::transmute!(padded::<32>(data));
    let layout = ShmLayout {
        sq_entries: header.sq_entries,
        cq_entries: header.cq_entries,
        arena_size: header.arena_size,
    };
    let valid = layout.validate().is_ok();
    if valid {
        check_geometry(&layout);
    }
    let arena = layout.arena_size;
    let rest = data.get(32..).unwrap_or_default();
    let fuzzed = rest.chunks_exact(16).map(|c| {
        let pair: [u64; 2] = zerocopy::transmute!(padded::<16>(c));
        (u64::from_le(pair[0]), u64::from_le(pair[1]))
    });
    let edges = [
        (0, 0),
        (0, arena),
        (arena, 0),
        (arena, 1),
        (1, arena),
        (arena.saturating_sub(1), 1),
        (u64::MAX, 1),
        (1, u64::MAX),
        (u64::MAX, u64::MAX),
    ];
    for (offset, len) in fuzzed.chain(edges) {
        let fits = offset as u128 + len as u128 <= arena as u128;
        match layout.arena_range(offset, len) {
            Some(r) => {
                assert!(fits, "{layout:?}: granted {offset}+{len} outside the arena");
                assert_eq!(
                    (r.start as u64, r.end as u64),
                    (offset, offset + len),
                    "{layout:?}: wrong range for {offset}+{len}"
                );
                if valid {
                    assert!(
                        layout.arena_offset() + r.end <= layout.total_size(),
                        "{layout:?}: {r:?} ends past the region"
                    );
                }
            }
            None => assert!(!fits, "{layout:?}: refused {offset}+{len} inside the arena"),
        }
    }
}

/// What the rings and the arena rely on in a layout that validated.
fn check_geometry(l: &ShmLayout) {
    for n in [l.sq_entries, l.cq_entries] {
        // The rings mask slot indices with `capacity - 1`.
        assert!(
            n >= 2 && n.is_power_of_two() && n <= MAX_RING_ENTRIES,
            "{l:?}"
        );
    }
    assert!(l.cq_entries >= l.sq_entries, "{l:?}");
    assert!(l.arena_size > 0 && l.arena_size <= MAX_ARENA_SIZE, "{l:?}");
    let sq_end =
        l.sq_offset() as u128 + l.sq_entries as u128 * size_of::<SubmissionEntry>() as u128;
    let cq_end =
        l.cq_offset() as u128 + l.cq_entries as u128 * size_of::<CompletionEntry>() as u128;
    let end = l.arena_offset() as u128 + l.arena_size as u128;
    // The header and the six index cache lines fit below the submission ring.
    assert!(size_of::<RegionHeader>() + 6 * 64 <= l.sq_offset(), "{l:?}");
    for offset in [l.sq_offset(), l.cq_offset(), l.arena_offset()] {
        assert_eq!(
            offset % PAGE,
            0,
            "{l:?}: part at {offset:#x} is not page-aligned"
        );
    }
    assert!(sq_end <= l.cq_offset() as u128, "{l:?}: rings overlap");
    assert!(
        cq_end <= l.arena_offset() as u128,
        "{l:?}: ring and arena overlap"
    );
    assert_eq!(l.total_size() as u128, end, "{l:?}: wrong total size");
    assert_eq!(l.total_size() % PAGE, 0, "{l:?}: region is not whole pages");
}

/// The first `N` bytes of `data`, zero-padded.
fn padded<const N: usize>(data: &[u8]) -> [u8; N] {
    let mut out = [0u8; N];
    let n = data.len().min(N);
    out[..n].copy_from_slice(&data[..n]);
    out
}
