//! The eBPF maps' key and value types, shared by the programs in `bpf/` and the broker's
//! loader (`broker/src/telemetry`). Maps are the only interface between the two sides, so every
//! type here is `#[repr(C)]`, has no implicit padding (the kernel copies keys byte by byte:
//! padding would make equal keys differ) and only plain integers.
//!
//! Times are `bpf_ktime_get_ns()`: CLOCK_MONOTONIC nanoseconds since boot.

#![no_std]

/// Longest device-path prefix the programs compare (`--telemetry-dev-prefix`).
pub const PREFIX_CAP: usize = 64;

/// Length of a task's `comm`.
pub const COMM_LEN: usize = 16;

/// Map names, as the programs declare them and the loader looks them up.
pub mod maps {
    /// `Array<Config>`, one entry, written by the loader before attaching.
    pub const CONFIG: &str = "CONFIG";
    /// `LruHashMap<FdKey, GpuFd>`: descriptors that refer to a GPU device file.
    pub const GPU_FDS: &str = "GPU_FDS";
    /// `LruHashMap<u64 pid_tgid, PendingFd>`: a thread inside a syscall that may create a GPU fd.
    pub const PENDING_FDS: &str = "PENDING_FDS";
    /// `LruHashMap<u64 pid_tgid, IoctlStart>`: a thread's last ioctl on a GPU fd (updated in
    /// place rather than inserted and deleted per call: an LRU insert costs far more).
    pub const IN_FLIGHT: &str = "IN_FLIGHT";
    /// `LruHashMap<IoctlKey, IoctlStat>`: per process and command totals.
    pub const IOCTL_STATS: &str = "IOCTL_STATS";
    /// `LruHashMap<u32 tgid, ProcInfo>`: every process seen touching the GPU; an exited one
    /// stays, marked, until user space has read it and swept its entries.
    pub const PROCS: &str = "PROCS";
}

/// Sizes of the LRU maps: bounded so a fork bomb of GPU users costs the kernel a fixed amount
/// of memory; the oldest entries go first when full.
pub mod limits {
    pub const GPU_FDS: u32 = 16384;
    pub const PENDING_FDS: u32 = 4096;
    pub const IN_FLIGHT: u32 = 8192;
    pub const IOCTL_STATS: u32 = 16384;
    pub const PROCS: u32 = 4096;
}

/// Where a GPU descriptor was learned, in [`GpuFd::source`].
pub mod source {
    /// `open`/`openat`/`openat2` of a path under the prefix.
    pub const OPEN: u32 = 1;
    /// `dup`/`dup2`/`dup3`/`fcntl(F_DUPFD*)` of a GPU descriptor.
    pub const DUP: u32 = 2;
    /// Found in `/proc/PID/fd` when the broker started.
    pub const SEED: u32 = 3;
}

/// What the loader tells the programs (`CONFIG[0]`).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Config {
    /// Device-path prefix; only the first `prefix_len` bytes count.
    pub prefix: [u8; PREFIX_CAP],
    /// 0 disables learning descriptors from `open*` (nothing matches).
    pub prefix_len: u32,
    /// Offset of `group_dead` in the `sched_process_exit` record, 0 where the kernel lacks the
    /// field (before 6.16): the programs then treat the leader thread's exit as the process's.
    pub exit_group_dead_offset: u32,
}

impl Config {
    pub const EMPTY: Config = Config {
        prefix: [0; PREFIX_CAP],
        prefix_len: 0,
        exit_group_dead_offset: 0,
    };
}

/// One descriptor of one process.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FdKey {
    pub tgid: u32,
    pub fd: u32,
}

/// A GPU descriptor.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GpuFd {
    /// When it was learned. A descriptor learned before the process's last `execve` is stale
    /// (NVIDIA's libraries open with O_CLOEXEC) and is dropped at its next use.
    pub since_ns: u64,
    /// One of [`source`].
    pub source: u32,
    pub _pad: u32,
}

/// A thread in a syscall that will create a GPU descriptor if it succeeds.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PendingFd {
    /// The syscall, so a stale entry (the thread died in the syscall) never matches another.
    pub syscall_nr: u32,
    /// One of [`source`].
    pub source: u32,
}

