//! The context entry points: the primary context, contexts the program creates, the
//! thread's current context, and what a context remembers.

use std::ffi::{c_int, c_uint, c_void};
use std::sync::atomic::Ordering;

use super::{Context, STACK, current, set_current};
use crate::device::{check, visible};
use crate::driver;
use crate::status::{Cu, entry, out};
use crate::types::{CUcontext, CUdevice, CUresult, result};

/// # Safety
/// `pctx` is NULL or valid for writing.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDevicePrimaryCtxRetain(pctx: *mut CUcontext, dev: CUdevice) -> CUresult {
    entry("cuDevicePrimaryCtxRetain", || {
        let ctx = primary_of(dev)?;
        ctx.retain();
        // SAFETY: the caller's contract.
        unsafe { out(pctx, ctx.handle()) }
    })
}

/// The primary context of a device the program sees (another GPU's answers but runs nothing).
pub(crate) fn primary_of(dev: CUdevice) -> Cu<&'static Context> {
    visible(dev)?;
    driver::get()?
        .contexts
        .primary_of(dev)
        .ok_or(result::INVALID_DEVICE)
}

fn release_primary(dev: CUdevice) -> Cu<()> {
    primary_of(dev)?.release();
    Ok(())
}

#[unsafe(no_mangle)]
pub extern "C" fn cuDevicePrimaryCtxRelease(dev: CUdevice) -> CUresult {
    entry("cuDevicePrimaryCtxRelease", || release_primary(dev))
}

#[unsafe(no_mangle)]
pub extern "C" fn cuDevicePrimaryCtxRelease_v2(dev: CUdevice) -> CUresult {
    entry("cuDevicePrimaryCtxRelease_v2", || release_primary(dev))
}

/// # Safety
/// `flags` and `active` are NULL or valid for writing.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDevicePrimaryCtxGetState(
    dev: CUdevice,
    flags: *mut c_uint,
    active: *mut c_int,
) -> CUresult {
    entry("cuDevicePrimaryCtxGetState", || {
        let ctx = primary_of(dev)?;
        // SAFETY: the caller's contract.
        unsafe {
            out(flags, ctx.flags.load(Ordering::Relaxed))?;
            out(active, ctx.active() as c_int)
        }
    })
}

fn set_primary_flags(dev: CUdevice, flags: c_uint) -> Cu<()> {
    primary_of(dev)?.flags.store(flags, Ordering::Relaxed);
    Ok(())
}

#[unsafe(no_mangle)]
pub extern "C" fn cuDevicePrimaryCtxSetFlags(dev: CUdevice, flags: c_uint) -> CUresult {
    entry("cuDevicePrimaryCtxSetFlags", || {
        set_primary_flags(dev, flags)
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuDevicePrimaryCtxSetFlags_v2(dev: CUdevice, flags: c_uint) -> CUresult {
    entry("cuDevicePrimaryCtxSetFlags_v2", || {
        set_primary_flags(dev, flags)
    })
}

/// Resetting the primary context ends its local storage. The device memory and modules the
/// program made stay (they belong to the device's session); a program that resets to free
/// them keeps them until it exits. A device this process has not worked on has no work to
/// wait for.
fn reset_primary(dev: CUdevice) -> Cu<()> {
    let first = driver::first()?;
    let ctx = primary_of(dev)?;
    if let Some(d) = crate::route::opened_device(first, dev) {
        d.synchronize()?;
    }
    first.contexts.run_storage_dtors(ctx.handle());
    ctx.reset();
    Ok(())
}

#[unsafe(no_mangle)]
pub extern "C" fn cuDevicePrimaryCtxReset(dev: CUdevice) -> CUresult {
    entry("cuDevicePrimaryCtxReset", || reset_primary(dev))
}

#[unsafe(no_mangle)]
pub extern "C" fn cuDevicePrimaryCtxReset_v2(dev: CUdevice) -> CUresult {
    entry("cuDevicePrimaryCtxReset_v2", || reset_primary(dev))
}

fn create(pctx: *mut CUcontext, flags: c_uint, dev: CUdevice) -> Cu<()> {
    let d = driver::get()?;
    check(dev)?;
    // Before making it current: a context the program is never told of must not be.
    if pctx.is_null() {
        return Err(result::INVALID_VALUE);
    }
    let ctx = d.contexts.create(flags, dev);
    let _ = STACK.try_with(|s| s.borrow_mut().push(ctx as usize));
    // SAFETY: the caller's contract.
    unsafe { out(pctx, ctx) }
}

/// # Safety
/// `pctx` is NULL or valid for writing.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxCreate(
    pctx: *mut CUcontext,
    flags: c_uint,
    dev: CUdevice,
) -> CUresult {
    entry("cuCtxCreate", || create(pctx, flags, dev))
}

/// # Safety
/// `pctx` is NULL or valid for writing.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxCreate_v2(
    pctx: *mut CUcontext,
    flags: c_uint,
    dev: CUdevice,
) -> CUresult {
    entry("cuCtxCreate_v2", || create(pctx, flags, dev))
}

/// Execution-affinity parameters (SM limits per context) are not supported.
///
/// # Safety
/// `pctx` is NULL or valid for writing.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxCreate_v3(
    pctx: *mut CUcontext,
    params: *mut c_void,
    num_params: c_int,
    flags: c_uint,
    dev: CUdevice,
) -> CUresult {
    entry("cuCtxCreate_v3", || {
        if !params.is_null() && num_params > 0 {
            crate::entry::say_unsupported("cuCtxCreate_v3 with execution-affinity parameters");
            return Err(result::NOT_SUPPORTED);
        }
        create(pctx, flags, dev)
    })
}

