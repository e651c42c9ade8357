//! Contexts. All of a process's contexts share its one session with the broker (whose context
//! is the real one): the primary context, and any the program creates, differ only in their
//! flags and their context-local storage. Each thread has its own stack of current contexts.

use std::cell::RefCell;
use std::collections::{HashMap, HashSet};
use std::ffi::{c_int, c_uint, c_void};
use std::sync::Mutex;
use std::sync::atomic::{AtomicI32, AtomicU32, AtomicU64, Ordering};

use gpushare_protocol::Command;

use crate::device::check;
use crate::driver::{self, Driver};
use crate::status::{Cu, entry, out};
use crate::types::{CUcontext, CUdevice, CUresult, limit, result};

/// One context, as the program holds it.
pub struct Context {
    pub id: u64,
    pub flags: AtomicU32,
}

/// A destructor a library registered with a context-local value.
pub type StorageDtor = extern "C" fn(CUcontext, *mut c_void, *mut c_void);

/// Context-local values by (context, key), with their destructors.
type Storage = HashMap<(usize, usize), (usize, Option<StorageDtor>)>;

pub struct Contexts {
    primary: &'static Context,
    primary_retains: AtomicI32,
    /// Contexts the program created and has not destroyed.
    created: Mutex<HashSet<usize>>,
    next_id: AtomicU64,
    /// Context-local storage (an export table's service): (context, key) → value.
    storage: Mutex<Storage>,
    limits: Mutex<[u64; limit::COUNT]>,
    cache_config: AtomicI32,
}

thread_local! {
    static STACK: RefCell<Vec<usize>> = const { RefCell::new(Vec::new()) };
}

impl Default for Contexts {
    fn default() -> Contexts {
        Contexts::new()
    }
}

impl Contexts {
    pub fn new() -> Contexts {
        let mut limits = [0u64; limit::COUNT];
        limits[limit::STACK_SIZE] = 1024;
        limits[limit::PRINTF_FIFO_SIZE] = 1 << 20;
        limits[limit::MALLOC_HEAP_SIZE] = 8 << 20;
        limits[limit::DEV_RUNTIME_SYNC_DEPTH] = 2;
        limits[limit::DEV_RUNTIME_PENDING_LAUNCH_COUNT] = 2048;
        limits[limit::MAX_L2_FETCH_GRANULARITY] = 32;
        Contexts {
            primary: Box::leak(Box::new(Context {
                id: 1,
                flags: AtomicU32::new(0),
            })),
            primary_retains: AtomicI32::new(0),
            created: Mutex::new(HashSet::new()),
            next_id: AtomicU64::new(2),
            storage: Mutex::new(HashMap::new()),
            limits: Mutex::new(limits),
            cache_config: AtomicI32::new(0),
        }
    }

    pub fn primary(&self) -> CUcontext {
        self.primary as *const Context as CUcontext
    }

    /// The context a handle names (the primary one or one the program created).
    pub fn get(&self, ctx: CUcontext) -> Cu<&Context> {
        if ctx == self.primary() {
            return Ok(self.primary);
        }
        let live = self
            .created
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .contains(&(ctx as usize));
        if !live {
            return Err(result::INVALID_CONTEXT);
        }
        // SAFETY: a live created context is a leaked `Box<Context>` (destroyed ones are kept
        // allocated, only forgotten, so a stale handle never dangles).
        Ok(unsafe { &*(ctx as *const Context) })
    }

    /// The context a call means: `ctx`, or the thread's current one for NULL.
    pub fn resolve(&self, ctx: CUcontext) -> Cu<&Context> {
        if ctx.is_null() {
            let current = current();
            if current.is_null() {
                return Err(result::INVALID_CONTEXT);
            }
            self.get(current)
        } else {
            self.get(ctx)
        }
    }

    pub(crate) fn create(&self, flags: u32) -> CUcontext {
        let ctx = Box::leak(Box::new(Context {
            id: self.next_id.fetch_add(1, Ordering::Relaxed),
            flags: AtomicU32::new(flags),
        })) as *const Context as CUcontext;
        self.created
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(ctx as usize);
        ctx
    }

