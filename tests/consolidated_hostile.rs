//! Bad commands and requests in the consolidated role (what a client-side CUDA driver
//! speaks) never hurt gpushared: they fail with errors, and other clients are served
//! correctly throughout. Host memory: `consolidated_host_memory.rs`.

use std::time::Duration;

use gpushare::ErrorCode;
use gpushare_protocol::command::{ModuleLaunch, OccupancyQuery, opcode};
use gpushare_protocol::control::{BrokerMessage, ClientMessage, ModuleFormat};
use gpushare_protocol::ring::SubmissionEntry;
use gpushare_protocol::{Command, Kernel};
use gpushare_tests::hostile::{
    Bystander, assert_fails, consolidated, raw_status, sim_broker, status_of, submit_noise,
};
use gpushare_tests::wait_until;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const SECOND: Duration = Duration::from_secs(1);

fn launch(function: u64, params_len: u32, params_offset: u64) -> ModuleLaunch {
    ModuleLaunch {
        function,
        grid: [1; 3],
        block: [1; 3],
        shared_mem_bytes: 0,
        params_offset,
        params_len,
    }
}

#[test]
fn hostile_commands_fail_with_errors_and_others_are_served() {
    let broker = sim_broker();
    let bystander = Bystander::new(&broker);
    let raw = consolidated(&broker);
    let len = 65536;
    let c = raw
        .submit_one(Command::Alloc { bytes: len })
        .expect("alloc");
    assert_eq!(c.status, 0);
    let buf = c.result;
    let arena = raw.layout.arena_size;
    use ErrorCode::*;
    let create_as = |stream| Command::StreamCreateAs {
        stream,
        flags: 0,
        priority: 0,
    };
    let wait = |stream, event| Command::StreamWaitEvent { stream, event };
    let record = |stream, event| Command::EventRecord { stream, event };
    let memset = |stream, dst, elem_bytes, count| Command::MemsetWide {
        stream,
        dst,
        value: 1,
        elem_bytes,
        count,
    };
    let htod = |arena_offset, dst, len| Command::CopyHtoDStaged {
        stream: 0,
        arena_offset,
        dst,
        len,
    };
    let dtoh = |src, arena_offset, len| Command::CopyDtoHStaged {
        stream: 0,
        src,
        arena_offset,
        len,
    };
    let htod_host = |region, offset, len| Command::CopyHtoDHost {
        stream: 0,
        region,
        offset,
        dst: buf,
        len,
    };
    let dtoh_host = |region, offset, len| Command::CopyDtoHHost {
        stream: 0,
        src: buf,
        region,
        offset,
        len,
    };
    let launch_ex = |function, params_len, params_offset| Command::LaunchEx {
        stream: 0,
        launch: launch(function, params_len, params_offset),
    };
    let occupancy = |query| Command::Occupancy {
        function: 77,
        query,
        block_size: 1024,
        dynamic_smem: u64::MAX,
        flags: u32::MAX,
        cluster: [u32::MAX; 3],
    };
    assert_eq!(status_of(&raw, create_as(1)), 0);
    assert_eq!(
        status_of(&raw, Command::EventCreateAs { event: 1, flags: 0 }),
        0
    );
    let cases = [
        // Handles it never made, or already has.
        (create_as(0), InvalidHandle),
        (create_as(1), InvalidHandle),
        (Command::EventCreateAs { event: 1, flags: 0 }, InvalidHandle),
        (wait(1, 999), InvalidHandle),
        (wait(999, 1), InvalidHandle),
        (Command::StreamQuery { stream: 999 }, InvalidHandle),
        (record(999, 1), InvalidHandle),
        (record(0, 999), InvalidHandle),
        (Command::EventElapsed { start: 1, end: 999 }, InvalidHandle),
        (Command::StreamDestroy { stream: 0 }, InvalidHandle),
        (Command::StreamDestroy { stream: 999 }, InvalidHandle),
        (Command::StreamSync { stream: 999 }, InvalidHandle),
        (Command::EventDestroy { event: 999 }, InvalidHandle),
        // Sizes past anything.
        (Command::Alloc { bytes: u64::MAX }, OutOfMemory),
        (memset(0, buf, 4, u64::MAX), InvalidArgument),
        (memset(0, buf, 2, 1 << 62), InvalidPointer),
        (memset(0, buf + len - 4, 4, 2), InvalidPointer),
        (memset(999, buf, 4, 2), InvalidHandle),
        // Staged copies outside the arena or the allocation.
        (htod(arena - 8, buf, 64), ArenaOutOfBounds),
        (htod(u64::MAX - 3, buf, 8), ArenaOutOfBounds),
        (htod(0, buf, 1 << 40), InvalidPointer),
        (dtoh(buf, arena, 1), ArenaOutOfBounds),
        (dtoh(buf + len, 0, 1), InvalidPointer),
        // Host regions it never shared.
        (htod_host(999, 0, 64), InvalidHandle),
        (dtoh_host(999, 0, 64), InvalidHandle),
        // Functions it never looked up; LaunchEx's attribute header is garbage.
        (launch_ex(12345, 32 + 16, 0), InvalidHandle),
        (launch_ex(12345, 32, arena * 4), InvalidHandle),
        (
            Command::LaunchModule {
                stream: 0,
                launch: launch(0, 0, 0),
            },
            InvalidHandle,
        ),
        (
            Command::FunctionSetAttribute {
                function: 77,
                attribute: 8,
                value: 1 << 20,
            },
            InvalidHandle,
        ),
        (occupancy(OccupancyQuery::BlocksPerSm), InvalidHandle),
        // Memory that is not its own, or not an allocation's start.
        (Command::Free { ptr: buf + 1 }, InvalidPointer),
        (Command::Free { ptr: 0 }, InvalidPointer),
        (
            Command::Launch {
                stream: 0,
                kernel: Kernel::Fault { hang: true },
            },
            NotSupported,
        ),
    ];
    raw.write_arena(0, &[0xff; 64]);
    for (cmd, want) in cases {
        assert_fails(&raw, cmd, want);
    }
    // The event a failed wait named is still there.
    assert_eq!(status_of(&raw, record(1, 1)), 0);

    // Entries no client library encodes.
    let with = |cmd: Command, arg: usize, value: u64| {
        let mut e = cmd.encode(1);
        e.args[arg] = value;
        e
    };
    // Each: an argument word out of its range (3-byte elements, a value wider than 32 bits,
    // no such query, parameters shorter than the attribute header, an empty grid, flags
    // wider than 32 bits, a word that must be zero).
    for entry in [
        with(memset(0, buf, 4, 4), 2, 3),
        with(memset(0, buf, 4, 4), 1, 1 << 32),
        with(occupancy(OccupancyQuery::BlocksPerSm), 1, 9),
        with(launch_ex(1, 32, 0), 4, 16 << 32),
        with(launch_ex(1, 32, 0), 1, 0),
        with(Command::EventCreateAs { event: 5, flags: 0 }, 1, 1 << 40),
        with(create_as(5), 3, 1),
    ] {
        assert_eq!(
            raw_status(&raw, entry),
            InvalidArgument.as_u32(),
            "{entry:?}"
        );
    }

    // Noise on the consolidated opcodes: every entry answered, none hurts.
    let mut rng = StdRng::seed_from_u64(0x636f_6e73);
    let opcodes = [
        opcode::STREAM_CREATE_AS,
        opcode::EVENT_CREATE_AS,
        opcode::STREAM_WAIT_EVENT,
        opcode::STREAM_QUERY,
        opcode::MEMSET_WIDE,
        opcode::COPY_HTOD_STAGED,
        opcode::COPY_DTOH_STAGED,
        opcode::COPY_HTOD_HOST,
        opcode::COPY_DTOH_HOST,
        opcode::MEM_INFO,
        opcode::LAUNCH_EX,
        opcode::FUNCTION_SET_ATTRIBUTE,
        opcode::OCCUPANCY,
    ];
    let noise: Vec<SubmissionEntry> = (0..3000)
        .map(|i| {
            let mut e = SubmissionEntry {
                user_tag: i,
                opcode: opcodes[rng.random_range(0..opcodes.len())],
                stream: rng.random_range(0..4),
                ..Default::default()
            };
            for a in &mut e.args {
                *a = match rng.random_range(0..3) {
                    0 => buf + rng.random_range(0..2 * len),
                    1 => rng.random_range(0..8),
                    _ => rng.random(),
                };
            }
            e
        })
        .collect();
    submit_noise(&broker, &bystander, raw, &noise);
}

