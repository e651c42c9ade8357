//! Polls the broker and turns consecutive status reports into rates and shares.
//!
//! A [`Frame`] is what every output draws from: the interactive screen, the plain-text batch
//! frames and the JSON lines. Rates are deltas between two reports divided by the broker's own
//! clock (its uptime), so a slow round trip does not distort them; a row seen for the first
//! time gets its average since it connected, as `top` does on its first frame.

use std::collections::HashMap;

use gpushare::{ClientStats, Monitor, StatusReport};
use gpushare_protocol::control::DeviceInfo;
use gpushare_protocol::stats::{BrokerUsage, ClientMode, ProcessActivity, TelemetryStatus};
use gpushare_protocol::text::printable;
use gpushare_tools::socket::BrokerSocket;
use serde::Serialize;

/// How a process uses the GPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Kind {
    /// Runs its work through the broker (links the client library).
    Library,
    /// An unmodified program under `gpushare run`: gpushare's CUDA driver runs its work in
    /// the broker's context.
    Consolidated,
    /// Touches `/dev/nvidia*` itself; only eBPF telemetry sees it.
    Observed,
    /// A broker client that also touches the device itself.
    Both,
    /// An unmodified program under `gpushare run`: it uses the device itself, with the
    /// broker's admission for its memory and launches.
    Governed,
}

impl Kind {
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Library => "library",
            Kind::Consolidated => "consolidated",
            Kind::Observed => "observed",
            Kind::Both => "both",
            Kind::Governed => "governed",
        }
    }
}

/// What identifies a row from one frame to the next.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum RowKey {
    Client(u64),
    Process(i32),
}

/// One process (or broker session) on one line.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Row {
    pub key: RowKey,
    pub client_id: Option<u64>,
    pub pid: i32,
    pub user: String,
    pub name: String,
    pub kind: Kind,
    /// The device the client runs on (brokered rows).
    pub gpu: Option<u32>,
    pub class: Option<String>,
    pub weight: Option<u32>,
    /// Fraction of the device's time this row used over the last interval (1.0 = all of it).
    pub gpu_share: Option<f64>,
    pub memory_used: Option<u64>,
    /// `None` for no quota (and for rows the broker does not manage).
    pub memory_quota: Option<u64>,
    pub kernels_per_s: Option<f64>,
    pub copy_bytes_per_s: Option<f64>,
    pub queue_depth: Option<u64>,
    pub latency_p50_ns: Option<u64>,
    pub latency_p99_ns: Option<u64>,
    pub ioctls_per_s: Option<f64>,
    pub errors: Option<u64>,
    /// Fraction of the last interval a governed program waited for launch tokens.
    pub throttled_share: Option<f64>,
}

/// One device's load, summed over the rows that run on it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DeviceLoad {
    pub index: u32,
    pub name: String,
    /// Sum of the clients' GPU shares; kernels of several clients overlap, so it can pass 1.0.
    pub utilisation: f64,
    pub memory_used: u64,
    pub memory_total: u64,
    /// Each user's memory on this device (users holding some), the most first.
    pub users: Vec<(String, u64)>,
}

/// Everything one refresh shows.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Frame {
    pub broker_version: String,
    pub backend: String,
    pub policy: String,
    pub uptime_ms: u64,
    /// Broker time between this report and the previous one (`None` on the first).
    pub interval_ms: Option<u64>,
    pub devices: Vec<DeviceLoad>,
    /// Broker sessions (brokered and both rows).
    pub clients: usize,
    /// `None` when the broker reports nothing about telemetry.
    pub telemetry: Option<TelemetryStatus>,
    /// What gpushared itself costs.
    pub broker: BrokerLoad,
    pub rows: Vec<Row>,
}

/// gpushared's own CPU and memory: CPU over the last interval (its average since it started
/// on the first frame), in cores (1.0 = one core busy all the time).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct BrokerLoad {
    pub cpu_cores: f64,
    /// Its device workers', spares included.
    pub workers_cpu_cores: f64,
    pub rss_bytes: u64,
    pub workers_rss_bytes: u64,
    pub threads: u32,
    pub workers: u32,
}

