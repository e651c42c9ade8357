//! Bodies of the fuzz targets in `client-lib/protocol/fuzz/`, and their seed corpus.
//!
//! Not part of the API: compiled only for this crate's tests and with the `fuzzing` feature
//! (which the fuzz crate turns on), never into production builds. Each body takes the fuzzer's
//! bytes and panics on any broken property, so that libFuzzer reports it; none hides a failure.
//! The fuzz crate calls these from its `fuzz_targets/*.rs` (nightly, `cargo fuzz`), and the unit
//! tests below replay the checked-in corpus (`fuzz/corpus/<target>/*`) through the same bodies
//! on stable `cargo test`.
//!
//! The seed corpus is generated from [`seeds`]:
//! `cargo test -p gpushare-protocol --lib fuzzing::tests::write_seed_corpus -- --ignored`.

use std::fmt::Debug;

use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::PriorityClass;
use crate::command::{Access, Command, Kernel, MAX_LAUNCH_PARAMS, ModuleLaunch, Operand};
use crate::control::{
    self, BrokerMessage, ClientMessage, DeviceInfo, Hello, LostState, ModuleFormat, Role, Welcome,
};
use crate::error::{ErrorCode, WireError};
use crate::ring::{
    CompletionEntry, MAX_ARENA_SIZE, MAX_RING_ENTRIES, PAGE, RegionHeader, ShmLayout,
    SubmissionEntry,
};
use crate::stats::{
    ClientStats, IoctlStats, OutsideLoad, ProcessActivity, ProcessKind, StatusReport,
    TelemetryStatus, UserStats,
};

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

// ---------------------------------------------------------------------------------------------
// The seed corpus

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

fn encoded<T: Serialize>(msg: &T) -> Vec<u8> {
    match control::encode(msg) {
        Ok(bytes) => bytes,
        Err(e) => panic!("a seed message does not encode: {e}"),
    }
}

fn device(index: u32) -> DeviceInfo {
    DeviceInfo {
        index,
        name: "NVIDIA H100 80GB HBM3".into(),
        total_memory: 80 << 30,
        sm_count: 132,
        compute_capability: (9, 0),
        fp32_flops: 6.7e13,
        memory_bandwidth: 3.35e12,
        host_bandwidth: 5.0e10,
        uuid: [7; 16],
        pci: (0, 6, 0),
        driver_version: 13000,
        attributes: vec![0, 1024, 1024, 1024, 64],
    }
}

fn welcome(layout: Option<ShmLayout>) -> Welcome {
    Welcome {
        protocol_version: crate::PROTOCOL_VERSION,
        broker_version: "0.1.0".into(),
        client_id: 7,
        layout,
        backend: "sim".into(),
        device: device(0),
        class: PriorityClass::Normal,
        weight: 100,
        memory_quota: Some(1 << 30),
    }
}

fn hello(role: Role, requested_class: Option<PriorityClass>, gpu: Option<u32>) -> Hello {
    Hello {
        protocol_version: crate::PROTOCOL_VERSION,
        role,
        client_name: "trainer".into(),
        requested_class,
        sq_entries: 256,
        arena_size: 1 << 20,
        gpu,
    }
}

