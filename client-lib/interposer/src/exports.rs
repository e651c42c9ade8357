//! The libcuda entry points the interposer exports, with libcuda's exact names and C ABI.
//!
//! Each asks the [`governor`](crate::governor) for admission and then calls the real function:
//! allocations reserve their size first (past the quota they fail with
//! `CUDA_ERROR_OUT_OF_MEMORY` and the driver is never called) and give it back if the driver
//! fails or when they are freed; launches take a token; synchronizations report the work done.
//! Context creation connects to the broker (as `cuInit` does) and is otherwise passed through.
//!
//! Types follow `cuda.h` on 64-bit Linux: `CUresult` is an `int`, `CUdeviceptr` and VMM
//! handles are `unsigned long long`, every `CU*` object is an opaque pointer.

#![allow(non_snake_case, clippy::too_many_arguments)]

use std::ffi::{c_char, c_int, c_uint, c_void};
use std::sync::OnceLock;

use crate::governor::{self, Admission};
use crate::real::real;
use crate::sizes::Sizes;

pub type CUresult = c_int;
pub type CUdeviceptr = u64;
pub type CUdevice = c_int;
type Ptr = *mut c_void;

pub const CUDA_SUCCESS: CUresult = 0;
pub const CUDA_ERROR_OUT_OF_MEMORY: CUresult = 2;
pub const CUDA_ERROR_NOT_INITIALIZED: CUresult = 3;
pub const CUDA_ERROR_NOT_FOUND: CUresult = 500;

/// What live allocations reserved, by device address; VMM handles apart.
fn pointers() -> &'static Sizes {
    static S: OnceLock<Sizes> = OnceLock::new();
    S.get_or_init(Sizes::new)
}

fn handles() -> &'static Sizes {
    static S: OnceLock<Sizes> = OnceLock::new();
    S.get_or_init(Sizes::new)
}

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

fn blocks(x: c_uint, y: c_uint, z: c_uint) -> u64 {
    u64::from(x.max(1)) * u64::from(y.max(1)) * u64::from(z.max(1))
}

// ---- initialisation and lookup ---------------------------------------------------------

/// # Safety
/// As libcuda's `cuInit`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuInit(flags: c_uint) -> CUresult {
    let Some(f) = real!(cuInit: unsafe extern "C" fn(c_uint) -> CUresult) else {
        return CUDA_ERROR_NOT_INITIALIZED;
    };
    // SAFETY: forwarded as received.
    let r = unsafe { f(flags) };
    if r == CUDA_SUCCESS {
        governor::governed();
    }
    r
}

/// A `cuGetProcAddress` request, for the diagnostics.
///
/// # Safety
/// `symbol` is null or NUL-terminated.
unsafe fn proc_address<'a>(
    symbol: *const c_char,
    version: c_int,
    flags: u64,
    v2: bool,
) -> crate::debug::Lookup<'a> {
    crate::debug::Lookup::ProcAddress {
        symbol: if symbol.is_null() {
            c""
        } else {
            // SAFETY: per the contract.
            unsafe { std::ffi::CStr::from_ptr(symbol) }
        },
        version,
        flags,
        v2,
    }
}

/// `cuGetProcAddress` as CUDA 11 defined it (CUDA 12's headers call `_v2`).
///
/// # Safety
/// As libcuda's `cuGetProcAddress`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGetProcAddress(
    symbol: *const c_char,
    pfn: *mut Ptr,
    cuda_version: c_int,
    flags: u64,
) -> CUresult {
    let Some(f) = real!(cuGetProcAddress: unsafe extern "C" fn(*const c_char, *mut Ptr, c_int, u64) -> CUresult)
    else {
        return CUDA_ERROR_NOT_FOUND;
    };
    // SAFETY: forwarded as received.
    let r = unsafe { f(symbol, pfn, cuda_version, flags) };
    // SAFETY: `pfn` is the caller's out-parameter, written by the driver on success, which
    // means `symbol` was a NUL-terminated name.
    unsafe { crate::lookup::substitute(r, pfn, proc_address(symbol, cuda_version, flags, false)) };
    r
}

/// `cuGetProcAddress_v2` (CUDA 12 and 13), through which the CUDA runtime finds every driver
/// function: the real answer, with the interposer's wrapper in place of any governed one.
///
/// # Safety
/// As libcuda's `cuGetProcAddress_v2`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGetProcAddress_v2(
    symbol: *const c_char,
    pfn: *mut Ptr,
    cuda_version: c_int,
    flags: u64,
    symbol_status: *mut c_int,
) -> CUresult {
    let Some(f) = real!(cuGetProcAddress_v2: unsafe extern "C" fn(*const c_char, *mut Ptr, c_int, u64, *mut c_int) -> CUresult)
    else {
        return CUDA_ERROR_NOT_FOUND;
    };
    // SAFETY: forwarded as received.
    let r = unsafe { f(symbol, pfn, cuda_version, flags, symbol_status) };
    // SAFETY: as in `cuGetProcAddress`.
    unsafe { crate::lookup::substitute(r, pfn, proc_address(symbol, cuda_version, flags, true)) };
    r
}