    fn destroy(&self, ctx: CUcontext) -> Cu<()> {
        if ctx == self.primary() {
            return Err(result::INVALID_CONTEXT);
        }
        if !self
            .created
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&(ctx as usize))
        {
            return Err(result::INVALID_CONTEXT);
        }
        self.run_storage_dtors(ctx);
        STACK.with(|s| s.borrow_mut().retain(|&c| c != ctx as usize));
        Ok(())
    }

    /// Calls and forgets the destructors of a context's local storage.
    fn run_storage_dtors(&self, ctx: CUcontext) {
        let gone: Vec<(usize, usize, Option<StorageDtor>)> = {
            let mut storage = self.storage.lock().unwrap_or_else(|p| p.into_inner());
            let keys: Vec<(usize, usize)> = storage
                .keys()
                .filter(|k| k.0 == ctx as usize)
                .copied()
                .collect();
            keys.into_iter()
                .filter_map(|k| storage.remove(&k).map(|(v, d)| (k.1, v, d)))
                .collect()
        };
        for (key, value, dtor) in gone {
            if let Some(dtor) = dtor {
                dtor(ctx, key as *mut c_void, value as *mut c_void);
            }
        }
    }

    pub fn storage_put(&self, ctx: CUcontext, key: usize, value: usize, dtor: Option<StorageDtor>) {
        self.storage
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert((ctx as usize, key), (value, dtor));
    }

    pub fn storage_get(&self, ctx: CUcontext, key: usize) -> Option<usize> {
        self.storage
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&(ctx as usize, key))
            .map(|v| v.0)
    }

    pub fn storage_delete(&self, ctx: CUcontext, key: usize) -> bool {
        self.storage
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&(ctx as usize, key))
            .is_some()
    }
}

/// The calling thread's current context (NULL for none).
pub fn current() -> CUcontext {
    STACK.with(|s| s.borrow().last().copied().unwrap_or(0)) as CUcontext
}

fn set_current(ctx: CUcontext) {
    STACK.with(|s| {
        let mut s = s.borrow_mut();
        match (ctx.is_null(), s.last_mut()) {
            (true, Some(_)) => {
                s.pop();
            }
            (true, None) => {}
            (false, Some(top)) => *top = ctx as usize,
            (false, None) => s.push(ctx as usize),
        }
    });
}

impl Driver {
    /// Waits for all of this client's work; reports the first error any of it met.
    pub fn synchronize(&self) -> Cu<()> {
        // A sync that fails on its own leaves the work's error for the next call.
        let outcome = self
            .transport
            .call(Command::ClientSync)
            .and_then(|_| self.deferred());
        if let Err(code) = outcome {
            self.notice_loss(code);
        }
        outcome
    }
}

/// # Safety
/// `pctx` is NULL or valid for writing.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDevicePrimaryCtxRetain(pctx: *mut CUcontext, dev: CUdevice) -> CUresult {
    entry("cuDevicePrimaryCtxRetain", || {
        let d = driver::get()?;
        check(dev)?;
        d.contexts.primary_retains.fetch_add(1, Ordering::Relaxed);
        // SAFETY: the caller's contract.
        unsafe { out(pctx, d.contexts.primary()) }
    })
}

fn release_primary(dev: CUdevice) -> Cu<()> {
    let d = driver::get()?;
    check(dev)?;
    let _ = d
        .contexts
        .primary_retains
        .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
            (n > 0).then(|| n - 1)
        });
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
        let d = driver::get()?;
        check(dev)?;
        let c = &d.contexts;
        // SAFETY: the caller's contract.
        unsafe {
            out(flags, c.primary.flags.load(Ordering::Relaxed))?;
            out(
                active,
                (c.primary_retains.load(Ordering::Relaxed) > 0) as c_int,
            )
        }
    })
}

fn set_primary_flags(dev: CUdevice, flags: c_uint) -> Cu<()> {
    let d = driver::get()?;
    check(dev)?;
    d.contexts.primary.flags.store(flags, Ordering::Relaxed);
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
/// program made stay (they belong to its one session); a program that resets to free them
/// keeps them until it exits.
fn reset_primary(dev: CUdevice) -> Cu<()> {
    let d = driver::get()?;
    check(dev)?;
    d.synchronize()?;
    d.contexts.run_storage_dtors(d.contexts.primary());
    d.contexts.primary_retains.store(0, Ordering::Relaxed);
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
    let ctx = d.contexts.create(flags);
    STACK.with(|s| s.borrow_mut().push(ctx as usize));
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
    STACK.with(|s| s.borrow_mut().push(ctx as usize));
    Ok(())
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
        .with(|s| s.borrow_mut().pop())
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
        d.contexts.resolve(std::ptr::null_mut())?;
        // SAFETY: the caller's contract.
        unsafe { out(dev, 0) }
    })
}