fn status_report() -> StatusReport {
    StatusReport {
        broker_version: "0.1.0".into(),
        protocol_version: crate::PROTOCOL_VERSION,
        backend: "cuda".into(),
        device: device(0),
        devices: vec![device(0), device(1)],
        uptime_ms: 12_345,
        policy: "orion".into(),
        memory_used: 3 << 20,
        clients: vec![ClientStats {
            client_id: 1,
            pid: 4242,
            uid: 1000,
            user: "alice".into(),
            name: "trainer".into(),
            gpu: 0,
            class: PriorityClass::High,
            weight: 100,
            memory_used: 3 << 20,
            memory_peak: 4 << 20,
            memory_quota: None,
            allocations: 3,
            streams: 2,
            commands: 1000,
            kernels: 400,
            bytes_htod: 1 << 20,
            bytes_dtoh: 1 << 19,
            bytes_dtod: 0,
            gpu_time_ns: 9_000_000,
            errors: 1,
            connected_ms: 5000,
            bypassing: true,
            queue_depth: 4,
            latency_p50_ns: Some(300),
            latency_p99_ns: None,
            governed: true,
            throttled_ns: 1_500_000,
            consolidated: false,
            trust_domain: "default".into(),
        }],
        telemetry: TelemetryStatus {
            enabled: false,
            reason: Some("not root".into()),
            dev_prefix: "/dev/nvidia".into(),
            uprobes: false,
        },
        processes: vec![ProcessActivity {
            pid: 99,
            comm: "python3".into(),
            uid: 0,
            first_seen_ns: 1,
            last_seen_ns: 2,
            ioctls: vec![IoctlStats {
                cmd: 0xc020_462a,
                name: "RM_CONTROL".into(),
                count: 10,
                errors: 0,
                total_ns: 500,
                arg_bytes: 320,
            }],
            launches: 5,
            allocs: 1,
            frees: 0,
            ctx_creates: 1,
            gpu_fds: 3,
            kind: ProcessKind::Both,
            client_id: Some(1),
        }],
        outside_load: OutsideLoad {
            processes: 1,
            ioctls_per_s: 10.5,
            launches_per_s: 2.0,
        },
        users: vec![UserStats {
            uid: 1000,
            user: "alice".into(),
            sessions: 1,
            memory_used: 3 << 20,
            memory_quota: Some(8 << 30),
            pinned_bytes: 17 << 20,
            max_sessions: 64,
            max_pinned_bytes: Some(2 << 30),
        }],
    }
}

fn client_variant(m: &ClientMessage) -> &'static str {
    // Exhaustive on purpose: a new variant must get a seed here.
    match m {
        ClientMessage::Hello(_) => "hello",
        ClientMessage::LoadModule { .. } => "load_module",
        ClientMessage::GetFunction { .. } => "get_function",
        ClientMessage::UnloadModule { .. } => "unload_module",
        ClientMessage::Status { .. } => "status",
        ClientMessage::Goodbye => "goodbye",
        ClientMessage::AdminSet { .. } => "admin_set",
        ClientMessage::AdminEvict { .. } => "admin_evict",
        ClientMessage::LoadCachedModule { .. } => "load_cached_module",
        ClientMessage::GetFunctionInfo { .. } => "get_function_info",
        ClientMessage::GetGlobal { .. } => "get_global",
        ClientMessage::ShareHostMemory { .. } => "share_host_memory",
        ClientMessage::UnshareHostMemory { .. } => "unshare_host_memory",
        ClientMessage::Ping { .. } => "ping",
    }
}

fn broker_variant(m: &BrokerMessage) -> &'static str {
    // Exhaustive on purpose: a new variant must get a seed here.
    match m {
        BrokerMessage::Welcome(_) => "welcome",
        BrokerMessage::Rejected(_) => "rejected",
        BrokerMessage::ModuleLoaded { .. } => "module_loaded",
        BrokerMessage::Function { .. } => "function",
        BrokerMessage::ModuleUnloaded { .. } => "module_unloaded",
        BrokerMessage::Status { .. } => "status",
        BrokerMessage::RequestFailed { .. } => "request_failed",
        BrokerMessage::ShuttingDown { .. } => "shutting_down",
        BrokerMessage::Evicted { .. } => "evicted",
        BrokerMessage::AdminDone { .. } => "admin_done",
        BrokerMessage::DeviceReset { .. } => "device_reset",
        BrokerMessage::FunctionInfo { .. } => "function_info",
        BrokerMessage::Global { .. } => "global",
        BrokerMessage::HostShared { .. } => "host_shared",
        BrokerMessage::HostUnshared { .. } => "host_unshared",
        BrokerMessage::Pong { .. } => "pong",
    }
}