// ---- memory --------------------------------------------------------------------------------

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

/// Reserves `width` rounded up to 512 bytes (the widest pitch alignment) per row, since the
/// pitch is known only after the call.
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
    let bytes = (width_in_bytes as u64)
        .div_ceil(512)
        .saturating_mul(512)
        .saturating_mul(height as u64);
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

// ---- launches ------------------------------------------------------------------------------

macro_rules! launch_kernel {
    ($name:ident) => {
        /// # Safety
        /// As libcuda's function of this name.
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name(
            f: Ptr,
            grid_x: c_uint,
            grid_y: c_uint,
            grid_z: c_uint,
            block_x: c_uint,
            block_y: c_uint,
            block_z: c_uint,
            shared_mem_bytes: c_uint,
            h_stream: Ptr,
            kernel_params: *mut Ptr,
            extra: *mut Ptr,
        ) -> CUresult {
            type Launch = unsafe extern "C" fn(
                Ptr,
                c_uint,
                c_uint,
                c_uint,
                c_uint,
                c_uint,
                c_uint,
                c_uint,
                Ptr,
                *mut Ptr,
                *mut Ptr,
            ) -> CUresult;
            let Some(real) = real!($name: Launch) else {
                return CUDA_ERROR_NOT_INITIALIZED;
            };
            governor::admit_launch(blocks(grid_x, grid_y, grid_z));
            // SAFETY: forwarded as received.
            unsafe {
                real(
                    f,
                    grid_x,
                    grid_y,
                    grid_z,
                    block_x,
                    block_y,
                    block_z,
                    shared_mem_bytes,
                    h_stream,
                    kernel_params,
                    extra,
                )
            }
        }
    };
}
launch_kernel!(cuLaunchKernel);
launch_kernel!(cuLaunchKernel_ptsz);

macro_rules! launch_cooperative {
    ($name:ident) => {
        /// # Safety
        /// As libcuda's function of this name.
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name(
            f: Ptr,
            grid_x: c_uint,
            grid_y: c_uint,
            grid_z: c_uint,
            block_x: c_uint,
            block_y: c_uint,
            block_z: c_uint,
            shared_mem_bytes: c_uint,
            h_stream: Ptr,
            kernel_params: *mut Ptr,
        ) -> CUresult {
            type Launch = unsafe extern "C" fn(
                Ptr,
                c_uint,
                c_uint,
                c_uint,
                c_uint,
                c_uint,
                c_uint,
                c_uint,
                Ptr,
                *mut Ptr,
            ) -> CUresult;
            let Some(real) = real!($name: Launch) else {
                return CUDA_ERROR_NOT_INITIALIZED;
            };
            governor::admit_launch(blocks(grid_x, grid_y, grid_z));
            // SAFETY: forwarded as received.
            unsafe {
                real(
                    f,
                    grid_x,
                    grid_y,
                    grid_z,
                    block_x,
                    block_y,
                    block_z,
                    shared_mem_bytes,
                    h_stream,
                    kernel_params,
                )
            }
        }
    };
}
launch_cooperative!(cuLaunchCooperativeKernel);
launch_cooperative!(cuLaunchCooperativeKernel_ptsz);

/// The start of `CUlaunchConfig`: the grid comes first.
#[repr(C)]
pub struct LaunchConfigHead {
    pub grid_dim_x: c_uint,
    pub grid_dim_y: c_uint,
    pub grid_dim_z: c_uint,
}

macro_rules! launch_kernel_ex {
    ($name:ident) => {
        /// # Safety
        /// As libcuda's function of this name.
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name(
            config: *const LaunchConfigHead,
            f: Ptr,
            kernel_params: *mut Ptr,
            extra: *mut Ptr,
        ) -> CUresult {
            let Some(real) =
                real!($name: unsafe extern "C" fn(*const LaunchConfigHead, Ptr, *mut Ptr, *mut Ptr) -> CUresult)
            else {
                return CUDA_ERROR_NOT_INITIALIZED;
            };
            let grid = if config.is_null() {
                1
            } else {
                // SAFETY: a non-null `config` points to the caller's CUlaunchConfig, which
                // starts with the three grid dimensions.
                let c = unsafe { &*config };
                blocks(c.grid_dim_x, c.grid_dim_y, c.grid_dim_z)
            };
            governor::admit_launch(grid);
            // SAFETY: forwarded as received.
            unsafe { real(config, f, kernel_params, extra) }
        }
    };
}
launch_kernel_ex!(cuLaunchKernelEx);
launch_kernel_ex!(cuLaunchKernelEx_ptsz);

