//! Prometheus metrics: the status report in the text exposition format (version 0.0.4), and a
//! small HTTP/1.1 endpoint that serves it at `/metrics`.
//!
//! Names follow Prometheus conventions: base units (seconds, bytes), `_total` on counters,
//! one `# HELP` and `# TYPE` per family with all of its samples together. Client series are
//! labelled `client` (the broker's client id), `pid`, `user`, `name`, `class`, `kind` and `gpu`;
//! observed processes (eBPF telemetry) `pid`, `comm`, `uid` and `kind`.
//!
//! - `clients`: the per-client series; `telemetry`: the per-process ones (eBPF);
//! - `exposition`: the text format; `http`: the endpoint.

use gpushare_protocol::stats::{ProcessActivity, StatusReport, TelemetryStatus};

mod clients;
mod exposition;
mod http;
mod jobs;
mod telemetry;
#[cfg(test)]
pub(crate) mod testing;
mod users;

pub use exposition::CONTENT_TYPE_TEXT;
pub use http::{serve, serve_on};

use clients::render_clients;
use exposition::Exposition;
use jobs::render_jobs;
use telemetry::render_telemetry;

/// The report as Prometheus text. Telemetry series appear once the report carries telemetry;
/// see [`render_with_telemetry`].
pub fn render(report: &StatusReport) -> String {
    render_with_telemetry(report, Some(&report.telemetry), &report.processes)
}

