//! What a forked child of a process that called `cuInit` gets, as NVIDIA's driver gives it
//! (driver 580 on the H200, `scripts/probes/fork_pinned.c`): no CUDA (every call, `cuInit`
//! too, returns `CUDA_ERROR_NOT_INITIALIZED`); the memory of `cuMemAllocHost` and
//! `cuMemHostAlloc` shared with the parent, a write of either seen by the other; and
//! `cuMemHostRegister`ed memory its own copy, like the rest of its memory. Here registered
//! pages live in a shared mapping, so the child copies them into a private one.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::ffi::c_void;
use std::sync::RwLockReadGuard;

use crate::driver;
use crate::memory::HostRegion;

type HostTable = RwLockReadGuard<'static, BTreeMap<usize, HostRegion>>;

thread_local! {
    /// The host table, read-locked by the forking thread from just before the fork to just
    /// after, so that the child sees it whole.
    static HELD: RefCell<Option<HostTable>> = const { RefCell::new(None) };
}

/// Installs the fork handlers (once, when the driver connects).
pub fn install() {
    // SAFETY: registers plain functions; they touch only this thread's state, the driver's
    // tables under their lock, and (in the child, single-threaded) mappings and descriptors.
    unsafe { libc::pthread_atfork(Some(prepare), Some(parent), Some(child)) };
}

extern "C" fn prepare() {
    if let Ok(d) = driver::get() {
        let table = d.memory.host_table();
        HELD.with(|h| *h.borrow_mut() = Some(table));
    }
}

extern "C" fn parent() {
    HELD.with(|h| drop(h.borrow_mut().take()));
}

extern "C" fn child() {
    HELD.with(|h| {
        if let Some(table) = h.borrow_mut().take() {
            for (&addr, region) in table.iter().filter(|(_, r)| r.registered) {
                privatize(addr, region.len);
            }
        }
    });
    driver::forget_in_child();
}

/// Replaces the shared mapping at `[addr, addr + len)` with a private one holding the same
/// bytes (as of the copy: another thread of the parent may write meanwhile). Left shared if
/// no memory is left for the copy.
fn privatize(addr: usize, len: usize) {
    let prot = libc::PROT_READ | libc::PROT_WRITE;
    let flags = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS;
    // SAFETY: a fresh anonymous mapping; `addr..addr + len` is mapped (the driver's own
    // shared mapping of a registered range), and replaced whole by one of the same length.
    unsafe {
        let copy = libc::mmap(std::ptr::null_mut(), len, prot, flags, -1, 0);
        if copy == libc::MAP_FAILED {
            return;
        }
        std::ptr::copy_nonoverlapping(addr as *const u8, copy.cast::<u8>(), len);
        let fixed = libc::MREMAP_MAYMOVE | libc::MREMAP_FIXED;
        if libc::mremap(copy, len, len, fixed, addr as *mut c_void) == libc::MAP_FAILED {
            libc::munmap(copy, len);
        }
    }
}
