//! `raw-attack`: a raw client that aims ring entries at device memory another user owns.

use std::io::Write;

use gpushare::{Command, Kernel};
use gpushare_protocol::ring::SubmissionEntry;
use gpushare_tests::raw::RawClient;

/// Aims every kind of operand at `victim` (BYTES long), which another user owns.
pub(crate) fn raw_attack(victim: u64, bytes: u64) {
    let raw = RawClient::connect(&gpushare_protocol::socket_path_from_env());
    let own = raw.submit_all(&[Command::Alloc { bytes }.encode(1)]);
    let mine = match own.first() {
        Some(c) if c.status == 0 => c.result,
        other => {
            println!("own-alloc failed {other:?}");
            return;
        }
    };
    let n = bytes / 4;
    let kernel = |kernel| Command::Launch { stream: 0, kernel };
    let attacks: Vec<(&str, Command)> = vec![
        (
            "own-memset",
            Command::Memset {
                stream: 0,
                dst: mine,
                value: 0,
                len: bytes,
            },
        ),
        (
            "own-fill",
            kernel(Kernel::FillF32 {
                dst: mine,
                n,
                value: 3.0,
            }),
        ),
        (
            "copy-dtoh-from-victim",
            Command::CopyDtoH {
                stream: 0,
                src: victim,
                arena_offset: 0,
                len: bytes,
            },
        ),
        (
            "copy-dtod-from-victim",
            Command::CopyDtoD {
                stream: 0,
                src: victim,
                dst: mine,
                len: bytes,
            },
        ),
        (
            "copy-dtod-to-victim",
            Command::CopyDtoD {
                stream: 0,
                src: mine,
                dst: victim,
                len: bytes,
            },
        ),
        (
            "copy-htod-to-victim",
            Command::CopyHtoD {
                stream: 0,
                arena_offset: 0,
                dst: victim,
                len: bytes,
            },
        ),
        (
            "memset-victim",
            Command::Memset {
                stream: 0,
                dst: victim,
                value: 0,
                len: bytes,
            },
        ),
        (
            "memset-victim-interior",
            Command::Memset {
                stream: 0,
                dst: victim + 4,
                value: 0,
                len: 4,
            },
        ),
        (
            "memset-own-past-its-end",
            Command::Memset {
                stream: 0,
                dst: mine,
                value: 0,
                len: bytes + 4096,
            },
        ),
        (
            "fill-victim",
            kernel(Kernel::FillF32 {
                dst: victim,
                n,
                value: -1.0,
            }),
        ),
        (
            "axpy-reads-victim",
            kernel(Kernel::AxpyF32 {
                x: victim,
                y: mine,
                n,
                alpha: 1.0,
            }),
        ),
        (
            "axpy-writes-victim",
            kernel(Kernel::AxpyF32 {
                x: mine,
                y: victim,
                n,
                alpha: 1.0,
            }),
        ),
        (
            "vec-add-reads-victim",
            kernel(Kernel::VecAddF32 {
                a: victim,
                b: mine,
                c: mine,
                n,
            }),
        ),
        (
            "reduce-reads-victim",
            kernel(Kernel::ReduceSumF32 {
                x: victim,
                out: mine,
                n,
            }),
        ),
        (
            "gemm-reads-victim",
            kernel(Kernel::GemmF32 {
                a: victim,
                b: mine,
                c: mine,
                m: 1,
                n: 1,
                k: 1,
                alpha: 1.0,
                beta: 0.0,
            }),
        ),
        ("free-victim", Command::Free { ptr: victim }),
        ("sync", Command::ClientSync),
    ];
    // A sentinel in the arena: what a leaking copy of the victim's memory would overwrite.
    let sentinel = vec![0xa5u8; bytes as usize];
    raw.scribble(raw.layout.arena_offset(), &sentinel);
    let entries: Vec<SubmissionEntry> = attacks
        .iter()
        .enumerate()
        .map(|(i, (_, c))| c.encode(100 + i as u64))
        .collect();
    let done = raw.submit_all(&entries);
    for (i, (name, _)) in attacks.iter().enumerate() {
        match done.iter().find(|c| c.user_tag == 100 + i as u64) {
            Some(c) => println!("{name} {}", c.status),
            None => println!("{name} missing"),
        }
    }
    println!("arena-clean {}", read_arena(&raw, bytes) == sentinel);
    // The same path works on this client's own memory (filled with 3.0 above).
    let own = raw.submit_all(&[
        Command::CopyDtoH {
            stream: 0,
            src: mine,
            arena_offset: 0,
            len: bytes,
        }
        .encode(1000),
        Command::ClientSync.encode(1001),
    ]);
    let own_ok = own.iter().all(|c| c.status == 0)
        && read_arena(&raw, bytes)
            .chunks(4)
            .all(|c| c == 3.0f32.to_ne_bytes());
    println!("own-readback {own_ok}");
    let _ = std::io::stdout().flush();
}

/// The first `bytes` of the raw client's arena (all zeros past the arena's end).
fn read_arena(raw: &RawClient, bytes: u64) -> Vec<u8> {
    let mut arena = vec![0u8; bytes as usize];
    if bytes <= raw.layout.arena_size {
        // SAFETY: the first `bytes` of the arena lie inside the mapping (checked just above).
        // The broker may be writing them only while a copy is in flight; callers read after a
        // synchronization.
        unsafe {
            std::ptr::copy_nonoverlapping(
                raw.map.as_ptr().add(raw.layout.arena_offset()),
                arena.as_mut_ptr(),
                arena.len(),
            )
        };
    }
    arena
}
