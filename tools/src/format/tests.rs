use gpushare::{JobGpu, PriorityClass};

use super::*;
use crate::top::collect::tests::client;

#[test]
fn a_job_column_only_where_a_client_runs_on_a_job() {
    let mut clients = vec![client(1, 100, "a"), client(2, 200, "b")];
    let plain = super::clients(&clients);
    assert!(
        plain
            .lines()
            .next()
            .is_some_and(|h| h.ends_with("THROTTLED"))
    );
    clients[1].job = Some(12);
    let with_job = super::clients(&clients);
    let lines: Vec<&str> = with_job.lines().collect();
    assert!(lines[0].ends_with("THROTTLED      JOB"), "{with_job}");
    assert!(lines[1].ends_with("        -"), "{with_job}");
    assert!(lines[2].ends_with("       12"), "{with_job}");
    // The rest of each line is as before.
    for (old, new) in plain.lines().zip(lines) {
        assert!(new.starts_with(old), "{new}");
    }
}

#[test]
fn the_jobs_table() {
    let job = |job: u64, gpus: Vec<JobGpu>| JobStats {
        job,
        uid: 1000,
        user: "alice".into(),
        gpus,
        partition: None,
        qos: None,
        class: PriorityClass::Normal,
        weight: 3,
        memory_quota: 6 << 30,
        memory_used: 3 << 29,
        sessions: 1,
        sessions_total: 3,
        gpu_time_ns: 2_510_000_000,
        age_ms: 1000,
        evicted_at_end: 0,
        pod: None,
    };
    let shards = |gpu, n| JobGpu {
        gpu,
        shards: Some(n),
    };
    let text = jobs(&[
        job(12, vec![shards(0, 3)]),
        job(13, vec![shards(0, 8), shards(1, 8)]),
    ]);
    let lines: Vec<&str> = text.lines().collect();
    assert!(lines[0].starts_with("jobs (Slurm"), "{text}");
    assert_eq!(
        lines[1],
        "     JOB USER       SHARDS           CLASS         W     MEMORY      QUOTA  SESSIONS   GPU TIME"
    );
    assert_eq!(
        lines[2],
        "      12 alice      3 on GPU 0       normal        3    1.5 GiB    6.0 GiB       1/3     2.51 s"
    );
    assert!(lines[3].contains("16 on GPUs 0,1"), "{text}");
}

#[test]
fn with_several_gpus_status_shows_each_ones_load_and_each_users_memory_on_it() {
    use gpushare::UserStats;
    use gpushare_protocol::stats::{GpuLoad, GpuMemory};
    let mut r = crate::top::collect::tests::report(1_000, Vec::new());
    r.devices = vec![
        crate::top::collect::tests::device(0),
        crate::top::collect::tests::device(1),
    ];
    r.gpu_loads = vec![
        GpuLoad {
            gpu: 0,
            busy: 0.82,
            memory_used: 10 << 30,
            clients: 2,
        },
        GpuLoad {
            gpu: 1,
            ..GpuLoad::default()
        },
    ];
    r.next_gpu = 1;
    r.peers = vec![(0, 1)];
    r.users = vec![UserStats {
        uid: 1000,
        user: "alice".into(),
        sessions: 2,
        memory_used: 3 << 30,
        memory_quota: None,
        pinned_bytes: 0,
        max_sessions: 64,
        max_pinned_bytes: None,
        connections: 2,
        max_connections: 128,
        module_bytes: 0,
        max_module_bytes: None,
        gpu_memory: vec![
            GpuMemory {
                gpu: 0,
                memory_used: 1 << 30,
            },
            GpuMemory {
                gpu: 1,
                memory_used: 2 << 30,
            },
        ],
        gpu_memory_quota: Some(8 << 30),
    }];
    let text = status(&r);
    let lines: Vec<&str> = text.lines().collect();
    let after = |prefix: &str| {
        lines
            .iter()
            .position(|l| l.starts_with(prefix))
            .and_then(|i| lines.get(i + 1))
            .copied()
            .unwrap_or_default()
    };
    assert!(
        lines.iter().any(
            |l| l.starts_with("device 1: sim-gpu-1 (GPU-00000000-0000-0000-0000-000000000000)")
        ),
        "{text}"
    );
    assert_eq!(
        after("device 0:"),
        "  load: busy 82%, 10.0 GiB held by 2 clients",
        "{text}"
    );
    assert_eq!(
        after("device 1:"),
        "  load: busy 0%, 0 B held by 0 clients; a program that names no GPU runs here",
        "{text}"
    );
    assert_eq!(
        after("  load: busy 82%"),
        "  peer access to: GPU 1",
        "{text}"
    );
    assert_eq!(
        after("  load: busy 0%"),
        "  peer access to: none",
        "the peer access it lacks: {text}"
    );
    assert!(
        text.contains("per GPU: GPU 0 1.0 GiB, GPU 1 2.0 GiB (quota 8.0 GiB on each)"),
        "{text}"
    );
}

