//! The module, library, kernel and function entry points.

use std::ffi::{c_char, c_int, c_uint, c_void};

use super::loading::{Bytes, name_arg, read_file};
use super::{Image, Kernel};
use crate::driver;
use crate::status::{Cu, entry, out};
use crate::types::{
    CUdevice, CUdeviceptr, CUfunction, CUkernel, CUlibrary, CUmodule, CUresult,
    MODULE_LAZY_LOADING, result,
};

// ---- modules ---------------------------------------------------------------------------

/// # Safety
/// `module` is NULL or valid for writing; `image` points to a module image.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuModuleLoadData(module: *mut CUmodule, image: *const c_void) -> CUresult {
    entry("cuModuleLoadData", || {
        let d = driver::live()?;
        // SAFETY: the caller's contract.
        let img = unsafe { d.load_image(image, false) }?;
        // SAFETY: the caller's contract.
        unsafe { out(module, img as *const Image as CUmodule) }
    })
}

/// JIT options only tune or report on compiling PTX, which the broker's driver does.
///
/// # Safety
/// As `cuModuleLoadData`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuModuleLoadDataEx(
    module: *mut CUmodule,
    image: *const c_void,
    _num_options: c_uint,
    _options: *mut c_int,
    _values: *mut *mut c_void,
) -> CUresult {
    // SAFETY: the same contract.
    unsafe { cuModuleLoadData(module, image) }
}

/// # Safety
/// As `cuModuleLoadData`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuModuleLoadFatBinary(
    module: *mut CUmodule,
    fat: *const c_void,
) -> CUresult {
    // SAFETY: the same contract.
    unsafe { cuModuleLoadData(module, fat) }
}

/// # Safety
/// `module` is NULL or valid for writing; `path` is a NUL-terminated path.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuModuleLoad(module: *mut CUmodule, path: *const c_char) -> CUresult {
    entry("cuModuleLoad", || {
        let d = driver::live()?;
        // SAFETY: a NUL-terminated path, by the caller's contract.
        let (format, bytes) = unsafe { read_file(path) }?;
        let img = d.modules.add_image(format, Bytes::Owned(bytes));
        // SAFETY: the caller's contract.
        unsafe { out(module, img as *const Image as CUmodule) }
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuModuleUnload(module: CUmodule) -> CUresult {
    entry("cuModuleUnload", || driver::live()?.unload(module))
}

/// # Safety
/// `func` is NULL or valid for writing; `name` is NUL-terminated.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuModuleGetFunction(
    func: *mut CUfunction,
    module: CUmodule,
    name: *const c_char,
) -> CUresult {
    entry("cuModuleGetFunction", || {
        let d = driver::live()?;
        let image = d.image(module)?;
        // SAFETY: the caller's contract.
        let name = unsafe { name_arg(name) }?;
        let k = d.modules.kernel_of(image, name);
        // CUDA answers a missing name here: ask now (programs load and look up together).
        d.info(k)?;
        // SAFETY: the caller's contract.
        unsafe { out(func, k as *const Kernel as CUfunction) }
    })
}

/// # Safety
/// `dptr` and `bytes` are NULL or valid for writing; `name` is NUL-terminated.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuModuleGetGlobal_v2(
    dptr: *mut CUdeviceptr,
    bytes: *mut usize,
    module: CUmodule,
    name: *const c_char,
) -> CUresult {
    entry("cuModuleGetGlobal_v2", || {
        let d = driver::live()?;
        let image = d.image(module)?;
        // SAFETY: the caller's contract.
        let (ptr, len) = d.global(image, unsafe { name_arg(name) }?)?;
        // SAFETY: each is NULL (allowed) or writable.
        unsafe {
            if !dptr.is_null() {
                out(dptr, ptr)?;
            }
            if !bytes.is_null() {
                out(bytes, len as usize)?;
            }
        }
        Ok(())
    })
}

/// # Safety
/// `mode` is NULL or valid for writing.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuModuleGetLoadingMode(mode: *mut c_int) -> CUresult {
    entry("cuModuleGetLoadingMode", || {
        driver::get()?;
        // SAFETY: the caller's contract.
        unsafe { out(mode, MODULE_LAZY_LOADING) }
    })
}

// ---- libraries -------------------------------------------------------------------------

/// `CU_LIBRARY_BINARY_IS_PRESERVED`.
const LIBRARY_BINARY_IS_PRESERVED: c_int = 1;

