//! Sample control messages: one of each client and broker message variant.

use crate::PriorityClass;
use crate::control::{
    BrokerMessage, ClientMessage, DeviceInfo, Hello, LostState, ModuleFormat, Role, Welcome,
};
use crate::error::{ErrorCode, WireError};
use crate::job::{JobGpu, JobStart, JobStats, POD_JOB_BASE, PodGrant, PodIdentity};
use crate::ring::ShmLayout;
use crate::stats::{
    BrokerUsage, ClientStats, GpuLoad, GpuMemory, IoctlStats, OutsideLoad, ProcessActivity,
    ProcessKind, StatusReport, TelemetryStatus, UserStats,
};

pub(crate) fn device(index: u32) -> DeviceInfo {
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

pub(super) fn welcome(layout: Option<ShmLayout>) -> Welcome {
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
        memory_granularity: 2 << 20,
    }
}

pub(super) fn hello(role: Role, requested_class: Option<PriorityClass>, gpu: Option<u32>) -> Hello {
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

fn pod_identity() -> PodIdentity {
    PodIdentity {
        namespace: "ml-prod".into(),
        pod: "trainer-0".into(),
        container: "main".into(),
        service_account: None,
    }
}

fn job_stats() -> JobStats {
    JobStats {
        job: 4711,
        uid: 1000,
        user: "alice".into(),
        gpus: vec![JobGpu {
            gpu: 0,
            shards: Some(3),
        }],
        partition: Some("interactive".into()),
        qos: Some("normal".into()),
        class: PriorityClass::High,
        weight: 3,
        memory_quota: 6 << 30,
        memory_used: 3 << 20,
        sessions: 1,
        sessions_total: 2,
        gpu_time_ns: 9_000_000,
        age_ms: 60_000,
        evicted_at_end: 0,
        pod: None,
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
            spin_ns: 0,
            latency_p50_ns: Some(300),
            latency_p99_ns: None,
            governed: true,
            throttled_ns: 1_500_000,
            consolidated: false,
            trust_domain: "default".into(),
            job: Some(4711),
        }],
        jobs: vec![job_stats()],
        gpu_loads: vec![
            GpuLoad {
                gpu: 0,
                busy: 0.75,
                memory_used: 3 << 20,
                clients: 1,
            },
            GpuLoad::default(),
        ],
        next_gpu: 1,
        peers: vec![(0, 1), (1, 0)],
        free_running: vec![crate::stats::FreeRunning {
            gpu: 0,
            now: true,
            total_ns: 2_500_000_000,
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
            connections: 2,
            max_connections: 128,
            module_bytes: 5 << 20,
            max_module_bytes: Some(1 << 30),
            gpu_memory: vec![GpuMemory {
                gpu: 0,
                memory_used: 3 << 20,
            }],
            gpu_memory_quota: Some(4 << 30),
        }],
        usage: BrokerUsage {
            cpu_ns: 1_500_000_000,
            workers_cpu_ns: 700_000_000,
            rss_bytes: 25 << 20,
            workers_rss_bytes: 600 << 20,
            threads: 9,
            workers: 2,
        },
    }
}

pub(super) fn client_variant(m: &ClientMessage) -> &'static str {
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
        ClientMessage::AdminJobStart { .. } => "admin_job_start",
        ClientMessage::AdminJobEnd { .. } => "admin_job_end",
        ClientMessage::AdminPodStart { .. } => "admin_pod_start",
        ClientMessage::AdminPodIdentify { .. } => "admin_pod_identify",
        ClientMessage::LoadCachedModule { .. } => "load_cached_module",
        ClientMessage::GetFunctionInfo { .. } => "get_function_info",
        ClientMessage::GetGlobal { .. } => "get_global",
        ClientMessage::ShareHostMemory { .. } => "share_host_memory",
        ClientMessage::UnshareHostMemory { .. } => "unshare_host_memory",
        ClientMessage::ExportMemory { .. } => "export_memory",
        ClientMessage::ImportMemory { .. } => "import_memory",
        ClientMessage::EnablePeerAccess { .. } => "enable_peer_access",
        ClientMessage::EncodeTensorMap { .. } => "encode_tensor_map",
        ClientMessage::GetFunctionNames { .. } => "get_function_names",
        ClientMessage::Ping { .. } => "ping",
        ClientMessage::MakeGraph { .. } => "make_graph",
    }
}

