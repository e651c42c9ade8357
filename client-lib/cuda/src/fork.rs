//! What a forked child of a process that called `cuInit` gets, as NVIDIA's driver gives it
//! (driver 580 on the H200, `scripts/probes/fork_pinned.c`): no CUDA (every call, `cuInit`
//! too, returns `CUDA_ERROR_NOT_INITIALIZED`); the memory of `cuMemAllocHost` and
//! `cuMemHostAlloc` shared with the parent, a write of either seen by the other; and
//! `cuMemHostRegister`ed memory its own copy, like the rest of its memory. Here registered
//! pages live in a shared mapping, so the child copies them into a private one.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::sync::RwLockReadGuard;

use crate::driver;
use crate::memory::HostRegion;
use crate::memory::host::make_private;

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
                make_private(addr, region.len);
            }
        }
    });
    driver::forget_in_child();
}
