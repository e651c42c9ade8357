//! Chunks: clients' device memory as physical allocations with a shareable handle (a POSIX
//! file descriptor), made through the driver's virtual memory management API and mapped into
//! a range of addresses reserved at the same place in every context that serves the same
//! clients. A context that faults takes nothing with it: the memory belongs to whoever holds a
//! descriptor or a mapping (probed on an H200: 8 GiB intact after the maker's fault and exit).
//!
//! `cuMemAddressReserve` honours its address hint only for a range on a 32 MiB boundary, so
//! the reservation is made in whole 32 MiB blocks.

use std::collections::BTreeMap;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::sync::Mutex;

use cudarc::driver::sys;

use super::error::check;
use crate::device::{DeviceError, DeviceResult};

/// Address space is reserved in blocks of this size and alignment (see the module's doc).
const VA_BLOCK: u64 = 32 << 20;

/// The chunks mapped into one context, by address.
#[derive(Default)]
pub struct Chunks {
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    /// (base, size) of the reservation, once made.
    reserved: Option<(u64, u64)>,
    /// (base, size) of other devices' reservations made here too, for their chunks (peer
    /// access).
    peers: Vec<(u64, u64)>,
    mapped: BTreeMap<u64, (u64, sys::CUmemGenericAllocationHandle)>,
}

fn location(ordinal: i32) -> sys::CUmemLocation {
    sys::CUmemLocation {
        type_: sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE,
        id: ordinal,
    }
}

fn properties(ordinal: i32) -> sys::CUmemAllocationProp {
    sys::CUmemAllocationProp {
        type_: sys::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED,
        requestedHandleTypes:
            sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
        location: location(ordinal),
        win32HandleMetaData: std::ptr::null_mut(),
        allocFlags: sys::CUmemAllocationProp_st__bindgen_ty_1 {
            compressionType: 0,
            gpuDirectRDMACapable: 0,
            usage: 0,
            reserved: [0; 4],
        },
    }
}

/// The smallest physical allocation the device makes; every method expects the device's
/// context current on the calling thread.
pub fn granularity(ordinal: i32) -> DeviceResult<u64> {
    let prop = properties(ordinal);
    let mut g = 0usize;
    // SAFETY: out-parameter on our stack, a valid property struct.
    check("cuMemGetAllocationGranularity", unsafe {
        sys::cuMemGetAllocationGranularity(
            &mut g,
            &prop,
            sys::CUmemAllocationGranularity_flags::CU_MEM_ALLOC_GRANULARITY_MINIMUM,
        )
    })?;
    if g == 0 || !g.is_power_of_two() {
        return Err(DeviceError::Failed(format!(
            "the driver reports an allocation granularity of {g} bytes"
        )));
    }
    Ok(g as u64)
}

/// Makes `size` bytes of physical memory mapped nowhere and returns its descriptor; this
/// context keeps no handle, so the memory lives while the descriptor or a mapping does.
pub fn make(ordinal: i32, size: u64) -> DeviceResult<OwnedFd> {
    let (handle, fd) = create_exported(ordinal, size)?;
    // SAFETY: our handle, never mapped; the descriptor holds the memory from now on.
    let _ = unsafe { sys::cuMemRelease(handle) };
    Ok(fd)
}

/// `cuMemCreate` and the handle's descriptor.
fn create_exported(
    ordinal: i32,
    size: u64,
) -> DeviceResult<(sys::CUmemGenericAllocationHandle, OwnedFd)> {
    let prop = properties(ordinal);
    let n = usize::try_from(size).map_err(|_| DeviceError::OutOfMemory)?;
    let mut handle: sys::CUmemGenericAllocationHandle = 0;
    // SAFETY: out-parameter; the caller checked `size` against the granularity.
    let made = unsafe { sys::cuMemCreate(&mut handle, n, &prop, 0) };
    if made == sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY {
        return Err(DeviceError::OutOfMemory);
    }
    check("cuMemCreate", made)?;
    let mut raw: libc::c_int = -1;
    // SAFETY: exporting our handle as a descriptor into an out-parameter.
    let exported = check("cuMemExportToShareableHandle", unsafe {
        sys::cuMemExportToShareableHandle(
            (&mut raw as *mut libc::c_int).cast(),
            handle,
            sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
            0,
        )
    });
    if let Err(e) = exported {
        // SAFETY: our handle, never mapped.
        let _ = unsafe { sys::cuMemRelease(handle) };
        return Err(e);
    }
    // SAFETY: the driver just opened this descriptor for us; nothing else owns it.
    Ok((handle, unsafe { OwnedFd::from_raw_fd(raw) }))
}

/// Reserves `size` bytes of address space, in whole blocks, at `hint` (0: anywhere): where,
/// and how much.
fn reserve_blocks(hint: u64, size: u64) -> DeviceResult<(u64, u64)> {
    let len = size.div_ceil(VA_BLOCK) * VA_BLOCK;
    let n = usize::try_from(len).map_err(|_| DeviceError::OutOfMemory)?;
    let mut got: sys::CUdeviceptr = 0;
    // SAFETY: an out-parameter; reserving address space touches no memory.
    check("cuMemAddressReserve", unsafe {
        sys::cuMemAddressReserve(&mut got, n, VA_BLOCK as usize, hint, 0)
    })?;
    if hint != 0 && got != hint {
        // SAFETY: the range we were just given, unused.
        let _ = unsafe { sys::cuMemAddressFree(got, n) };
        return Err(DeviceError::AddressUnavailable(format!(
            "{len} bytes at {hint:#x} are in use in this process (the driver offered {got:#x})"
        )));
    }
    Ok((got, len))
}

