//! Plain-text rendering: status reports, the client table, and `top` cells and batch frames
//! (the interactive screen draws the same cells).

use std::fmt::Write;
use std::time::Duration;

use bytesize::ByteSize;
use gpushare::{ClientStats, JobStats, StatusReport, UserStats};
use gpushare_protocol::stats::FreeRunning;
use gpushare_protocol::text::printable;

use crate::top::collect::{Frame, Row};

pub fn duration(d: Duration) -> String {
    let s = d.as_secs();
    match s {
        0..60 => format!("{:.1}s", d.as_secs_f64()),
        60..3600 => format!("{}m{:02}s", s / 60, s % 60),
        _ => format!("{}h{:02}m", s / 3600, (s % 3600) / 60),
    }
}

/// A refresh interval: `1s`, `0.2s`, `0.05s`.
pub fn interval(d: Duration) -> String {
    let text = format!("{:.2}", d.as_secs_f64());
    format!("{}s", text.trim_end_matches('0').trim_end_matches('.'))
}

/// FAIR running free on one GPU (`[fair] free_lead_us`: launches skip the scheduler while no
/// account leads by more), the GPU named when there are several.
pub fn free_running(f: &FreeRunning, name_gpu: bool) -> String {
    let gpu = if name_gpu {
        format!(" on GPU {}", f.gpu)
    } else {
        String::new()
    };
    let total = duration(Duration::from_nanos(f.total_ns));
    match f.now {
        true => format!("fair running free{gpu}: launches skip the scheduler now ({total} in all)"),
        false => format!(
            "fair running free{gpu}: no, launches wait for the scheduler now ({total} free in all)"
        ),
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
    let _ = writeln!(
        out,
        "gpushared {} (protocol {}), backend {}, up {}, policy {}",
        r.broker_version,
        r.protocol_version,
        r.backend,
        duration(Duration::from_millis(r.uptime_ms)),
        r.policy
    );
    for f in &r.free_running {
        let _ = writeln!(out, "{}", free_running(f, r.free_running.len() > 1));
    }
    let devices = if r.devices.is_empty() {
        std::slice::from_ref(&r.device)
    } else {
        &r.devices[..]
    };
    for d in devices {
        let _ = writeln!(
            out,
            "device {}: {} ({}), {} SMs, compute {}.{}, {} memory",
            d.index,
            d.name,
            d.uuid_text(),
            d.sm_count,
            d.compute_capability.0,
            d.compute_capability.1,
            ByteSize(d.total_memory)
        );
        if devices.len() > 1
            && let Some(l) = r.gpu_loads.iter().find(|l| l.gpu == d.index)
        {
            let _ = writeln!(
                out,
                "  load: {}{}",
                gpu_load(l),
                if r.next_gpu == d.index {
                    "; a program that names no GPU runs here"
                } else {
                    ""
                }
            );
        }
        if devices.len() > 1 {
            let reaches: Vec<String> = r
                .peers
                .iter()
                .filter(|&&(from, _)| from == d.index)
                .map(|&(_, to)| format!("GPU {to}"))
                .collect();
            let _ = writeln!(
                out,
                "  peer access to: {}",
                if reaches.is_empty() {
                    "none".to_string()
                } else {
                    reaches.join(", ")
                }
            );
        }
    }
    let total: u64 = devices.iter().map(|d| d.total_memory).sum();
    let _ = writeln!(
        out,
        "memory held by clients: {} of {}",
        ByteSize(r.memory_used),
        ByteSize(total)
    );
    let u = &r.usage;
    let _ = writeln!(
        out,
        "gpushared: {} of CPU, memory {}, {} threads; {} device worker{}: {} of CPU, memory {}",
        gpu_time(u.cpu_ns),
        ByteSize(u.rss_bytes),
        u.threads,
        u.workers,
        if u.workers == 1 { "" } else { "s" },
        gpu_time(u.workers_cpu_ns),
        ByteSize(u.workers_rss_bytes)
    );
    let _ = writeln!(out, "clients: {}", r.clients.len());
    if !r.clients.is_empty() {
        out.push_str(&clients(&r.clients));
    }
    if !r.users.is_empty() {
        out.push_str(&users(&r.users));
    }
    if !r.jobs.is_empty() {
        out.push_str(&jobs(&r.jobs));
    }
    out
}

/// The Slurm jobs holding shares of the GPUs, each with its grant and what its sessions use.
pub fn jobs(jobs: &[JobStats]) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "jobs (Slurm; QUOTA holds for all of a job's sessions together; SESSIONS: open now/in all):"
    );
    let _ = writeln!(
        out,
        "{:>8} {:<10} {:<16} {:<11} {:>3} {:>10} {:>10} {:>9} {:>10}",
        "JOB", "USER", "SHARDS", "CLASS", "W", "MEMORY", "QUOTA", "SESSIONS", "GPU TIME"
    );
    for j in jobs {
        let _ = writeln!(
            out,
            "{:>8} {:<10} {:<16} {:<11} {:>3} {:>10} {:>10} {:>9} {:>10}",
            j.job,
            truncate(&j.user, 10),
            truncate(&job_shards(j), 16),
            j.class.as_str(),
            j.weight,
            ByteSize(j.memory_used).to_string(),
            ByteSize(j.memory_quota).to_string(),
            format!("{}/{}", j.sessions, j.sessions_total),
            gpu_time(j.gpu_time_ns),
        );
    }
    out
}

