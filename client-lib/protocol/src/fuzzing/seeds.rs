//! The seed corpus: valid encodings of the sample messages and commands, plus edge cases.

use serde::Serialize;

use crate::PriorityClass;
use crate::command::{Command, Kernel, MAX_LAUNCH_PARAMS};
use crate::control::{self, BrokerMessage, ClientMessage, Role};
use crate::ring::{MAX_ARENA_SIZE, MAX_RING_ENTRIES, PAGE, ShmLayout, SubmissionEntry};

use super::commands::{command_variant, commands};
use super::messages::{
    broker_messages, broker_variant, client_messages, client_variant, hello, welcome,
};

/// The seed corpus: `(target, file name, bytes)`, from valid encodings of every control
/// message and command variant plus edge cases. `fuzz/corpus/` holds these files, and may
/// hold more (regression inputs, named `regress-*`).
pub fn seeds() -> Vec<(&'static str, String, Vec<u8>)> {
    let mut out = Vec::new();
    for (name, bytes) in control_seeds() {
        out.push(("control_decode", name, bytes));
    }
    for (name, bytes) in ring_entry_seeds() {
        out.push(("ring_entry", name, bytes));
    }
    for (name, bytes) in shm_layout_seeds() {
        out.push(("shm_layout", name, bytes));
    }
    out
}

pub(super) fn encoded<T: Serialize>(msg: &T) -> Vec<u8> {
    match control::encode(msg) {
        Ok(bytes) => bytes,
        Err(e) => panic!("a seed message does not encode: {e}"),
    }
}

fn numbered<'a>(prefix: &str, names: impl Iterator<Item = &'a str>) -> Vec<String> {
    let mut seen = std::collections::HashMap::<&str, usize>::new();
    names
        .map(|name| {
            let n = seen.entry(name).or_default();
            *n += 1;
            format!("{prefix}-{name}-{n}")
        })
        .collect()
}

fn control_seeds() -> Vec<(String, Vec<u8>)> {
    let mut out = Vec::new();
    let clients = client_messages();
    let names = numbered("client", clients.iter().map(client_variant));
    out.extend(names.into_iter().zip(clients.iter().map(encoded)));
    let brokers = broker_messages();
    let names = numbered("broker", brokers.iter().map(broker_variant));
    out.extend(names.into_iter().zip(brokers.iter().map(encoded)));
    out.push((
        "hello".into(),
        encoded(&hello(Role::Client, Some(PriorityClass::High), Some(0))),
    ));
    out.push((
        "welcome".into(),
        encoded(&welcome(Some(ShmLayout {
            sq_entries: 2,
            cq_entries: 2,
            arena_size: PAGE as u64,
        }))),
    ));

    // Edge cases.
    out.push(("edge-empty".into(), vec![]));
    let mut trailing = encoded(&ClientMessage::Goodbye);
    trailing.push(0);
    out.push(("edge-trailing-byte".into(), trailing));
    // A GetFunction whose name claims to be 2^60 bytes long.
    let mut huge = encoded(&ClientMessage::GetFunction {
        request: 1,
        module: 2,
        name: String::new(),
    });
    huge.pop();
    huge.extend_from_slice(&[0xff, 0, 0, 0, 0, 0, 0, 0, 0x10]);
    out.push(("edge-huge-length".into(), huge));
    // A name that is not UTF-8.
    let mut bad_utf8 = encoded(&ClientMessage::GetFunction {
        request: 1,
        module: 2,
        name: "ab".into(),
    });
    let n = bad_utf8.len();
    bad_utf8[n - 2..].copy_from_slice(&[0xc3, 0x28]);
    out.push(("edge-bad-utf8".into(), bad_utf8));
    // A variant index past the last variant.
    out.push(("edge-unknown-variant".into(), vec![0xfb, 0xff, 0x00]));
    // A request number written as a long varint (not the shortest form).
    out.push((
        "edge-long-varint".into(),
        vec![4, 0xfd, 5, 0, 0, 0, 0, 0, 0, 0],
    ));
    // An option tag that is neither 0 nor 1 (a Welcome's `memory_quota`, its last field).
    let mut no_quota = welcome(None);
    no_quota.memory_quota = None;
    let mut bad_tag = encoded(&no_quota);
    let tag_at = bad_tag.len() - 1;
    bad_tag[tag_at] = 2;
    out.push(("edge-bad-option-tag".into(), bad_tag));
    // A Welcome whose device reports NaN rates.
    let mut nan = welcome(None);
    nan.device.fp32_flops = f64::NAN;
    nan.device.memory_bandwidth = f64::from_bits(0x7ff0_0000_0000_0001);
    out.push((
        "edge-nan".into(),
        encoded(&BrokerMessage::Welcome(Box::new(nan))),
    ));
    out
}

fn entry_bytes(e: SubmissionEntry) -> Vec<u8> {
    let bytes: [u8; 64] = zerocopy::transmute!(e);
    bytes.to_vec()
}