/// Context parameters (execution affinity, CIG) are not supported.
///
/// # Safety
/// `pctx` is NULL or valid for writing.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxCreate_v4(
    pctx: *mut CUcontext,
    params: *mut c_void,
    flags: c_uint,
    dev: CUdevice,
) -> CUresult {
    entry("cuCtxCreate_v4", || {
        if !params.is_null() {
            crate::entry::say_unsupported("cuCtxCreate_v4 with context parameters");
            return Err(result::NOT_SUPPORTED);
        }
        create(pctx, flags, dev)
    })
}

fn destroy(ctx: CUcontext) -> Cu<()> {
    let d = driver::get()?;
    d.contexts.destroy(ctx)
}

#[unsafe(no_mangle)]
pub extern "C" fn cuCtxDestroy(ctx: CUcontext) -> CUresult {
    entry("cuCtxDestroy", || destroy(ctx))
}

#[unsafe(no_mangle)]
pub extern "C" fn cuCtxDestroy_v2(ctx: CUcontext) -> CUresult {
    entry("cuCtxDestroy_v2", || destroy(ctx))
}

fn push(ctx: CUcontext) -> Cu<()> {
    let d = driver::get()?;
    d.contexts.get(ctx)?;
    STACK
        .try_with(|s| s.borrow_mut().push(ctx as usize))
        .map_err(|_| result::INVALID_CONTEXT)
}

#[unsafe(no_mangle)]
pub extern "C" fn cuCtxPushCurrent(ctx: CUcontext) -> CUresult {
    entry("cuCtxPushCurrent", || push(ctx))
}

#[unsafe(no_mangle)]
pub extern "C" fn cuCtxPushCurrent_v2(ctx: CUcontext) -> CUresult {
    entry("cuCtxPushCurrent_v2", || push(ctx))
}

fn pop(pctx: *mut CUcontext) -> Cu<()> {
    driver::get()?;
    let popped = STACK
        .try_with(|s| s.borrow_mut().pop())
        .ok()
        .flatten()
        .ok_or(result::INVALID_CONTEXT)?;
    if !pctx.is_null() {
        // SAFETY: non-NULL: the caller's contract says writable.
        unsafe { out(pctx, popped as CUcontext)? };
    }
    Ok(())
}

/// # Safety
/// `pctx` is NULL or valid for writing.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxPopCurrent(pctx: *mut CUcontext) -> CUresult {
    entry("cuCtxPopCurrent", || pop(pctx))
}

/// # Safety
/// `pctx` is NULL or valid for writing.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxPopCurrent_v2(pctx: *mut CUcontext) -> CUresult {
    entry("cuCtxPopCurrent_v2", || pop(pctx))
}

#[unsafe(no_mangle)]
pub extern "C" fn cuCtxSetCurrent(ctx: CUcontext) -> CUresult {
    entry("cuCtxSetCurrent", || {
        let d = driver::get()?;
        if !ctx.is_null() {
            d.contexts.get(ctx)?;
        }
        set_current(ctx);
        Ok(())
    })
}

/// # Safety
/// `pctx` is NULL or valid for writing.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxGetCurrent(pctx: *mut CUcontext) -> CUresult {
    entry("cuCtxGetCurrent", || {
        driver::get()?;
        // SAFETY: the caller's contract.
        unsafe { out(pctx, current()) }
    })
}

/// # Safety
/// `dev` is NULL or valid for writing.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxGetDevice(dev: *mut CUdevice) -> CUresult {
    entry("cuCtxGetDevice", || {
        let d = driver::get()?;
        let ctx = d.contexts.resolve(std::ptr::null_mut())?;
        // SAFETY: the caller's contract.
        unsafe { out(dev, ctx.device) }
    })
}

/// # Safety
/// `dev` is NULL or valid for writing.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxGetDevice_v2(dev: *mut CUdevice, ctx: CUcontext) -> CUresult {
    entry("cuCtxGetDevice_v2", || {
        let d = driver::get()?;
        let ctx = d.contexts.resolve(ctx)?;
        // SAFETY: the caller's contract.
        unsafe { out(dev, ctx.device) }
    })
}