/// A stream it creates the ordinary way never takes the id of one it named itself (the
/// displaced stream would be lost to the session, and never destroyed).
#[test]
fn streams_and_events_made_both_ways_never_share_an_id() {
    let broker = sim_broker();
    let raw = consolidated(&broker);
    for stream in 1..=3 {
        let cmd = Command::StreamCreateAs {
            stream,
            flags: 0,
            priority: 0,
        };
        assert_eq!(status_of(&raw, cmd), 0);
    }
    for event in 1..=3 {
        assert_eq!(
            status_of(&raw, Command::EventCreateAs { event, flags: 0 }),
            0
        );
    }
    let stream = raw.submit_one(Command::StreamCreate).expect("completion");
    let event = raw.submit_one(Command::EventCreate).expect("completion");
    assert_eq!((stream.status, event.status), (0, 0));
    assert!(
        stream.result > 3,
        "a fresh stream id, not {}",
        stream.result
    );
    assert!(event.result > 3, "a fresh event id, not {}", event.result);
    // Every one of them is there to destroy, once.
    for stream in [1, 2, 3, stream.result as u32] {
        assert_eq!(status_of(&raw, Command::StreamDestroy { stream }), 0);
    }
    for event in [1, 2, 3, event.result as u32] {
        assert_eq!(status_of(&raw, Command::EventDestroy { event }), 0);
    }
    assert_eq!(broker.status().clients[0].streams, 1, "stream 0 left");
}

