//! gpushare's eBPF programs: which processes use the GPU, and how, from the kernel's side.
//!
//! - `fd_*`: learn which file descriptors refer to NVIDIA device files (`open*` of a path under
//!   the configured prefix, `dup*`, `fcntl(F_DUPFD*)`; forget them on `close`).
//! - `ioctl_enter`/`ioctl_exit`: for ioctls on those descriptors, count, time and errors per
//!   process and command.
//! - `process_exec`/`process_exit`: stale descriptors after `execve`; cleanup at exit.
//! - `cuda_*`: uprobes on libcuda entry points (launches, allocations, frees, contexts).
//!
//! Every program runs for every process on the machine, so the path a non-GPU process takes
//! is one hash lookup that misses. Maps are described in `gpushare-bpf-common`.

#![no_std]
#![no_main]
// The BPF target has no compare-and-swap, so core's atomic types offer no `fetch_add`; the
// intrinsic lowers to BPF's atomic add, which every kernel with BPF_ATOMIC/XADD runs.
#![feature(core_intrinsics)]
#![allow(internal_features)]

use core::intrinsics::{AtomicOrdering, atomic_xadd};

use aya_ebpf::EbpfContext as _;
use aya_ebpf::bindings::BPF_NOEXIST;
use aya_ebpf::helpers::{
    bpf_get_current_comm, bpf_get_current_pid_tgid, bpf_get_current_uid_gid, bpf_ktime_get_ns,
    bpf_probe_read_user_buf,
};
use aya_ebpf::macros::{map, tracepoint, uprobe};
use aya_ebpf::maps::{Array, LruHashMap};
use aya_ebpf::programs::{ProbeContext, TracePointContext};
use gpushare_bpf_common::{
    COMM_LEN, Config, FdKey, GpuFd, IoctlKey, IoctlStart, IoctlStat, PREFIX_CAP, PendingFd,
    ProcInfo, limits, source,
};

#[map]
static CONFIG: Array<Config> = Array::with_max_entries(1, 0);
#[map]
static GPU_FDS: LruHashMap<FdKey, GpuFd> = LruHashMap::with_max_entries(limits::GPU_FDS, 0);
#[map]
static PENDING_FDS: LruHashMap<u64, PendingFd> =
    LruHashMap::with_max_entries(limits::PENDING_FDS, 0);
#[map]
static IN_FLIGHT: LruHashMap<u64, IoctlStart> = LruHashMap::with_max_entries(limits::IN_FLIGHT, 0);
#[map]
static IOCTL_STATS: LruHashMap<IoctlKey, IoctlStat> =
    LruHashMap::with_max_entries(limits::IOCTL_STATS, 0);
#[map]
static PROCS: LruHashMap<u32, ProcInfo> = LruHashMap::with_max_entries(limits::PROCS, 0);

// Offsets in the syscall tracepoint records (tracefs `events/syscalls/*/format`): a common
// header, `int __syscall_nr` at 8, then each argument, or the return value, as 8 bytes from 16.
const SYSCALL_NR: usize = 8;
const ARG0: usize = 16;
const ARG1: usize = 24;
const RET: usize = 16;

const F_DUPFD: u64 = 0;
const F_DUPFD_CLOEXEC: u64 = 1030;

/// A field of a tracepoint record at a constant offset.
#[inline(always)]
fn field<T: Copy>(ctx: &TracePointContext, offset: usize) -> T {
    // SAFETY: tracepoint programs may read their record directly; the offsets are the
    // constants above, taken from the kernel's format files, and aligned for `T`. The verifier
    // checks every such read against the record's size.
    unsafe { core::ptr::read(ctx.as_ptr().cast::<u8>().add(offset).cast::<T>()) }
}

#[inline(always)]
fn tgid_of(pid_tgid: u64) -> u32 {
    (pid_tgid >> 32) as u32
}

/// Adds to a counter that other CPUs may update at the same time.
#[inline(always)]
fn add(counter: *mut u64, value: u64) {
    // SAFETY: `counter` points into a map value that the kernel keeps alive for the program's
    // run; an atomic add (BPF_ATOMIC) is the documented way to share it between CPUs. The old
    // value is not used, so no BPF_FETCH (and no newer CPU version) is needed.
    let _ = unsafe { atomic_xadd::<u64, u64, { AtomicOrdering::Relaxed }>(counter, value) };
}

/// CLOCK_MONOTONIC nanoseconds.
#[inline(always)]
fn now() -> u64 {
    // SAFETY: a helper without arguments or side effects.
    unsafe { bpf_ktime_get_ns() }
}

