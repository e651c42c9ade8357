//! A status report and the parsing of rendered text, for the metrics tests.

use gpushare_protocol::PriorityClass;
use gpushare_protocol::control::DeviceInfo;
use gpushare_protocol::stats::{ClientStats, StatusReport};

pub fn device(index: u32) -> DeviceInfo {
    DeviceInfo {
        index,
        name: "gpushare sim".into(),
        total_memory: 16 << 30,
        sm_count: 132,
        compute_capability: (9, 0),
        fp32_flops: 6e13,
        memory_bandwidth: 3.3e12,
        host_bandwidth: 5e10,
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
        class: PriorityClass::High,
        weight: 4,
        memory_used: 3 << 20,
        memory_peak: 5 << 20,
        memory_quota: Some(1 << 30),
        allocations: 7,
        streams: 2,
        commands: 1_000,
        kernels: 600,
        bytes_htod: 4_096,
        bytes_dtoh: 2_048,
        bytes_dtod: 1_024,
        gpu_time_ns: 1_500_000_000,
        errors: 3,
        connected_ms: 2_500,
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

pub fn report() -> StatusReport {
    let mut b = client(9, 200, "notebook");
    b.memory_quota = None;
    b.class = PriorityClass::BestEffort;
    b.gpu = 1;
    StatusReport {
        broker_version: "0.1.0".into(),
        protocol_version: 1,
        backend: "sim".into(),
        device: device(0),
        devices: vec![device(0), device(1)],
        uptime_ms: 65_500,
        policy: "fifo".into(),
        memory_used: 6 << 20,
        clients: vec![client(7, 100, "trainer"), b],
        telemetry: gpushare_protocol::stats::TelemetryStatus {
            enabled: false,
            reason: Some("not in this test".into()),
            dev_prefix: "/dev/nvidia".into(),
            uprobes: false,
        },
        processes: Vec::new(),
        outside_load: Default::default(),
        users: Vec::new(),
        jobs: Vec::new(),
        gpu_loads: Vec::new(),
        next_gpu: 0,
        peers: Vec::new(),
        free_running: Vec::new(),
        usage: gpushare_protocol::stats::BrokerUsage {
            cpu_ns: 2_000_000_000,
            workers_cpu_ns: 750_000_000,
            rss_bytes: 24 << 20,
            workers_rss_bytes: 600 << 20,
            threads: 8,
            workers: 2,
        },
    }
}

pub fn job(id: u64, user: &str) -> gpushare_protocol::job::JobStats {
    gpushare_protocol::job::JobStats {
        job: id,
        uid: 1000,
        user: user.into(),
        gpus: vec![gpushare_protocol::job::JobGpu {
            gpu: 0,
            shards: Some(2),
        }],
        partition: Some("debug".into()),
        qos: None,
        class: PriorityClass::Normal,
        weight: 2,
        memory_quota: 4 << 30,
        memory_used: 1 << 30,
        sessions: 1,
        sessions_total: 3,
        gpu_time_ns: 2_500_000_000,
        age_ms: 90_000,
        evicted_at_end: 0,
        pod: None,
    }
}

pub fn parse(text: &str) -> prometheus_parse::Scrape {
    let scrape =
        prometheus_parse::Scrape::parse(text.lines().map(|l| Ok(l.to_string()))).expect("parse");
    // The parser skips lines it cannot read; every sample line must have become a sample.
    let lines = text.lines().filter(|l| !l.starts_with('#')).count();
    assert_eq!(scrape.samples.len(), lines, "unparsed lines in:\n{text}");
    scrape
}

pub fn value(scrape: &prometheus_parse::Scrape, name: &str, labels: &[(&str, &str)]) -> f64 {
    let found: Vec<_> = scrape
        .samples
        .iter()
        .filter(|s| s.metric == name && labels.iter().all(|(k, v)| s.labels.get(k) == Some(v)))
        .collect();
    assert_eq!(found.len(), 1, "{name} {labels:?}: {found:?}");
    match found[0].value {
        prometheus_parse::Value::Counter(v)
        | prometheus_parse::Value::Gauge(v)
        | prometheus_parse::Value::Untyped(v) => v,
        ref other => panic!("{name}: unexpected {other:?}"),
    }
}
