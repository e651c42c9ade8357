//! The virtual memory API's entry points (`cuMemCreate`, `cuMemAddressReserve`, `cuMemMap`
//! …): see `vmm.rs` for what the process keeps, and the broker's `pool/reserved.rs` for where
//! the memory lives.

use std::ffi::{c_uint, c_ulonglong, c_void};

use super::vmm::{AccessDesc, AllocationProp, HANDLE_POSIX_FD, Location, posix_handles_only};
use crate::driver;
use crate::status::{entry, out};
use crate::types::{CUdeviceptr, CUresult, result};

/// `CUmemGenericAllocationHandle`.
pub type MemHandle = c_ulonglong;

/// A handle as the program holds it: its device's session's own number, and the device's
/// ordinal + 1 in the low byte (each device's session numbers its handles from 1, so one
/// device's handle must never be taken for another's).
fn tag(d: &driver::Driver, handle: u64) -> MemHandle {
    (handle << 8) | ((d.device as u64 + 1) & 0xff)
}

/// The device's driver and its session's number for a handle the program holds.
fn untag(handle: MemHandle) -> crate::status::Cu<(&'static driver::Driver, u64)> {
    let dev = (handle & 0xff) as i32 - 1;
    if dev < 0 {
        return Err(result::INVALID_VALUE);
    }
    let first = driver::first()?;
    let d = crate::route::opened_device(first, dev).ok_or(result::INVALID_VALUE)?;
    Ok((d.intact()?, handle >> 8))
}

/// The driver whose reservation holds `[ptr, ptr + size)` (the current device's where none
/// does: it refuses the range). Address space is the process's, as in CUDA: a range is
/// mapped, unmapped and freed whichever device is current.
fn reserved_by(ptr: u64, size: u64) -> crate::status::Cu<&'static driver::Driver> {
    let first = driver::first()?;
    match crate::route::opened(first).find(|d| d.holds_reservation(ptr, size)) {
        Some(d) => d.intact(),
        None => driver::live(),
    }
}

/// Reads a property struct the program passed.
///
/// # Safety
/// `prop` is NULL or valid for reading.
unsafe fn read_prop(prop: *const AllocationProp) -> Result<AllocationProp, CUresult> {
    if prop.is_null() {
        return Err(result::INVALID_VALUE);
    }
    // SAFETY: the caller's contract; the struct may be unaligned in C's eyes, so read it so.
    Ok(unsafe { prop.read_unaligned() })
}

/// The driver of the device an allocation's properties name (the current device's for a
/// location that is none).
fn on_location(prop: &AllocationProp) -> crate::status::Cu<&'static crate::driver::Driver> {
    if prop.location.kind == super::vmm::LOCATION_DEVICE {
        crate::route::on_device(prop.location.id)
    } else {
        driver::live()
    }
}

/// # Safety
/// `granularity` is NULL or valid for writing; `prop` NULL or valid for reading.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemGetAllocationGranularity(
    granularity: *mut usize,
    prop: *const AllocationProp,
    _option: c_uint,
) -> CUresult {
    entry("cuMemGetAllocationGranularity", || {
        // SAFETY: the caller's contract.
        let prop = unsafe { read_prop(prop) }?;
        let g = on_location(&prop)?.vmm_granularity(&prop)?;
        // SAFETY: the caller's contract.
        unsafe { out(granularity, g as usize) }
    })
}

