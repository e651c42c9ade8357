//! Device memory: plain allocations, and the client arenas page-locked so that copies are
//! DMA straight from shared memory. (Clients' memory is in `chunks.rs`.)

use std::collections::BTreeMap;
use std::ffi::c_void;
use std::sync::Mutex;

use cudarc::driver::result as cu;
use cudarc::driver::sys;
use gpushare_protocol::DevicePtr;

use super::error::{self, driver};
use crate::device::{DeviceError, DeviceResult};
use crate::shm::ArenaSlice;

/// Allocates `bytes` of device memory; the caller has bound the context.
pub(super) fn alloc(bytes: u64) -> DeviceResult<DevicePtr> {
    let n = usize::try_from(bytes).map_err(|_| DeviceError::OutOfMemory)?;
    // SAFETY: plain allocation with our context current.
    unsafe { cu::malloc_sync(n) }.map_err(|e| driver("cuMemAlloc", e))
}

/// Frees a plain allocation; the caller has bound the context.
pub(super) fn free(ptr: DevicePtr) -> DeviceResult<()> {
    // SAFETY: the session only frees pointers this device returned for that client.
    unsafe { cu::free_sync(ptr) }.map_err(|e| driver("cuMemFree", e))
}

/// Free and total memory of the device; the caller has bound the context.
pub(super) fn info() -> DeviceResult<(u64, u64)> {
    let (mut free, mut total) = (0usize, 0usize);
    // SAFETY: out-parameters on our stack, our context current.
    unsafe { sys::cuMemGetInfo_v2(&mut free, &mut total) }
        .result()
        .map_err(|e| driver("cuMemGetInfo", e))?;
    Ok((free as u64, total as u64))
}

/// Unlocks an arena [`PinnedArenas::register`] page-locked; the caller has bound the context.
pub(super) fn unpin(arena: ArenaSlice<'_>) {
    // SAFETY: called only for an arena `register` page-locked (`forget` said so), once every
    // stream that copied from it was synchronized.
    let _ = unsafe { sys::cuMemHostUnregister(arena.as_ptr() as *mut c_void) };
}

/// The client arenas that are page-locked: copies from them can be asynchronous.
#[derive(Default)]
pub(super) struct PinnedArenas {
    /// Base address → length.
    by_base: Mutex<BTreeMap<usize, usize>>,
}

impl PinnedArenas {
    /// Page-locks `arena`; the caller has bound the context. Copies still work from pageable
    /// memory, just slower, so a failure is said and otherwise ignored.
    pub(super) fn register(&self, arena: ArenaSlice<'_>) {
        // SAFETY: the arena is a live, page-aligned mapping that stays mapped until
        // `unregister_arena` (the session calls it before dropping the region).
        let r = unsafe {
            sys::cuMemHostRegister_v2(
                arena.as_ptr() as *mut c_void,
                arena.len(),
                sys::CU_MEMHOSTREGISTER_PORTABLE,
            )
        };
        match r.result() {
            Ok(()) => self.insert(arena.as_ptr() as usize, arena.len()),
            Err(e) => {
                tracing::warn!(error = %error::describe("cuMemHostRegister", e), "arena not page-locked; copies will be staged by the driver")
            }
        }
    }

    /// Page-locks a client's shared host region for DMA and device access; returns the
    /// device address of its start. The caller has bound the context.
    pub(super) fn register_host(&self, region: ArenaSlice<'_>) -> DeviceResult<u64> {
        let p = region.as_ptr() as *mut c_void;
        // SAFETY: a live, page-aligned mapping of a sealed memfd that stays mapped until
        // `unregister_host`.
        let r = unsafe {
            sys::cuMemHostRegister_v2(
                p,
                region.len(),
                sys::CU_MEMHOSTREGISTER_PORTABLE | sys::CU_MEMHOSTREGISTER_DEVICEMAP,
            )
        };
        r.result().map_err(|e| driver("cuMemHostRegister", e))?;
        let mut dptr = 0;
        // SAFETY: registered just above; out-parameter on our stack.
        let r = unsafe { sys::cuMemHostGetDevicePointer_v2(&mut dptr, p, 0) };
        if let Err(e) = r.result() {
            // SAFETY: registered just above.
            let _ = unsafe { sys::cuMemHostUnregister(p) };
            return Err(driver("cuMemHostGetDevicePointer", e));
        }
        self.insert(region.as_ptr() as usize, region.len());
        Ok(dptr)
    }

    fn insert(&self, base: usize, len: usize) {
        self.lock().insert(base, len);
    }

    /// Forgets the arena at `base`; whether it was page-locked (and must be unlocked).
    pub(super) fn forget(&self, base: usize) -> bool {
        self.lock().remove(&base).is_some()
    }

    /// Whether `[ptr, ptr+len)` lies in one page-locked arena.
    #[inline]
    pub(super) fn contains(&self, ptr: *const u8, len: usize) -> bool {
        let p = ptr as usize;
        self.lock()
            .range(..=p)
            .next_back()
            .is_some_and(|(&base, &size)| p + len <= base + size)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<usize, usize>> {
        self.by_base.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn arenas(ranges: &[(usize, usize)]) -> PinnedArenas {
        let pinned = PinnedArenas::default();
        for &(base, len) in ranges {
            pinned.insert(base, len);
        }
        pinned
    }

    fn contains(pinned: &PinnedArenas, ptr: usize, len: usize) -> bool {
        pinned.contains(ptr as *const u8, len)
    }

    #[test]
    fn a_range_is_pinned_only_if_one_arena_holds_all_of_it() {
        let pinned = arenas(&[(0x1000, 0x1000), (0x2000, 0x1000), (0x8000, 0x100)]);
        assert!(contains(&pinned, 0x1000, 0x1000), "the whole arena");
        assert!(contains(&pinned, 0x1800, 0x10), "inside");
        assert!(contains(&pinned, 0x2fff, 1), "the last byte");
        assert!(
            !contains(&pinned, 0xfff, 2),
            "starts before the first arena"
        );
        assert!(
            !contains(&pinned, 0x1800, 0x1000),
            "runs into the next arena"
        );
        assert!(!contains(&pinned, 0x3000, 1), "just past an arena");
        assert!(!contains(&pinned, 0x7000, 0x10), "between arenas");
        assert!(!contains(&pinned, 0x80f0, 0x20), "runs past the last arena");
    }

    #[test]
    fn a_forgotten_arena_is_no_longer_pinned() {
        let pinned = arenas(&[(0x1000, 0x1000)]);
        assert!(!pinned.forget(0x1800), "forget takes the base address");
        assert!(pinned.forget(0x1000));
        assert!(!contains(&pinned, 0x1000, 1));
        assert!(!pinned.forget(0x1000), "forgotten once");
    }
}