/// One of each client message variant (several for those with options).
pub fn client_messages() -> Vec<ClientMessage> {
    let mut out = vec![
        ClientMessage::Hello(hello(
            Role::Client,
            Some(PriorityClass::BestEffort),
            Some(1),
        )),
        ClientMessage::Hello(hello(Role::Monitor, None, None)),
        ClientMessage::Hello(hello(Role::Governed, Some(PriorityClass::High), None)),
        ClientMessage::Hello(hello(Role::Consolidated, None, Some(0))),
    ];
    for format in [ModuleFormat::Ptx, ModuleFormat::Cubin, ModuleFormat::Fatbin] {
        out.push(ClientMessage::LoadModule {
            request: 1,
            format,
            image_len: 4096,
        });
    }
    out.extend([
        ClientMessage::GetFunction {
            request: 2,
            module: 1,
            name: "vector_add".into(),
        },
        ClientMessage::UnloadModule {
            request: 3,
            module: 1,
        },
        ClientMessage::Status { request: u64::MAX },
        ClientMessage::Goodbye,
        ClientMessage::AdminSet {
            request: 4,
            client: 2,
            class: None,
            weight: None,
            memory_quota: None,
        },
        ClientMessage::AdminSet {
            request: 5,
            client: 2,
            class: Some(PriorityClass::High),
            weight: Some(300),
            memory_quota: Some(None),
        },
        ClientMessage::AdminSet {
            request: 6,
            client: 2,
            class: Some(PriorityClass::Normal),
            weight: None,
            memory_quota: Some(Some(1 << 30)),
        },
        ClientMessage::AdminEvict {
            request: 7,
            client: 2,
            reason: "over budget".into(),
        },
        ClientMessage::LoadCachedModule {
            request: 8,
            format: ModuleFormat::Fatbin,
            hash: [0x5a; 32],
        },
        ClientMessage::GetFunctionInfo {
            request: 9,
            module: 1,
            name: "_Z6kernelPf".into(),
        },
        ClientMessage::GetGlobal {
            request: 10,
            module: 1,
            name: "counter".into(),
        },
        ClientMessage::ShareHostMemory {
            request: 11,
            bytes: 2 << 20,
            at: 0x7f12_3400_0000,
        },
        ClientMessage::UnshareHostMemory {
            request: 12,
            region: 3,
        },
        ClientMessage::Ping { request: 13 },
    ]);
    out
}

