//! Work from C: the built-in kernels, and modules (load, look up a function, launch it).

use std::ffi::{CStr, c_char, c_int, c_void};

use gpushare_protocol::control::ModuleFormat;
use gpushare_protocol::{Command, Kernel};

use super::codes::{GPUSHARE_MODULE_CUBIN, GPUSHARE_MODULE_FATBIN, GPUSHARE_MODULE_PTX};
use super::guard::{FfiResult, bytes, client_ref, guard, invalid, non_null, put};
use super::session::gpushare_client;

/// Launches a built-in kernel on `stream` without waiting.
///
/// # Safety
/// `client` is NULL or a live handle.
unsafe fn launch(
    func: &'static str,
    client: *const gpushare_client,
    stream: u32,
    kernel: Kernel,
) -> c_int {
    guard(func, || {
        // SAFETY: the caller's contract.
        let client = unsafe { client_ref(client) }?;
        Ok(client.submit_async(Command::Launch { stream, kernel })?)
    })
}

/// `dst[i] = value` for `i < n` (asynchronous).
///
/// # Safety
/// `client` is NULL or a live handle.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn gpushare_fill_f32(
    client: *const gpushare_client,
    stream: u32,
    dst: u64,
    n: u64,
    value: f32,
) -> c_int {
    let kernel = Kernel::FillF32 { dst, n, value };
    // SAFETY: the caller's contract is `launch`'s.
    unsafe { launch("gpushare_fill_f32", client, stream, kernel) }
}

/// `y[i] = alpha * x[i] + y[i]` for `i < n` (asynchronous).
///
/// # Safety
/// `client` is NULL or a live handle.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn gpushare_axpy_f32(
    client: *const gpushare_client,
    stream: u32,
    x: u64,
    y: u64,
    n: u64,
    alpha: f32,
) -> c_int {
    let kernel = Kernel::AxpyF32 { x, y, n, alpha };
    // SAFETY: the caller's contract is `launch`'s.
    unsafe { launch("gpushare_axpy_f32", client, stream, kernel) }
}

/// `c[i] = a[i] + b[i]` for `i < n` (asynchronous).
///
/// # Safety
/// `client` is NULL or a live handle.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn gpushare_vec_add_f32(
    client: *const gpushare_client,
    stream: u32,
    a: u64,
    b: u64,
    c: u64,
    n: u64,
) -> c_int {
    let kernel = Kernel::VecAddF32 { a, b, c, n };
    // SAFETY: the caller's contract is `launch`'s.
    unsafe { launch("gpushare_vec_add_f32", client, stream, kernel) }
}

/// `out[0] = sum(x[0..n])` (asynchronous).
///
/// # Safety
/// `client` is NULL or a live handle.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn gpushare_reduce_sum_f32(
    client: *const gpushare_client,
    stream: u32,
    x: u64,
    out: u64,
    n: u64,
) -> c_int {
    let kernel = Kernel::ReduceSumF32 { x, out, n };
    // SAFETY: the caller's contract is `launch`'s.
    unsafe { launch("gpushare_reduce_sum_f32", client, stream, kernel) }
}

/// `C = alpha * A·B + beta * C`, row-major, A m×k, B k×n, C m×n (asynchronous).
///
/// # Safety
/// `client` is NULL or a live handle.
#[unsafe(no_mangle)]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn gpushare_gemm_f32(
    client: *const gpushare_client,
    stream: u32,
    a: u64,
    b: u64,
    c: u64,
    m: u32,
    n: u32,
    k: u32,
    alpha: f32,
    beta: f32,
) -> c_int {
    let kernel = Kernel::GemmF32 {
        a,
        b,
        c,
        m,
        n,
        k,
        alpha,
        beta,
    };
    // SAFETY: the caller's contract is `launch`'s.
    unsafe { launch("gpushare_gemm_f32", client, stream, kernel) }
}

/// `C = alpha * A·B + beta * C` with A (m×k) and B (k×n) in bfloat16 and C (m×n) in f32,
/// row-major, accumulated in f32 (asynchronous; `GPUSHARE_E_NOT_SUPPORTED` without cuBLAS).
///
/// # Safety
/// `client` is NULL or a live handle.
#[unsafe(no_mangle)]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn gpushare_gemm_bf16(
    client: *const gpushare_client,
    stream: u32,
    a: u64,
    b: u64,
    c: u64,
    m: u32,
    n: u32,
    k: u32,
    alpha: f32,
    beta: f32,
) -> c_int {
    let kernel = Kernel::GemmBf16 {
        a,
        b,
        c,
        m,
        n,
        k,
        alpha,
        beta,
    };
    // SAFETY: the caller's contract is `launch`'s.
    unsafe { launch("gpushare_gemm_bf16", client, stream, kernel) }
}

/// Occupies `blocks` thread blocks for `micros` microseconds (asynchronous).
///
/// # Safety
/// `client` is NULL or a live handle.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn gpushare_spin(
    client: *const gpushare_client,
    stream: u32,
    micros: u64,
    blocks: u32,
) -> c_int {
    let kernel = Kernel::Spin { micros, blocks };
    // SAFETY: the caller's contract is `launch`'s.
    unsafe { launch("gpushare_spin", client, stream, kernel) }
}

/// The module format a `GPUSHARE_MODULE_*` value names.
fn module_format(format: c_int) -> FfiResult<ModuleFormat> {
    match format {
        GPUSHARE_MODULE_PTX => Ok(ModuleFormat::Ptx),
        GPUSHARE_MODULE_CUBIN => Ok(ModuleFormat::Cubin),
        GPUSHARE_MODULE_FATBIN => Ok(ModuleFormat::Fatbin),
        other => Err(invalid(format!(
            "unknown module format {other} (expected GPUSHARE_MODULE_PTX, _CUBIN or _FATBIN)"
        ))),
    }
}

