//! The allocation entry points: each reserves its size against the quota before the driver
//! is called, and each free gives back exactly what its allocation reserved.

#![allow(non_snake_case)]

use std::ffi::{c_uint, c_void};

use crate::abi::{
    CUDA_ERROR_NOT_INITIALIZED, CUDA_ERROR_OUT_OF_MEMORY, CUDA_SUCCESS, CUdeviceptr, CUresult, Ptr,
};
use crate::governor::{self, Admission};
use crate::real::real;
use crate::sizes::{Sizes, handles, pointers};

/// Reserves `bytes`, runs the real allocation, and records it under the key it produced (or
/// gives the reservation back when it failed).
fn allocate(
    bytes: u64,
    table: &Sizes,
    call: impl FnOnce() -> CUresult,
    key: impl FnOnce() -> Option<u64>,
) -> CUresult {
    match governor::reserve(bytes) {
        Admission::Refused => return CUDA_ERROR_OUT_OF_MEMORY,
        Admission::Failed(code) => return code,
        Admission::Unmanaged => return call(),
        Admission::Reserved => {}
    }
    let r = call();
    match (r, key()) {
        (CUDA_SUCCESS, Some(k)) => table.insert(k, bytes),
        _ => governor::release(bytes),
    }
    r
}

/// Runs the real free of `key` and gives back what its allocation reserved. The record is
/// taken first, so that the same address allocated again meanwhile by another thread keeps
/// its own, and put back if the driver refuses the free.
fn free(key: u64, table: &Sizes, call: impl FnOnce() -> CUresult) -> CUresult {
    let held = table.remove(key);
    let r = call();
    match (r, held) {
        (CUDA_SUCCESS, Some(bytes)) => governor::release(bytes),
        (_, Some(bytes)) => table.insert(key, bytes),
        _ => {}
    }
    r
}

/// Reads the address a successful allocation wrote.
fn written(dptr: *mut CUdeviceptr) -> Option<u64> {
    // SAFETY: the driver just wrote a device pointer there (the caller's out-parameter).
    (!dptr.is_null()).then(|| unsafe { dptr.read() })
}

/// # Safety
/// As libcuda's `cuMemAlloc_v2`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAlloc_v2(dptr: *mut CUdeviceptr, bytesize: usize) -> CUresult {
    let Some(f) = real!(cuMemAlloc_v2: unsafe extern "C" fn(*mut CUdeviceptr, usize) -> CUresult)
    else {
        return CUDA_ERROR_NOT_INITIALIZED;
    };
    // SAFETY: forwarded as received.
    let call = || unsafe { f(dptr, bytesize) };
    allocate(bytesize as u64, pointers(), call, || written(dptr))
}

/// What a pitched allocation reserves: `width` rounded up to 512 bytes (the widest pitch
/// alignment) per row, since the pitch is known only after the call.
fn pitched_bytes(width_in_bytes: usize, height: usize) -> u64 {
    (width_in_bytes as u64)
        .div_ceil(512)
        .saturating_mul(512)
        .saturating_mul(height as u64)
}

/// Reserves `pitched_bytes`.
///
/// # Safety
/// As libcuda's `cuMemAllocPitch_v2`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAllocPitch_v2(
    dptr: *mut CUdeviceptr,
    p_pitch: *mut usize,
    width_in_bytes: usize,
    height: usize,
    element_size_bytes: c_uint,
) -> CUresult {
    let Some(f) = real!(cuMemAllocPitch_v2: unsafe extern "C" fn(*mut CUdeviceptr, *mut usize, usize, usize, c_uint) -> CUresult)
    else {
        return CUDA_ERROR_NOT_INITIALIZED;
    };
    let bytes = pitched_bytes(width_in_bytes, height);
    // SAFETY: forwarded as received.
    let call = || unsafe { f(dptr, p_pitch, width_in_bytes, height, element_size_bytes) };
    allocate(bytes, pointers(), call, || written(dptr))
}

/// # Safety
/// As libcuda's `cuMemFree_v2`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemFree_v2(dptr: CUdeviceptr) -> CUresult {
    let Some(f) = real!(cuMemFree_v2: unsafe extern "C" fn(CUdeviceptr) -> CUresult) else {
        return CUDA_ERROR_NOT_INITIALIZED;
    };
    // SAFETY: forwarded as received.
    free(dptr, pointers(), || unsafe { f(dptr) })
}

/// # Safety
/// As libcuda's `cuMemAllocManaged`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAllocManaged(
    dptr: *mut CUdeviceptr,
    bytesize: usize,
    flags: c_uint,
) -> CUresult {
    let Some(f) =
        real!(cuMemAllocManaged: unsafe extern "C" fn(*mut CUdeviceptr, usize, c_uint) -> CUresult)
    else {
        return CUDA_ERROR_NOT_INITIALIZED;
    };
    // SAFETY: forwarded as received.
    let call = || unsafe { f(dptr, bytesize, flags) };
    allocate(bytesize as u64, pointers(), call, || written(dptr))
}