fn ring_entry_seeds() -> Vec<(String, Vec<u8>)> {
    let mut out: Vec<(String, Vec<u8>)> = commands()
        .iter()
        .enumerate()
        .map(|(i, c)| {
            let tag = 0x1000 + i as u64;
            (
                format!("cmd-{}", command_variant(c)),
                entry_bytes(c.encode(tag)),
            )
        })
        .collect();

    // Edge cases, each a valid entry with one thing wrong or extreme.
    let edit = |cmd: Command, f: &dyn Fn(&mut SubmissionEntry)| {
        let mut e = cmd.encode(u64::MAX);
        f(&mut e);
        entry_bytes(e)
    };
    let gemm = Command::Launch {
        stream: 1,
        kernel: Kernel::GemmF32 {
            a: 1,
            b: 2,
            c: 3,
            m: u32::MAX,
            n: u32::MAX,
            k: u32::MAX,
            alpha: 1.0,
            beta: 0.0,
        },
    };
    let fill = Command::Launch {
        stream: 1,
        kernel: Kernel::FillF32 {
            dst: 0,
            n: u64::MAX,
            value: f32::NAN,
        },
    };
    let module = commands()
        .into_iter()
        .find(|c| matches!(c, Command::LaunchModule { .. }))
        .unwrap_or(Command::Nop);
    let edges: Vec<(&str, Vec<u8>)> = vec![
        ("edge-zeroes", vec![0; 64]),
        ("edge-ones", vec![0xff; 64]),
        (
            "edge-short",
            vec![crate::command::opcode::ALLOC as u8, 0, 0, 0],
        ),
        ("edge-flags-set", edit(Command::Nop, &|e| e.flags = 1)),
        (
            "edge-unknown-opcode",
            edit(Command::Nop, &|e| e.opcode = 0x7fff),
        ),
        (
            "edge-memset-value-too-big",
            edit(
                Command::Memset {
                    stream: 0,
                    dst: 1,
                    value: 0,
                    len: 1,
                },
                &|e| e.args[1] = 256,
            ),
        ),
        (
            "edge-event-id-too-big",
            edit(Command::EventQuery { event: 0 }, &|e| e.args[0] = 1 << 32),
        ),
        ("edge-gemm-overflow", edit(gemm, &|_| {})),
        ("edge-gemm-k-too-big", edit(gemm, &|e| e.args[4] = 1 << 32)),
        ("edge-fill-overflow-nan", edit(fill, &|_| {})),
        ("edge-module-zero-grid", edit(module, &|e| e.args[1] = 0)),
        (
            "edge-module-params-too-long",
            edit(module, &|e| {
                e.args[4] = (MAX_LAUNCH_PARAMS as u64 + 1) << 32;
            }),
        ),
        (
            "edge-fault-hang-not-bool",
            edit(
                Command::Launch {
                    stream: 0,
                    kernel: Kernel::Fault { hang: false },
                },
                &|e| e.args[0] = 2,
            ),
        ),
        (
            "edge-nop-with-args",
            edit(Command::Nop, &|e| e.args = [u64::MAX; 6]),
        ),
    ];
    out.extend(edges.into_iter().map(|(n, b)| (n.to_string(), b)));
    out
}

fn layout_seed(sq: u32, cq: u32, arena: u64, ranges: &[(u64, u64)]) -> Vec<u8> {
    let l = ShmLayout {
        sq_entries: sq,
        cq_entries: cq,
        arena_size: arena,
    };
    let header: [u8; 32] = zerocopy::transmute!(l.header());
    let mut out = header.to_vec();
    for &(offset, len) in ranges {
        out.extend_from_slice(&offset.to_le_bytes());
        out.extend_from_slice(&len.to_le_bytes());
    }
    out
}

fn shm_layout_seeds() -> Vec<(String, Vec<u8>)> {
    let page = PAGE as u64;
    let max_ring = MAX_RING_ENTRIES;
    let seeds: Vec<(&str, Vec<u8>)> = vec![
        (
            "valid-smallest",
            layout_seed(2, 2, page, &[(0, page), (1, page)]),
        ),
        (
            "valid-default",
            layout_seed(256, 512, 1 << 20, &[(4096, 64), (0, 1 << 20), (1 << 20, 1)]),
        ),
        (
            "valid-largest",
            layout_seed(
                max_ring,
                max_ring,
                MAX_ARENA_SIZE,
                &[(MAX_ARENA_SIZE - 1, 1), (u64::MAX - 1, 2)],
            ),
        ),
        ("bad-ring-not-power-of-two", layout_seed(3, 4, page, &[])),
        (
            "bad-ring-too-big",
            layout_seed(max_ring * 2, max_ring * 2, page, &[]),
        ),
        ("bad-ring-zero", layout_seed(0, 0, page, &[])),
        ("bad-cq-smaller", layout_seed(512, 256, page, &[])),
        ("bad-arena-unaligned", layout_seed(8, 8, page + 1, &[])),
        (
            "bad-arena-too-big",
            layout_seed(8, 8, MAX_ARENA_SIZE + page, &[]),
        ),
        ("bad-arena-zero", layout_seed(8, 8, 0, &[(0, 0)])),
        ("edge-empty", vec![]),
    ];
    seeds.into_iter().map(|(n, b)| (n.to_string(), b)).collect()
}
