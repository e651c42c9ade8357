//! eBPF telemetry: every process that uses the GPU, as the kernel sees it.
//!
//! The programs in `bpf/` (built by `broker/build.rs`) watch ioctls on NVIDIA device files
//! (descriptors learned from `open*`/`dup*`/`close`, and seeded from `/proc/*/fd` here) and,
//! optionally, libcuda calls through uprobes. This module loads them, and turns their maps into
//! [`ProcessActivity`] snapshots. See `docs/telemetry.md`.
//!
//! - [`loader`]: the object, tracefs, tracepoint attachment.
//! - [`seed`]: descriptors opened before the broker started.
//! - [`uprobes`]: libcuda discovery and uprobes.
//! - [`snapshot`]: maps → per-process activity; cleanup of exited processes.
//! - [`decode`]: NVIDIA ioctl command names.

pub mod decode;
mod loader;
pub mod seed;
mod snapshot;
pub mod uprobes;

use std::collections::{HashMap, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use aya::Ebpf;
pub use gpushare_protocol::stats::{IoctlStats, ProcessActivity, TelemetryStatus};
use gpushare_protocol::wake::monotonic_ns;
use tracing::{info, warn};

/// Device-path prefix of NVIDIA's device files.
pub const DEFAULT_DEV_PREFIX: &str = "/dev/nvidia";

/// Exited processes kept for [`Telemetry::take_exited`]; the oldest go first.
const EXITED_KEPT: usize = 1024;

/// How to start telemetry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TelemetryOptions {
    /// Descriptors whose path starts with this are GPU descriptors (`--telemetry-dev-prefix`).
    pub dev_prefix: String,
    /// Attach uprobes on libcuda where it is found (`--no-uprobes` turns this off).
    pub uprobes: bool,
    /// libcuda to probe; found in the usual places and `ldconfig -p` when `None`.
    pub libcuda: Option<PathBuf>,
}

impl Default for TelemetryOptions {
    fn default() -> Self {
        TelemetryOptions {
            dev_prefix: DEFAULT_DEV_PREFIX.into(),
            uprobes: true,
            libcuda: None,
        }
    }
}

impl TelemetryOptions {
    /// The status to report when telemetry is off for `reason`.
    pub fn off(&self, reason: impl Into<String>) -> TelemetryStatus {
        TelemetryStatus {
            enabled: false,
            reason: Some(reason.into()),
            dev_prefix: self.dev_prefix.clone(),
            uprobes: false,
        }
    }
}

/// Loaded and attached eBPF programs; dropping this detaches them.
pub struct Telemetry {
    /// The maps are read and swept under this lock; the kernel side never waits for it.
    ebpf: Mutex<Ebpf>,
    status: TelemetryStatus,
    proc_root: PathBuf,
    /// Processes that exited, as last seen, until `take_exited`.
    exited: Mutex<VecDeque<ProcessActivity>>,
    /// The libcuda uprobes (loaded, attached per observed process), if on.
    uprobes: Option<Mutex<UprobeState>>,
}

/// Which processes carry the libcuda uprobes.
struct UprobeState {
    probes: uprobes::Probes,
    attached: HashMap<u32, uprobes::ProcessLinks>,
    /// This process: never probed (its own CUDA calls would pay for every hit).
    me: u32,
    /// Its executable: processes running it (its CUDA driver holder) are gpushared's own
    /// and never probed either.
    my_exe: Option<PathBuf>,
}

impl std::fmt::Debug for Telemetry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Telemetry")
            .field("status", &self.status)
            .finish_non_exhaustive()
    }
}

impl Telemetry {
    /// Loads and attaches the programs, seeds GPU descriptors from `/proc`, and attaches the
    /// libcuda uprobes when asked and found. `Err` is a sentence saying why telemetry is off
    /// (not root, no BPF, no tracefs, programs not built); log it as `telemetry off: {reason}`.
    pub fn start(opts: &TelemetryOptions) -> Result<Telemetry, String> {
        if let Some(problem) = privilege_problem() {
            return Err(problem);
        }
        if loader::ensure_tracefs()? {
            info!("telemetry: mounted tracefs at /sys/kernel/tracing (it was not mounted)");
        }
        let mut ebpf = loader::load(&opts.dev_prefix)?;
        let attached = loader::attach_tracepoints(&mut ebpf)?;

        // After attaching, so a descriptor opened during the walk is seen one way or the other.
        let proc_root = PathBuf::from("/proc");
        let seeds = seed::gpu_fds(&proc_root, &opts.dev_prefix);
        snapshot::insert_seeds(&mut ebpf, &seeds, &proc_root, monotonic_ns())?;

        let probes = if opts.uprobes {
            load_uprobes(&mut ebpf, opts)
        } else {
            None
        };
        let uprobes = probes.is_some();
        info!(
            dev_prefix = %opts.dev_prefix,
            tracepoints = attached,
            seeded_fds = seeds.len(),
            uprobes,
            "telemetry on: watching ioctls on GPU device files"
        );
        Ok(Telemetry {
            ebpf: Mutex::new(ebpf),
            status: TelemetryStatus {
                enabled: true,
                reason: None,
                dev_prefix: opts.dev_prefix.clone(),
                uprobes,
            },
            proc_root,
            exited: Mutex::new(VecDeque::new()),
            uprobes: probes.map(|probes| {
                Mutex::new(UprobeState {
                    probes,
                    attached: HashMap::new(),
                    me: std::process::id(),
                    my_exe: std::fs::read_link("/proc/self/exe").ok(),
                })
            }),
        })
    }