impl BrokerLoad {
    fn derive(now: &BrokerUsage, before: Option<&BrokerUsage>, span_ms: u64) -> BrokerLoad {
        let zero = BrokerUsage::default();
        let before = before.unwrap_or(&zero);
        let cores = |now: u64, then: u64| match span_ms {
            0 => 0.0,
            ms => delta(now, then) / ms as f64 / 1e6,
        };
        BrokerLoad {
            cpu_cores: cores(now.cpu_ns, before.cpu_ns),
            workers_cpu_cores: cores(now.workers_cpu_ns, before.workers_cpu_ns),
            rss_bytes: now.rss_bytes,
            workers_rss_bytes: now.workers_rss_bytes,
            threads: now.threads,
            workers: now.workers,
        }
    }
}

/// What the report says beyond the broker's own accounting. Brokers that run eBPF telemetry
/// report processes; until `StatusReport` carries these fields, [`Extras::of`] finds none and
/// the columns that need them show "-".
#[derive(Debug, Clone, Default)]
pub struct Extras {
    pub telemetry: Option<TelemetryStatus>,
    pub processes: Vec<ProcessActivity>,
    /// Scheduler figures per client id.
    pub queues: HashMap<u64, QueueStats>,
}

/// A client's scheduler figures, where the broker reports them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct QueueStats {
    pub depth: u64,
    pub latency_p50_ns: Option<u64>,
    pub latency_p99_ns: Option<u64>,
}

impl Extras {
    /// The extras in a report. The one place that reads telemetry and scheduler fields: when
    /// the protocol gains them, fill them in here.
    pub fn of(report: &StatusReport) -> Extras {
        Extras {
            telemetry: Some(report.telemetry.clone()),
            processes: report.processes.clone(),
            queues: report
                .clients
                .iter()
                .map(|c| {
                    let q = QueueStats {
                        depth: c.queue_depth.into(),
                        latency_p50_ns: c.latency_p50_ns,
                        latency_p99_ns: c.latency_p99_ns,
                    };
                    (c.client_id, q)
                })
                .collect(),
        }
    }
}

/// Counters of one row at the previous report.
#[derive(Debug, Clone, Copy, Default)]
struct Counters {
    gpu_time_ns: u64,
    kernels: u64,
    bytes: u64,
    ioctls: u64,
    throttled_ns: u64,
}

#[derive(Debug, Default)]
struct Previous {
    uptime_ms: u64,
    usage: BrokerUsage,
    rows: HashMap<RowKey, Counters>,
}

/// Turns reports into frames; keeps the previous report's counters for the deltas.
#[derive(Debug, Default)]
pub struct Deriver {
    previous: Option<Previous>,
    user_names: HashMap<u32, String>,
}

impl Deriver {
    /// Forgets the previous report (after a reconnect the counters start over).
    pub fn reset(&mut self) {
        self.previous = None;
    }