/// Makes sure the current process has a `PROCS` entry and marks it active at `now`.
#[inline(always)]
fn touch_proc(tgid: u32, now: u64) -> Option<*mut ProcInfo> {
    let mut flags = BPF_NOEXIST as u64;
    if let Some(p) = PROCS.get_ptr_mut(tgid) {
        // SAFETY: `p` points at a live map value; plain 4- and 8-byte accesses cannot tear.
        unsafe {
            if (*p).exited == 0 {
                (*p).last_ns = now;
                return Some(p);
            }
        }
        // The entry of an exited process whose pid is in use again: start afresh.
        flags = 0;
    }
    let comm = bpf_get_current_comm().unwrap_or([0; COMM_LEN]);
    let uid = bpf_get_current_uid_gid() as u32;
    // NOEXIST: another thread may have inserted it meanwhile; theirs is as good.
    let _ = PROCS.insert(tgid, ProcInfo::new(comm, uid, now), flags);
    PROCS.get_ptr_mut(tgid)
}

/// Is `path` (a user pointer) under the configured prefix?
#[inline(always)]
fn under_prefix(path: *const u8) -> bool {
    let Some(cfg) = CONFIG.get(0) else {
        return false;
    };
    let len = cfg.prefix_len as usize;
    if len == 0 || len > PREFIX_CAP {
        return false;
    }
    // Only the prefix's length is read (a plain copy is cheaper than a string copy): a path
    // shorter than the prefix has its NUL where the prefix has a character, so it cannot match
    // even if bytes past its end are read; if those bytes are unmapped the read fails: no match.
    let mut buf = [0u8; PREFIX_CAP];
    let Some(head) = buf.get_mut(..len) else {
        return false;
    };
    // SAFETY: the helper reads `head.len()` bytes of user memory into `head`, and fails
    // cleanly on a bad pointer.
    if unsafe { bpf_probe_read_user_buf(path, head) }.is_err() {
        return false;
    }
    let mut i = 0;
    while i < PREFIX_CAP {
        if i >= len {
            return true;
        }
        if buf[i] != cfg.prefix[i] {
            return false;
        }
        i += 1;
    }
    true
}

#[inline(always)]
fn is_gpu_fd(tgid: u32, fd: u32) -> bool {
    GPU_FDS.get_ptr(FdKey { tgid, fd }).is_some()
}

#[inline(always)]
fn mark_pending(ctx: &TracePointContext, pid_tgid: u64, src: u32) {
    let pending = PendingFd {
        syscall_nr: field::<i32>(ctx, SYSCALL_NR) as u32,
        source: src,
    };
    let _ = PENDING_FDS.insert(pid_tgid, pending, 0);
}

/// `sys_enter_openat` and `sys_enter_openat2`: the path is the second argument.
#[tracepoint]
pub fn fd_openat_enter(ctx: TracePointContext) -> u32 {
    if under_prefix(field::<u64>(&ctx, ARG1) as *const u8) {
        mark_pending(&ctx, bpf_get_current_pid_tgid(), source::OPEN);
    }
    0
}

/// `sys_enter_open` (x86-64's legacy open): the path is the first argument.
#[tracepoint]
pub fn fd_open_enter(ctx: TracePointContext) -> u32 {
    if under_prefix(field::<u64>(&ctx, ARG0) as *const u8) {
        mark_pending(&ctx, bpf_get_current_pid_tgid(), source::OPEN);
    }
    0
}

/// `sys_enter_dup`: a copy of a GPU descriptor is a GPU descriptor.
#[tracepoint]
pub fn fd_dup_enter(ctx: TracePointContext) -> u32 {
    let pid_tgid = bpf_get_current_pid_tgid();
    if is_gpu_fd(tgid_of(pid_tgid), field::<u64>(&ctx, ARG0) as u32) {
        mark_pending(&ctx, pid_tgid, source::DUP);
    }
    0
}

/// `sys_enter_dup2`, `sys_enter_dup3`: as `dup`, and a GPU descriptor that `newfd` replaces
/// with something else is gone.
#[tracepoint]
pub fn fd_dup2_enter(ctx: TracePointContext) -> u32 {
    let pid_tgid = bpf_get_current_pid_tgid();
    let tgid = tgid_of(pid_tgid);
    let old = field::<u64>(&ctx, ARG0) as u32;
    let new = field::<u64>(&ctx, ARG1) as u32;
    if old == new {
        return 0;
    }
    if is_gpu_fd(tgid, old) {
        mark_pending(&ctx, pid_tgid, source::DUP);
    } else {
        let _ = GPU_FDS.remove(FdKey { tgid, fd: new });
    }
    0
}