/// # Safety
/// `library` is NULL or valid for writing; `code` points to a module image; the option
/// arrays hold `n` entries each.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuLibraryLoadData(
    library: *mut CUlibrary,
    code: *const c_void,
    _jit_options: *mut c_int,
    _jit_values: *mut *mut c_void,
    _num_jit: c_uint,
    lib_options: *mut c_int,
    lib_values: *mut *mut c_void,
    num_lib: c_uint,
) -> CUresult {
    entry("cuLibraryLoadData", || {
        let d = driver::live()?;
        let mut preserved = false;
        if !lib_options.is_null() && !lib_values.is_null() {
            for i in 0..num_lib as usize {
                // SAFETY: `i < num_lib`, inside both arrays.
                let (opt, value) = unsafe { (*lib_options.add(i), *lib_values.add(i)) };
                if opt == LIBRARY_BINARY_IS_PRESERVED && value as usize != 0 {
                    preserved = true;
                }
            }
        }
        // SAFETY: the caller's contract.
        let img = unsafe { d.load_image(code, preserved) }?;
        // SAFETY: the caller's contract.
        unsafe { out(library, img as *const Image as CUlibrary) }
    })
}

/// # Safety
/// `library` is NULL or valid for writing; `path` is a NUL-terminated path.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuLibraryLoadFromFile(
    library: *mut CUlibrary,
    path: *const c_char,
    _jit_options: *mut c_int,
    _jit_values: *mut *mut c_void,
    _num_jit: c_uint,
    _lib_options: *mut c_int,
    _lib_values: *mut *mut c_void,
    _num_lib: c_uint,
) -> CUresult {
    entry("cuLibraryLoadFromFile", || {
        let d = driver::live()?;
        // SAFETY: a NUL-terminated path, by the caller's contract.
        let (format, bytes) = unsafe { read_file(path) }?;
        let img = d.modules.add_image(format, Bytes::Owned(bytes));
        // SAFETY: the caller's contract.
        unsafe { out(library, img as *const Image as CUlibrary) }
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuLibraryUnload(library: CUlibrary) -> CUresult {
    entry("cuLibraryUnload", || driver::live()?.unload(library))
}

/// # Safety
/// `kernel` is NULL or valid for writing; `name` is NUL-terminated.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuLibraryGetKernel(
    kernel: *mut CUkernel,
    library: CUlibrary,
    name: *const c_char,
) -> CUresult {
    entry("cuLibraryGetKernel", || {
        let d = driver::live()?;
        let image = d.image(library)?;
        // SAFETY: the caller's contract.
        let k = d.modules.kernel_of(image, unsafe { name_arg(name) }?);
        // SAFETY: the caller's contract.
        unsafe { out(kernel, k as *const Kernel as CUkernel) }
    })
}

/// # Safety
/// `module` is NULL or valid for writing.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuLibraryGetModule(module: *mut CUmodule, library: CUlibrary) -> CUresult {
    entry("cuLibraryGetModule", || {
        let d = driver::live()?;
        let image = d.image(library)?;
        // SAFETY: the caller's contract.
        unsafe { out(module, image as *const Image as CUmodule) }
    })
}

/// # Safety
/// `dptr` and `bytes` are NULL or valid for writing; `name` is NUL-terminated.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuLibraryGetGlobal(
    dptr: *mut CUdeviceptr,
    bytes: *mut usize,
    library: CUlibrary,
    name: *const c_char,
) -> CUresult {
    // SAFETY: the same contract (a library is a module here).
    unsafe { cuModuleGetGlobal_v2(dptr, bytes, library, name) }
}

/// # Safety
/// `func` is NULL or valid for writing.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuKernelGetFunction(func: *mut CUfunction, kernel: CUkernel) -> CUresult {
    entry("cuKernelGetFunction", || {
        let d = driver::live()?;
        let k = d.kernel(kernel)?;
        // SAFETY: the caller's contract.
        unsafe { out(func, k as *const Kernel as CUfunction) }
    })
}

/// # Safety
/// `library` is NULL or valid for writing.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuKernelGetLibrary(library: *mut CUlibrary, kernel: CUkernel) -> CUresult {
    entry("cuKernelGetLibrary", || {
        let d = driver::live()?;
        let k = d.kernel(kernel)?;
        // SAFETY: the caller's contract.
        unsafe { out(library, k.image as *const Image as CUlibrary) }
    })
}

/// # Safety
/// `module` is NULL or valid for writing.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuFuncGetModule(module: *mut CUmodule, func: CUfunction) -> CUresult {
    // SAFETY: the same contract.
    unsafe { cuKernelGetLibrary(module, func) }
}

fn get_name(name: *mut *const c_char, h: *mut c_void) -> Cu<()> {
    let d = driver::live()?;
    let k = d.kernel(h)?;
    // SAFETY: the caller's contract; the name lives as long as the process.
    unsafe { out(name, k.name.as_ptr()) }
}

/// # Safety
/// `name` is NULL or valid for writing.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuFuncGetName(name: *mut *const c_char, func: CUfunction) -> CUresult {
    entry("cuFuncGetName", || get_name(name, func))
}

/// # Safety
/// `name` is NULL or valid for writing.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuKernelGetName(name: *mut *const c_char, kernel: CUkernel) -> CUresult {
    entry("cuKernelGetName", || get_name(name, kernel))
}