#[test]
fn rates_and_latencies_fit_their_columns() {
    assert_eq!(rate(0.0), "0.0");
    assert_eq!(rate(9.94), "9.9");
    assert_eq!(rate(1234.4), "1234");
    assert_eq!(rate(123_456.0), "123k");
    assert_eq!(rate(5e9), "5000M");
    assert_eq!(latency(870), "0.9µs");
    assert_eq!(latency(120_000), "120µs");
    assert_eq!(latency(3_400_000), "3.4ms");
    assert_eq!(latency(2_500_000_000), "2.50s");
    assert_eq!(interval(Duration::from_secs(1)), "1s");
    assert_eq!(interval(Duration::from_millis(200)), "0.2s");
    assert_eq!(interval(Duration::from_millis(50)), "0.05s");
    assert_eq!(interval(Duration::from_secs(30)), "30s");
    assert_eq!(truncate("abcdef", 4), "abc…");
    assert_eq!(truncate("abc", 4), "abc");
}

#[test]
fn with_several_gpus_top_shows_each_programs_gpu_and_each_users_memory_on_each() {
    use crate::top::collect::tests::{device, report};
    use crate::top::collect::{Deriver, Extras};
    let mut on_one = client(2, 200, "infer.py");
    on_one.gpu = 1;
    on_one.user = "bob".into();
    on_one.memory_used = 3 << 30;
    let mut also_on_one = client(3, 300, "eval.py");
    also_on_one.gpu = 1;
    also_on_one.memory_used = 1 << 30;
    let mut r = report(1_000, vec![client(1, 100, "train.py"), on_one, also_on_one]);
    r.devices = vec![device(0), device(1)];
    let f = Deriver::default().derive(&r, &Extras::default());
    let rows: Vec<&crate::top::collect::Row> = f.rows.iter().collect();
    let text = top_frame(&f, &rows);
    let line = |needle: &str| {
        text.lines()
            .find(|l| l.contains(needle))
            .unwrap_or_default()
            .to_string()
    };
    assert!(
        line("GPU 0 sim-gpu-0").ends_with("· alice 256.0 MiB"),
        "{text}"
    );
    assert!(
        line("GPU 1 sim-gpu-1").ends_with("· bob 3.0 GiB, alice 1.0 GiB"),
        "{text}"
    );
    let header_line = line("COMMAND");
    let header: Vec<&str> = header_line.split_whitespace().collect();
    let gpu = header.iter().position(|&t| t == "GPU");
    let kind = header.iter().position(|&t| t == "KIND");
    assert_eq!(gpu, kind.map(|k| k + 1), "GPU after KIND: {text}");
    for (program, on) in [("train.py", "0"), ("infer.py", "1"), ("eval.py", "1")] {
        let cells: Vec<String> = line(program)
            .split_whitespace()
            .map(str::to_string)
            .collect();
        assert_eq!(
            gpu.and_then(|g| cells.get(g)).map(String::as_str),
            Some(on),
            "{program}: {text}"
        );
    }

    // One GPU: neither the column nor the users on the device line.
    r.devices = vec![device(0)];
    let f = Deriver::default().derive(&r, &Extras::default());
    let rows: Vec<&crate::top::collect::Row> = f.rows.iter().collect();
    let text = top_frame(&f, &rows);
    assert!(!line_has_token(&text, "COMMAND", "GPU"), "{text}");
    assert!(!text.contains("· alice"), "{text}");
}

fn line_has_token(text: &str, line_with: &str, token: &str) -> bool {
    text.lines()
        .find(|l| l.contains(line_with))
        .is_some_and(|l| l.split_whitespace().any(|t| t == token))
}

#[test]
fn top_says_telemetry_is_starting_while_gpushared_loads_it_not_that_it_is_off() {
    use crate::top::collect::tests::report;
    use crate::top::collect::{Deriver, Extras};
    use gpushare_protocol::stats::{TELEMETRY_STARTING, TelemetryStatus};
    let mut r = report(1_000, vec![client(1, 100, "train.py")]);
    let status = |enabled, reason: Option<&str>| TelemetryStatus {
        enabled,
        reason: reason.map(str::to_string),
        dev_prefix: "/dev/nvidia".into(),
        uprobes: false,
    };
    let mut line = |t| {
        r.telemetry = t;
        telemetry_line(&Deriver::default().derive(&r, &Extras::of(&r)))
    };
    assert_eq!(
        line(status(false, Some(TELEMETRY_STARTING))).as_deref(),
        Some("telemetry: starting")
    );
    assert_eq!(
        line(status(false, Some("no BPF"))).as_deref(),
        Some("telemetry: off — no BPF")
    );
    assert_eq!(
        line(status(true, None)).as_deref(),
        Some("telemetry: eBPF on (ioctls)")
    );
}

#[test]
fn status_says_whether_fair_runs_free_and_for_how_long() {
    use gpushare_protocol::stats::FreeRunning;
    let mut r = crate::top::collect::tests::report(1_000, Vec::new());
    assert!(!status(&r).contains("running free"), "not asked for");
    r.free_running = vec![FreeRunning {
        gpu: 0,
        now: true,
        total_ns: 12_300_000_000,
    }];
    let text = status(&r);
    assert!(
        text.contains("fair running free: launches skip the scheduler now (12.3s in all)"),
        "{text}"
    );
    r.free_running[0].now = false;
    r.free_running.push(FreeRunning {
        gpu: 1,
        now: true,
        total_ns: 0,
    });
    let text = status(&r);
    assert!(
        text.contains(
            "fair running free on GPU 0: no, launches wait for the scheduler now (12.3s free in all)"
        ),
        "{text}"
    );
    assert!(
        text.contains("fair running free on GPU 1: launches skip"),
        "{text}"
    );
}