/// A thread's ioctl on a GPU descriptor.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IoctlStart {
    pub start_ns: u64,
    pub cmd: u32,
    /// 1 from entry to exit; 0 once accounted, so the thread's other ioctls are ignored.
    pub active: u32,
}

/// One ioctl command of one process.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct IoctlKey {
    pub tgid: u32,
    pub cmd: u32,
}

/// Totals for one [`IoctlKey`]; the programs add with atomic adds.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct IoctlStat {
    pub count: u64,
    /// Calls that returned a negative value (an errno).
    pub errors: u64,
    /// Time from syscall entry to exit, summed.
    pub total_ns: u64,
    // No argument-byte total: it is `count * ioc_size(cmd)`, so user space computes it and the
    // programs save an atomic add per call.
    pub first_ns: u64,
    pub last_ns: u64,
}

/// A process seen touching the GPU (a GPU descriptor, or a probed libcuda call).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProcInfo {
    /// `comm` of the thread that made it known (user space prefers `/proc/PID/comm`).
    pub comm: [u8; COMM_LEN],
    pub uid: u32,
    /// 1 once the process has exited: its last figures, kept for user space to read once.
    pub exited: u32,
    pub first_ns: u64,
    pub last_ns: u64,
    /// Time of the last `execve` seen (0: none); see [`GpuFd::since_ns`].
    pub exec_ns: u64,
    /// Calls of the probed libcuda functions.
    pub launches: u64,
    pub allocs: u64,
    pub frees: u64,
    pub ctx_creates: u64,
}

impl ProcInfo {
    pub const fn new(comm: [u8; COMM_LEN], uid: u32, now_ns: u64) -> ProcInfo {
        ProcInfo {
            comm,
            uid,
            exited: 0,
            first_ns: now_ns,
            last_ns: now_ns,
            exec_ns: 0,
            launches: 0,
            allocs: 0,
            frees: 0,
            ctx_creates: 0,
        }
    }
}

/// `_IOC_SIZE(cmd)`: the argument size a Linux ioctl number encodes.
pub const fn ioc_size(cmd: u32) -> u32 {
    (cmd >> 16) & 0x3fff
}

#[cfg(feature = "user")]
mod pod {
    use super::*;

    // SAFETY: all of these are #[repr(C)], made only of integers and integer arrays, with
    // explicit padding fields: every bit pattern is valid and there are no uninitialised bytes.
    unsafe impl aya::Pod for Config {}
    // SAFETY: as above.
    unsafe impl aya::Pod for FdKey {}
    // SAFETY: as above.
    unsafe impl aya::Pod for GpuFd {}
    // SAFETY: as above.
    unsafe impl aya::Pod for PendingFd {}
    // SAFETY: as above.
    unsafe impl aya::Pod for IoctlStart {}
    // SAFETY: as above.
    unsafe impl aya::Pod for IoctlKey {}
    // SAFETY: as above.
    unsafe impl aya::Pod for IoctlStat {}
    // SAFETY: as above.
    unsafe impl aya::Pod for ProcInfo {}
}

#[cfg(test)]
mod tests {
    use super::*;
    use core::mem::size_of;

    /// The sizes the kernel sees; a change here must change both sides at once.
    #[test]
    fn layouts_have_no_hidden_padding() {
        assert_eq!(size_of::<Config>(), PREFIX_CAP + 8);
        assert_eq!(size_of::<FdKey>(), 8);
        assert_eq!(size_of::<GpuFd>(), 16);
        assert_eq!(size_of::<PendingFd>(), 8);
        assert_eq!(size_of::<IoctlStart>(), 16);
        assert_eq!(size_of::<IoctlKey>(), 8);
        assert_eq!(size_of::<IoctlStat>(), 40);
        assert_eq!(size_of::<ProcInfo>(), COMM_LEN + 8 + 7 * 8);
    }

    #[test]
    fn ioc_size_reads_the_size_field() {
        // _IOWR('F', 0x2a, 32 bytes): NVIDIA's RM_CONTROL.
        assert_eq!(ioc_size(0xc020_462a), 32);
        assert_eq!(ioc_size(0xc030_462b), 48);
        // UVM commands are plain numbers.
        assert_eq!(ioc_size(0x21), 0);
    }
}