/// `sys_enter_fcntl`: `F_DUPFD` and `F_DUPFD_CLOEXEC` are dups too.
#[tracepoint]
pub fn fd_fcntl_enter(ctx: TracePointContext) -> u32 {
    let cmd = field::<u64>(&ctx, ARG1);
    if cmd != F_DUPFD && cmd != F_DUPFD_CLOEXEC {
        return 0;
    }
    let pid_tgid = bpf_get_current_pid_tgid();
    if is_gpu_fd(tgid_of(pid_tgid), field::<u64>(&ctx, ARG0) as u32) {
        mark_pending(&ctx, pid_tgid, source::DUP);
    }
    0
}

/// The `sys_exit_*` of every syscall above: a non-negative result of a pending syscall is a
/// new GPU descriptor.
#[tracepoint]
pub fn fd_new_exit(ctx: TracePointContext) -> u32 {
    let pid_tgid = bpf_get_current_pid_tgid();
    let Some(pending) = PENDING_FDS.get_ptr(pid_tgid) else {
        return 0;
    };
    // SAFETY: `pending` points at a live map value of this thread's; copy it before removing.
    let pending = unsafe { *pending };
    let _ = PENDING_FDS.remove(pid_tgid);
    let ret = field::<i64>(&ctx, RET);
    if pending.syscall_nr != field::<i32>(&ctx, SYSCALL_NR) as u32 || ret < 0 {
        return 0;
    }
    let tgid = tgid_of(pid_tgid);
    let now = now();
    let gpu_fd = GpuFd {
        since_ns: now,
        source: pending.source,
        _pad: 0,
    };
    let _ = GPU_FDS.insert(
        FdKey {
            tgid,
            fd: ret as u32,
        },
        gpu_fd,
        0,
    );
    let _ = touch_proc(tgid, now);
    0
}

/// `sys_enter_close`.
#[tracepoint]
pub fn fd_close_enter(ctx: TracePointContext) -> u32 {
    let tgid = tgid_of(bpf_get_current_pid_tgid());
    let _ = GPU_FDS.remove(FdKey {
        tgid,
        fd: field::<u64>(&ctx, ARG0) as u32,
    });
    0
}

/// `sys_enter_ioctl`: note the start of an ioctl on a GPU descriptor.
#[tracepoint]
pub fn ioctl_enter(ctx: TracePointContext) -> u32 {
    let pid_tgid = bpf_get_current_pid_tgid();
    let key = FdKey {
        tgid: tgid_of(pid_tgid),
        fd: field::<u64>(&ctx, ARG0) as u32,
    };
    let Some(gpu_fd) = GPU_FDS.get_ptr(key) else {
        return 0;
    };
    // SAFETY: a live map value; only read.
    let since = unsafe { (*gpu_fd).since_ns };
    if let Some(p) = PROCS.get_ptr(key.tgid) {
        // SAFETY: a live map value; only read.
        if since < unsafe { (*p).exec_ns } {
            // Learned before the process's last execve: that descriptor is gone.
            let _ = GPU_FDS.remove(key);
            return 0;
        }
    }
    let start = IoctlStart {
        start_ns: now(),
        cmd: field::<u64>(&ctx, ARG1) as u32,
        active: 1,
    };
    match IN_FLIGHT.get_ptr_mut(pid_tgid) {
        // SAFETY: this thread's own entry, a live map value; only this thread writes it.
        Some(slot) => unsafe { *slot = start },
        None => {
            let _ = IN_FLIGHT.insert(pid_tgid, start, 0);
        }
    }
    0
}

/// `sys_exit_ioctl`: account a finished ioctl on a GPU descriptor.
#[tracepoint]
pub fn ioctl_exit(ctx: TracePointContext) -> u32 {
    let pid_tgid = bpf_get_current_pid_tgid();
    let Some(slot) = IN_FLIGHT.get_ptr_mut(pid_tgid) else {
        return 0;
    };
    // SAFETY: this thread's own entry, a live map value; only this thread writes it.
    let start = unsafe { *slot };
    if start.active == 0 {
        return 0;
    }
    // SAFETY: as above.
    unsafe { (*slot).active = 0 };
    let now = now();
    let took = now.saturating_sub(start.start_ns);
    let failed = field::<i64>(&ctx, RET) < 0;
    let key = IoctlKey {
        tgid: tgid_of(pid_tgid),
        cmd: start.cmd,
    };
    if let Some(stat) = IOCTL_STATS.get_ptr_mut(key) {
        // SAFETY: `stat` points at a live map value; counters change only by atomic adds and
        // `last_ns` by a plain 8-byte store. The process's `last_ns` in PROCS is left alone on
        // this hot path: user space takes the latest of its commands' `last_ns`.
        unsafe {
            add(&raw mut (*stat).count, 1);
            add(&raw mut (*stat).total_ns, took);
            if failed {
                add(&raw mut (*stat).errors, 1);
            }
            (*stat).last_ns = now;
        }
        return 0;
    }
    let first = IoctlStat {
        count: 1,
        errors: u64::from(failed),
        total_ns: took,
        first_ns: now,
        last_ns: now,
    };
    // NOEXIST: if a racing thread inserted first, add to its entry instead of overwriting it.
    if IOCTL_STATS.insert(key, first, BPF_NOEXIST as u64).is_err()
        && let Some(stat) = IOCTL_STATS.get_ptr_mut(key)
    {
        // SAFETY: as above.
        unsafe {
            add(&raw mut (*stat).count, 1);
            add(&raw mut (*stat).total_ns, took);
            add(&raw mut (*stat).errors, u64::from(failed));
        }
    }
    // A new command: make sure the process has its PROCS entry (LRU may have evicted it).
    let _ = touch_proc(key.tgid, now);
    0
}

