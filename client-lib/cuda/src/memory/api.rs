//! The memory entry points: allocations, page-locked host memory, pointer queries.

use std::ffi::{c_int, c_uint, c_void};

use gpushare_protocol::Command;

use super::attributes::{Pointee, pointee, write_attribute};
use super::{PAGE, Pages};
use crate::driver;
use crate::log::say_once;
use crate::status::{entry, out};
use crate::types::{CUdeviceptr, CUresult, host_mem, ptr_attr, result};

/// # Safety
/// `dptr` is NULL or valid for writing.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAlloc_v2(dptr: *mut CUdeviceptr, bytes: usize) -> CUresult {
    entry("cuMemAlloc_v2", || {
        let d = driver::live()?;
        // Before allocating: memory the program cannot be told of would stay charged to it.
        if dptr.is_null() {
            return Err(result::INVALID_VALUE);
        }
        let ptr = d.alloc(bytes as u64)?;
        // SAFETY: the caller's contract.
        unsafe { out(dptr, ptr) }
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuMemFree_v2(ptr: CUdeviceptr) -> CUresult {
    entry("cuMemFree_v2", || {
        let d = crate::route::for_pointer(ptr)?;
        if ptr == 0 {
            return Ok(());
        }
        d.free(ptr)
    })
}

/// Stream-ordered free: the broker frees once work before it is done (its free waits).
#[unsafe(no_mangle)]
pub extern "C" fn cuMemFreeAsync(ptr: CUdeviceptr, _stream: *mut c_void) -> CUresult {
    cuMemFree_v2(ptr)
}

#[unsafe(no_mangle)]
pub extern "C" fn cuMemFreeAsync_ptsz(ptr: CUdeviceptr, _stream: *mut c_void) -> CUresult {
    cuMemFree_v2(ptr)
}

/// # Safety
/// `free` and `total` are NULL or valid for writing.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemGetInfo_v2(free: *mut usize, total: *mut usize) -> CUresult {
    entry("cuMemGetInfo_v2", || {
        let d = driver::live()?;
        let (f, t) = d.transport.call(Command::MemInfo)?;
        // SAFETY: the caller's contract.
        unsafe {
            out(free, f as usize)?;
            out(total, t as usize)
        }
    })
}

/// # Safety
/// `base` and `size` are NULL or valid for writing.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemGetAddressRange_v2(
    base: *mut CUdeviceptr,
    size: *mut usize,
    ptr: CUdeviceptr,
) -> CUresult {
    entry("cuMemGetAddressRange_v2", || {
        let d = crate::route::for_pointer(ptr)?;
        let (b, r) = d.memory.device_range(ptr, 0).ok_or(result::NOT_FOUND)?;
        // SAFETY: each is NULL (allowed) or writable, by the caller's contract.
        unsafe {
            if !base.is_null() {
                out(base, b)?;
            }
            if !size.is_null() {
                out(size, r.bytes as usize)?;
            }
        }
        Ok(())
    })
}

/// # Safety
/// `pp` is NULL or valid for writing.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemHostAlloc(
    pp: *mut *mut c_void,
    bytes: usize,
    flags: c_uint,
) -> CUresult {
    entry("cuMemHostAlloc", || {
        let d = driver::live()?;
        if pp.is_null() {
            return Err(result::INVALID_VALUE);
        }
        let addr = d.pin(bytes, None, flags)?;
        // SAFETY: checked non-NULL; the caller's contract.
        unsafe { out(pp, addr as *mut c_void) }
    })
}

/// # Safety
/// `pp` is NULL or valid for writing.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAllocHost_v2(pp: *mut *mut c_void, bytes: usize) -> CUresult {
    // SAFETY: the same contract.
    unsafe { cuMemHostAlloc(pp, bytes, 0) }
}