/// One of each broker message variant (several for those with options).
pub fn broker_messages() -> Vec<BrokerMessage> {
    let err = |code| WireError::new(code, "no");
    let layout = ShmLayout {
        sq_entries: 256,
        cq_entries: 512,
        arena_size: 1 << 20,
    };
    vec![
        BrokerMessage::Welcome(Box::new(welcome(Some(layout)))),
        BrokerMessage::Welcome(Box::new(welcome(None))),
        BrokerMessage::Rejected(err(ErrorCode::VersionMismatch)),
        BrokerMessage::ModuleLoaded {
            request: 1,
            result: Ok(11),
        },
        BrokerMessage::ModuleLoaded {
            request: 1,
            result: Err(err(ErrorCode::NotSupported)),
        },
        BrokerMessage::Function {
            request: 2,
            result: Ok(12),
        },
        BrokerMessage::Function {
            request: 2,
            result: Err(err(ErrorCode::InvalidHandle)),
        },
        BrokerMessage::ModuleUnloaded {
            request: 3,
            result: Ok(()),
        },
        BrokerMessage::ModuleUnloaded {
            request: 3,
            result: Err(err(ErrorCode::InvalidHandle)),
        },
        BrokerMessage::Status {
            request: 4,
            report: Box::new(status_report()),
        },
        BrokerMessage::RequestFailed {
            request: 5,
            error: err(ErrorCode::ProtocolViolation),
        },
        BrokerMessage::ShuttingDown {
            kind: crate::control::ShutdownKind::Stopping,
            reason: "SIGTERM".into(),
        },
        BrokerMessage::ShuttingDown {
            kind: crate::control::ShutdownKind::Restarting,
            reason: "GPU 0 faulted".into(),
        },
        BrokerMessage::Evicted {
            reason: "by root".into(),
        },
        BrokerMessage::AdminDone {
            request: 6,
            result: Ok(()),
        },
        BrokerMessage::AdminDone {
            request: 6,
            result: Err(err(ErrorCode::PermissionDenied)),
        },
        BrokerMessage::DeviceReset {
            gpu: 0,
            reason: "illegal address in client 3".into(),
            lost: LostState {
                buffers: vec![(0x7f00_0000_0000, 4096), (0x7f00_0001_0000, 1 << 20)],
                streams: vec![1, 2],
                events: vec![5],
                modules: vec![9],
            },
        },
        BrokerMessage::DeviceReset {
            gpu: 1,
            reason: String::new(),
            lost: LostState::default(),
        },
        BrokerMessage::FunctionInfo {
            request: 7,
            result: Ok(crate::control::FunctionDetails {
                id: 12,
                params: vec![(0, 8), (8, 4), (16, 16)],
                attributes: vec![1024, 0, 0, 0, 32, 90, 90],
            }),
        },
        BrokerMessage::FunctionInfo {
            request: 7,
            result: Err(err(ErrorCode::NotFound)),
        },
        BrokerMessage::Global {
            request: 8,
            result: Ok((0x7f00_0000_2000, 64)),
        },
        BrokerMessage::Global {
            request: 8,
            result: Err(err(ErrorCode::NotFound)),
        },
        BrokerMessage::HostShared {
            request: 9,
            result: Ok(crate::control::HostRegionGrant {
                region: 1,
                device_ptr: 0x7f12_3400_0000,
            }),
        },
        BrokerMessage::HostShared {
            request: 9,
            result: Err(err(ErrorCode::PermissionDenied)),
        },
        BrokerMessage::HostUnshared {
            request: 10,
            result: Ok(()),
        },
        BrokerMessage::Pong { request: 11 },
    ]
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

fn command_variant(c: &Command) -> &'static str {
    // Exhaustive on purpose: a new command must get a seed here.
    match c {
        Command::Nop => "nop",
        Command::Alloc { .. } => "alloc",
        Command::AllocAt { .. } => "alloc_at",
        Command::Free { .. } => "free",
        Command::CopyHtoD { .. } => "copy_htod",
        Command::CopyDtoH { .. } => "copy_dtoh",
        Command::CopyDtoD { .. } => "copy_dtod",
        Command::Memset { .. } => "memset",
        Command::StreamCreate => "stream_create",
        Command::StreamDestroy { .. } => "stream_destroy",
        Command::StreamSync { .. } => "stream_sync",
        Command::EventCreate => "event_create",
        Command::EventRecord { .. } => "event_record",
        Command::EventQuery { .. } => "event_query",
        Command::EventSync { .. } => "event_sync",
        Command::EventElapsed { .. } => "event_elapsed",
        Command::EventDestroy { .. } => "event_destroy",
        Command::ClientSync => "client_sync",
        Command::IterationEnd => "iteration_end",
        Command::DeclareJob { .. } => "declare_job",
        Command::DeclareDeadline { .. } => "declare_deadline",
        // Named by `Kernel::name`, which is exhaustive like this match.
        Command::Launch { kernel, .. } => kernel.name(),
        Command::LaunchModule { .. } => "launch_module",
        Command::GovernedReserve { .. } => "governed_reserve",
        Command::GovernedRelease { .. } => "governed_release",
        Command::GovernedTokens { .. } => "governed_tokens",
        Command::GovernedIdle { .. } => "governed_idle",
        Command::GovernedWeight { .. } => "governed_weight",
        Command::GovernedHeld { .. } => "governed_held",
        Command::StreamCreateAs { .. } => "stream_create_as",
        Command::EventCreateAs { .. } => "event_create_as",
        Command::StreamWaitEvent { .. } => "stream_wait_event",
        Command::StreamQuery { .. } => "stream_query",
        Command::MemsetWide { .. } => "memset_wide",
        Command::CopyHtoDStaged { .. } => "copy_htod_staged",
        Command::CopyDtoHStaged { .. } => "copy_dtoh_staged",
        Command::CopyHtoDHost { .. } => "copy_htod_host",
        Command::CopyDtoHHost { .. } => "copy_dtoh_host",
        Command::MemInfo => "mem_info",
        Command::LaunchEx { .. } => "launch_ex",
        Command::FunctionSetAttribute { .. } => "function_set_attribute",
        Command::Occupancy { .. } => "occupancy",
    }
}