/// `sched_process_exec`: descriptors learned before now are stale (see [`GpuFd::since_ns`]).
#[tracepoint]
pub fn process_exec(_ctx: TracePointContext) -> u32 {
    let tgid = tgid_of(bpf_get_current_pid_tgid());
    if let Some(p) = PROCS.get_ptr_mut(tgid) {
        let now = now();
        // SAFETY: a live map value; plain stores, and the comm is the new program's.
        unsafe {
            (*p).exec_ns = now;
            (*p).last_ns = now;
            if let Ok(comm) = bpf_get_current_comm() {
                (*p).comm = comm;
            }
        }
    }
    0
}

/// `sched_process_exit`: forget the thread's in-flight state; when the whole process is gone,
/// mark its entry exited, so user space reads its last figures once and then sweeps its
/// descriptors and ioctl totals.
#[tracepoint]
pub fn process_exit(ctx: TracePointContext) -> u32 {
    let pid_tgid = bpf_get_current_pid_tgid();
    let _ = IN_FLIGHT.remove(pid_tgid);
    let _ = PENDING_FDS.remove(pid_tgid);
    let tgid = tgid_of(pid_tgid);
    let group_dead = match CONFIG.get(0) {
        Some(cfg) if cfg.exit_group_dead_offset != 0 => {
            // SAFETY: the offset comes from this kernel's format file for this tracepoint;
            // bpf_probe_read_kernel fails cleanly rather than fault.
            unsafe { ctx.read_at::<u8>(cfg.exit_group_dead_offset as usize) }
                .is_ok_and(|dead| dead != 0)
        }
        // Without `group_dead`, the leader thread's exit stands for the process's.
        _ => pid_tgid as u32 == tgid,
    };
    if group_dead && let Some(p) = PROCS.get_ptr_mut(tgid) {
        // SAFETY: a live map value; plain stores.
        unsafe {
            (*p).exited = 1;
            (*p).last_ns = now();
        }
    }
    0
}

/// Counts one call of a probed libcuda function in the field `pick` selects.
#[inline(always)]
fn count_cuda_call(pick: fn(*mut ProcInfo) -> *mut u64) -> u32 {
    let tgid = tgid_of(bpf_get_current_pid_tgid());
    if let Some(p) = touch_proc(tgid, now()) {
        add(pick(p), 1);
    }
    0
}

/// `cuLaunchKernel` and its variants.
#[uprobe]
pub fn cuda_launch(_ctx: ProbeContext) -> u32 {
    // SAFETY (all four): `p` comes from `touch_proc`, a live map value; only a field address
    // is taken.
    count_cuda_call(|p| unsafe { &raw mut (*p).launches })
}

/// `cuMemAlloc_v2` and its variants.
#[uprobe]
pub fn cuda_alloc(_ctx: ProbeContext) -> u32 {
    count_cuda_call(|p| unsafe { &raw mut (*p).allocs })
}

/// `cuMemFree_v2` and its variants.
#[uprobe]
pub fn cuda_free(_ctx: ProbeContext) -> u32 {
    count_cuda_call(|p| unsafe { &raw mut (*p).frees })
}

/// `cuCtxCreate*` and `cuDevicePrimaryCtxRetain`.
#[uprobe]
pub fn cuda_ctx_create(_ctx: ProbeContext) -> u32 {
    count_cuda_call(|p| unsafe { &raw mut (*p).ctx_creates })
}

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    // Unreachable in a verified program: the verifier rejects any path that could get here.
    loop {}
}

#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 13] = *b"Dual MIT/GPL\0";