/// # Safety
/// `p` is NULL or memory from `cuMemHostAlloc` the program no longer uses.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemFreeHost(p: *mut c_void) -> CUresult {
    entry("cuMemFreeHost", || {
        let d = crate::route::for_pointer(p as u64)?;
        let addr = p as usize;
        match d.memory.host_region_at(addr) {
            Some((base, r)) if base == addr && r.pages == Pages::Allocated => {}
            _ => return Err(result::INVALID_VALUE),
        }
        let r = d.unpin(addr)?;
        // SAFETY: the region's whole mapping, made by `cuMemHostAlloc` and now forgotten.
        unsafe { libc::munmap(p, r.len) };
        Ok(())
    })
}

/// # Safety
/// `p` points to `bytes` bytes of the program's memory.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemHostRegister_v2(
    p: *mut c_void,
    bytes: usize,
    flags: c_uint,
) -> CUresult {
    entry("cuMemHostRegister_v2", || {
        let d = driver::live()?;
        if p.is_null() || bytes == 0 {
            return Err(result::INVALID_VALUE);
        }
        if flags & host_mem::REGISTER_IOMEMORY != 0 {
            say_once("cuMemHostRegister of I/O memory is not supported");
            return Err(result::NOT_SUPPORTED);
        }
        let start = p as usize / PAGE * PAGE;
        // A range past the end of the address space is the caller's error.
        let end = (p as usize)
            .checked_add(bytes)
            .and_then(|end| end.checked_next_multiple_of(PAGE))
            .ok_or(result::INVALID_VALUE)?;
        if d.memory.host_region_at(start).is_some() || d.memory.host_region_at(end - 1).is_some() {
            return Err(result::HOST_MEMORY_ALREADY_REGISTERED);
        }
        d.pin(end - start, Some(start), flags).map(drop)
    })
}

/// # Safety
/// As `cuMemHostRegister_v2`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemHostRegister(
    p: *mut c_void,
    bytes: usize,
    flags: c_uint,
) -> CUresult {
    // SAFETY: the same contract.
    unsafe { cuMemHostRegister_v2(p, bytes, flags) }
}

/// The broker lets go of the pages; they become private memory again, contents kept (a forked
/// child then has its own copy, and the range may be registered again).
#[unsafe(no_mangle)]
pub extern "C" fn cuMemHostUnregister(p: *mut c_void) -> CUresult {
    entry("cuMemHostUnregister", || {
        let d = crate::route::for_pointer(p as u64)?;
        let addr = p as usize / PAGE * PAGE;
        match d.memory.host_region_at(addr) {
            Some((base, r)) if base == addr && r.pages != Pages::Allocated => {}
            _ => return Err(result::HOST_MEMORY_NOT_REGISTERED),
        }
        let r = d.unpin(addr)?;
        if r.pages == Pages::Moved && !super::host::make_private(addr, r.len) {
            say_once(
                "cuMemHostUnregister: no memory to make the pages private again; they stay shared with forked children",
            );
        }
        Ok(())
    })
}

/// # Safety
/// `dptr` is NULL or valid for writing.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemHostGetDevicePointer_v2(
    dptr: *mut CUdeviceptr,
    p: *mut c_void,
    flags: c_uint,
) -> CUresult {
    entry("cuMemHostGetDevicePointer_v2", || {
        let d = crate::route::for_pointer(p as u64)?;
        if flags != 0 {
            return Err(result::INVALID_VALUE);
        }
        let (base, r) = d
            .memory
            .host_region_at(p as usize)
            .ok_or(result::INVALID_VALUE)?;
        // SAFETY: the caller's contract.
        unsafe { out(dptr, r.device_ptr + (p as usize - base) as u64) }
    })
}

/// # Safety
/// `flags` is NULL or valid for writing.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemHostGetFlags(flags: *mut c_uint, p: *mut c_void) -> CUresult {
    entry("cuMemHostGetFlags", || {
        let d = crate::route::for_pointer(p as u64)?;
        let (_, r) = d
            .memory
            .host_region_at(p as usize)
            .ok_or(result::INVALID_VALUE)?;
        // SAFETY: the caller's contract.
        unsafe { out(flags, r.flags | host_mem::DEVICEMAP) }
    })
}

