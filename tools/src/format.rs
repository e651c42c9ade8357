//! Plain-text rendering of status reports.

use std::fmt::Write;
use std::time::Duration;

use bytesize::ByteSize;
use gpushare::StatusReport;

pub fn duration(d: Duration) -> String {
    let s = d.as_secs();
    match s {
        0..60 => format!("{:.1}s", d.as_secs_f64()),
        60..3600 => format!("{}m{:02}s", s / 60, s % 60),
        _ => format!("{}h{:02}m", s / 3600, (s % 3600) / 60),
    }
}

pub fn gpu_time(ns: u64) -> String {
    match ns {
        0..1_000 => format!("{ns} ns"),
        1_000..1_000_000 => format!("{:.1} µs", ns as f64 / 1e3),
        1_000_000..1_000_000_000 => format!("{:.1} ms", ns as f64 / 1e6),
        _ => format!("{:.2} s", ns as f64 / 1e9),
    }
}

pub fn status(r: &StatusReport) -> String {
    let mut out = String::new();
    let d = &r.device;
    let _ = writeln!(
        out,
        "gpushared {} (protocol {}), backend {}, up {}, policy {}",
        r.broker_version,
        r.protocol_version,
        r.backend,
        duration(Duration::from_millis(r.uptime_ms)),
        r.policy
    );
    let _ = writeln!(
        out,
        "device {}: {}, {} SMs, compute {}.{}, {} memory",
        d.index,
        d.name,
        d.sm_count,
        d.compute_capability.0,
        d.compute_capability.1,
        ByteSize(d.total_memory)
    );
    let _ = writeln!(
        out,
        "memory held by clients: {} of {}",
        ByteSize(r.memory_used),
        ByteSize(d.total_memory)
    );
    let _ = writeln!(out, "clients: {}", r.clients.len());
    if r.clients.is_empty() {
        return out;
    }
    let _ = writeln!(
        out,
        "{:>4} {:>7} {:<10} {:<16} {:<11} {:>3} {:>10} {:>10} {:>8} {:>10} {:>10} {:>6}",
        "ID",
        "PID",
        "USER",
        "NAME",
        "CLASS",
        "W",
        "MEMORY",
        "QUOTA",
        "KERNELS",
        "COPIED",
        "GPU TIME",
        "ERRORS"
    );
    for c in &r.clients {
        let quota = c
            .memory_quota
            .map_or("unlimited".to_string(), |q| ByteSize(q).to_string());
        let copied = ByteSize(c.bytes_htod + c.bytes_dtoh + c.bytes_dtod);
        let _ = writeln!(
            out,
            "{:>4} {:>7} {:<10} {:<16} {:<11} {:>3} {:>10} {:>10} {:>8} {:>10} {:>10} {:>6}",
            c.client_id,
            c.pid,
            truncate(&c.user, 10),
            truncate(&c.name, 16),
            c.class.as_str(),
            c.weight,
            ByteSize(c.memory_used).to_string(),
            quota,
            c.kernels,
            copied.to_string(),
            gpu_time(c.gpu_time_ns),
            c.errors
        );
    }
    out
}

fn truncate(s: &str, n: usize) -> String {
    if s.chars().count() <= n {
        s.to_string()
    } else {
        s.chars().take(n - 1).chain(['…']).collect()
    }
}