/// One of each command and built-in kernel.
pub fn commands() -> Vec<Command> {
    let launch = |stream, kernel| Command::Launch { stream, kernel };
    vec![
        Command::Nop,
        Command::Alloc { bytes: 1 << 40 },
        Command::AllocAt {
            bytes: 4096,
            ptr: 0x7000_0000_0100,
        },
        Command::Free { ptr: 0xdead_beef },
        Command::CopyHtoD {
            stream: 3,
            arena_offset: 4096,
            dst: 77,
            len: 5,
        },
        Command::CopyDtoH {
            stream: 1,
            src: 9,
            arena_offset: 8,
            len: 7,
        },
        Command::CopyDtoD {
            stream: 2,
            src: 1,
            dst: 2,
            len: 3,
        },
        Command::Memset {
            stream: 0,
            dst: 5,
            value: 0xab,
            len: 9,
        },
        Command::StreamCreate,
        Command::StreamDestroy { stream: 4 },
        Command::StreamSync { stream: 4 },
        Command::EventCreate,
        Command::EventRecord {
            stream: 1,
            event: 2,
        },
        Command::EventQuery { event: 2 },
        Command::EventSync { event: 2 },
        Command::EventElapsed { start: 1, end: 2 },
        Command::EventDestroy { event: 2 },
        Command::ClientSync,
        Command::IterationEnd,
        Command::DeclareJob {
            remaining_ns: 30_000_000_000,
            persistent_bytes: 1 << 30,
            ephemeral_bytes: 1 << 28,
        },
        Command::DeclareDeadline {
            period_ns: 33_000_000,
            deadline_ns: 20_000_000,
        },
        launch(
            1,
            Kernel::FillF32 {
                dst: 1,
                n: 2,
                value: 1.5,
            },
        ),
        launch(
            1,
            Kernel::AxpyF32 {
                x: 1,
                y: 2,
                n: 3,
                alpha: -2.0,
            },
        ),
        launch(
            1,
            Kernel::VecAddF32 {
                a: 1,
                b: 2,
                c: 3,
                n: 4,
            },
        ),
        launch(1, Kernel::ReduceSumF32 { x: 1, out: 2, n: 3 }),
        launch(
            1,
            Kernel::GemmF32 {
                a: 1,
                b: 2,
                c: 3,
                m: 4,
                n: 5,
                k: 6,
                alpha: 1.0,
                beta: 0.5,
            },
        ),
        launch(
            9,
            Kernel::Spin {
                micros: 100,
                blocks: 132,
            },
        ),
        launch(
            3,
            Kernel::GemmBf16 {
                a: 1,
                b: 2,
                c: 3,
                m: 7,
                n: 8,
                k: 9,
                alpha: 2.0,
                beta: 0.0,
            },
        ),
        launch(0, Kernel::Fault { hang: true }),
        Command::LaunchModule {
            stream: 2,
            launch: ModuleLaunch {
                function: 7,
                grid: [1, 2, 3],
                block: [32, 4, 1],
                shared_mem_bytes: 1024,
                params_offset: 64,
                params_len: 24,
            },
        },
        Command::GovernedReserve { bytes: 3 << 30 },
        Command::GovernedRelease { bytes: 1 << 20 },
        Command::GovernedTokens {
            launched: 64,
            blocks: 8192,
        },
        Command::GovernedIdle {
            launched: 3,
            blocks: 96,
        },
        Command::GovernedWeight { weight: 2 },
        Command::GovernedHeld { bytes: 1 << 20 },
        Command::StreamCreateAs {
            stream: 1 << 20,
            flags: 1,
            priority: -1,
        },
        Command::EventCreateAs {
            event: 1 << 20,
            flags: 2,
        },
        Command::StreamWaitEvent {
            stream: 3,
            event: 4,
        },
        Command::StreamQuery { stream: 3 },
        Command::MemsetWide {
            stream: 0,
            dst: 0x7000_0000_0000,
            value: 0x3f80_0000,
            elem_bytes: 4,
            count: 1 << 20,
        },
        Command::CopyHtoDStaged {
            stream: 1,
            arena_offset: 8192,
            dst: 0x7000_0000_0000,
            len: 4096,
        },
        Command::CopyDtoHStaged {
            stream: 1,
            src: 0x7000_0000_0000,
            arena_offset: 0,
            len: 64,
        },
        Command::CopyHtoDHost {
            stream: 2,
            region: 1,
            offset: 4096,
            dst: 0x7000_0000_1000,
            len: 1 << 20,
        },
        Command::CopyDtoHHost {
            stream: 2,
            src: 0x7000_0000_1000,
            region: 1,
            offset: 0,
            len: 8,
        },
        Command::MemInfo,
        Command::LaunchEx {
            stream: 5,
            launch: ModuleLaunch {
                function: 9,
                grid: [132, 1, 1],
                block: [384, 1, 1],
                shared_mem_bytes: 200 * 1024,
                params_offset: 128,
                params_len: crate::command::LAUNCH_ATTRIBUTES_BYTES + 40,
            },
        },
        Command::FunctionSetAttribute {
            function: 9,
            attribute: 8,
            value: 200 * 1024,
        },
        Command::Occupancy {
            function: 9,
            query: crate::command::OccupancyQuery::MaxActiveClusters,
            block_size: 384,
            dynamic_smem: 0,
            flags: 0,
            cluster: [2, 1, 1],
        },
    ]
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    fn corpus_dir(target: &str) -> PathBuf {
        PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("fuzz/corpus")
            .join(target)
    }

    /// Every checked-in corpus file goes through its target's body, as the fuzzer would.
    #[test]
    fn checked_in_corpus_replays() {
        for (target, body) in TARGETS {
            let dir = corpus_dir(target);
            let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
                .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
                .map(|entry| entry.expect("corpus entry").path())
                .collect();
            files.sort();
            assert!(!files.is_empty(), "{}: empty corpus", dir.display());
            let failed: Vec<String> = files
                .iter()
                .filter(|path| {
                    let bytes = std::fs::read(path).expect("read corpus file");
                    std::panic::catch_unwind(|| body(&bytes)).is_err()
                })
                .map(|path| path.display().to_string())
                .collect();
            assert!(failed.is_empty(), "{target}: failing inputs {failed:#?}");
        }
    }

    /// The checked-in corpus holds every seed [`seeds`] makes, byte for byte.
    #[test]
    fn seed_corpus_is_checked_in() {
        let mut stale = Vec::new();
        for (target, name, bytes) in seeds() {
            let path = corpus_dir(target).join(&name);
            if std::fs::read(&path).ok().as_deref() != Some(&bytes[..]) {
                stale.push(path.display().to_string());
            }
        }
        assert!(
            stale.is_empty(),
            "seed corpus out of date; regenerate with `cargo test -p gpushare-protocol --lib \
             fuzzing::tests::write_seed_corpus -- --ignored`: {stale:#?}"
        );
    }

    /// Every seed is a valid message or command where it should be, so the fuzzer starts from
    /// deep inside the decoders.
    #[test]
    fn seeds_cover_every_variant() {
        for m in client_messages() {
            let bytes = encoded(&m);
            assert_eq!(
                control::decode::<ClientMessage>(&bytes).expect("decodes"),
                m
            );
        }
        for m in broker_messages() {
            let bytes = encoded(&m);
            assert_eq!(
                control::decode::<BrokerMessage>(&bytes).expect("decodes"),
                m
            );
        }
        let mut names: Vec<&str> = commands().iter().map(command_variant).collect();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), 49, "one seed per command and kernel");
        for c in commands() {
            assert_eq!(Command::decode(&c.encode(1)), Ok(c));
        }
        let mut names: Vec<&str> = client_messages().iter().map(client_variant).collect();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), 14, "every client message");
        let mut names: Vec<&str> = broker_messages().iter().map(broker_variant).collect();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), 16, "every broker message");
        let total = seeds().len();
        assert!(total < 200, "{total} seeds: keep the corpus small");
    }

    /// Writes [`seeds`] into `fuzz/corpus/` (run by hand after changing them).
    #[test]
    #[ignore = "writes the seed corpus; run by hand"]
    fn write_seed_corpus() {
        for (target, name, bytes) in seeds() {
            let dir = corpus_dir(target);
            std::fs::create_dir_all(&dir).expect("create corpus dir");
            std::fs::write(dir.join(name), bytes).expect("write seed");
        }
    }
}
