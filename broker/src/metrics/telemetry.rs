//! Series from eBPF telemetry: whether it runs, and each process's driver calls.

use std::collections::HashSet;

use gpushare_protocol::stats::{ClientStats, OutsideLoad, ProcessActivity, TelemetryStatus};

use super::exposition::{Exposition, borrow};

/// Series from eBPF telemetry: whether it runs, the load outside the broker, and each
/// process's driver calls.
pub(super) fn render_telemetry(
    out: &mut Exposition,
    telemetry: &TelemetryStatus,
    outside: &OutsideLoad,
    clients: &[ClientStats],
    processes: &[ProcessActivity],
) {
    out.family(
        "gpushare_telemetry_enabled",
        "gauge",
        "1 when eBPF telemetry runs, else 0.",
    );
    out.sample(
        "gpushare_telemetry_enabled",
        &[],
        if telemetry.enabled { 1.0 } else { 0.0 },
    );
    out.family(
        "gpushare_outside_processes",
        "gauge",
        "Processes eBPF sees using the GPU directly, outside the broker (observed, or clients that also bypass it).",
    );
    out.sample(
        "gpushare_outside_processes",
        &[],
        f64::from(outside.processes),
    );
    let brokered: HashSet<i32> = clients.iter().map(|c| c.pid).collect();
    let governed: HashSet<i32> = clients
        .iter()
        .filter(|c| c.governed)
        .map(|c| c.pid)
        .collect();
    let labels: Vec<[(&str, String); 4]> = processes
        .iter()
        .map(|p| {
            let kind = if governed.contains(&p.pid) {
                "governed"
            } else if brokered.contains(&p.pid) {
                "both"
            } else {
                "observed"
            };
            [
                ("pid", p.pid.to_string()),
                ("comm", p.comm.clone()),
                ("uid", p.uid.to_string()),
                ("kind", kind.to_string()),
            ]
        })
        .collect();
    type Get = fn(&ProcessActivity) -> f64;
    let mut families: Vec<(&str, &str, &str, Get)> = vec![(
        "gpushare_process_gpu_fds",
        "gauge",
        "GPU device descriptors the process holds.",
        |p| f64::from(p.gpu_fds),
    )];
    if telemetry.uprobes {
        families.extend([
            (
                "gpushare_process_launches_total",
                "counter",
                "Kernel launches through libcuda (uprobes).",
                (|p: &ProcessActivity| p.launches as f64) as Get,
            ),
            (
                "gpushare_process_allocations_total",
                "counter",
                "Device allocations through libcuda (uprobes).",
                |p| p.allocs as f64,
            ),
            (
                "gpushare_process_frees_total",
                "counter",
                "Device frees through libcuda (uprobes).",
                |p| p.frees as f64,
            ),
            (
                "gpushare_process_contexts_created_total",
                "counter",
                "CUDA contexts created or retained through libcuda (uprobes).",
                |p| p.ctx_creates as f64,
            ),
        ]);
    }
    for (name, kind, help, get) in &families {
        out.family(name, kind, help);
        for (p, l) in processes.iter().zip(&labels) {
            out.sample(name, &borrow(l), get(p));
        }
    }
    type GetIoctl = fn(&gpushare_protocol::stats::IoctlStats) -> f64;
    let ioctl_families: [(&str, &str, GetIoctl); 3] = [
        (
            "gpushare_process_ioctls_total",
            "NVIDIA driver ioctls of the process, by command.",
            |i| i.count as f64,
        ),
        (
            "gpushare_process_ioctl_errors_total",
            "NVIDIA driver ioctls of the process that failed, by command.",
            |i| i.errors as f64,
        ),
        (
            "gpushare_process_ioctl_seconds_total",
            "Time the process spent in NVIDIA driver ioctls, by command.",
            |i| i.total_ns as f64 / 1e9,
        ),
    ];
    for (name, help, get) in ioctl_families {
        out.family(name, "counter", help);
        for (p, l) in processes.iter().zip(&labels) {
            for i in &p.ioctls {
                let mut labels = borrow(l);
                labels.push(("ioctl", &i.name));
                out.sample(name, &labels, get(i));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use gpushare_protocol::stats::IoctlStats;

    use super::*;
    use crate::metrics::render_with_telemetry;
    use crate::metrics::testing::{parse, report, value};

    #[test]
    fn telemetry_adds_process_series_and_kinds() {
        let r = report();
        let telemetry = TelemetryStatus {
            enabled: true,
            reason: None,
            dev_prefix: "/dev/nvidia".into(),
            uprobes: true,
        };
        let process = |pid: i32, comm: &str| ProcessActivity {
            pid,
            comm: comm.into(),
            uid: 0,
            first_seen_ns: 1,
            last_seen_ns: 2,
            ioctls: vec![IoctlStats {
                cmd: 0x2a,
                name: "RM_CONTROL".into(),
                count: 40,
                errors: 1,
                total_ns: 2_000_000,
                arg_bytes: 64,
            }],
            launches: 12,
            allocs: 3,
            frees: 2,
            ctx_creates: 1,
            gpu_fds: 4,
            kind: gpushare_protocol::stats::ProcessKind::Observed,
            client_id: None,
        };
        let processes = [process(100, "trainer"), process(300, "python3")];
        let mut r = r;
        r.outside_load.processes = 1;
        let text = render_with_telemetry(&r, Some(&telemetry), &processes);
        let scrape = parse(&text);
        assert_eq!(
            value(
                &scrape,
                "gpushare_client_kernels_total",
                &[("client", "7"), ("kind", "both")]
            ),
            600.0
        );
        assert_eq!(value(&scrape, "gpushare_telemetry_enabled", &[]), 1.0);
        assert_eq!(value(&scrape, "gpushare_outside_processes", &[]), 1.0);
        let py = [
            ("pid", "300"),
            ("comm", "python3"),
            ("kind", "observed"),
            ("uid", "0"),
        ];
        let mut rm = py.to_vec();
        rm.push(("ioctl", "RM_CONTROL"));
        assert_eq!(value(&scrape, "gpushare_process_ioctls_total", &rm), 40.0);
        assert_eq!(
            value(&scrape, "gpushare_process_ioctl_errors_total", &rm),
            1.0
        );
        assert_eq!(
            value(&scrape, "gpushare_process_ioctl_seconds_total", &rm),
            0.002
        );
        assert_eq!(value(&scrape, "gpushare_process_launches_total", &py), 12.0);
        assert_eq!(
            value(&scrape, "gpushare_process_allocations_total", &py),
            3.0
        );
        assert_eq!(value(&scrape, "gpushare_process_gpu_fds", &py), 4.0);
        assert_eq!(
            value(
                &scrape,
                "gpushare_process_ioctls_total",
                &[("pid", "100"), ("kind", "both")]
            ),
            40.0
        );
    }
}
