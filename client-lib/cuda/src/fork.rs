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
    /// Every device's host table, read-locked by the forking thread from just before the fork
    /// to just after, so that the child sees them whole.
    static HELD: RefCell<Vec<HostTable>> = const { RefCell::new(Vec::new()) };
}

/// Installs the fork handlers (once, when the driver connects).
pub fn install() {
    // SAFETY: registers plain functions; they touch only this thread's state, the driver's
    // tables under their lock, and (in the child, single-threaded) mappings and descriptors.
    unsafe { libc::pthread_atfork(Some(prepare), Some(parent), Some(child)) };
}

extern "C" fn prepare() {
    if let Ok(first) = driver::first() {
        let tables: Vec<HostTable> = crate::route::opened(first)
            .map(|d| d.memory.host_table())
            .collect();
        HELD.with(|h| *h.borrow_mut() = tables);
    }
}

extern "C" fn parent() {
    HELD.with(|h| h.borrow_mut().clear());
}

extern "C" fn child() {
    HELD.with(|h| {
        for table in h.borrow_mut().drain(..) {
            let moved = |r: &&HostRegion| r.pages == crate::memory::Pages::Moved;
            for (&addr, region) in table.iter().filter(|(_, r)| moved(r)) {
                make_private(addr, region.len);
            }
        }
    });
    driver::forget_in_child();
}
