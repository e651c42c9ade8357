//! The status snapshot the broker serves to `gpushare status` and friends.

use serde::{Deserialize, Serialize};

use crate::PriorityClass;
use crate::control::DeviceInfo;
use crate::job::JobStats;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StatusReport {
    pub broker_version: String,
    pub protocol_version: u32,
    pub backend: String,
    /// The first device (all of them are in `devices`).
    pub device: DeviceInfo,
    /// Every device this broker serves, by index.
    pub devices: Vec<DeviceInfo>,
    pub uptime_ms: u64,
    pub policy: String,
    /// Device memory held by all clients.
    pub memory_used: u64,
    pub clients: Vec<ClientStats>,
    /// Whether eBPF telemetry runs, and why not.
    pub telemetry: TelemetryStatus,
    /// Every process that uses the GPU directly, as eBPF sees it (empty without telemetry).
    pub processes: Vec<ProcessActivity>,
    /// GPU activity of processes outside the broker: what the scheduler counts as outside load.
    pub outside_load: OutsideLoad,
    /// Each user's sessions together: what the per-user quota counts.
    #[serde(default)]
    pub users: Vec<UserStats>,
    /// What gpushared itself costs the machine.
    #[serde(default)]
    pub usage: BrokerUsage,
    /// Batch scheduler jobs holding shares of the GPUs here.
    #[serde(default)]
    pub jobs: Vec<JobStats>,
    /// Each GPU's load, as the default placement weighs it, by index.
    #[serde(default)]
    pub gpu_loads: Vec<GpuLoad>,
    /// The GPU a program that names none would run on now.
    #[serde(default)]
    pub next_gpu: u32,
    /// Pairs of GPUs (gpushared's indices) where a program on the first may map memory of
    /// the second (peer access; every GPU reaches itself, not listed).
    #[serde(default)]
    pub peers: Vec<(u32, u32)>,
    /// FAIR running free on each GPU whose policy may (`[fair] free_lead_us`), by index.
    #[serde(default)]
    pub free_running: Vec<FreeRunning>,
}

/// FAIR's launches skipping the scheduler on one GPU while no account leads by more than
/// `[fair] free_lead_us`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct FreeRunning {
    pub gpu: u32,
    /// They skip it now.
    pub now: bool,
    /// How long they have skipped it, all told, since gpushared started.
    pub total_ns: u64,
}

/// How loaded one GPU is, as the default placement weighs it: busy first, then memory, then
/// clients.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct GpuLoad {
    pub gpu: u32,
    /// Device time its clients' work took per second lately (kernels and copies; above 1
    /// where work overlaps).
    pub busy: f64,
    /// Device memory its clients hold.
    pub memory_used: u64,
    pub clients: u32,
}

/// Busy fractions within this of each other weigh the same, so that noise does not decide.
pub const BUSY_STEP: f64 = 0.05;

/// The indices of `loads`, the least loaded first (busy in steps of [`BUSY_STEP`], then
/// memory, then clients, then index): where the default placement puts programs.
pub fn by_load(loads: &[GpuLoad]) -> Vec<usize> {
    let mut order: Vec<usize> = (0..loads.len()).collect();
    order.sort_by_key(|&i| {
        let l = &loads[i];
        (
            (l.busy / BUSY_STEP).round() as u64,
            l.memory_used,
            l.clients,
            i,
        )
    });
    order
}

/// gpushared's own use of the machine: its process, and its device workers (spares
/// included). CPU times only grow (a replaced worker's time stays counted once it is reaped),
/// so a monitor turns two reports into a CPU share.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct BrokerUsage {
    /// CPU time, user and system, gpushared's own threads have used since it started, ns.
    pub cpu_ns: u64,
    /// CPU time of its device workers, live and reaped, ns.
    pub workers_cpu_ns: u64,
    /// Resident memory of gpushared, and of its live device workers together, bytes.
    pub rss_bytes: u64,
    pub workers_rss_bytes: u64,
    pub threads: u32,
    /// Device workers alive now.
    pub workers: u32,
}

