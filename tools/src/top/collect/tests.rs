use super::*;
use gpushare::PriorityClass;

pub fn device(index: u32) -> DeviceInfo {
    DeviceInfo {
        index,
        name: format!("sim-gpu-{index}"),
        total_memory: 16 << 30,
        sm_count: 80,
        compute_capability: (8, 0),
        fp32_flops: 1e13,
        memory_bandwidth: 9e11,
        host_bandwidth: 2.5e10,
        uuid: [0; 16],
        pci: (0, 1, 0),
        driver_version: 13000,
        attributes: Vec::new(),
    }
}

pub fn client(id: u64, pid: i32, name: &str) -> ClientStats {
    ClientStats {
        client_id: id,
        pid,
        uid: 1000,
        user: "alice".into(),
        name: name.into(),
        gpu: 0,
        class: PriorityClass::Normal,
        weight: 1,
        memory_used: 256 << 20,
        memory_peak: 256 << 20,
        memory_quota: Some(1 << 30),
        allocations: 3,
        streams: 1,
        commands: 0,
        kernels: 0,
        bytes_htod: 0,
        bytes_dtoh: 0,
        bytes_dtod: 0,
        gpu_time_ns: 0,
        errors: 0,
        connected_ms: 1_000,
        bypassing: false,
        queue_depth: 0,
        spin_ns: 0,
        latency_p50_ns: None,
        latency_p99_ns: None,
        governed: false,
        throttled_ns: 0,
        consolidated: false,
        trust_domain: "default".into(),
        job: None,
    }
}

pub fn report(uptime_ms: u64, clients: Vec<ClientStats>) -> StatusReport {
    StatusReport {
        broker_version: "0.1.0".into(),
        protocol_version: 1,
        backend: "sim".into(),
        device: device(0),
        devices: vec![device(0)],
        uptime_ms,
        policy: "fifo".into(),
        memory_used: clients.iter().map(|c| c.memory_used).sum(),
        clients,
        telemetry: gpushare_protocol::stats::TelemetryStatus {
            enabled: false,
            reason: Some("not in this test".into()),
            dev_prefix: "/dev/nvidia".into(),
            uprobes: false,
        },
        processes: Vec::new(),
        outside_load: Default::default(),
        users: Vec::new(),
        usage: Default::default(),
        jobs: Vec::new(),
        gpu_loads: Vec::new(),
        next_gpu: 0,
        peers: Vec::new(),
        free_running: Vec::new(),
    }
}

/// What eBPF telemetry (on, ioctls only) adds to a report: `processes`.
pub fn telemetry_with(processes: Vec<ProcessActivity>) -> Extras {
    Extras {
        telemetry: Some(TelemetryStatus {
            enabled: true,
            reason: None,
            dev_prefix: "/dev/nvidia".into(),
            uprobes: false,
        }),
        processes,
        queues: HashMap::new(),
    }
}

pub fn process(pid: i32, comm: &str, ioctls: u64) -> ProcessActivity {
    ProcessActivity {
        pid,
        comm: comm.into(),
        uid: 0,
        first_seen_ns: 0,
        last_seen_ns: 2_000_000_000,
        ioctls: vec![gpushare_protocol::stats::IoctlStats {
            cmd: 0x2a,
            name: "RM_CONTROL".into(),
            count: ioctls,
            errors: 0,
            total_ns: 1_000,
            arg_bytes: 64,
        }],
        launches: 0,
        allocs: 0,
        frees: 0,
        ctx_creates: 0,
        gpu_fds: 2,
        kind: gpushare_protocol::stats::ProcessKind::Observed,
        client_id: None,
    }
}

#[test]
fn first_frame_averages_since_connect_then_rates_follow_deltas() {
    let mut d = Deriver::default();
    let mut c = client(1, 100, "train");
    c.gpu_time_ns = 500_000_000; // 0.5 s of GPU in 1 s connected
    c.kernels = 1_000;
    c.bytes_htod = 2_000_000;
    let f1 = d.derive(&report(10_000, vec![c.clone()]), &Extras::default());
    let r = &f1.rows[0];
    assert_eq!(f1.interval_ms, None);
    assert_eq!(r.gpu_share, Some(0.5));
    assert_eq!(r.kernels_per_s, Some(1_000.0));
    assert_eq!(r.copy_bytes_per_s, Some(2_000_000.0));
    assert_eq!(r.kind, Kind::Library);
    assert_eq!(r.queue_depth, None);
    assert_eq!(r.ioctls_per_s, None);

    c.gpu_time_ns += 100_000_000; // 0.1 s in 0.5 s
    c.kernels += 50;
    c.connected_ms += 500;
    let f2 = d.derive(&report(10_500, vec![c]), &Extras::default());
    let r = &f2.rows[0];
    assert_eq!(f2.interval_ms, Some(500));
    assert!((r.gpu_share.unwrap_or_default() - 0.2).abs() < 1e-9);
    assert_eq!(r.kernels_per_s, Some(100.0));
    assert_eq!(r.copy_bytes_per_s, Some(0.0));
    assert!((f2.devices[0].utilisation - 0.2).abs() < 1e-9);
    assert_eq!(f2.devices[0].memory_used, 256 << 20);
}