macro_rules! graph_launch {
    ($name:ident) => {
        /// A graph counts as one launch of one block: its kernels are not visible here.
        ///
        /// # Safety
        /// As libcuda's function of this name.
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name(exec: Ptr, h_stream: Ptr) -> CUresult {
            let Some(real) = real!($name: unsafe extern "C" fn(Ptr, Ptr) -> CUresult) else {
                return CUDA_ERROR_NOT_INITIALIZED;
            };
            governor::admit_launch(1);
            // SAFETY: forwarded as received.
            unsafe { real(exec, h_stream) }
        }
    };
}
graph_launch!(cuGraphLaunch);
graph_launch!(cuGraphLaunch_ptsz);

// ---- synchronization -----------------------------------------------------------------------

/// # Safety
/// As libcuda's `cuCtxSynchronize`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxSynchronize() -> CUresult {
    let Some(real) = real!(cuCtxSynchronize: unsafe extern "C" fn() -> CUresult) else {
        return CUDA_ERROR_NOT_INITIALIZED;
    };
    // SAFETY: no arguments.
    let r = unsafe { real() };
    if r == CUDA_SUCCESS {
        governor::synchronized();
    }
    r
}

macro_rules! synchronize_one {
    ($name:ident) => {
        /// # Safety
        /// As libcuda's function of this name.
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name(object: Ptr) -> CUresult {
            let Some(real) = real!($name: unsafe extern "C" fn(Ptr) -> CUresult) else {
                return CUDA_ERROR_NOT_INITIALIZED;
            };
            // SAFETY: forwarded as received.
            let r = unsafe { real(object) };
            if r == CUDA_SUCCESS {
                governor::synchronized();
            }
            r
        }
    };
}
synchronize_one!(cuStreamSynchronize);
synchronize_one!(cuStreamSynchronize_ptsz);
synchronize_one!(cuEventSynchronize);
// CUDA 13's `cuCtxSynchronize` (it takes the context): what cuGetProcAddress hands the runtime.
synchronize_one!(cuCtxSynchronize_v2);

// ---- contexts ------------------------------------------------------------------------------

/// Runs a context creation and, when it worked, makes sure the program is registered.
fn context(r: CUresult) -> CUresult {
    if r == CUDA_SUCCESS {
        governor::governed();
    }
    r
}

/// # Safety
/// As libcuda's `cuCtxCreate_v2`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxCreate_v2(pctx: *mut Ptr, flags: c_uint, dev: CUdevice) -> CUresult {
    let Some(real) =
        real!(cuCtxCreate_v2: unsafe extern "C" fn(*mut Ptr, c_uint, CUdevice) -> CUresult)
    else {
        return CUDA_ERROR_NOT_INITIALIZED;
    };
    // SAFETY: forwarded as received.
    context(unsafe { real(pctx, flags, dev) })
}

/// # Safety
/// As libcuda's `cuCtxCreate_v3`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxCreate_v3(
    pctx: *mut Ptr,
    params: Ptr,
    num_params: c_int,
    flags: c_uint,
    dev: CUdevice,
) -> CUresult {
    let Some(real) = real!(cuCtxCreate_v3: unsafe extern "C" fn(*mut Ptr, Ptr, c_int, c_uint, CUdevice) -> CUresult)
    else {
        return CUDA_ERROR_NOT_INITIALIZED;
    };
    // SAFETY: forwarded as received.
    context(unsafe { real(pctx, params, num_params, flags, dev) })
}

/// `cuCtxCreate` of CUDA 12.5 and later (and of CUDA 13's headers).
///
/// # Safety
/// As libcuda's `cuCtxCreate_v4`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxCreate_v4(
    pctx: *mut Ptr,
    params: Ptr,
    flags: c_uint,
    dev: CUdevice,
) -> CUresult {
    let Some(real) =
        real!(cuCtxCreate_v4: unsafe extern "C" fn(*mut Ptr, Ptr, c_uint, CUdevice) -> CUresult)
    else {
        return CUDA_ERROR_NOT_INITIALIZED;
    };
    // SAFETY: forwarded as received.
    context(unsafe { real(pctx, params, flags, dev) })
}

/// The CUDA runtime's context: each process's primary context on a device.
///
/// # Safety
/// As libcuda's `cuDevicePrimaryCtxRetain`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDevicePrimaryCtxRetain(pctx: *mut Ptr, dev: CUdevice) -> CUresult {
    let Some(real) =
        real!(cuDevicePrimaryCtxRetain: unsafe extern "C" fn(*mut Ptr, CUdevice) -> CUresult)
    else {
        return CUDA_ERROR_NOT_INITIALIZED;
    };
    // SAFETY: forwarded as received.
    context(unsafe { real(pctx, dev) })
}
