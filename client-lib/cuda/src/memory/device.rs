//! Device allocations: made by the broker, each address range reserved in this process too
//! (see the parent module), and module globals, which the broker places.

use std::ffi::c_void;

use gpushare_protocol::Command;

use super::{DeviceKind, PAGE};
use crate::driver::Driver;
use crate::log::say_once;
use crate::status::Cu;
use crate::types::result;

/// Reserves `[ptr, ptr + bytes)` of this process's address space, inaccessible, so that no
/// host mapping lands there. `false` if any of it is in use.
pub(super) fn reserve_range(ptr: u64, bytes: u64) -> bool {
    let len = (bytes.max(1) as usize).div_ceil(PAGE) * PAGE;
    if !(ptr as usize).is_multiple_of(PAGE) {
        return true; // cannot reserve a partial page; device allocations are page-aligned
    }
    // SAFETY: MAP_FIXED_NOREPLACE never replaces an existing mapping; PROT_NONE memory is
    // never touched.
    let got = unsafe {
        libc::mmap(
            ptr as *mut c_void,
            len,
            libc::PROT_NONE,
            libc::MAP_PRIVATE
                | libc::MAP_ANONYMOUS
                | libc::MAP_NORESERVE
                | libc::MAP_FIXED_NOREPLACE,
            -1,
            0,
        )
    };
    if got == libc::MAP_FAILED {
        return false;
    }
    if got as u64 != ptr {
        // An old kernel without MAP_FIXED_NOREPLACE placed it elsewhere: undo.
        // SAFETY: the mapping just made, and only it.
        unsafe { libc::munmap(got, len) };
        return false;
    }
    true
}

pub(super) fn unreserve_range(ptr: u64, bytes: u64) {
    let len = (bytes.max(1) as usize).div_ceil(PAGE) * PAGE;
    // SAFETY: the range is the PROT_NONE reservation made by `reserve_range`.
    unsafe { libc::munmap(ptr as *mut c_void, len) };
}

/// How many times an allocation whose address collides with host memory is tried again.
pub(super) const PLACEMENT_TRIES: usize = 8;

impl Driver {
    /// Allocates `bytes` of device memory through the broker and reserves its address.
    pub fn alloc(&self, bytes: u64) -> Cu<u64> {
        if bytes == 0 {
            return Err(result::INVALID_VALUE);
        }
        let mut colliding = Vec::new();
        let outcome = (|| {
            for _ in 0..PLACEMENT_TRIES {
                let (ptr, _) = self.transport.call(Command::Alloc { bytes })?;
                if reserve_range(ptr, bytes) {
                    self.memory
                        .add_device(ptr, bytes, DeviceKind::Allocation, true);
                    return Ok(ptr);
                }
                // The address is in use in this process: keep it held while asking again.
                colliding.push(ptr);
            }
            say_once("device addresses collide with this process's own memory; allocation refused");
            Err(result::OUT_OF_MEMORY)
        })();
        for ptr in colliding {
            let _ = self.transport.post(Command::Free { ptr });
        }
        outcome
    }

    /// Frees an allocation by its base address.
    pub fn free(&self, ptr: u64) -> Cu<()> {
        match self.memory.device_range(ptr, 0) {
            Some((base, r)) if base == ptr && r.kind == DeviceKind::Allocation => {}
            _ => return Err(result::INVALID_VALUE),
        }
        let range = self
            .memory
            .remove_device(ptr)
            .ok_or(result::INVALID_VALUE)?;
        self.transport.post(Command::Free { ptr })?;
        self.pools.note_free(ptr);
        if range.reserved {
            unreserve_range(ptr, range.bytes);
        }
        Ok(())
    }

    /// Records a module global's device range (the broker placed it; copies may name it).
    pub fn note_global(&self, ptr: u64, bytes: u64) {
        if self.memory.device_range(ptr, bytes).is_none() {
            let reserved = reserve_range(ptr, bytes);
            self.memory
                .add_device(ptr, bytes, DeviceKind::Global, reserved);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reserved_range_keeps_host_mappings_out() {
        // Somewhere free: map and unmap to find it.
        let len = 1 << 20;
        // SAFETY: a throwaway mapping, unmapped at once.
        let probe = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_NONE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert_ne!(probe, libc::MAP_FAILED);
        // SAFETY: as above.
        unsafe { libc::munmap(probe, len) };
        let at = probe as u64;
        assert!(reserve_range(at, len as u64));
        assert!(!reserve_range(at, 4096), "taken now");
        unreserve_range(at, len as u64);
        assert!(reserve_range(at, 4096), "free again");
        unreserve_range(at, 4096);
    }
}