#[test]
fn hostile_module_requests_fail_with_errors() {
    let broker = sim_broker();
    let bystander = Bystander::new(&broker);
    let raw = consolidated(&broker);
    let mut rng = StdRng::seed_from_u64(7);
    let long = "k".repeat(60_000);
    for format in [ModuleFormat::Ptx, ModuleFormat::Cubin, ModuleFormat::Fatbin] {
        for hash in [[0u8; 32], rng.random()] {
            match raw.request(
                &ClientMessage::LoadCachedModule {
                    request: 3,
                    format,
                    hash,
                },
                &[],
            ) {
                Some(BrokerMessage::ModuleLoaded { result: Err(e), .. }) => {
                    assert_eq!(e.code, ErrorCode::NotFound)
                }
                other => panic!("LoadCachedModule of an unknown image answered {other:?}"),
            }
        }
    }
    for module in [0, 1, 999, u64::MAX] {
        for name in ["", "kernel", "a\0b", long.as_str()] {
            let info = raw.request(
                &ClientMessage::GetFunctionInfo {
                    request: 4,
                    module,
                    name: name.into(),
                },
                &[],
            );
            assert!(
                matches!(
                    info,
                    Some(BrokerMessage::FunctionInfo { result: Err(_), .. })
                ),
                "GetFunctionInfo({module}, {} bytes): {info:?}",
                name.len()
            );
            let global = raw.request(
                &ClientMessage::GetGlobal {
                    request: 5,
                    module,
                    name: name.into(),
                },
                &[],
            );
            assert!(
                matches!(global, Some(BrokerMessage::Global { result: Err(_), .. })),
                "GetGlobal({module}, {} bytes): {global:?}",
                name.len()
            );
        }
    }
    assert!(raw.status_ok(), "the hostile session is still answered");
    bystander.assert_unharmed(&broker);
}