/// `3 on GPU 0`, `11 on GPUs 0,1`.
fn job_shards(j: &JobStats) -> String {
    let gpus: Vec<String> = j.gpus.iter().map(|g| g.gpu.to_string()).collect();
    match gpus.as_slice() {
        [one] => format!("{} on GPU {one}", j.shards()),
        many => format!("{} on GPUs {}", j.shards(), many.join(",")),
    }
}

/// Each user's sessions together, against the per-user quota and bounds.
pub fn users(users: &[UserStats]) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "users (quota and bounds hold for all of a user's sessions together):"
    );
    let _ = writeln!(
        out,
        "{:<10} {:>7} {:>9} {:>11} {:>10} {:>10} {:>21} {:>21}",
        "USER", "UID", "SESSIONS", "CONNECTIONS", "MEMORY", "QUOTA", "PINNED", "MODULES"
    );
    let size = |v: Option<u64>| v.map_or("unlimited".to_string(), |b| ByteSize(b).to_string());
    for u in users {
        // Root's connections are not counted (an administrator can always look).
        let connections = if u.uid == 0 {
            MISSING.to_string()
        } else {
            format!("{}/{}", u.connections, u.max_connections)
        };
        let _ = writeln!(
            out,
            "{:<10} {:>7} {:>9} {:>11} {:>10} {:>10} {:>21} {:>21}",
            truncate(&u.user, 10),
            u.uid,
            format!("{}/{}", u.sessions, u.max_sessions),
            connections,
            ByteSize(u.memory_used).to_string(),
            size(u.memory_quota),
            format!("{}/{}", ByteSize(u.pinned_bytes), size(u.max_pinned_bytes)),
            format!("{}/{}", ByteSize(u.module_bytes), size(u.max_module_bytes)),
        );
        if u.gpu_memory.len() > 1 || u.gpu_memory_quota.is_some() {
            let held: Vec<String> = u
                .gpu_memory
                .iter()
                .map(|g| format!("GPU {} {}", g.gpu, ByteSize(g.memory_used)))
                .collect();
            let _ = writeln!(
                out,
                "{:<10} per GPU: {} (quota {} on each)",
                "",
                if held.is_empty() {
                    "nothing held".to_string()
                } else {
                    held.join(", ")
                },
                size(u.gpu_memory_quota)
            );
        }
    }
    out
}

/// The client table of `gpushare status` and `gpushare clients`.
pub fn clients(clients: &[ClientStats]) -> String {
    let mut out = String::new();
    // The JOB column only where a client runs on a Slurm job's grant.
    let job_column = clients.iter().any(|c| c.job.is_some());
    let _ = write!(
        out,
        "{:>4} {:>7} {:<10} {:<16} {:<12} {:>3} {:<11} {:>3} {:>10} {:>10} {:>8} {:>10} {:>10} {:>6} {:>10}",
        "ID",
        "PID",
        "USER",
        "NAME",
        "KIND",
        "GPU",
        "CLASS",
        "W",
        "MEMORY",
        "QUOTA",
        "KERNELS",
        "COPIED",
        "GPU TIME",
        "ERRORS",
        "THROTTLED"
    );
    if job_column {
        let _ = write!(out, " {:>8}", "JOB");
    }
    out.push('\n');
    for c in clients {
        let quota = c
            .memory_quota
            .map_or("unlimited".to_string(), |q| ByteSize(q).to_string());
        let copied = ByteSize(c.bytes_htod + c.bytes_dtoh + c.bytes_dtod);
        let _ = write!(
            out,
            "{:>4} {:>7} {:<10} {:<16} {:<12} {:>3} {:<11} {:>3} {:>10} {:>10} {:>8} {:>10} {:>10} {:>6} {:>10}",
            c.client_id,
            c.pid,
            truncate(&c.user, 10),
            truncate(&c.name, 16),
            c.mode().as_str(),
            c.gpu,
            c.class.as_str(),
            c.weight,
            ByteSize(c.memory_used).to_string(),
            quota,
            c.kernels,
            copied.to_string(),
            gpu_time(c.gpu_time_ns),
            c.errors,
            gpu_time(c.throttled_ns)
        );
        if job_column {
            let job = c.job.map_or(MISSING.to_string(), |j| j.to_string());
            let _ = write!(out, " {job:>8}");
        }
        out.push('\n');
    }
    out
}