    /// One snapshot of every live observed process, by pid. Processes that exited since the
    /// last snapshot move to [`Telemetry::take_exited`] and their kernel map entries are
    /// removed, so call this periodically (every second or so) to keep the maps small.
    pub fn snapshot(&self) -> Vec<ProcessActivity> {
        let mut ebpf = self.ebpf.lock().unwrap_or_else(|p| p.into_inner());
        match snapshot::collect(&mut ebpf, &self.proc_root) {
            Ok(collected) => {
                if let Some(state) = &self.uprobes {
                    let mut state = state.lock().unwrap_or_else(|p| p.into_inner());
                    follow_processes(&mut ebpf, &mut state, &collected.live);
                }
                let mut exited = self.exited.lock().unwrap_or_else(|p| p.into_inner());
                exited.extend(collected.exited);
                let excess = exited.len().saturating_sub(EXITED_KEPT);
                exited.drain(..excess);
                collected.live
            }
            Err(e) => {
                warn!("telemetry: cannot read the eBPF maps: {e}");
                Vec::new()
            }
        }
    }

    /// Processes that exited (noticed by a `snapshot`) since the last call, with their final
    /// figures as last read: for accounting of short-lived GPU users.
    pub fn take_exited(&self) -> Vec<ProcessActivity> {
        let mut exited = self.exited.lock().unwrap_or_else(|p| p.into_inner());
        exited.drain(..).collect()
    }

    pub fn status(&self) -> TelemetryStatus {
        self.status.clone()
    }

    /// (GPU descriptors, ioctl-command entries) the kernel maps hold for `pid`: for tests that
    /// check exited processes are swept.
    #[doc(hidden)]
    pub fn entries_for(&self, pid: i32) -> (usize, usize) {
        let ebpf = self.ebpf.lock().unwrap_or_else(|p| p.into_inner());
        snapshot::entries_for(&ebpf, pid as u32).unwrap_or((0, 0))
    }
}

/// Loads the libcuda uprobes (attached later, per observed process); their absence is not
/// an error, only a log line.
fn load_uprobes(ebpf: &mut Ebpf, opts: &TelemetryOptions) -> Option<uprobes::Probes> {
    let Some(library) = opts.libcuda.clone().or_else(uprobes::find_libcuda) else {
        info!("telemetry: no libcuda on this machine; launch and allocation counts off");
        return None;
    };
    match uprobes::load(ebpf, &library) {
        Ok(p) => {
            info!(library = %library.display(), "telemetry: libcuda uprobes ready; attached to each process that uses the GPU");
            Some(p)
        }
        Err(e) => {
            warn!("telemetry: no uprobes on libcuda ({e}); launch and allocation counts off");
            None
        }
    }
}

/// Puts the uprobes into every newly observed process (never this one) and takes them off
/// processes that are gone.
fn follow_processes(ebpf: &mut Ebpf, state: &mut UprobeState, live: &[ProcessActivity]) {
    let alive: std::collections::HashSet<u32> = live.iter().map(|p| p.pid as u32).collect();
    let gone: Vec<u32> = state
        .attached
        .keys()
        .copied()
        .filter(|pid| !alive.contains(pid))
        .collect();
    for pid in gone {
        if let Some(links) = state.attached.remove(&pid) {
            uprobes::detach(ebpf, links);
        }
    }
    for &pid in &alive {
        if pid == state.me || state.attached.contains_key(&pid) {
            continue;
        }
        let Some(nz) = std::num::NonZeroU32::new(pid) else {
            continue;
        };
        let exe = std::fs::read_link(format!("/proc/{pid}/exe")).ok();
        if exe.is_some() && exe == state.my_exe {
            state.attached.insert(pid, Vec::new());
            continue;
        }
        let links = uprobes::attach_to(ebpf, &mut state.probes, nz);
        state.attached.insert(pid, links);
    }
}

/// Why this process cannot load tracing programs, if it cannot: it needs CAP_BPF and
/// CAP_PERFMON (or CAP_SYS_ADMIN, which implies both on older kernels).
fn privilege_problem() -> Option<String> {
    const CAP_SYS_ADMIN: u32 = 21;
    const CAP_PERFMON: u32 = 38;
    const CAP_BPF: u32 = 39;
    let caps = effective_caps(Path::new("/proc/self/status"))?;
    let has = |bit: u32| caps & (1u64 << bit) != 0;
    if has(CAP_SYS_ADMIN) || (has(CAP_BPF) && has(CAP_PERFMON)) {
        return None;
    }
    if nix::unistd::geteuid().is_root() {
        Some(
            "running as root without CAP_BPF and CAP_PERFMON (a container that drops them?)".into(),
        )
    } else {
        Some("not running as root (eBPF needs CAP_BPF and CAP_PERFMON)".into())
    }
}

fn effective_caps(status: &Path) -> Option<u64> {
    let text = std::fs::read_to_string(status).ok()?;
    let hex = text.lines().find_map(|l| l.strip_prefix("CapEff:"))?;
    u64::from_str_radix(hex.trim(), 16).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_effective_capabilities() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("status");
        std::fs::write(&path, "Name:\tx\nCapEff:\t000001ffffffffff\n").expect("write");
        assert_eq!(effective_caps(&path), Some(0x1ff_ffff_ffff));
        std::fs::write(&path, "Name:\tx\n").expect("write");
        assert_eq!(effective_caps(&path), None);
    }

    #[test]
    fn telemetry_can_be_shared_between_tasks() {
        fn shareable<T: Send + Sync>() {}
        shareable::<Telemetry>();
    }

    #[test]
    fn off_status_carries_the_reason() {
        let s = TelemetryOptions::default().off("no BPF");
        assert!(!s.enabled);
        assert_eq!(s.reason.as_deref(), Some("no BPF"));
        assert_eq!(s.dev_prefix, DEFAULT_DEV_PREFIX);
    }
}