/// The virtual memory API's and CUDA IPC's commands with bad arguments fail with errors,
/// noise on their opcodes hurts nobody, and what the session made goes with it.
#[test]
fn hostile_virtual_memory_and_ipc_commands_fail_with_errors() {
    let broker = sim_broker();
    let bystander = Bystander::new(&broker);
    let raw = consolidated(&broker);
    let g = raw.memory_granularity;
    assert!(g > 0, "the sim offers the virtual memory API");
    use ErrorCode::*;
    let at = raw
        .submit_one(Command::MemReserve {
            size: 4 * g,
            align: 0,
            hint: 0,
        })
        .expect("reserve");
    assert_eq!(at.status, 0);
    let at = at.result;
    let h = raw
        .submit_one(Command::MemCreate { size: g })
        .expect("create");
    assert_eq!(h.status, 0);
    let h = h.result;
    let map = |ptr, size, handle| Command::MemMap { ptr, size, handle };
    for (cmd, want) in [
        (
            Command::MemReserve {
                size: 0,
                align: 0,
                hint: 0,
            },
            InvalidArgument,
        ),
        (
            Command::MemReserve {
                size: g + 1,
                align: 0,
                hint: 0,
            },
            InvalidArgument,
        ),
        (
            Command::MemReserve {
                size: g,
                align: 3,
                hint: 0,
            },
            InvalidArgument,
        ),
        (
            Command::MemReserve {
                size: !(g - 1),
                align: 0,
                hint: 0,
            },
            OutOfMemory,
        ),
        (Command::MemCreate { size: 0 }, InvalidArgument),
        (Command::MemCreate { size: g + 1 }, InvalidArgument),
        (Command::MemCreate { size: 1 << 60 }, OutOfMemory),
        (Command::MemRelease { handle: 999 }, InvalidHandle),
        (map(at, g, 999), InvalidHandle),
        (map(at + 4 * g, g, h), InvalidArgument),
        (map(at + 1, g, h), InvalidArgument),
        (map(at, 2 * g, h), InvalidArgument),
        (map(u64::MAX - g + 1, g, h), InvalidArgument),
        (Command::MemUnmap { ptr: at, size: g }, InvalidArgument),
        (Command::MemUnreserve { ptr: at, size: g }, InvalidPointer),
        (
            Command::MemUnreserve {
                ptr: 0x1234,
                size: 4 * g,
            },
            InvalidPointer,
        ),
        (Command::IpcExportMemory { ptr: 0x1234 }, InvalidPointer),
        (
            Command::IpcOpenMemory {
                token_lo: 1,
                token_hi: 2,
            },
            InvalidArgument,
        ),
        (Command::IpcCloseMemory { ptr: at }, InvalidPointer),
        (Command::IpcExportEvent { event: 77 }, InvalidHandle),
        (
            Command::IpcOpenEvent {
                token_lo: 1,
                token_hi: 2,
                event: 5,
            },
            InvalidArgument,
        ),
        (
            Command::IpcOpenEvent {
                token_lo: 1,
                token_hi: 2,
                event: 0,
            },
            InvalidHandle,
        ),
    ] {
        assert_fails(&raw, cmd, want);
    }
    // Mapped, a copy may run over it, and not a byte past it.
    assert_eq!(status_of(&raw, map(at, g, h)), 0);
    let fill = |dst, len| Command::Memset {
        stream: 0,
        dst,
        value: 7,
        len,
    };
    assert_eq!(status_of(&raw, fill(at, g)), 0);
    assert_fails(&raw, fill(at, g + 1), InvalidPointer);
    assert_fails(
        &raw,
        Command::MemUnreserve {
            ptr: at,
            size: 4 * g,
        },
        InvalidArgument,
    );

    // Noise on their opcodes: every entry answered, none hurts.
    let mut rng = StdRng::seed_from_u64(0x766d_6d21);
    let opcodes = [
        opcode::MEM_RESERVE,
        opcode::MEM_UNRESERVE,
        opcode::MEM_CREATE,
        opcode::MEM_RELEASE,
        opcode::MEM_MAP,
        opcode::MEM_UNMAP,
        opcode::IPC_EXPORT_MEMORY,
        opcode::IPC_OPEN_MEMORY,
        opcode::IPC_CLOSE_MEMORY,
        opcode::IPC_EXPORT_EVENT,
        opcode::IPC_OPEN_EVENT,
    ];
    let noise: Vec<SubmissionEntry> = (0..3000)
        .map(|i| {
            let mut e = SubmissionEntry {
                user_tag: i,
                opcode: opcodes[rng.random_range(0..opcodes.len())],
                ..Default::default()
            };
            for a in &mut e.args[..3] {
                *a = match rng.random_range(0..4) {
                    0 => at + g * rng.random_range(0..6),
                    1 => g * rng.random_range(0..4),
                    2 => rng.random_range(0..8),
                    _ => rng.random(),
                };
            }
            e
        })
        .collect();
    submit_noise(&broker, &bystander, raw, &noise);
    assert!(
        wait_until(5 * SECOND, || broker.status().memory_used
            == broker
                .status()
                .clients
                .iter()
                .map(|c| c.memory_used)
                .sum::<u64>()),
        "what it made went with it"
    );
}