/// One column of `gpushare top`.
pub struct Column {
    pub title: &'static str,
    pub width: u16,
    pub right: bool,
}

const fn col(title: &'static str, width: u16, right: bool) -> Column {
    Column {
        title,
        width,
        right,
    }
}

/// Index of the COMMAND column, the one that takes what width is left.
pub const NAME_COLUMN: usize = 2;

/// Index of the GPU column, shown only where the broker has several GPUs.
pub const GPU_COLUMN: usize = 4;

pub const TOP_COLUMNS: [Column; 16] = [
    col("PID", 7, true),
    col("USER", 10, false),
    col("COMMAND", 16, false),
    col("KIND", 12, false),
    col("GPU", 3, true),
    col("CLASS", 11, false),
    col("GPU%", 6, true),
    col("MEMORY", 10, true),
    col("QUOTA", 10, true),
    col("KERN/s", 8, true),
    col("COPY MB/s", 9, true),
    col("QUEUE", 5, true),
    col("P50", 7, true),
    col("P99", 7, true),
    col("IOCTL/s", 8, true),
    col("THROT%", 6, true),
];

/// What an unknown or not-yet-reported figure shows.
pub const MISSING: &str = "-";

/// A row's cells in [`TOP_COLUMNS`] order.
pub fn top_cells(r: &Row) -> [String; 16] {
    let brokered = r.client_id.is_some();
    [
        r.pid.to_string(),
        r.user.clone(),
        r.name.clone(),
        r.kind.as_str().to_string(),
        opt(r.gpu, |g| g.to_string()),
        r.class.clone().unwrap_or_else(|| MISSING.into()),
        opt(r.gpu_share, |s| format!("{:.1}", s * 100.0)),
        opt(r.memory_used, |m| ByteSize(m).to_string()),
        match (r.memory_quota, brokered) {
            (Some(q), _) => ByteSize(q).to_string(),
            (None, true) => "none".into(),
            (None, false) => MISSING.into(),
        },
        opt(r.kernels_per_s, rate),
        opt(r.copy_bytes_per_s, |b| rate(b / 1e6)),
        opt(r.queue_depth, |q| q.to_string()),
        opt(r.latency_p50_ns, latency),
        opt(r.latency_p99_ns, latency),
        opt(r.ioctls_per_s, rate),
        opt(r.throttled_share, |s| format!("{:.1}", s * 100.0)),
    ]
}

/// The columns of `gpushare top` for a broker of `devices` GPUs, in display order: all of
/// them, less the GPU column where there is only one.
pub fn top_columns(devices: usize) -> Vec<usize> {
    (0..TOP_COLUMNS.len())
        .filter(|&i| i != GPU_COLUMN || devices > 1)
        .collect()
}

fn opt<T>(v: Option<T>, f: impl FnOnce(T) -> String) -> String {
    v.map_or_else(|| MISSING.into(), f)
}

/// A per-second rate in at most 6 characters.
pub fn rate(v: f64) -> String {
    match v {
        v if v < 10.0 => format!("{v:.1}"),
        v if v < 100_000.0 => format!("{v:.0}"),
        v if v < 100_000_000.0 => format!("{:.0}k", v / 1e3),
        v => format!("{:.0}M", v / 1e6),
    }
}

/// A command latency in at most 7 characters.
pub fn latency(ns: u64) -> String {
    match ns {
        0..10_000 => format!("{:.1}µs", ns as f64 / 1e3),
        10_000..1_000_000 => format!("{:.0}µs", ns as f64 / 1e3),
        1_000_000..1_000_000_000 => format!("{:.1}ms", ns as f64 / 1e6),
        _ => format!("{:.2}s", ns as f64 / 1e9),
    }
}

/// The header lines of a `top` frame (the interactive screen shows the same facts).
pub fn top_summary(f: &Frame) -> String {
    format!(
        "gpushared {} · backend {} · policy {} · up {} · {} client{}",
        f.broker_version,
        f.backend,
        f.policy,
        duration(Duration::from_millis(f.uptime_ms)),
        f.clients,
        if f.clients == 1 { "" } else { "s" }
    )
}