/// The report and the eBPF view of processes as Prometheus text.
pub fn render_with_telemetry(
    report: &StatusReport,
    telemetry: Option<&TelemetryStatus>,
    processes: &[ProcessActivity],
) -> String {
    let mut out = Exposition::default();
    let devices = if report.devices.is_empty() {
        std::slice::from_ref(&report.device)
    } else {
        &report.devices[..]
    };
    let protocol = report.protocol_version.to_string();

    out.family(
        "gpushare_build_info",
        "gauge",
        "Broker version and device backend; always 1.",
    );
    out.sample(
        "gpushare_build_info",
        &[
            ("version", &report.broker_version),
            ("backend", &report.backend),
            ("protocol", &protocol),
        ],
        1.0,
    );
    out.family(
        "gpushare_policy_info",
        "gauge",
        "The scheduling policy in force; always 1.",
    );
    out.sample("gpushare_policy_info", &[("policy", &report.policy)], 1.0);
    out.family(
        "gpushare_uptime_seconds",
        "gauge",
        "Seconds since the broker started.",
    );
    out.sample(
        "gpushare_uptime_seconds",
        &[],
        report.uptime_ms as f64 / 1e3,
    );
    out.family("gpushare_clients", "gauge", "Connected broker clients.");
    out.sample("gpushare_clients", &[], report.clients.len() as f64);
    out.family(
        "gpushare_memory_used_bytes",
        "gauge",
        "Device memory held by all clients on all devices.",
    );
    out.sample("gpushare_memory_used_bytes", &[], report.memory_used as f64);
    let usage = &report.usage;
    out.family(
        "gpushare_broker_cpu_seconds_total",
        "counter",
        "CPU time, user and system, of gpushared (part=\"gpushared\") and of its device workers (part=\"workers\").",
    );
    for (part, ns) in [
        ("gpushared", usage.cpu_ns),
        ("workers", usage.workers_cpu_ns),
    ] {
        out.sample(
            "gpushare_broker_cpu_seconds_total",
            &[("part", part)],
            ns as f64 / 1e9,
        );
    }
    out.family(
        "gpushare_broker_resident_bytes",
        "gauge",
        "Resident memory of gpushared and of its live device workers.",
    );
    for (part, bytes) in [
        ("gpushared", usage.rss_bytes),
        ("workers", usage.workers_rss_bytes),
    ] {
        out.sample(
            "gpushare_broker_resident_bytes",
            &[("part", part)],
            bytes as f64,
        );
    }

    let gpu_labels: Vec<(String, &str)> = devices
        .iter()
        .map(|d| (d.index.to_string(), d.name.as_str()))
        .collect();
    out.family(
        "gpushare_device_info",
        "gauge",
        "A device the broker serves; always 1.",
    );
    for (d, (gpu, name)) in devices.iter().zip(&gpu_labels) {
        let cc = format!("{}.{}", d.compute_capability.0, d.compute_capability.1);
        out.sample(
            "gpushare_device_info",
            &[("gpu", gpu), ("name", name), ("compute_capability", &cc)],
            1.0,
        );
    }
    out.family(
        "gpushare_device_memory_total_bytes",
        "gauge",
        "Device memory in total.",
    );
    for (d, (gpu, _)) in devices.iter().zip(&gpu_labels) {
        out.sample(
            "gpushare_device_memory_total_bytes",
            &[("gpu", gpu)],
            d.total_memory as f64,
        );
    }
    out.family(
        "gpushare_device_memory_used_bytes",
        "gauge",
        "Device memory held by the clients on this device.",
    );
    for (d, (gpu, _)) in devices.iter().zip(&gpu_labels) {
        let used: u64 = report
            .clients
            .iter()
            .filter(|c| c.gpu == d.index)
            .map(|c| c.memory_used)
            .sum();
        out.sample(
            "gpushare_device_memory_used_bytes",
            &[("gpu", gpu)],
            used as f64,
        );
    }
    out.family(
        "gpushare_device_sms",
        "gauge",
        "Streaming multiprocessors of the device.",
    );
    for (d, (gpu, _)) in devices.iter().zip(&gpu_labels) {
        out.sample(
            "gpushare_device_sms",
            &[("gpu", gpu)],
            f64::from(d.sm_count),
        );
    }

    users::render_gpu_loads(&mut out, &report.gpu_loads);
    users::render_free_running(&mut out, &report.free_running);
    render_clients(&mut out, &report.clients, processes);
    users::render_users(&mut out, &report.users);
    render_jobs(&mut out, &report.jobs);
    if let Some(t) = telemetry {
        render_telemetry(
            &mut out,
            t,
            &report.outside_load,
            &report.clients,
            processes,
        );
    }
    out.text
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use super::*;
    use testing::{parse, report, value};

    #[test]
    fn renders_conventional_names_types_labels_and_values() {
        let text = render(&report());
        let scrape = parse(&text);
        let trainer = [
            ("client", "7"),
            ("pid", "100"),
            ("user", "alice"),
            ("name", "trainer"),
            ("class", "high"),
            ("kind", "library"),
            ("gpu", "0"),
        ];
        assert_eq!(
            value(&scrape, "gpushare_client_gpu_seconds_total", &trainer),
            1.5
        );
        assert_eq!(
            value(&scrape, "gpushare_client_memory_bytes", &trainer),
            3_145_728.0
        );
        assert_eq!(
            value(&scrape, "gpushare_client_memory_quota_bytes", &trainer),
            1_073_741_824.0
        );
        assert_eq!(
            value(&scrape, "gpushare_client_kernels_total", &trainer),
            600.0
        );
        assert_eq!(
            value(&scrape, "gpushare_client_commands_total", &trainer),
            1_000.0
        );
        assert_eq!(
            value(&scrape, "gpushare_client_errors_total", &trainer),
            3.0
        );
        for (direction, bytes) in [("htod", 4_096.0), ("dtoh", 2_048.0), ("dtod", 1_024.0)] {
            let mut labels = trainer.to_vec();
            labels.push(("direction", direction));
            assert_eq!(
                value(&scrape, "gpushare_client_copied_bytes_total", &labels),
                bytes
            );
        }
        let notebook = [("client", "9"), ("class", "best-effort"), ("gpu", "1")];
        assert_eq!(
            value(&scrape, "gpushare_client_memory_bytes", &notebook),
            3_145_728.0
        );
        assert!(
            !text.contains("gpushare_client_memory_quota_bytes{client=\"9\""),
            "no quota series for an unlimited client"
        );
        assert_eq!(value(&scrape, "gpushare_clients", &[]), 2.0);
        assert_eq!(value(&scrape, "gpushare_uptime_seconds", &[]), 65.5);
        assert_eq!(
            value(
                &scrape,
                "gpushare_broker_cpu_seconds_total",
                &[("part", "workers")]
            ),
            0.75
        );
        assert_eq!(
            value(
                &scrape,
                "gpushare_broker_resident_bytes",
                &[("part", "gpushared")]
            ),
            (24u64 << 20) as f64
        );
        assert_eq!(
            value(&scrape, "gpushare_memory_used_bytes", &[]),
            6_291_456.0
        );
        assert_eq!(
            value(
                &scrape,
                "gpushare_device_memory_total_bytes",
                &[("gpu", "1")]
            ),
            17_179_869_184.0
        );
        assert_eq!(
            value(
                &scrape,
                "gpushare_device_memory_used_bytes",
                &[("gpu", "1")]
            ),
            3_145_728.0
        );
        assert_eq!(
            value(
                &scrape,
                "gpushare_build_info",
                &[("version", "0.1.0"), ("backend", "sim"), ("protocol", "1")]
            ),
            1.0
        );
        // Types as declared, and every family has its HELP.
        let kind = |name: &str| {
            scrape
                .samples
                .iter()
                .find(|s| s.metric == name)
                .map(|s| std::mem::discriminant(&s.value))
        };
        let counter = std::mem::discriminant(&prometheus_parse::Value::Counter(0.0));
        let gauge = std::mem::discriminant(&prometheus_parse::Value::Gauge(0.0));
        for s in &scrape.samples {
            assert!(
                scrape.docs.contains_key(&s.metric),
                "{} has no HELP",
                s.metric
            );
            let expected = if s.metric.ends_with("_total") {
                counter
            } else {
                gauge
            };
            assert_eq!(kind(&s.metric), Some(expected), "{}", s.metric);
        }
        // One TYPE line per family: all of a family's samples follow it.
        let types: Vec<&str> = text.lines().filter(|l| l.starts_with("# TYPE")).collect();
        let unique: HashSet<&&str> = types.iter().collect();
        assert_eq!(types.len(), unique.len());
    }

    #[test]
    fn label_values_and_help_are_escaped() {
        let mut r = report();
        r.clients[0].name = "say \"hi\"\\now\nnext".into();
        let text = render(&r);
        assert!(
            text.contains(r#"name="say \"hi\"\\now\nnext""#),
            "escaped label in:\n{text}"
        );
        assert_eq!(text.lines().filter(|l| l.contains("say")).count(), 17);
        parse(&text);
    }
}