/// Loads a module image (`GPUSHARE_MODULE_PTX`, `_CUBIN` or `_FATBIN`); `*out_module` gets its
/// id. The sim device answers `GPUSHARE_E_NOT_SUPPORTED`.
///
/// # Safety
/// `client` is NULL or a live handle; `image` is valid for reads of `len` bytes; `out_module`
/// is NULL or valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn gpushare_module_load(
    client: *const gpushare_client,
    format: c_int,
    image: *const c_void,
    len: usize,
    out_module: *mut u64,
) -> c_int {
    guard("gpushare_module_load", || {
        // SAFETY: the caller's contract.
        let client = unsafe { client_ref(client) }?;
        non_null(image, "image")?;
        non_null(out_module, "out_module")?;
        // SAFETY: the caller's contract.
        let image = unsafe { bytes(image, len, "image") }?;
        let module = client.load_module_raw(module_format(format)?, image)?;
        // SAFETY: checked non-NULL; writable by the contract.
        unsafe { put(out_module, module) };
        Ok(())
    })
}

/// Unloads a module; its functions become invalid.
///
/// # Safety
/// `client` is NULL or a live handle.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn gpushare_module_unload(
    client: *const gpushare_client,
    module: u64,
) -> c_int {
    guard("gpushare_module_unload", || {
        // SAFETY: the caller's contract.
        let client = unsafe { client_ref(client) }?;
        Ok(client.unload_module(module)?)
    })
}

/// Looks up a kernel of a loaded module by its (mangled) name; `*out_fn` gets its id.
///
/// # Safety
/// `client` is NULL or a live handle; `name` is NULL or a NUL-terminated string; `out_fn` is
/// NULL or valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn gpushare_module_function(
    client: *const gpushare_client,
    module: u64,
    name: *const c_char,
    out_fn: *mut u64,
) -> c_int {
    guard("gpushare_module_function", || {
        // SAFETY: the caller's contract.
        let client = unsafe { client_ref(client) }?;
        non_null(name, "name")?;
        non_null(out_fn, "out_fn")?;
        // SAFETY: non-NULL, and NUL-terminated by the contract.
        let name = unsafe { CStr::from_ptr(name) };
        let name = name
            .to_str()
            .map_err(|_| invalid("the function name is not valid UTF-8"))?;
        let function = client.get_function(module, name)?;
        // SAFETY: checked non-NULL; writable by the contract.
        unsafe { put(out_fn, function) };
        Ok(())
    })
}

/// Launches a module function on `stream` with `params_len` bytes of packed parameters
/// (asynchronous; returns once the parameters are copied into the shared arena, without
/// waiting for the broker: an error the launch meets comes with the next synchronization).
///
/// # Safety
/// `client` is NULL or a live handle; `grid` and `block` are NULL or point to three
/// `uint32_t` each; `params` is valid for reads of `params_len` bytes (it may be NULL when
/// `params_len` is 0).
#[unsafe(no_mangle)]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn gpushare_launch(
    client: *const gpushare_client,
    stream: u32,
    function: u64,
    grid: *const u32,
    block: *const u32,
    shared_mem: u32,
    params: *const c_void,
    params_len: usize,
) -> c_int {
    guard("gpushare_launch", || {
        // SAFETY: the caller's contract.
        let client = unsafe { client_ref(client) }?;
        non_null(grid, "grid")?;
        non_null(block, "block")?;
        // SAFETY: non-NULL and pointing to three `uint32_t` by the contract; read unaligned
        // so a misaligned C array cannot make this undefined.
        let (grid, block) = unsafe {
            (
                grid.cast::<[u32; 3]>().read_unaligned(),
                block.cast::<[u32; 3]>().read_unaligned(),
            )
        };
        // SAFETY: the caller's contract.
        let params = unsafe { bytes(params, params_len, "params") }?;
        Ok(client.launch_function_raw(stream, function, grid, block, shared_mem, params)?)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ffi::GPUSHARE_E_NULL;
    use crate::ffi::guard::{Failure, last_error};

    #[test]
    fn each_module_format_value_names_its_format_and_others_are_refused() {
        assert!(matches!(
            module_format(GPUSHARE_MODULE_PTX),
            Ok(ModuleFormat::Ptx)
        ));
        assert!(matches!(
            module_format(GPUSHARE_MODULE_CUBIN),
            Ok(ModuleFormat::Cubin)
        ));
        assert!(matches!(
            module_format(GPUSHARE_MODULE_FATBIN),
            Ok(ModuleFormat::Fatbin)
        ));
        let Err(Failure::Client(crate::Error::InvalidArgument(why))) = module_format(7) else {
            panic!("format 7 is refused as an invalid argument");
        };
        assert!(why.contains("unknown module format 7"), "{why}");
    }

    #[test]
    fn a_null_client_is_refused_before_anything_is_sent() {
        let mut module = 0u64;
        // SAFETY: NULL client (checked first) and a valid out-pointer.
        let rc = unsafe {
            gpushare_module_load(
                std::ptr::null(),
                GPUSHARE_MODULE_PTX,
                c"x".as_ptr().cast(),
                1,
                &mut module,
            )
        };
        assert_eq!(rc, GPUSHARE_E_NULL);
        assert_eq!(
            last_error(),
            "gpushare_module_load: `client` must not be NULL"
        );
        // SAFETY: NULL client, checked first.
        let rc = unsafe { gpushare_spin(std::ptr::null(), 0, 1, 1) };
        assert_eq!(rc, GPUSHARE_E_NULL);
        assert_eq!(last_error(), "gpushare_spin: `client` must not be NULL");
    }
}
