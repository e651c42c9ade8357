//! Per-client series: one family at a time, every client in it.

use std::collections::HashSet;

use gpushare_protocol::stats::{ClientMode, ClientStats, ProcessActivity};

use super::exposition::{Exposition, borrow};

/// Per-client series: one family at a time, every client in it.
pub(super) fn render_clients(
    out: &mut Exposition,
    clients: &[ClientStats],
    processes: &[ProcessActivity],
) {
    let observed: HashSet<i32> = processes.iter().map(|p| p.pid).collect();
    let labels: Vec<[(&str, String); 8]> = clients
        .iter()
        .map(|c| {
            let kind = match c.mode() {
                ClientMode::Governed => "governed",
                // A client that eBPF also sees using the GPU directly bypasses the broker.
                _ if observed.contains(&c.pid) => "both",
                mode => mode.as_str(),
            };
            [
                ("client", c.client_id.to_string()),
                ("pid", c.pid.to_string()),
                ("user", c.user.clone()),
                ("name", c.name.clone()),
                ("class", c.class.as_str().to_string()),
                ("kind", kind.to_string()),
                ("gpu", c.gpu.to_string()),
                // Empty (so absent, to Prometheus) outside a batch scheduler job.
                ("job", c.job.map(|j| j.to_string()).unwrap_or_default()),
            ]
        })
        .collect();
    type Get = fn(&ClientStats) -> Option<f64>;
    let families: [(&str, &str, &str, Get); 16] = [
        (
            "gpushare_client_gpu_seconds_total",
            "counter",
            "Device time of the client's kernels and copies (modelled on sim, measured on cuda).",
            |c| Some(c.gpu_time_ns as f64 / 1e9),
        ),
        (
            "gpushare_client_memory_bytes",
            "gauge",
            "Device memory the client holds.",
            |c| Some(c.memory_used as f64),
        ),
        (
            "gpushare_client_memory_peak_bytes",
            "gauge",
            "Most device memory the client has held at once.",
            |c| Some(c.memory_peak as f64),
        ),
        (
            "gpushare_client_memory_quota_bytes",
            "gauge",
            "The client's device-memory quota (absent when unlimited).",
            |c| c.memory_quota.map(|q| q as f64),
        ),
        (
            "gpushare_client_weight",
            "gauge",
            "The client's fair-share weight.",
            |c| Some(f64::from(c.weight)),
        ),
        (
            "gpushare_client_allocations_total",
            "counter",
            "Device allocations the client has made.",
            |c| Some(c.allocations as f64),
        ),
        (
            "gpushare_client_streams",
            "gauge",
            "Streams the client holds.",
            |c| Some(f64::from(c.streams)),
        ),
        (
            "gpushare_client_commands_total",
            "counter",
            "Commands the client has submitted.",
            |c| Some(c.commands as f64),
        ),
        (
            "gpushare_client_kernels_total",
            "counter",
            "Kernels the client has launched.",
            |c| Some(c.kernels as f64),
        ),
        (
            "gpushare_client_throttled_seconds_total",
            "counter",
            "Time the scheduling policy held the client's launches (a governed client: its wait for launch tokens).",
            |c| Some(c.throttled_ns as f64 / 1e9),
        ),
        (
            "gpushare_client_queue_depth",
            "gauge",
            "Commands waiting in the client's submission ring when last looked at.",
            |c| Some(f64::from(c.queue_depth)),
        ),
        (
            "gpushare_client_spin_seconds",
            "gauge",
            "How long the client's data thread spins on its empty ring before it sleeps: longer for a client whose requests come close together.",
            |c| Some(c.spin_ns as f64 / 1e9),
        ),
        (
            "gpushare_client_latency_p50_seconds",
            "gauge",
            "Median time the broker took to serve one of the client's recent commands (absent before any).",
            |c| c.latency_p50_ns.map(|ns| ns as f64 / 1e9),
        ),
        (
            "gpushare_client_latency_p99_seconds",
            "gauge",
            "99th percentile of the time the broker took to serve one of the client's recent commands (absent before any).",
            |c| c.latency_p99_ns.map(|ns| ns as f64 / 1e9),
        ),
        (
            "gpushare_client_errors_total",
            "counter",
            "Commands of the client that failed.",
            |c| Some(c.errors as f64),
        ),
        (
            "gpushare_client_connected_seconds",
            "gauge",
            "Seconds since the client connected.",
            |c| Some(c.connected_ms as f64 / 1e3),
        ),
    ];
    for (name, kind, help, get) in &families {
        out.family(name, kind, help);
        for (c, l) in clients.iter().zip(&labels) {
            if let Some(v) = get(c) {
                out.sample(name, &borrow(l), v);
            }
        }
    }
    let copied = "gpushare_client_copied_bytes_total";
    out.family(
        copied,
        "counter",
        "Bytes the client has copied, by direction.",
    );
    for (c, l) in clients.iter().zip(&labels) {
        for (direction, bytes) in [
            ("htod", c.bytes_htod),
            ("dtoh", c.bytes_dtoh),
            ("dtod", c.bytes_dtod),
        ] {
            let mut labels = borrow(l);
            labels.push(("direction", direction));
            out.sample(copied, &labels, bytes as f64);
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::metrics::render;
    use crate::metrics::testing::{parse, report, value};

    #[test]
    fn each_client_mode_has_its_kind_with_memory_kernels_gpu_time_and_latency() {
        let mut r = report();
        r.clients[0].consolidated = true;
        r.clients[0].queue_depth = 3;
        r.clients[0].spin_ns = 150_000;
        r.clients[0].latency_p50_ns = Some(40_000);
        r.clients[0].latency_p99_ns = Some(2_500_000);
        r.clients[1].governed = true;
        let text = render(&r);
        let scrape = parse(&text);
        let consolidated = [("client", "7"), ("kind", "consolidated")];
        for (name, want) in [
            ("gpushare_client_memory_bytes", 3_145_728.0),
            ("gpushare_client_kernels_total", 600.0),
            ("gpushare_client_gpu_seconds_total", 1.5),
            ("gpushare_client_queue_depth", 3.0),
            ("gpushare_client_spin_seconds", 0.00015),
            ("gpushare_client_latency_p50_seconds", 0.00004),
            ("gpushare_client_latency_p99_seconds", 0.0025),
        ] {
            assert_eq!(value(&scrape, name, &consolidated), want, "{name}");
        }
        let governed = [("client", "9"), ("kind", "governed")];
        assert_eq!(
            value(&scrape, "gpushare_client_memory_bytes", &governed),
            3_145_728.0
        );
        // No latency yet: no sample, rather than a made-up zero.
        assert!(
            !text.contains("gpushare_client_latency_p99_seconds{client=\"9\""),
            "{text}"
        );
        r.clients[0].consolidated = false;
        let scrape = parse(&render(&r));
        assert_eq!(
            value(
                &scrape,
                "gpushare_client_kernels_total",
                &[("client", "7"), ("kind", "library")]
            ),
            600.0
        );
    }
}
