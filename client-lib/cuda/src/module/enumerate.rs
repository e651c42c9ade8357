//! A module's (or library's) kernels, counted and listed (`cuModuleGetFunctionCount`,
//! `cuModuleEnumerateFunctions`, `cuLibraryGetKernelCount`, `cuLibraryEnumerateKernels`): the
//! names come from gpushared's device worker (`Driver::kernels_of`), the handles are the ones
//! `cuModuleGetFunction` gives.

use std::ffi::{c_uint, c_void};

use super::Kernel;
use crate::driver;
use crate::status::{Cu, entry, out};
use crate::types::{CUfunction, CUkernel, CUlibrary, CUmodule, CUresult, result};

fn kernels(module: *mut c_void) -> Cu<Vec<&'static Kernel>> {
    let d = driver::live()?;
    d.kernels_of(d.image(module)?)
}

/// # Safety
/// `count` is NULL or valid for writing.
unsafe fn count_of(count: *mut c_uint, module: *mut c_void) -> Cu<()> {
    let n = c_uint::try_from(kernels(module)?.len()).map_err(|_| result::UNKNOWN)?;
    // SAFETY: the caller's contract.
    unsafe { out(count, n) }
}

/// Writes up to `room` handles; CUDA fills what it has.
///
/// # Safety
/// `handles` is NULL or valid for writing `room` handles.
unsafe fn list(handles: *mut *mut c_void, room: c_uint, module: *mut c_void) -> Cu<()> {
    if handles.is_null() || room == 0 {
        return Err(result::INVALID_VALUE);
    }
    for (i, k) in kernels(module)?.into_iter().take(room as usize).enumerate() {
        // SAFETY: `i < room`, inside the caller's buffer.
        unsafe { handles.add(i).write(std::ptr::from_ref(k) as *mut c_void) };
    }
    Ok(())
}

/// # Safety
/// `count` is NULL or valid for writing.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuModuleGetFunctionCount(
    count: *mut c_uint,
    module: CUmodule,
) -> CUresult {
    // SAFETY: the caller's contract.
    entry("cuModuleGetFunctionCount", || unsafe {
        count_of(count, module)
    })
}

/// # Safety
/// `functions` is NULL or valid for writing `room` handles.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuModuleEnumerateFunctions(
    functions: *mut CUfunction,
    room: c_uint,
    module: CUmodule,
) -> CUresult {
    // SAFETY: the caller's contract.
    entry("cuModuleEnumerateFunctions", || unsafe {
        list(functions.cast(), room, module)
    })
}

/// # Safety
/// `count` is NULL or valid for writing.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuLibraryGetKernelCount(
    count: *mut c_uint,
    library: CUlibrary,
) -> CUresult {
    // SAFETY: the caller's contract (a library is a module here).
    entry("cuLibraryGetKernelCount", || unsafe {
        count_of(count, library)
    })
}

/// # Safety
/// `kernels` is NULL or valid for writing `room` handles.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuLibraryEnumerateKernels(
    kernels: *mut CUkernel,
    room: c_uint,
    library: CUlibrary,
) -> CUresult {
    // SAFETY: the caller's contract.
    entry("cuLibraryEnumerateKernels", || unsafe {
        list(kernels.cast(), room, library)
    })
}
