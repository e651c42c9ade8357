//! The libcuda entry points the interposer exports, with libcuda's exact names and C ABI.
//!
//! Each asks the [`governor`](crate::governor) for admission and then calls the real function:
//! allocations reserve their size first (past the quota they fail with
//! `CUDA_ERROR_OUT_OF_MEMORY` and the driver is never called) and give it back if the driver
//! fails or when they are freed; launches take a token; synchronizations report the work done.
//! Context creation connects to the broker (as `cuInit` does) and is otherwise passed through.
//!
//! The types and codes they speak are in [`crate::abi`].
//!
//! Where each part lives: this file (initialisation and lookup, synchronization, contexts),
//! `memory.rs` (allocations and frees, and what each reserved), `launch.rs` (kernel and graph
//! launches).

#![allow(non_snake_case)]

use std::ffi::{c_char, c_int, c_uint};

use crate::abi::{
    CUDA_ERROR_NOT_FOUND, CUDA_ERROR_NOT_INITIALIZED, CUDA_SUCCESS, CUdevice, CUresult, Ptr,
};
use crate::governor;
use crate::real::real;

mod launch;
mod memory;

pub use self::launch::*;
pub use self::memory::*;

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
        return governor::init();
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
        return governor::init();
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