/// One GPU's load as the default placement weighs it: `busy 82%, 10.0 GiB held by 2 clients`.
pub fn gpu_load(l: &gpushare_protocol::stats::GpuLoad) -> String {
    format!(
        "busy {:.0}%, {} held by {} client{}",
        l.busy * 100.0,
        ByteSize(l.memory_used),
        l.clients,
        if l.clients == 1 { "" } else { "s" }
    )
}

/// One device's line: utilisation and memory.
pub fn device_line(d: &crate::top::collect::DeviceLoad, several: bool) -> String {
    let mut line = format!(
        "GPU {} {}: util {:.1}% · memory {} / {}",
        d.index,
        d.name,
        d.utilisation * 100.0,
        ByteSize(d.memory_used),
        ByteSize(d.memory_total)
    );
    if several && let Some(users) = device_users(d) {
        let _ = write!(line, " · {users}");
    }
    line
}

/// Each user's memory on a device, the most first (`alice 2.0 GiB, bob 512.0 MiB`); `None`
/// where no one holds any.
pub fn device_users(d: &crate::top::collect::DeviceLoad) -> Option<String> {
    (!d.users.is_empty()).then(|| {
        d.users
            .iter()
            .map(|(user, bytes)| format!("{} {}", printable(user), ByteSize(*bytes)))
            .collect::<Vec<_>>()
            .join(", ")
    })
}

/// The telemetry line, where the broker says anything about telemetry.
pub fn telemetry_line(f: &Frame) -> Option<String> {
    let t = f.telemetry.as_ref()?;
    Some(match (t.enabled, &t.reason) {
        (true, _) if t.uprobes => "telemetry: eBPF on (ioctls, libcuda uprobes)".into(),
        (true, _) => "telemetry: eBPF on (ioctls)".into(),
        // gpushared loads its eBPF programs after it starts serving: not off, not on yet.
        (false, _) if t.starting() => "telemetry: starting".into(),
        (false, Some(why)) => format!("telemetry: off — {why}"),
        (false, None) => "telemetry: off".into(),
    })
}

/// gpushared's own cost: CPU as `top` counts it (100% = one core), and resident memory.
pub fn broker_line(f: &Frame) -> String {
    let b = &f.broker;
    format!(
        "gpushared: CPU {:.1}% · {} device worker{} {:.1}% · memory {} + workers {} · {} threads",
        b.cpu_cores * 100.0,
        b.workers,
        if b.workers == 1 { "" } else { "s" },
        b.workers_cpu_cores * 100.0,
        ByteSize(b.rss_bytes),
        ByteSize(b.workers_rss_bytes),
        b.threads
    )
}

/// A batch frame, like one screen of `top -b`.
pub fn top_frame(f: &Frame, rows: &[&Row]) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "{}", top_summary(f));
    for d in &f.devices {
        let _ = writeln!(out, "{}", device_line(d, f.devices.len() > 1));
    }
    let _ = writeln!(out, "{}", broker_line(f));
    if let Some(t) = telemetry_line(f) {
        let _ = writeln!(out, "{t}");
    }
    out.push('\n');
    let shown = top_columns(f.devices.len());
    let header = TOP_COLUMNS.map(|c| c.title.to_string());
    out.push_str(&table_line(&header, &shown));
    for r in rows {
        out.push_str(&table_line(&top_cells(r), &shown));
    }
    out
}

fn table_line(cells: &[String], shown: &[usize]) -> String {
    let mut line = String::new();
    for (n, &i) in shown.iter().enumerate() {
        let (Some(cell), Some(c)) = (cells.get(i), TOP_COLUMNS.get(i)) else {
            continue;
        };
        if n > 0 {
            line.push(' ');
        }
        let w = c.width as usize;
        let cell = truncate(cell, w);
        if c.right {
            let _ = write!(line, "{cell:>w$}");
        } else {
            let _ = write!(line, "{cell:<w$}");
        }
    }
    line.truncate(line.trim_end().len());
    line.push('\n');
    line
}

/// `s` escaped ([`printable`]: a name is the broker's to show, but anyone can choose it) and
/// cut to `n` characters.
pub fn truncate(s: &str, n: usize) -> String {
    let s = printable(s);
    if s.chars().count() <= n {
        s.into_owned()
    } else {
        s.chars().take(n.saturating_sub(1)).chain(['…']).collect()
    }
}

#[cfg(test)]
mod tests;