    pub fn derive(&mut self, report: &StatusReport, extras: &Extras) -> Frame {
        // A broker that restarted behind our back has a younger uptime: start over.
        let previous = self
            .previous
            .take()
            .filter(|p| p.uptime_ms <= report.uptime_ms);
        let interval_ms = previous
            .as_ref()
            .map(|p| report.uptime_ms - p.uptime_ms)
            .filter(|&d| d > 0);
        let mut now = HashMap::new();
        let mut rows = Vec::with_capacity(report.clients.len() + extras.processes.len());

        let processes: HashMap<i32, &ProcessActivity> =
            extras.processes.iter().map(|p| (p.pid, p)).collect();
        // A process with several sessions gets its ioctls on its first (oldest) session only.
        let mut ioctls_claimed = std::collections::HashSet::new();
        let mut clients: Vec<&ClientStats> = report.clients.iter().collect();
        clients.sort_by_key(|c| c.client_id);

        for c in clients {
            let key = RowKey::Client(c.client_id);
            let process = processes.get(&c.pid).copied();
            let owns_ioctls = process.is_some() && ioctls_claimed.insert(c.pid);
            let counters = Counters {
                gpu_time_ns: c.gpu_time_ns,
                throttled_ns: c.throttled_ns,
                kernels: c.kernels,
                bytes: c.bytes_htod + c.bytes_dtoh + c.bytes_dtod,
                ioctls: if owns_ioctls {
                    process.map_or(0, |p| p.total_ioctls())
                } else {
                    0
                },
            };
            let (base, span_ms) = baseline(previous.as_ref(), key, interval_ms, c.connected_ms);
            let queue = extras.queues.get(&c.client_id);
            rows.push(Row {
                key,
                client_id: Some(c.client_id),
                pid: c.pid,
                user: printable(&c.user).into_owned(),
                name: printable(&c.name).into_owned(),
                kind: match c.mode() {
                    ClientMode::Governed => Kind::Governed,
                    _ if process.is_some() => Kind::Both,
                    ClientMode::Library => Kind::Library,
                    ClientMode::Consolidated => Kind::Consolidated,
                },
                gpu: Some(c.gpu),
                class: Some(c.class.as_str().to_string()),
                weight: Some(c.weight),
                gpu_share: span_ms
                    .map(|ms| delta(counters.gpu_time_ns, base.gpu_time_ns) / ms / 1e6),
                memory_used: Some(c.memory_used),
                memory_quota: c.memory_quota,
                kernels_per_s: span_ms.map(|ms| per_s(counters.kernels, base.kernels, ms)),
                copy_bytes_per_s: span_ms.map(|ms| per_s(counters.bytes, base.bytes, ms)),
                queue_depth: queue.map(|q| q.depth),
                latency_p50_ns: queue.and_then(|q| q.latency_p50_ns),
                latency_p99_ns: queue.and_then(|q| q.latency_p99_ns),
                ioctls_per_s: if owns_ioctls {
                    span_ms.map(|ms| per_s(counters.ioctls, base.ioctls, ms))
                } else {
                    None
                },
                errors: Some(c.errors),
                throttled_share: span_ms
                    .map(|ms| delta(counters.throttled_ns, base.throttled_ns) / ms / 1e6),
            });
            now.insert(key, counters);
        }

        let client_pids: std::collections::HashSet<i32> =
            report.clients.iter().map(|c| c.pid).collect();
        let uprobes = extras.telemetry.as_ref().is_some_and(|t| t.uprobes);
        for p in &extras.processes {
            if client_pids.contains(&p.pid) {
                continue;
            }
            let key = RowKey::Process(p.pid);
            let counters = Counters {
                kernels: p.launches,
                ioctls: p.total_ioctls(),
                ..Counters::default()
            };
            let seen_ms = p.last_seen_ns.saturating_sub(p.first_seen_ns) / 1_000_000;
            let (base, span_ms) = baseline(previous.as_ref(), key, interval_ms, seen_ms);
            let user = self.user_name(p.uid);
            rows.push(Row {
                key,
                client_id: None,
                pid: p.pid,
                user,
                name: printable(&p.comm).into_owned(),
                kind: Kind::Observed,
                gpu: None,
                class: None,
                weight: None,
                gpu_share: None,
                memory_used: None,
                memory_quota: None,
                kernels_per_s: if uprobes {
                    span_ms.map(|ms| per_s(counters.kernels, base.kernels, ms))
                } else {
                    None
                },
                copy_bytes_per_s: None,
                queue_depth: None,
                latency_p50_ns: None,
                latency_p99_ns: None,
                ioctls_per_s: span_ms.map(|ms| per_s(counters.ioctls, base.ioctls, ms)),
                errors: None,
                throttled_share: None,
            });
            now.insert(key, counters);
        }

        let devices = device_loads(report, &rows);
        let broker = match (previous.as_ref(), interval_ms) {
            (Some(p), Some(ms)) => BrokerLoad::derive(&report.usage, Some(&p.usage), ms),
            _ => BrokerLoad::derive(&report.usage, None, report.uptime_ms),
        };
        self.previous = Some(Previous {
            uptime_ms: report.uptime_ms,
            usage: report.usage,
            rows: now,
        });
        Frame {
            broker_version: report.broker_version.clone(),
            backend: report.backend.clone(),
            // FAIR's launches skipping the scheduler (`[fair] free_lead_us`) on any GPU.
            policy: match report.free_running.iter().any(|f| f.now) {
                true => format!("{} (running free)", report.policy),
                false => report.policy.clone(),
            },
            uptime_ms: report.uptime_ms,
            interval_ms,
            devices,
            clients: report.clients.len(),
            telemetry: extras.telemetry.clone(),
            broker,
            rows,
        }
    }

