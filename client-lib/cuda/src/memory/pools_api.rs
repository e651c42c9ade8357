//! The memory pool entry points (see `pools.rs`).

use std::ffi::{c_int, c_uint, c_void};

use super::pools::{POOL_ACCESS, attr, on_device, pool_handle, pool_id};
use super::vmm::{ALLOCATION_PINNED, AccessDesc, Location};
use crate::driver::{self, Driver};
use crate::log::say_once;
use crate::status::{Cu, entry, out};
use crate::types::{CUdeviceptr, CUresult, result};

/// `CUmemoryPool`.
pub type CUmemoryPool = *mut c_void;

/// The part of `CUmemPoolProps` read here (its first 16 bytes).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct PoolPropsHead {
    pub kind: u32,
    pub handle_types: u32,
    pub location: Location,
}

fn live_pool(d: &Driver, pool: CUmemoryPool) -> Cu<u64> {
    pool_id(pool)
        .filter(|&id| d.pools.exists(id))
        .ok_or(result::INVALID_VALUE)
}

/// # Safety
/// `pool` is NULL or valid for writing.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceGetDefaultMemPool(
    pool: *mut CUmemoryPool,
    dev: c_int,
) -> CUresult {
    entry("cuDeviceGetDefaultMemPool", || {
        crate::route::on_device(dev)?;
        // SAFETY: the caller's contract.
        unsafe { out(pool, pool_handle(super::pools::DEFAULT_POOL)) }
    })
}

/// # Safety
/// `pool` is NULL or valid for writing.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceGetMemPool(pool: *mut CUmemoryPool, dev: c_int) -> CUresult {
    entry("cuDeviceGetMemPool", || {
        let d = crate::route::on_device(dev)?;
        // SAFETY: the caller's contract.
        unsafe { out(pool, pool_handle(d.pools.current())) }
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuDeviceSetMemPool(dev: c_int, pool: CUmemoryPool) -> CUresult {
    entry("cuDeviceSetMemPool", || {
        let d = crate::route::on_device(dev)?;
        d.pools.set_current(live_pool(d, pool)?)
    })
}

/// The pool of pinned memory at a location (CUDA 13's forms of the three above).
///
/// # Safety
/// `location` is NULL or valid for reading.
unsafe fn device_location(location: *const Location, kind: c_uint) -> Cu<()> {
    if location.is_null() {
        return Err(result::INVALID_VALUE);
    }
    if kind != ALLOCATION_PINNED {
        say_once("memory pools of managed memory are not supported");
        return Err(result::NOT_SUPPORTED);
    }
    // SAFETY: the caller's contract.
    on_device(&unsafe { location.read_unaligned() })
}

/// # Safety
/// `pool` is NULL or valid for writing; `location` NULL or valid for reading.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemGetDefaultMemPool(
    pool: *mut CUmemoryPool,
    location: *const Location,
    kind: c_uint,
) -> CUresult {
    entry("cuMemGetDefaultMemPool", || {
        driver::live()?;
        // SAFETY: the caller's contract.
        unsafe {
            device_location(location, kind)?;
            out(pool, pool_handle(super::pools::DEFAULT_POOL))
        }
    })
}

/// # Safety
/// As `cuMemGetDefaultMemPool`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemGetMemPool(
    pool: *mut CUmemoryPool,
    location: *const Location,
    kind: c_uint,
) -> CUresult {
    entry("cuMemGetMemPool", || {
        let d = driver::live()?;
        // SAFETY: the caller's contract.
        unsafe {
            device_location(location, kind)?;
            out(pool, pool_handle(d.pools.current()))
        }
    })
}

/// # Safety
/// `location` is NULL or valid for reading.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemSetMemPool(
    location: *const Location,
    kind: c_uint,
    pool: CUmemoryPool,
) -> CUresult {
    entry("cuMemSetMemPool", || {
        let d = driver::live()?;
        // SAFETY: the caller's contract.
        unsafe { device_location(location, kind)? };
        d.pools.set_current(live_pool(d, pool)?)
    })
}