impl Chunks {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Reserves `size` bytes of address space at `hint` (0: anywhere), once.
    pub fn reserve(&self, hint: u64, size: u64) -> DeviceResult<u64> {
        let mut st = self.lock();
        if let Some((base, have)) = st.reserved {
            if (hint == 0 || hint == base) && have >= size {
                return Ok(base);
            }
            return Err(DeviceError::AddressUnavailable(format!(
                "this context has reserved {have} bytes at {base:#x} already"
            )));
        }
        let (got, len) = reserve_blocks(hint, size)?;
        st.reserved = Some((got, len));
        Ok(got)
    }

    /// Reserves another device's range (`size` bytes at `base`) at the same addresses, once.
    pub fn reserve_peer(&self, base: u64, size: u64) -> DeviceResult<()> {
        let mut st = self.lock();
        if st.peers.iter().any(|&(b, s)| b == base && s >= size) {
            return Ok(());
        }
        let (_, len) = reserve_blocks(base, size)?;
        st.peers.push((base, len));
        Ok(())
    }

    fn check_inside(st: &State, at: u64, size: u64) -> DeviceResult<()> {
        let within = |(base, len): (u64, u64)| {
            at >= base && at.checked_add(size).is_some_and(|end| end <= base + len)
        };
        let inside = st.reserved.is_some_and(within) || st.peers.iter().copied().any(within);
        let free = st
            .mapped
            .range(..at.saturating_add(size))
            .next_back()
            .is_none_or(|(&b, &(s, _))| b + s <= at);
        if inside && free {
            Ok(())
        } else {
            Err(DeviceError::AddressUnavailable(format!(
                "{size} bytes at {at:#x} are outside the reservation or in use"
            )))
        }
    }

    /// Maps `handle` at `at` for read and write; releases it when that fails.
    fn map(
        st: &mut State,
        ordinal: i32,
        at: u64,
        size: u64,
        handle: sys::CUmemGenericAllocationHandle,
    ) -> DeviceResult<()> {
        let n = size as usize;
        let access = sys::CUmemAccessDesc {
            location: location(ordinal),
            flags: sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
        };
        // SAFETY: `at..at + size` lies in our reservation, unmapped (checked); the handle is
        // ours.
        let mapped = check("cuMemMap", unsafe { sys::cuMemMap(at, n, 0, handle, 0) });
        let ready = mapped.and_then(|()| {
            // SAFETY: the range just mapped.
            check("cuMemSetAccess", unsafe {
                sys::cuMemSetAccess(at, n, &access, 1)
            })
            .inspect_err(|_| {
                // SAFETY: as above.
                let _ = unsafe { sys::cuMemUnmap(at, n) };
            })
        });
        match ready {
            Ok(()) => {
                st.mapped.insert(at, (size, handle));
                Ok(())
            }
            Err(e) => {
                // SAFETY: our handle, no longer mapped.
                let _ = unsafe { sys::cuMemRelease(handle) };
                Err(e)
            }
        }
    }

    /// Makes `size` bytes of physical memory, maps them at `at`; returns its descriptor.
    pub fn create(&self, ordinal: i32, at: u64, size: u64) -> DeviceResult<OwnedFd> {
        let mut st = self.lock();
        Self::check_inside(&st, at, size)?;
        let (handle, fd) = create_exported(ordinal, size)?;
        Self::map(&mut st, ordinal, at, size, handle)?;
        Ok(fd)
    }

    /// Maps memory another context made (its descriptor) at `at`.
    pub fn import(&self, ordinal: i32, at: u64, size: u64, fd: BorrowedFd<'_>) -> DeviceResult<()> {
        let mut st = self.lock();
        Self::check_inside(&st, at, size)?;
        let mut handle: sys::CUmemGenericAllocationHandle = 0;
        // The driver takes the descriptor's number as a pointer-sized value.
        let raw = fd.as_raw_fd() as usize as *mut std::ffi::c_void;
        // SAFETY: out-parameter; the descriptor is open for the call's duration.
        check("cuMemImportFromShareableHandle", unsafe {
            sys::cuMemImportFromShareableHandle(
                &mut handle,
                raw,
                sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
            )
        })?;
        Self::map(&mut st, ordinal, at, size, handle)
    }

    /// Unmaps the chunk at `at` and lets go of this context's handle.
    pub fn release(&self, at: u64) -> DeviceResult<()> {
        let mut st = self.lock();
        let (size, handle) = st
            .mapped
            .remove(&at)
            .ok_or_else(|| DeviceError::InvalidArgument(format!("no chunk at {at:#x}")))?;
        // SAFETY: our mapping of our handle; the caller's pool has nothing left in it.
        check("cuMemUnmap", unsafe { sys::cuMemUnmap(at, size as usize) })?;
        // SAFETY: our handle, unmapped now.
        check("cuMemRelease", unsafe { sys::cuMemRelease(handle) })
    }
}