    fn user_name(&mut self, uid: u32) -> String {
        self.user_names
            .entry(uid)
            .or_insert_with(|| {
                nix::unistd::User::from_uid(nix::unistd::Uid::from_raw(uid))
                    .ok()
                    .flatten()
                    .map_or_else(|| uid.to_string(), |u| u.name)
            })
            .clone()
    }
}

/// The counters to subtract and the milliseconds they cover: the previous report's for a row
/// seen before, else zero at the row's start (`age_ms` ago).
fn baseline(
    previous: Option<&Previous>,
    key: RowKey,
    interval_ms: Option<u64>,
    age_ms: u64,
) -> (Counters, Option<f64>) {
    match (previous.and_then(|p| p.rows.get(&key)), interval_ms) {
        (Some(c), Some(ms)) => (*c, Some(ms as f64)),
        _ => (Counters::default(), (age_ms > 0).then_some(age_ms as f64)),
    }
}

fn delta(now: u64, before: u64) -> f64 {
    now.saturating_sub(before) as f64
}

fn per_s(now: u64, before: u64, ms: f64) -> f64 {
    delta(now, before) * 1e3 / ms
}

fn device_loads(report: &StatusReport, rows: &[Row]) -> Vec<DeviceLoad> {
    let devices: Vec<&DeviceInfo> = if report.devices.is_empty() {
        vec![&report.device]
    } else {
        report.devices.iter().collect()
    };
    devices
        .into_iter()
        .map(|d| DeviceLoad {
            index: d.index,
            name: d.name.clone(),
            // A fold from +0.0: `sum()` of no shares is -0.0, which prints as `-0.0%`.
            utilisation: rows
                .iter()
                .filter(|r| r.gpu == Some(d.index))
                .filter_map(|r| r.gpu_share)
                .fold(0.0, |total, share| total + share),
            memory_used: report
                .clients
                .iter()
                .filter(|c| c.gpu == d.index)
                .map(|c| c.memory_used)
                .sum(),
            memory_total: d.total_memory,
            users: users_on(report, d.index),
        })
        .collect()
}

/// Each user's memory on device `gpu`, the most first (then by name).
fn users_on(report: &StatusReport, gpu: u32) -> Vec<(String, u64)> {
    let mut held: std::collections::BTreeMap<&str, u64> = std::collections::BTreeMap::new();
    for c in report.clients.iter().filter(|c| c.gpu == gpu) {
        *held.entry(c.user.as_str()).or_default() += c.memory_used;
    }
    let mut users: Vec<(String, u64)> = held
        .into_iter()
        .filter(|&(_, bytes)| bytes > 0)
        .map(|(user, bytes)| (user.to_string(), bytes))
        .collect();
    users.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    users
}

/// A connection to the broker that comes back after the broker restarts.
pub struct Collector {
    socket: BrokerSocket,
    monitor: Option<Monitor>,
    deriver: Deriver,
}

impl Collector {
    pub fn new(socket: BrokerSocket) -> Collector {
        Collector {
            socket,
            monitor: None,
            deriver: Deriver::default(),
        }
    }

    /// One refresh: a frame, or why there is none (the next call tries to reconnect). A
    /// connection the broker closed meanwhile (idle past its `--monitor-idle-timeout`, or a
    /// restart) is made again at once.
    pub fn poll(&mut self) -> Result<Frame, String> {
        let fresh = self.monitor.is_none();
        let monitor = match &mut self.monitor {
            Some(m) => m,
            None => self.monitor.insert(self.socket.monitor()?),
        };
        match monitor.status() {
            Ok(report) => {
                if fresh {
                    self.deriver.reset();
                }
                let extras = Extras::of(&report);
                Ok(self.deriver.derive(&report, &extras))
            }
            Err(_) if !fresh => {
                self.monitor = None;
                self.poll()
            }
            Err(e) => {
                self.monitor = None;
                Err(self.socket.describe(&e))
            }
        }
    }
}

#[cfg(test)]
pub(crate) mod tests;