/// # Safety
/// `dev` is NULL or valid for writing.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxGetDevice_v2(dev: *mut CUdevice, ctx: CUcontext) -> CUresult {
    entry("cuCtxGetDevice_v2", || {
        let d = driver::get()?;
        d.contexts.resolve(ctx)?;
        // SAFETY: the caller's contract.
        unsafe { out(dev, 0) }
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
    entry("cuCtxSynchronize", || driver::live()?.synchronize())
}

#[unsafe(no_mangle)]
pub extern "C" fn cuCtxSynchronize_v2(ctx: CUcontext) -> CUresult {
    entry("cuCtxSynchronize_v2", || {
        let d = driver::live()?;
        d.contexts.resolve(ctx)?;
        d.synchronize()
    })
}

/// # Safety
/// `value` is NULL or valid for writing.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxGetLimit(value: *mut usize, which: c_int) -> CUresult {
    entry("cuCtxGetLimit", || {
        let d = driver::get()?;
        let limits = d.contexts.limits.lock().unwrap_or_else(|p| p.into_inner());
        let v = usize::try_from(which)
            .ok()
            .and_then(|i| limits.get(i).copied())
            .ok_or(result::INVALID_VALUE)?;
        // SAFETY: the caller's contract.
        unsafe { out(value, v as usize) }
    })
}

/// Limits are remembered, not applied: the broker's context keeps its own (the driver
/// grows a kernel's stack as it needs).
#[unsafe(no_mangle)]
pub extern "C" fn cuCtxSetLimit(which: c_int, value: usize) -> CUresult {
    entry("cuCtxSetLimit", || {
        let d = driver::get()?;
        let mut limits = d.contexts.limits.lock().unwrap_or_else(|p| p.into_inner());
        let slot = usize::try_from(which)
            .ok()
            .and_then(|i| limits.get_mut(i))
            .ok_or(result::INVALID_VALUE)?;
        *slot = value as u64;
        Ok(())
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
    fn the_current_context_is_per_thread_and_stacks() {
        let contexts = Contexts::new();
        let p = contexts.primary();
        assert!(current().is_null());
        set_current(p);
        assert_eq!(current(), p);
        let other = contexts.create(0);
        STACK.with(|s| s.borrow_mut().push(other as usize));
        assert_eq!(current(), other);
        std::thread::spawn(|| assert!(current().is_null(), "a new thread has none"))
            .join()
            .expect("thread");
        assert!(contexts.destroy(other).is_ok());
        assert_eq!(current(), p, "destroying pops it");
        assert_eq!(contexts.get(other).err(), Some(result::INVALID_CONTEXT));
        assert!(
            contexts.destroy(p).is_err(),
            "the primary context is not destroyed"
        );
        set_current(std::ptr::null_mut());
        assert!(current().is_null());
    }

    extern "C" fn count_dtor(_ctx: CUcontext, _key: *mut c_void, value: *mut c_void) {
        // SAFETY: the test passes a pointer to an AtomicI32.
        unsafe { &*(value as *const AtomicI32) }.fetch_add(1, Ordering::Relaxed);
    }

    #[test]
    fn context_local_storage_is_per_context_and_ends_with_it() {
        let contexts = Contexts::new();
        let a = contexts.create(0);
        let b = contexts.create(0);
        let calls = Box::leak(Box::new(AtomicI32::new(0)));
        contexts.storage_put(a, 7, calls as *const AtomicI32 as usize, Some(count_dtor));
        contexts.storage_put(b, 7, 99, None);
        assert_eq!(
            contexts.storage_get(a, 7),
            Some(calls as *const AtomicI32 as usize)
        );
        assert_eq!(contexts.storage_get(b, 7), Some(99));
        assert_eq!(contexts.storage_get(a, 8), None);
        contexts.destroy(a).expect("destroy");
        assert_eq!(calls.load(Ordering::Relaxed), 1, "the destructor ran once");
        assert_eq!(contexts.storage_get(a, 7), None);
        assert!(contexts.storage_delete(b, 7));
        assert!(!contexts.storage_delete(b, 7));
    }
}