#[test]
fn an_idle_device_is_at_zero_not_minus_zero() {
    let f = Deriver::default().derive(&report(1_000, Vec::new()), &Extras::default());
    let util = f.devices[0].utilisation;
    assert!(util == 0.0 && util.is_sign_positive(), "{util}");
    assert!(
        crate::format::device_line(&f.devices[0], false).contains("util 0.0%"),
        "{}",
        crate::format::device_line(&f.devices[0], false)
    );
}

#[test]
fn the_brokers_cpu_is_its_average_at_first_then_the_last_intervals() {
    let mut d = Deriver::default();
    let mut r = report(10_000, Vec::new());
    r.usage = BrokerUsage {
        cpu_ns: 1_000_000_000,
        workers_cpu_ns: 500_000_000,
        rss_bytes: 20 << 20,
        workers_rss_bytes: 600 << 20,
        threads: 7,
        workers: 2,
    };
    let f1 = d.derive(&r, &Extras::default());
    assert!((f1.broker.cpu_cores - 0.1).abs() < 1e-9, "{:?}", f1.broker);
    assert!((f1.broker.workers_cpu_cores - 0.05).abs() < 1e-9);
    // 500 ms later: 250 ms more CPU is half a core; a worker replaced and not yet reaped
    // (its time gone from the sum) counts as none, not as a negative share.
    r.uptime_ms += 500;
    r.usage.cpu_ns += 250_000_000;
    r.usage.workers_cpu_ns -= 100_000_000;
    let f2 = d.derive(&r, &Extras::default());
    assert!((f2.broker.cpu_cores - 0.5).abs() < 1e-9, "{:?}", f2.broker);
    assert_eq!(f2.broker.workers_cpu_cores, 0.0);
    let line = crate::format::broker_line(&f2);
    assert_eq!(
        line,
        "gpushared: CPU 50.0% · 2 device workers 0.0% · memory 20.0 MiB + workers 600.0 MiB · 7 threads"
    );
}

#[test]
fn a_restarted_broker_starts_the_deltas_over() {
    let mut d = Deriver::default();
    let mut c = client(1, 100, "train");
    c.kernels = 10_000;
    d.derive(&report(60_000, vec![c.clone()]), &Extras::default());
    // Same client id on a new broker: counters went down, uptime too.
    c.kernels = 10;
    c.connected_ms = 100;
    let f = d.derive(&report(200, vec![c]), &Extras::default());
    assert_eq!(f.interval_ms, None);
    assert_eq!(f.rows[0].kernels_per_s, Some(100.0));
}

#[test]
fn telemetry_adds_observed_rows_and_marks_clients_that_also_touch_the_device() {
    let mut d = Deriver::default();
    let extras = telemetry_with(vec![
        process(100, "train", 400),
        process(200, "python3", 1_000),
    ]);
    let f = d.derive(&report(5_000, vec![client(1, 100, "train")]), &extras);
    assert_eq!(f.rows.len(), 2);
    assert_eq!(f.rows[0].kind, Kind::Both);
    assert_eq!(
        f.rows[0].ioctls_per_s,
        Some(400.0),
        "since it connected, 1 s ago"
    );
    let observed = &f.rows[1];
    assert_eq!(observed.kind, Kind::Observed);
    assert_eq!(observed.key, RowKey::Process(200));
    assert_eq!(observed.user, "root");
    assert_eq!(observed.ioctls_per_s, Some(500.0));
    assert_eq!(observed.kernels_per_s, None, "no uprobes, no launch counts");
    assert_eq!(f.clients, 1);
}

#[test]
fn the_policy_says_when_fair_runs_free() {
    let mut r = report(1_000, Vec::new());
    r.policy = "fair".into();
    r.free_running = vec![gpushare_protocol::stats::FreeRunning {
        gpu: 0,
        now: false,
        total_ns: 1_000,
    }];
    assert_eq!(
        Deriver::default().derive(&r, &Extras::default()).policy,
        "fair"
    );
    r.free_running[0].now = true;
    let f = Deriver::default().derive(&r, &Extras::default());
    assert!(
        crate::format::top_summary(&f).contains("policy fair (running free)"),
        "{}",
        crate::format::top_summary(&f)
    );
}