/// One user's sessions together (library, governed and consolidated alike).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct UserStats {
    pub uid: u32,
    pub user: String,
    /// Sessions open now.
    pub sessions: u32,
    /// Device memory held by all of them: what the quota counts.
    pub memory_used: u64,
    /// The user's memory quota, for all of their sessions together (`None`: unlimited).
    pub memory_quota: Option<u64>,
    /// Host memory gpushared holds locked for the user: each session's shared region, and
    /// host memory consolidated programs share.
    pub pinned_bytes: u64,
    /// The policy's bounds for the user: sessions open at once, and pinned host memory
    /// (`None`: unlimited).
    pub max_sessions: u32,
    pub max_pinned_bytes: Option<u64>,
    /// Connections open now (sessions, monitors, handshakes), and the policy's bound.
    #[serde(default)]
    pub connections: u32,
    #[serde(default)]
    pub max_connections: u32,
    /// Module image bytes gpushared holds for the user (each image once), and the bound
    /// (`None`: unlimited).
    #[serde(default)]
    pub module_bytes: u64,
    #[serde(default)]
    pub max_module_bytes: Option<u64>,
    /// What the user holds on each GPU they have used, and the quota on any one GPU
    /// (`None`: unlimited).
    #[serde(default)]
    pub gpu_memory: Vec<GpuMemory>,
    #[serde(default)]
    pub gpu_memory_quota: Option<u64>,
}

/// Device memory a user holds on one GPU.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuMemory {
    pub gpu: u32,
    pub memory_used: u64,
}

/// How busy processes that bypass the broker keep the GPU, from eBPF.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct OutsideLoad {
    /// Processes that use the GPU directly (observed, or clients that also bypass).
    pub processes: u32,
    /// NVIDIA ioctls per second over the last sampling interval.
    pub ioctls_per_s: f64,
    /// `cuLaunchKernel` calls per second (uprobes), over the last sampling interval.
    pub launches_per_s: f64,
}

/// How a process uses the GPU.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ProcessKind {
    /// A broker client only.
    Brokered,
    /// Uses the GPU directly; not a broker client.
    #[default]
    Observed,
    /// A broker client that also uses the GPU directly: it bypasses the broker.
    Both,
    /// A governed client (`gpushare run --mode governed`): it uses the GPU directly, with the
    /// broker's admission for its memory and launches.
    Governed,
}

/// One connected client and what it has used.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ClientStats {
    pub client_id: u64,
    pub pid: i32,
    pub uid: u32,
    pub user: String,
    pub name: String,
    /// Index of the device the client's work runs on.
    pub gpu: u32,
    pub class: PriorityClass,
    pub weight: u32,
    pub memory_used: u64,
    pub memory_peak: u64,
    pub memory_quota: Option<u64>,
    pub allocations: u64,
    pub streams: u32,
    pub commands: u64,
    pub kernels: u64,
    pub bytes_htod: u64,
    pub bytes_dtoh: u64,
    pub bytes_dtod: u64,
    /// Device time of this client's kernels and copies: modelled on `sim`, measured on `cuda`.
    pub gpu_time_ns: u64,
    pub errors: u64,
    pub connected_ms: u64,
    /// The client also uses the GPU directly (eBPF saw GPU ioctls from its pid).
    #[serde(default)]
    pub bypassing: bool,
    /// Commands waiting in the client's submission ring when last looked at.
    #[serde(default)]
    pub queue_depth: u32,
    /// Median and 99th percentile of the broker's time to serve one command, in ns (recent
    /// commands; a synchronization's time includes waiting for the device).
    #[serde(default)]
    pub latency_p50_ns: Option<u64>,
    #[serde(default)]
    pub latency_p99_ns: Option<u64>,
    /// How long the client's data thread in gpushared spins on its empty ring before it
    /// sleeps, in ns: `--spin-us`, longer (up to `--spin-max-us`) for a client whose requests
    /// come close together, `--high-spin-us` for the high class.
    #[serde(default)]
    pub spin_ns: u64,
    /// An unmodified program under `gpushare run --mode governed` (the libcuda interposer): it
    /// runs on its own CUDA context; `memory_used` is what it reserved, `kernels` the launches
    /// it reported.
    #[serde(default)]
    pub governed: bool,
    /// Time the scheduler's policy held the client's launches: a governed program's wait for
    /// launch tokens (priority holds and rate limit); for others, the time a launch waited
    /// with none of the client's kernels on the GPU (not its wait behind its own kernels).
    #[serde(default)]
    pub throttled_ns: u64,
    /// An unmodified program under `gpushare run` whose GPU work runs in the broker's context
    /// through gpushare's CUDA driver.
    #[serde(default)]
    pub consolidated: bool,
    /// The trust domain whose GPU context its work shares (the policy's `trust_domain`);
    /// empty for a client that holds its own context.
    #[serde(default)]
    pub trust_domain: String,
    /// The batch scheduler job whose grant it runs on (its process is in the job).
    #[serde(default)]
    pub job: Option<u64>,
}

