//! Per-client series: one family at a time, every client in it.

use std::collections::HashSet;

use gpushare_protocol::stats::{ClientStats, ProcessActivity};

use super::exposition::{Exposition, borrow};

/// Per-client series: one family at a time, every client in it.
pub(super) fn render_clients(
    out: &mut Exposition,
    clients: &[ClientStats],
    processes: &[ProcessActivity],
) {
    let observed: HashSet<i32> = processes.iter().map(|p| p.pid).collect();
    let labels: Vec<[(&str, String); 7]> = clients
        .iter()
        .map(|c| {
            let kind = if c.governed {
                "governed"
            } else if observed.contains(&c.pid) {
                "both"
            } else {
                "brokered"
            };
            [
                ("client", c.client_id.to_string()),
                ("pid", c.pid.to_string()),
                ("user", c.user.clone()),
                ("name", c.name.clone()),
                ("class", c.class.as_str().to_string()),
                ("kind", kind.to_string()),
                ("gpu", c.gpu.to_string()),
            ]
        })
        .collect();
    type Get = fn(&ClientStats) -> Option<f64>;
    let families: [(&str, &str, &str, Get); 12] = [
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
            "Time a governed client (gpushare run) waited for launch tokens (absent for others).",
            |c| c.governed.then(|| c.throttled_ns as f64 / 1e9),
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
