//! Jobs of a batch scheduler (Slurm) that hold shares of this machine's GPUs. The scheduler's
//! prolog tells gpushared a job has started ([`JobStart`]), its epilog that it has ended; every
//! session of the job's processes runs on the job's grant in between.
//!
//! A Kubernetes container's shares are a job too (gpushare's kubelet plugin starts it,
//! [`PodGrant`]), with a socket of its own: every session through that socket runs on it.

use serde::{Deserialize, Serialize};

use crate::PriorityClass;

/// What a job holds on one GPU, as the scheduler allocated it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobGpu {
    /// gpushared's index of the GPU.
    pub gpu: u32,
    /// Shares of it (Slurm's GRES shards); `None`: the whole GPU.
    pub shards: Option<u32>,
}

/// A job that starts on this machine: who runs it and what the scheduler gave it. gpushared
/// decides from its policy what that is worth (memory, class, weight).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobStart {
    /// The scheduler's job id.
    pub job: u64,
    pub uid: u32,
    pub user: String,
    pub gpus: Vec<JobGpu>,
    /// The job's partition and quality of service, which the policy may map to a class.
    pub partition: Option<String>,
    pub qos: Option<String>,
}

/// A job's grant and what its sessions have used.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobStats {
    pub job: u64,
    pub uid: u32,
    pub user: String,
    /// Each GPU it holds shares of, with the shards resolved (a whole GPU is all of its
    /// shards).
    pub gpus: Vec<JobGpu>,
    pub partition: Option<String>,
    pub qos: Option<String>,
    /// The grant its sessions run on.
    pub class: PriorityClass,
    pub weight: u32,
    /// Device memory all of its sessions together may hold.
    pub memory_quota: u64,
    pub memory_used: u64,
    /// Sessions open now, and sessions it has had.
    pub sessions: u32,
    pub sessions_total: u64,
    /// GPU time of its sessions, ended ones included.
    pub gpu_time_ns: u64,
    /// Since the job started here.
    pub age_ms: u64,
    /// Sessions still open when the job ended, and so evicted (0 while it runs).
    pub evicted_at_end: u32,
    /// A Kubernetes container's shares: the pod that holds them, once the kubelet has said.
    pub pod: Option<PodIdentity>,
}

impl JobStats {
    /// All of its shards, over every GPU.
    pub fn shards(&self) -> u32 {
        total_shards(&self.gpus)
    }
}

/// The shards of `gpus` together (a GPU whose shards are not resolved counts none).
pub fn total_shards(gpus: &[JobGpu]) -> u32 {
    gpus.iter()
        .map(|g| g.shards.unwrap_or(0))
        .fold(0, u32::saturating_add)
}

/// Names the `scontrol` to run instead of searching for it.
pub const SCONTROL_ENV: &str = "GPUSHARE_SCONTROL";
/// Where `scontrol` is looked for after `PATH` (slurmd gives its prolog none, and gpushared
/// may run with a bare one).
pub const SCONTROL_DIRS: [&str; 4] = ["/usr/bin", "/usr/local/bin", "/usr/sbin", "/opt/slurm/bin"];

/// The `scontrol` the prolog and gpushared ask Slurm with: `$GPUSHARE_SCONTROL`, else the
/// first executable one in an absolute `PATH` entry, else in [`SCONTROL_DIRS`].
pub fn scontrol_path() -> Option<std::path::PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    if let Some(given) = std::env::var_os(SCONTROL_ENV).filter(|v| !v.is_empty()) {
        return Some(given.into());
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .filter(|d| d.is_absolute())
        .chain(SCONTROL_DIRS.iter().map(std::path::PathBuf::from))
        .map(|d| d.join("scontrol"))
        .find(|p| {
            std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        })
}

/// Job ids from here up are Kubernetes containers' shares (gpushared numbers them), below are
/// the batch scheduler's.
pub const POD_JOB_BASE: u64 = 1 << 32;

/// The pod whose container holds a Kubernetes allocation, as the kubelet tells it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PodIdentity {
    pub namespace: String,
    pub pod: String,
    pub container: String,
    /// Its service account, where the plugin knows it.
    pub service_account: Option<String>,
}

/// A Kubernetes allocation's grant, and the socket its container gets: a directory of its own
/// holding `gpushare.sock`, which only that allocation's sessions come through.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PodGrant {
    pub stats: JobStats,
    /// The directory on this machine to mount into the container (its socket is
    /// [`POD_SOCKET_NAME`] in it).
    pub socket_dir: String,
}

/// The allocation's socket, in its directory.
pub const POD_SOCKET_NAME: &str = "gpushare.sock";