/// How a client runs its GPU work: the names `status`, `top` and the metrics show.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ClientMode {
    /// A program written against gpushare's client library.
    Library,
    /// An unmodified program under `gpushare run --mode governed`: its own CUDA context,
    /// with the broker's admission for its memory and launches.
    Governed,
    /// An unmodified program under `gpushare run`: gpushare's CUDA driver runs its work in
    /// the broker's context.
    Consolidated,
}

impl ClientMode {
    pub fn as_str(self) -> &'static str {
        match self {
            ClientMode::Library => "library",
            ClientMode::Governed => "governed",
            ClientMode::Consolidated => "consolidated",
        }
    }
}

impl std::fmt::Display for ClientMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl ClientStats {
    pub fn mode(&self) -> ClientMode {
        if self.governed {
            ClientMode::Governed
        } else if self.consolidated {
            ClientMode::Consolidated
        } else {
            ClientMode::Library
        }
    }
}

/// The reason a [`TelemetryStatus`] gives while gpushared is still loading its eBPF programs:
/// telemetry is neither on nor off yet.
pub const TELEMETRY_STARTING: &str = "starting";

/// Whether the broker's eBPF telemetry runs, and if not, why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TelemetryStatus {
    pub enabled: bool,
    /// Why it is off, as a sentence for the user (`None` when enabled).
    pub reason: Option<String>,
    /// Device-path prefix whose file descriptors count as GPU descriptors.
    pub dev_prefix: String,
    /// Whether uprobes on libcuda are attached.
    pub uprobes: bool,
}

impl TelemetryStatus {
    /// Whether gpushared is still starting its telemetry (so neither on nor off yet).
    pub fn starting(&self) -> bool {
        !self.enabled && self.reason.as_deref() == Some(TELEMETRY_STARTING)
    }
}

/// One process that uses the GPU, as the kernel sees it (eBPF telemetry): its ioctls on NVIDIA
/// device files and, with uprobes, its calls into libcuda. Times are CLOCK_MONOTONIC ns.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcessActivity {
    pub pid: i32,
    pub comm: String,
    pub uid: u32,
    pub first_seen_ns: u64,
    pub last_seen_ns: u64,
    /// Per ioctl command, most frequent first.
    pub ioctls: Vec<IoctlStats>,
    /// Calls of `cuLaunchKernel` and its variants (uprobes).
    pub launches: u64,
    /// Calls of `cuMemAlloc_v2` and its variants (uprobes).
    pub allocs: u64,
    /// Calls of `cuMemFree_v2` and its variants (uprobes).
    pub frees: u64,
    /// Calls of `cuCtxCreate*` and `cuDevicePrimaryCtxRetain` (uprobes).
    pub ctx_creates: u64,
    /// GPU device descriptors the process holds now.
    #[serde(default)]
    pub gpu_fds: u32,
    /// Observed (outside the broker) or both (a client that also bypasses it).
    #[serde(default)]
    pub kind: ProcessKind,
    /// The broker client with this pid, if any.
    #[serde(default)]
    pub client_id: Option<u64>,
}

impl ProcessActivity {
    /// All ioctls on GPU descriptors, every command together.
    pub fn total_ioctls(&self) -> u64 {
        self.ioctls.iter().map(|i| i.count).sum()
    }
}

/// One ioctl command of one process.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct IoctlStats {
    pub cmd: u32,
    /// Decoded name (`RM_CONTROL`, `UVM_MAP_EXTERNAL_ALLOCATION`, …), or the number in hex.
    pub name: String,
    pub count: u64,
    /// Calls that failed (negative return).
    pub errors: u64,
    /// Time inside the ioctl, summed.
    pub total_ns: u64,
    /// Argument bytes the command declares (`_IOC_SIZE`), summed.
    pub arg_bytes: u64,
}