macro_rules! alloc_async {
    ($name:ident) => {
        /// # Safety
        /// As libcuda's function of this name.
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name(
            dptr: *mut CUdeviceptr,
            bytesize: usize,
            h_stream: Ptr,
        ) -> CUresult {
            let Some(f) = real!($name: unsafe extern "C" fn(*mut CUdeviceptr, usize, Ptr) -> CUresult)
            else {
                return CUDA_ERROR_NOT_INITIALIZED;
            };
            // SAFETY: forwarded as received.
            let call = || unsafe { f(dptr, bytesize, h_stream) };
            allocate(bytesize as u64, pointers(), call, || written(dptr))
        }
    };
}
alloc_async!(cuMemAllocAsync);
alloc_async!(cuMemAllocAsync_ptsz);

macro_rules! alloc_from_pool {
    ($name:ident) => {
        /// # Safety
        /// As libcuda's function of this name.
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name(
            dptr: *mut CUdeviceptr,
            bytesize: usize,
            pool: Ptr,
            h_stream: Ptr,
        ) -> CUresult {
            let Some(f) = real!($name: unsafe extern "C" fn(*mut CUdeviceptr, usize, Ptr, Ptr) -> CUresult)
            else {
                return CUDA_ERROR_NOT_INITIALIZED;
            };
            // SAFETY: forwarded as received.
            let call = || unsafe { f(dptr, bytesize, pool, h_stream) };
            allocate(bytesize as u64, pointers(), call, || written(dptr))
        }
    };
}
alloc_from_pool!(cuMemAllocFromPoolAsync);
alloc_from_pool!(cuMemAllocFromPoolAsync_ptsz);

macro_rules! free_async {
    ($name:ident) => {
        /// # Safety
        /// As libcuda's function of this name.
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name(dptr: CUdeviceptr, h_stream: Ptr) -> CUresult {
            let Some(f) = real!($name: unsafe extern "C" fn(CUdeviceptr, Ptr) -> CUresult) else {
                return CUDA_ERROR_NOT_INITIALIZED;
            };
            // SAFETY: forwarded as received.
            free(dptr, pointers(), || unsafe { f(dptr, h_stream) })
        }
    };
}
free_async!(cuMemFreeAsync);
free_async!(cuMemFreeAsync_ptsz);

/// Physical memory of the virtual memory management API, counted by its handle.
///
/// # Safety
/// As libcuda's `cuMemCreate`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemCreate(
    handle: *mut u64,
    size: usize,
    prop: *const c_void,
    flags: u64,
) -> CUresult {
    let Some(f) =
        real!(cuMemCreate: unsafe extern "C" fn(*mut u64, usize, *const c_void, u64) -> CUresult)
    else {
        return CUDA_ERROR_NOT_INITIALIZED;
    };
    // SAFETY: forwarded as received.
    let call = || unsafe { f(handle, size, prop, flags) };
    // SAFETY: on success the driver wrote the new handle there.
    let key = || (!handle.is_null()).then(|| unsafe { handle.read() });
    allocate(size as u64, handles(), call, key)
}

/// # Safety
/// As libcuda's `cuMemRelease`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemRelease(handle: u64) -> CUresult {
    let Some(f) = real!(cuMemRelease: unsafe extern "C" fn(u64) -> CUresult) else {
        return CUDA_ERROR_NOT_INITIALIZED;
    };
    // SAFETY: forwarded as received.
    free(handle, handles(), || unsafe { f(handle) })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pitched_allocation_reserves_whole_aligned_rows() {
        assert_eq!(pitched_bytes(1, 1), 512);
        assert_eq!(pitched_bytes(512, 3), 3 * 512);
        assert_eq!(pitched_bytes(513, 2), 2 * 1024);
        assert_eq!(pitched_bytes(0, 100), 0);
        assert_eq!(pitched_bytes(usize::MAX, usize::MAX), u64::MAX);
    }

    // Outside a governed program the governor holds no reservations, so only the record
    // of what each allocation reserved changes here.
    #[test]
    fn a_free_the_driver_refuses_keeps_its_record() {
        let table = Sizes::new();
        table.insert(0x7000, 4096);
        assert_eq!(free(0x7000, &table, || 1), 1);
        assert_eq!(table.remove(0x7000), Some(4096), "still recorded");
        table.insert(0x7000, 4096);
        assert_eq!(free(0x7000, &table, || CUDA_SUCCESS), CUDA_SUCCESS);
        assert_eq!(table.remove(0x7000), None, "released");
        // A pointer never recorded (allocated before the program was governed) frees too.
        assert_eq!(free(0x9000, &table, || CUDA_SUCCESS), CUDA_SUCCESS);
    }

    #[test]
    fn only_a_written_address_is_read() {
        assert_eq!(written(std::ptr::null_mut()), None);
        let mut at: CUdeviceptr = 0xdead_0000;
        assert_eq!(written(&mut at), Some(0xdead_0000));
    }
}