/// # Safety
/// `ptr` is NULL or valid for writing.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAddressReserve(
    ptr: *mut CUdeviceptr,
    size: usize,
    alignment: usize,
    addr: CUdeviceptr,
    flags: c_ulonglong,
) -> CUresult {
    entry("cuMemAddressReserve", || {
        let d = driver::live()?;
        if ptr.is_null() || flags != 0 {
            return Err(result::INVALID_VALUE);
        }
        let at = d.vmm_reserve(size as u64, alignment as u64, addr)?;
        // SAFETY: the caller's contract.
        unsafe { out(ptr, at) }
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuMemAddressFree(ptr: CUdeviceptr, size: usize) -> CUresult {
    entry("cuMemAddressFree", || {
        reserved_by(ptr, size as u64)?.vmm_unreserve(ptr, size as u64)
    })
}

/// # Safety
/// `handle` is NULL or valid for writing; `prop` NULL or valid for reading.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemCreate(
    handle: *mut MemHandle,
    size: usize,
    prop: *const AllocationProp,
    flags: c_ulonglong,
) -> CUresult {
    entry("cuMemCreate", || {
        // SAFETY: the caller's contract.
        let prop = unsafe { read_prop(prop) }?;
        if handle.is_null() || flags != 0 {
            return Err(result::INVALID_VALUE);
        }
        let d = on_location(&prop)?;
        let h = d.vmm_create(size as u64, &prop)?;
        // SAFETY: the caller's contract.
        unsafe { out(handle, tag(d, h)) }
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuMemRelease(handle: MemHandle) -> CUresult {
    entry("cuMemRelease", || {
        let (d, h) = untag(handle)?;
        d.vmm_release(h)
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuMemMap(
    ptr: CUdeviceptr,
    size: usize,
    offset: usize,
    handle: MemHandle,
    flags: c_ulonglong,
) -> CUresult {
    entry("cuMemMap", || {
        if flags != 0 {
            return Err(result::INVALID_VALUE);
        }
        let (owner, h) = untag(handle)?;
        let d = reserved_by(ptr, size as u64)?;
        if std::ptr::eq(d, owner) {
            return d.vmm_map(ptr, size as u64, offset as u64, h);
        }
        // Another device's memory in this device's range (NCCL maps a peer's buffer so):
        // taken by its descriptor, as another process would take it.
        let fd = owner.vmm_descriptor(h)?;
        // SAFETY: the descriptor `vmm_export` just opened for this process, used once here.
        let fd = unsafe { <std::os::fd::OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd) };
        let theirs = d.vmm_import(std::os::fd::AsRawFd::as_raw_fd(&fd))?;
        let mapped = d.vmm_map(ptr, size as u64, offset as u64, theirs);
        // The mapping holds the memory from now on.
        let _ = d.vmm_release(theirs);
        mapped
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuMemUnmap(ptr: CUdeviceptr, size: usize) -> CUresult {
    entry("cuMemUnmap", || {
        reserved_by(ptr, size as u64)?.vmm_unmap(ptr, size as u64)
    })
}

/// # Safety
/// `desc` is NULL or valid for reading `count` descriptors.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemSetAccess(
    ptr: CUdeviceptr,
    size: usize,
    desc: *const AccessDesc,
    count: usize,
) -> CUresult {
    entry("cuMemSetAccess", || {
        let d = reserved_by(ptr, size as u64)?;
        if desc.is_null() || count == 0 || count > 64 {
            return Err(result::INVALID_VALUE);
        }
        // SAFETY: the caller's contract; read one by one, unaligned as C may lay them out.
        let descs: Vec<AccessDesc> = (0..count)
            .map(|i| unsafe { desc.add(i).read_unaligned() })
            .collect();
        d.vmm_set_access(ptr, size as u64, &descs)
    })
}

/// # Safety
/// `flags` is NULL or valid for writing; `location` NULL or valid for reading.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemGetAccess(
    flags: *mut c_ulonglong,
    location: *const Location,
    ptr: CUdeviceptr,
) -> CUresult {
    entry("cuMemGetAccess", || {
        let d = reserved_by(ptr, 1)?;
        if location.is_null() {
            return Err(result::INVALID_VALUE);
        }
        // SAFETY: the caller's contract.
        let location = unsafe { location.read_unaligned() };
        let f = d.vmm_access(&location, ptr)?;
        // SAFETY: the caller's contract.
        unsafe { out(flags, c_ulonglong::from(f)) }
    })
}

/// # Safety
/// `handle` is NULL or valid for writing.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemRetainAllocationHandle(
    handle: *mut MemHandle,
    addr: *mut c_void,
) -> CUresult {
    entry("cuMemRetainAllocationHandle", || {
        let d = crate::route::for_pointer(addr as u64)?;
        if handle.is_null() {
            return Err(result::INVALID_VALUE);
        }
        let h = d.vmm_retain(addr as u64)?;
        // SAFETY: the caller's contract.
        unsafe { out(handle, tag(d, h)) }
    })
}

/// # Safety
/// `prop` is NULL or valid for writing.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemGetAllocationPropertiesFromHandle(
    prop: *mut AllocationProp,
    handle: MemHandle,
) -> CUresult {
    entry("cuMemGetAllocationPropertiesFromHandle", || {
        let (d, h) = untag(handle)?;
        let p = d.vmm_properties(h)?;
        if prop.is_null() {
            return Err(result::INVALID_VALUE);
        }
        // SAFETY: the caller's contract.
        unsafe { prop.write_unaligned(p) };
        Ok(())
    })
}

/// # Safety
/// `shareable` is NULL or valid for writing an `int`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemExportToShareableHandle(
    shareable: *mut c_void,
    handle: MemHandle,
    kind: c_uint,
    flags: c_ulonglong,
) -> CUresult {
    entry("cuMemExportToShareableHandle", || {
        if shareable.is_null() || flags != 0 {
            return Err(result::INVALID_VALUE);
        }
        let (d, h) = untag(handle)?;
        posix_handles_only(kind == HANDLE_POSIX_FD)?;
        let fd = d.vmm_export(h)?;
        // SAFETY: the caller's contract: a POSIX handle is an `int`.
        unsafe { out(shareable.cast::<i32>(), fd) }
    })
}

/// # Safety
/// `handle` is NULL or valid for writing; `os_handle` carries a descriptor's number.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemImportFromShareableHandle(
    handle: *mut MemHandle,
    os_handle: *mut c_void,
    kind: c_uint,
) -> CUresult {
    entry("cuMemImportFromShareableHandle", || {
        let d = driver::live()?;
        if handle.is_null() {
            return Err(result::INVALID_VALUE);
        }
        posix_handles_only(kind == HANDLE_POSIX_FD)?;
        // The descriptor's number travels in the pointer, as CUDA's samples pass it.
        let fd = i32::try_from(os_handle as usize).map_err(|_| result::INVALID_VALUE)?;
        let h = d.vmm_import(fd)?;
        // SAFETY: the caller's contract.
        unsafe { out(handle, tag(d, h)) }
    })
}