/// Managed (unified) memory needs page faults served across processes: not supported.
#[unsafe(no_mangle)]
pub extern "C" fn cuMemAllocManaged(
    _dptr: *mut CUdeviceptr,
    _bytes: usize,
    _flags: c_uint,
) -> CUresult {
    crate::entry::unsupported("cuMemAllocManaged")
}
/// # Safety
/// `data` is valid for writing the attribute's type.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuPointerGetAttribute(
    data: *mut c_void,
    attr: c_int,
    ptr: CUdeviceptr,
) -> CUresult {
    entry("cuPointerGetAttribute", || {
        let d = crate::route::for_pointer(ptr)?;
        if data.is_null() {
            return Err(result::INVALID_VALUE);
        }
        let p = pointee(&d.memory, ptr);
        if matches!(p, Pointee::Unknown) {
            return Err(result::INVALID_VALUE);
        }
        // SAFETY: the caller's contract.
        match unsafe { write_attribute((d.primary(), d.device), attr, &p, ptr, data) }? {
            true => Ok(()),
            false => Err(result::INVALID_VALUE),
        }
    })
}

/// Unknown pointers (pageable host memory) answer with zeros, as CUDA does.
///
/// # Safety
/// `attrs` holds `n` attributes and `data` `n` pointers, each valid for its attribute's type.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuPointerGetAttributes(
    n: c_uint,
    attrs: *const c_int,
    data: *mut *mut c_void,
    ptr: CUdeviceptr,
) -> CUresult {
    entry("cuPointerGetAttributes", || {
        let d = crate::route::for_pointer(ptr)?;
        if attrs.is_null() || data.is_null() {
            return Err(result::INVALID_VALUE);
        }
        let p = pointee(&d.memory, ptr);
        for i in 0..n as usize {
            // SAFETY: `i < n`, within both arrays by the caller's contract.
            let (attr, slot) = unsafe { (*attrs.add(i), *data.add(i)) };
            if slot.is_null() {
                continue;
            }
            // SAFETY: `slot` is valid for the attribute's type, by the contract.
            let written = unsafe { write_attribute((d.primary(), d.device), attr, &p, ptr, slot) }
                .unwrap_or(false);
            if !written {
                // SAFETY: as above; CUDA zeroes what does not apply (8 bytes covers every
                // attribute type, and each slot is at least that large).
                unsafe { slot.cast::<u64>().write(0) };
            }
        }
        Ok(())
    })
}

/// Sets an allocation attribute: only SYNC_MEMOPS, which this driver's copies always honour.
#[unsafe(no_mangle)]
pub extern "C" fn cuPointerSetAttribute(
    _value: *const c_void,
    attr: c_int,
    ptr: CUdeviceptr,
) -> CUresult {
    entry("cuPointerSetAttribute", || {
        let d = crate::route::for_pointer(ptr)?;
        d.memory.device_range(ptr, 0).ok_or(result::INVALID_VALUE)?;
        if attr == ptr_attr::SYNC_MEMOPS {
            Ok(())
        } else {
            Err(result::INVALID_VALUE)
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn before_cu_init_memory_calls_say_not_initialized() {
        let mut ptr: CUdeviceptr = 0;
        // SAFETY: valid out-parameters.
        unsafe {
            assert_eq!(cuMemAlloc_v2(&mut ptr, 4096), result::NOT_INITIALIZED);
            assert_eq!(cuMemFree_v2(0x1000), result::NOT_INITIALIZED);
            let mut host = std::ptr::null_mut();
            assert_eq!(cuMemHostAlloc(&mut host, 4096, 0), result::NOT_INITIALIZED);
            let mut kind: c_uint = 0;
            assert_eq!(
                cuPointerGetAttribute((&raw mut kind).cast(), ptr_attr::MEMORY_TYPE, 0x1000),
                result::NOT_INITIALIZED
            );
        }
        assert_eq!(ptr, 0, "nothing written");
    }

    #[test]
    fn managed_memory_is_not_supported() {
        let mut ptr: CUdeviceptr = 0;
        assert_eq!(cuMemAllocManaged(&mut ptr, 4096, 1), result::NOT_SUPPORTED);
    }
}
