//! The slots whose use was seen, as plain functions (the tables in `tables.rs` point here).

use std::cell::UnsafeCell;
use std::ffi::c_void;

use crate::context::{StorageDtor, current};
use crate::driver;
use crate::status::{Cu, entry, out};
use crate::types::{CUcontext, CUdevice, CUmodule, CUresult, result};

// ---- the CUDA runtime's interface ------------------------------------------------------

fn load(module: *mut CUmodule, image: *const c_void) -> Cu<()> {
    let d = driver::live()?;
    // SAFETY: the runtime registers its own fat binaries, kept for the process's life.
    let img = unsafe { d.load_image(image, true) }?;
    // SAFETY: the runtime passes a writable out-parameter.
    unsafe { out(module, std::ptr::from_ref(img) as CUmodule) }
}

/// Loads the fat binary a runtime wrapper points at.
pub extern "C" fn module_from_wrapper(module: *mut CUmodule, wrapper: *const c_void) -> CUresult {
    entry("module_from_wrapper", || load(module, wrapper))
}

/// As `module_from_wrapper`, with arguments for linking that are not used.
pub extern "C" fn module_from_wrapper_ext(
    module: *mut CUmodule,
    wrapper: *const c_void,
    _a: *mut c_void,
    _b: *mut c_void,
    _c: u32,
) -> CUresult {
    entry("module_from_wrapper_ext", || load(module, wrapper))
}

/// As `module_from_wrapper_ext`, taking the fat binary itself, first.
pub extern "C" fn module_from_fatbin_ext(
    fatbin: *const c_void,
    module: *mut CUmodule,
    _a: *mut c_void,
    _b: *mut c_void,
    _c: u32,
) -> CUresult {
    entry("module_from_fatbin_ext", || load(module, fatbin))
}

/// The device's primary context, without making it active. The runtime asks every device's
/// at start, so another GPU's of a job is handed out too (it runs nothing).
pub extern "C" fn primary_context(pctx: *mut CUcontext, dev: CUdevice) -> CUresult {
    entry("primary_context", || {
        let ctx = crate::context::api::primary_of(dev)?;
        // SAFETY: the runtime passes a writable out-parameter.
        unsafe { out(pctx, ctx.handle()) }
    })
}

/// Seen to take one word and return nothing; nothing to do here.
pub extern "C" fn ignore_word(_arg: usize) {}

/// Loads the PTX compiler and friends in a driver; this one compiles nothing itself.
pub extern "C" fn load_compilers() -> CUresult {
    result::SUCCESS
}

// ---- tools ---------------------------------------------------------------------------

/// The calling thread's current context, unchecked.
pub extern "C" fn current_context(pctx: *mut CUcontext) -> CUresult {
    entry("current_context", || {
        driver::get()?;
        // SAFETY: the caller passes a writable out-parameter.
        unsafe { out(pctx, current()) }
    })
}

/// A buffer the runtime's tools hooks write into.
struct Buffer<const N: usize>(UnsafeCell<[u64; N]>);

// SAFETY: handed to the runtime, which owns its use; never read here.
unsafe impl<const N: usize> Sync for Buffer<N> {}

static HOOKS_A: Buffer<1024> = Buffer(UnsafeCell::new([0; 1024]));
static HOOKS_B: Buffer<14> = Buffer(UnsafeCell::new([0; 14]));

/// Hands out the first hooks buffer and its length in entries.
pub extern "C" fn hooks_buffer_a(ptr: *mut *mut c_void, len: *mut usize) {
    // SAFETY: the runtime passes two writable out-parameters.
    unsafe {
        *ptr = HOOKS_A.0.get().cast();
        *len = 1024;
    }
}

/// Hands out the second hooks buffer and its length in entries.
pub extern "C" fn hooks_buffer_b(ptr: *mut *mut c_void, len: *mut usize) {
    // SAFETY: as above.
    unsafe {
        *ptr = HOOKS_B.0.get().cast();
        *len = 14;
    }
}

// ---- context-local storage ------------------------------------------------------------

fn context_or_current(ctx: CUcontext) -> Cu<CUcontext> {
    let c = if ctx.is_null() { current() } else { ctx };
    if c.is_null() {
        return Err(result::INVALID_CONTEXT);
    }
    driver::get()?.contexts.get(c)?;
    Ok(c)
}

pub extern "C" fn storage_put(
    ctx: CUcontext,
    key: *mut c_void,
    value: *mut c_void,
    dtor: Option<StorageDtor>,
) -> CUresult {
    entry("storage_put", || {
        let c = context_or_current(ctx)?;
        driver::get()?
            .contexts
            .storage_put(c, key as usize, value as usize, dtor);
        Ok(())
    })
}

pub extern "C" fn storage_delete(ctx: CUcontext, key: *mut c_void) -> CUresult {
    entry("storage_delete", || {
        let c = context_or_current(ctx)?;
        driver::get()?.contexts.storage_delete(c, key as usize);
        Ok(())
    })
}

pub extern "C" fn storage_get(
    value: *mut *mut c_void,
    ctx: CUcontext,
    key: *mut c_void,
) -> CUresult {
    entry("storage_get", || {
        let c = context_or_current(ctx)?;
        let v = driver::get()?
            .contexts
            .storage_get(c, key as usize)
            .ok_or(result::INVALID_HANDLE)?;
        // SAFETY: the caller passes a writable out-parameter.
        unsafe { out(value, v as *mut c_void) }
    })
}

// ---- context checks ------------------------------------------------------------------

/// Reports a context as fine: nothing here is ever not.
pub extern "C" fn context_check(
    _ctx: CUcontext,
    flags: *mut u32,
    _detail: *mut *const c_void,
) -> CUresult {
    entry("context_check", || {
        // SAFETY: the caller passes a writable out-parameter.
        unsafe { out(flags, 0) }
    })
}

/// A flag the driver keeps; never set here.
pub extern "C" fn flag_off() -> u32 {
    0
}

// ---- the integrity table's flag (its check is in `tables.rs`) ------------------------

/// Sets a flag the driver keeps; nothing here depends on it.
pub extern "C" fn integrity_flag(_on: bool) -> CUresult {
    result::SUCCESS
}

// ---- cuBLASLt's tables ---------------------------------------------------------------

/// Per-device data this device does not have (a driver answers so for such devices).
pub extern "C" fn no_device_data(_a: *mut *mut c_void, _b: *mut *mut c_void) -> CUresult {
    result::NOT_SUPPORTED
}

/// Frees what `no_device_data` would have given: nothing was.
pub extern "C" fn free_device_data(_a: *mut c_void, _b: *mut c_void) -> CUresult {
    result::SUCCESS
}