pub(super) fn broker_variant(m: &BrokerMessage) -> &'static str {
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
        BrokerMessage::Job { .. } => "job",
        BrokerMessage::Pod { .. } => "pod",
        BrokerMessage::DeviceReset { .. } => "device_reset",
        BrokerMessage::FunctionInfo { .. } => "function_info",
        BrokerMessage::Global { .. } => "global",
        BrokerMessage::HostShared { .. } => "host_shared",
        BrokerMessage::HostUnshared { .. } => "host_unshared",
        BrokerMessage::MemoryExported { .. } => "memory_exported",
        BrokerMessage::MemoryImported { .. } => "memory_imported",
        BrokerMessage::PeerAccessEnabled { .. } => "peer_access_enabled",
        BrokerMessage::TensorMap { .. } => "tensor_map",
        BrokerMessage::FunctionNames { .. } => "function_names",
        BrokerMessage::Pong { .. } => "pong",
        BrokerMessage::GraphMade { .. } => "graph_made",
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
            offset: 0,
        },
        ClientMessage::UnshareHostMemory {
            request: 12,
            region: 3,
        },
        ClientMessage::Ping { request: 13 },
        ClientMessage::ExportMemory {
            request: 14,
            handle: 2,
        },
        ClientMessage::ImportMemory { request: 15 },
        ClientMessage::EnablePeerAccess {
            request: 16,
            gpu: 1,
        },
        ClientMessage::MakeGraph {
            request: 18,
            bytes: 4096,
        },
        ClientMessage::EncodeTensorMap {
            request: 16,
            args: crate::control::TensorMapArgs::Tiled {
                layout: crate::control::TensorLayout {
                    data_type: 7,
                    global_address: 0x7000_0000_0000,
                    global_dim: vec![1024, 1024],
                    global_strides: vec![4096],
                    element_strides: vec![1, 1],
                    interleave: 0,
                    swizzle: 3,
                    l2_promotion: 2,
                    oob_fill: 0,
                },
                box_dim: vec![64, 64],
            },
        },
        ClientMessage::GetFunctionNames {
            request: 17,
            module: 1,
            first: 0,
        },
        ClientMessage::AdminJobStart {
            request: 19,
            start: JobStart {
                job: 4711,
                uid: 1000,
                user: "alice".into(),
                gpus: vec![
                    JobGpu {
                        gpu: 0,
                        shards: Some(3),
                    },
                    JobGpu {
                        gpu: 1,
                        shards: None,
                    },
                ],
                partition: Some("interactive".into()),
                qos: None,
            },
        },
        ClientMessage::AdminJobEnd {
            request: 20,
            job: 4711,
        },
        ClientMessage::AdminPodStart {
            request: 21,
            gpus: vec![JobGpu {
                gpu: 0,
                shards: Some(2),
            }],
        },
        ClientMessage::AdminPodIdentify {
            request: 22,
            job: POD_JOB_BASE + 1,
            pod: pod_identity(),
        },
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
        BrokerMessage::Job {
            request: 19,
            result: Ok(job_stats()),
        },
        BrokerMessage::Job {
            request: 20,
            result: Err(err(ErrorCode::NotFound)),
        },
        BrokerMessage::Pod {
            request: 21,
            result: Ok(PodGrant {
                stats: JobStats {
                    job: POD_JOB_BASE + 1,
                    pod: Some(pod_identity()),
                    ..job_stats()
                },
                socket_dir: "/run/gpushare/pods/4294967297".into(),
            }),
        },
        BrokerMessage::Pod {
            request: 22,
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
        BrokerMessage::MemoryExported {
            request: 12,
            result: Ok(()),
        },
        BrokerMessage::MemoryImported {
            request: 13,
            result: Ok((3, 2 << 20)),
        },
        BrokerMessage::MemoryImported {
            request: 13,
            result: Err(err(ErrorCode::PermissionDenied)),
        },
        BrokerMessage::PeerAccessEnabled {
            request: 13,
            result: Ok(()),
        },
        BrokerMessage::TensorMap {
            request: 14,
            result: Ok(vec![0; crate::control::TENSOR_MAP_BYTES]),
        },
        BrokerMessage::FunctionNames {
            request: 15,
            result: Ok((2, vec!["_Z10vector_fftILj4096EEvPf".into(), "spin".into()])),
        },
        BrokerMessage::FunctionNames {
            request: 15,
            result: Err(err(ErrorCode::InvalidHandle)),
        },
        BrokerMessage::GraphMade {
            request: 16,
            result: Ok(3),
        },
    ]
}