/// # Safety
/// `flags` is NULL or valid for writing.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxGetFlags(flags: *mut c_uint) -> CUresult {
    entry("cuCtxGetFlags", || {
        let d = driver::get()?;
        let ctx = d.contexts.resolve(std::ptr::null_mut())?;
        // SAFETY: the caller's contract.
        unsafe { out(flags, ctx.flags.load(Ordering::Relaxed)) }
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuCtxSetFlags(flags: c_uint) -> CUresult {
    entry("cuCtxSetFlags", || {
        let d = driver::get()?;
        let ctx = d.contexts.resolve(std::ptr::null_mut())?;
        ctx.flags.store(flags, Ordering::Relaxed);
        Ok(())
    })
}

/// # Safety
/// `id` is NULL or valid for writing.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxGetId(ctx: CUcontext, id: *mut u64) -> CUresult {
    entry("cuCtxGetId", || {
        let d = driver::get()?;
        let ctx = d.contexts.resolve(ctx)?;
        // SAFETY: the caller's contract.
        unsafe { out(id, ctx.id) }
    })
}

/// # Safety
/// `version` is NULL or valid for writing.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxGetApiVersion(ctx: CUcontext, version: *mut c_uint) -> CUresult {
    entry("cuCtxGetApiVersion", || {
        let d = driver::get()?;
        d.contexts.resolve(ctx)?;
        // SAFETY: the caller's contract.
        unsafe { out(version, 3020) }
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuCtxSynchronize() -> CUresult {
    entry("cuCtxSynchronize", || synchronize(std::ptr::null_mut()))
}

#[unsafe(no_mangle)]
pub extern "C" fn cuCtxSynchronize_v2(ctx: CUcontext) -> CUresult {
    entry("cuCtxSynchronize_v2", || synchronize(ctx))
}

/// Waits for the work of the context's device (a device this process has not worked on has
/// none to wait for).
fn synchronize(ctx: CUcontext) -> Cu<()> {
    let first = driver::first()?;
    let named = !ctx.is_null() || !current().is_null();
    if !named {
        return first.intact()?.synchronize();
    }
    let dev = first.contexts.resolve(ctx)?.device;
    match crate::route::opened_device(first, dev) {
        Some(d) => d.intact()?.synchronize(),
        None => Ok(()),
    }
}

/// # Safety
/// `value` is NULL or valid for writing.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxGetLimit(value: *mut usize, which: c_int) -> CUresult {
    entry("cuCtxGetLimit", || {
        let v = driver::get()?.contexts.limit(which)?;
        // SAFETY: the caller's contract.
        unsafe { out(value, v as usize) }
    })
}

/// Limits are remembered, not applied: the broker's context keeps its own (the driver
/// grows a kernel's stack as it needs).
#[unsafe(no_mangle)]
pub extern "C" fn cuCtxSetLimit(which: c_int, value: usize) -> CUresult {
    entry("cuCtxSetLimit", || {
        driver::get()?.contexts.set_limit(which, value as u64)
    })
}

/// # Safety
/// `config` is NULL or valid for writing.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxGetCacheConfig(config: *mut c_int) -> CUresult {
    entry("cuCtxGetCacheConfig", || {
        let d = driver::get()?;
        // SAFETY: the caller's contract.
        unsafe { out(config, d.contexts.cache_config.load(Ordering::Relaxed)) }
    })
}

/// A preference, remembered and not applied.
#[unsafe(no_mangle)]
pub extern "C" fn cuCtxSetCacheConfig(config: c_int) -> CUresult {
    entry("cuCtxSetCacheConfig", || {
        let d = driver::get()?;
        d.contexts.cache_config.store(config, Ordering::Relaxed);
        Ok(())
    })
}

/// # Safety
/// `least` and `greatest` are NULL or valid for writing.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxGetStreamPriorityRange(
    least: *mut c_int,
    greatest: *mut c_int,
) -> CUresult {
    entry("cuCtxGetStreamPriorityRange", || {
        driver::get()?;
        // The broker gives streams the priority of the client's class; the program's own
        // priorities are accepted and not applied.
        // SAFETY: each is NULL (allowed here) or writable.
        unsafe {
            if !least.is_null() {
                out(least, 0)?;
            }
            if !greatest.is_null() {
                out(greatest, -5)?;
            }
        }
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn before_cu_init_context_calls_say_not_initialized() {
        let mut ctx: CUcontext = std::ptr::null_mut();
        // SAFETY: valid out-parameters.
        unsafe {
            assert_eq!(
                cuDevicePrimaryCtxRetain(&mut ctx, 0),
                result::NOT_INITIALIZED
            );
            assert_eq!(cuCtxCreate_v2(&mut ctx, 0, 0), result::NOT_INITIALIZED);
            assert_eq!(cuCtxGetCurrent(&mut ctx), result::NOT_INITIALIZED);
        }
        assert!(ctx.is_null(), "nothing written");
        assert_eq!(cuCtxSynchronize(), result::NOT_INITIALIZED);
        assert!(current().is_null(), "no context was made current");
    }
}