/// # Safety
/// `pool` is NULL or valid for writing; `props` NULL or valid for reading.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemPoolCreate(
    pool: *mut CUmemoryPool,
    props: *const PoolPropsHead,
) -> CUresult {
    entry("cuMemPoolCreate", || {
        let d = driver::live()?;
        if props.is_null() || pool.is_null() {
            return Err(result::INVALID_VALUE);
        }
        // SAFETY: the caller's contract.
        let p = unsafe { props.read_unaligned() };
        if p.kind != ALLOCATION_PINNED {
            say_once("memory pools of managed memory are not supported");
            return Err(result::NOT_SUPPORTED);
        }
        on_device(&p.location)?;
        if p.handle_types != 0 {
            say_once("memory pools shared with other processes are not supported");
            return Err(result::NOT_SUPPORTED);
        }
        // SAFETY: the caller's contract.
        unsafe { out(pool, pool_handle(d.pools.create())) }
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuMemPoolDestroy(pool: CUmemoryPool) -> CUresult {
    entry("cuMemPoolDestroy", || {
        let d = driver::live()?;
        d.pools.destroy(live_pool(d, pool)?)
    })
}

/// # Safety
/// `value` points at what the attribute takes (an `int` for the reuse flags, else a
/// `cuuint64_t`).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemPoolSetAttribute(
    pool: CUmemoryPool,
    attribute: c_int,
    value: *mut c_void,
) -> CUresult {
    entry("cuMemPoolSetAttribute", || {
        let d = driver::live()?;
        let id = live_pool(d, pool)?;
        if value.is_null() {
            return Err(result::INVALID_VALUE);
        }
        // SAFETY: the caller's contract: the attribute's type.
        let v = unsafe {
            if attribute <= attr::REUSE_ALLOW_INTERNAL_DEPENDENCIES {
                value.cast::<c_int>().read_unaligned() as u64
            } else {
                value.cast::<u64>().read_unaligned()
            }
        };
        d.pools.set(id, attribute, v)
    })
}

/// # Safety
/// As `cuMemPoolSetAttribute`, for writing.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemPoolGetAttribute(
    pool: CUmemoryPool,
    attribute: c_int,
    value: *mut c_void,
) -> CUresult {
    entry("cuMemPoolGetAttribute", || {
        let d = driver::live()?;
        let id = live_pool(d, pool)?;
        let v = d.pools.get(id, attribute)?;
        if value.is_null() {
            return Err(result::INVALID_VALUE);
        }
        // SAFETY: the caller's contract: the attribute's type.
        unsafe {
            if attribute <= attr::REUSE_ALLOW_INTERNAL_DEPENDENCIES {
                value.cast::<c_int>().write_unaligned(v as c_int)
            } else {
                value.cast::<u64>().write_unaligned(v)
            }
        }
        Ok(())
    })
}

/// Nothing is held beyond what is allocated: there is nothing to give back.
#[unsafe(no_mangle)]
pub extern "C" fn cuMemPoolTrimTo(pool: CUmemoryPool, _keep: usize) -> CUresult {
    entry("cuMemPoolTrimTo", || {
        let d = driver::live()?;
        live_pool(d, pool).map(drop)
    })
}

/// # Safety
/// `descs` is NULL or valid for reading `count` descriptors.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemPoolSetAccess(
    pool: CUmemoryPool,
    descs: *const AccessDesc,
    count: usize,
) -> CUresult {
    entry("cuMemPoolSetAccess", || {
        let d = driver::live()?;
        live_pool(d, pool)?;
        if descs.is_null() || count == 0 || count > 64 {
            return Err(result::INVALID_VALUE);
        }
        for i in 0..count {
            // SAFETY: the caller's contract; unaligned as C may lay them out.
            let desc = unsafe { descs.add(i).read_unaligned() };
            on_device(&desc.location)?;
            // The device's own access is read and write, and stays so.
            if desc.flags != POOL_ACCESS {
                return Err(result::INVALID_VALUE);
            }
        }
        Ok(())
    })
}

/// # Safety
/// `flags` is NULL or valid for writing; `location` NULL or valid for reading.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemPoolGetAccess(
    flags: *mut c_uint,
    pool: CUmemoryPool,
    location: *const Location,
) -> CUresult {
    entry("cuMemPoolGetAccess", || {
        let d = driver::live()?;
        live_pool(d, pool)?;
        if location.is_null() {
            return Err(result::INVALID_VALUE);
        }
        // SAFETY: the caller's contract.
        on_device(&unsafe { location.read_unaligned() })?;
        // SAFETY: the caller's contract.
        unsafe { out(flags, POOL_ACCESS) }
    })
}

/// On the stream's device.
fn alloc_from(
    dptr: *mut CUdeviceptr,
    bytes: usize,
    pool: Option<CUmemoryPool>,
    stream: *mut c_void,
) -> Cu<()> {
    let d = crate::route::by_stream(stream)?;
    if dptr.is_null() {
        return Err(result::INVALID_VALUE);
    }
    let id = match pool {
        Some(p) => live_pool(d, p)?,
        None => d.pools.current(),
    };
    let ptr = d.alloc_from_pool(id, bytes as u64)?;
    // SAFETY: checked non-NULL; the caller's contract.
    unsafe { out(dptr, ptr) }
}

/// # Safety
/// `dptr` is NULL or valid for writing.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAllocFromPoolAsync(
    dptr: *mut CUdeviceptr,
    bytes: usize,
    pool: CUmemoryPool,
    stream: *mut c_void,
) -> CUresult {
    entry("cuMemAllocFromPoolAsync", || {
        alloc_from(dptr, bytes, Some(pool), stream)
    })
}

/// # Safety
/// As `cuMemAllocFromPoolAsync`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAllocFromPoolAsync_ptsz(
    dptr: *mut CUdeviceptr,
    bytes: usize,
    pool: CUmemoryPool,
    stream: *mut c_void,
) -> CUresult {
    entry("cuMemAllocFromPoolAsync_ptsz", || {
        alloc_from(dptr, bytes, Some(pool), stream)
    })
}

/// Stream-ordered allocation from the device's current pool, made at once (memory available
/// earlier than asked is fine).
///
/// # Safety
/// `dptr` is NULL or valid for writing.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAllocAsync(
    dptr: *mut CUdeviceptr,
    bytes: usize,
    stream: *mut c_void,
) -> CUresult {
    entry("cuMemAllocAsync", || alloc_from(dptr, bytes, None, stream))
}

/// # Safety
/// As `cuMemAllocAsync`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAllocAsync_ptsz(
    dptr: *mut CUdeviceptr,
    bytes: usize,
    stream: *mut c_void,
) -> CUresult {
    entry("cuMemAllocAsync_ptsz", || {
        alloc_from(dptr, bytes, None, stream)
    })
}