fn param_info(h: *mut c_void, index: usize, offset: *mut usize, size: *mut usize) -> Cu<()> {
    let d = driver::live()?;
    let info = d.info(d.kernel(h)?)?;
    let &(o, s) = info.params.get(index).ok_or(result::INVALID_VALUE)?;
    // SAFETY: each is NULL (allowed) or writable.
    unsafe {
        if !offset.is_null() {
            out(offset, o as usize)?;
        }
        if !size.is_null() {
            out(size, s as usize)?;
        }
    }
    Ok(())
}

/// # Safety
/// `offset` and `size` are NULL or valid for writing.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuFuncGetParamInfo(
    func: CUfunction,
    index: usize,
    offset: *mut usize,
    size: *mut usize,
) -> CUresult {
    entry("cuFuncGetParamInfo", || {
        param_info(func, index, offset, size)
    })
}

/// # Safety
/// `offset` and `size` are NULL or valid for writing.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuKernelGetParamInfo(
    kernel: CUkernel,
    index: usize,
    offset: *mut usize,
    size: *mut usize,
) -> CUresult {
    entry("cuKernelGetParamInfo", || {
        param_info(kernel, index, offset, size)
    })
}

/// # Safety
/// `value` is NULL or valid for writing.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuFuncGetAttribute(
    value: *mut c_int,
    attr: c_int,
    func: CUfunction,
) -> CUresult {
    entry("cuFuncGetAttribute", || {
        let d = driver::live()?;
        let v = d.function_attribute(d.kernel(func)?, attr)?;
        // SAFETY: the caller's contract.
        unsafe { out(value, v) }
    })
}

/// # Safety
/// `value` is NULL or valid for writing.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuKernelGetAttribute(
    value: *mut c_int,
    attr: c_int,
    kernel: CUkernel,
    dev: CUdevice,
) -> CUresult {
    entry("cuKernelGetAttribute", || {
        let d = crate::route::on_device(dev)?;
        let v = d.function_attribute(d.kernel(kernel)?, attr)?;
        // SAFETY: the caller's contract.
        unsafe { out(value, v) }
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuFuncSetAttribute(func: CUfunction, attr: c_int, value: c_int) -> CUresult {
    entry("cuFuncSetAttribute", || {
        let d = driver::live()?;
        d.set_function_attribute(d.kernel(func)?, attr, value)
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuKernelSetAttribute(
    attr: c_int,
    value: c_int,
    kernel: CUkernel,
    dev: CUdevice,
) -> CUresult {
    entry("cuKernelSetAttribute", || {
        let d = crate::route::on_device(dev)?;
        d.set_function_attribute(d.kernel(kernel)?, attr, value)
    })
}

/// A cache preference: accepted, not applied (the broker's context keeps its own).
#[unsafe(no_mangle)]
pub extern "C" fn cuFuncSetCacheConfig(func: CUfunction, _config: c_int) -> CUresult {
    entry("cuFuncSetCacheConfig", || {
        driver::live()?.kernel(func).map(drop)
    })
}

/// As `cuFuncSetCacheConfig`.
#[unsafe(no_mangle)]
pub extern "C" fn cuKernelSetCacheConfig(
    kernel: CUkernel,
    _config: c_int,
    dev: CUdevice,
) -> CUresult {
    entry("cuKernelSetCacheConfig", || {
        crate::route::on_device(dev)?.kernel(kernel).map(drop)
    })
}

/// # Safety
/// `state` is NULL or valid for writing.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuFuncIsLoaded(state: *mut c_int, func: CUfunction) -> CUresult {
    entry("cuFuncIsLoaded", || {
        let d = driver::live()?;
        let k = d.kernel(func)?;
        // CU_FUNCTION_LOADING_STATE_UNLOADED = 0, _LOADED = 1.
        // SAFETY: the caller's contract.
        unsafe { out(state, k.info.iter().any(|i| i.get().is_some()) as c_int) }
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuFuncLoad(func: CUfunction) -> CUresult {
    entry("cuFuncLoad", || {
        let d = driver::live()?;
        d.info(d.kernel(func)?).map(drop)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn before_cu_init_module_calls_say_not_initialized() {
        let ptx = c".version 8.0\n.target sm_90\n";
        let mut module: CUmodule = std::ptr::null_mut();
        let mut func: CUfunction = std::ptr::null_mut();
        // SAFETY: valid out-parameters, a NUL-terminated image and name.
        unsafe {
            assert_eq!(
                cuModuleLoadData(&mut module, ptx.as_ptr().cast()),
                result::NOT_INITIALIZED
            );
            assert_eq!(
                cuModuleGetFunction(&mut func, module, c"f".as_ptr()),
                result::NOT_INITIALIZED
            );
        }
        assert!(module.is_null() && func.is_null(), "nothing written");
    }
}
