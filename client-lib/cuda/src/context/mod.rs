//! Contexts. The contexts of one device share that device's session with the broker (whose
//! context is the real one): the primary context, and any the program creates on the device,
//! differ only in their flags and their context-local storage. Each thread has its own stack
//! of current contexts, and its current context's device is where its work goes
//! (`crate::route`).
//!
//! A process of a job over several GPUs (`gpushare run --gpus N`) sees a primary context per
//! device; its bound device (its local rank's) is the one whose session opens at `cuInit`,
//! another's opens at its first work.

mod limits;
mod storage;

pub mod api;

use std::cell::RefCell;
use std::collections::{HashMap, HashSet};
use std::sync::Mutex;
use std::sync::atomic::{AtomicI32, AtomicU32, AtomicU64, Ordering};

use gpushare_protocol::Command;

use crate::driver::Driver;
use crate::status::Cu;
use crate::types::{CUcontext, CUdevice, limit, result};

use storage::Storage;
pub use storage::StorageDtor;

/// One context, as the program holds it.
pub struct Context {
    pub id: u64,
    pub flags: AtomicU32,
    /// The ordinal of its device.
    pub device: CUdevice,
    /// Retains of a primary context (unused for created ones).
    retains: AtomicI32,
}

pub struct Contexts {
    /// Each device's primary context, by ordinal; `bound`'s is where work runs.
    primaries: &'static [Context],
    bound: usize,
    /// Contexts the program created and has not destroyed.
    created: Mutex<HashSet<usize>>,
    /// Peer access enabled: (context, the device whose primary context it names).
    peers: Mutex<HashSet<(usize, CUdevice)>>,
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
    /// The contexts of a process that sees one device.
    pub fn new() -> Contexts {
        Contexts::for_devices(1, 0)
    }

    /// The contexts of a process that sees `count` devices and runs its work on `bound`.
    pub fn for_devices(count: usize, bound: usize) -> Contexts {
        let count = count.max(bound + 1);
        let primaries: Vec<Context> = (0..count)
            .map(|i| Context::new(i as u64 + 1, i as CUdevice))
            .collect();
        Contexts {
            primaries: Box::leak(primaries.into_boxed_slice()),
            bound,
            created: Mutex::new(HashSet::new()),
            peers: Mutex::new(HashSet::new()),
            next_id: AtomicU64::new(count as u64 + 1),
            storage: Mutex::new(HashMap::new()),
            limits: Mutex::new(limits::defaults()),
            cache_config: AtomicI32::new(0),
        }
    }

    /// The primary context of the device the work runs on.
    pub fn primary(&self) -> CUcontext {
        handle(&self.primaries[self.bound])
    }

    /// The primary context of device `dev` (one the program sees).
    pub fn primary_of(&self, dev: CUdevice) -> Option<&Context> {
        usize::try_from(dev)
            .ok()
            .and_then(|i| self.primaries.get(i))
    }

    /// The device of the calling thread's current context, if it has one.
    #[inline]
    pub fn current_device(&self) -> Option<CUdevice> {
        let ctx = current();
        if ctx.is_null() {
            return None;
        }
        if let Some(p) = self.primaries.iter().find(|&c| handle(c) == ctx) {
            return Some(p.device);
        }
        // SAFETY: only handles `get` accepted are ever made current (`cuCtxSetCurrent`,
        // `cuCtxPushCurrent`, `cuCtxCreate`), and a created context is a leaked
        // `Box<Context>`, never freed (a destroyed one is only forgotten).
        Some(unsafe { &*(ctx as *const Context) }.device)
    }

    /// Enables (`on`) or disables peer access from `ctx` to device `to`; false if it already
    /// was (enabling) or was not (disabling).
    pub fn peer_enabled(&self, ctx: CUcontext, to: CUdevice, on: bool) -> bool {
        let mut peers = self.peers.lock().unwrap_or_else(|p| p.into_inner());
        if on {
            peers.insert((ctx as usize, to))
        } else {
            peers.remove(&(ctx as usize, to))
        }
    }

    /// The context a handle names (a primary one or one the program created).
    pub fn get(&self, ctx: CUcontext) -> Cu<&Context> {
        if let Some(p) = self.primaries.iter().find(|&c| handle(c) == ctx) {
            return Ok(p);
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

    pub(crate) fn create(&self, flags: u32, dev: CUdevice) -> CUcontext {
        let context = Context::new(self.next_id.fetch_add(1, Ordering::Relaxed), dev);
        context.flags.store(flags, Ordering::Relaxed);
        let ctx = handle(Box::leak(Box::new(context)));
        self.created
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(ctx as usize);
        ctx
    }

    fn destroy(&self, ctx: CUcontext) -> Cu<()> {
        if self.primaries.iter().any(|c| handle(c) == ctx) {
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
        let _ = STACK.try_with(|s| s.borrow_mut().retain(|&c| c != ctx as usize));
        Ok(())
    }
}

impl Context {
    fn new(id: u64, device: CUdevice) -> Context {
        Context {
            id,
            flags: AtomicU32::new(0),
            device,
            retains: AtomicI32::new(0),
        }
    }

    /// The handle the program holds it by.
    pub fn handle(&self) -> CUcontext {
        std::ptr::from_ref(self) as CUcontext
    }

    /// A retain of a primary context.
    pub fn retain(&self) {
        self.retains.fetch_add(1, Ordering::Relaxed);
    }

    /// A release of a primary context (none below zero).
    pub fn release(&self) {
        let _ = self
            .retains
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                (n > 0).then(|| n - 1)
            });
    }

    /// Whether a primary context is retained.
    pub fn active(&self) -> bool {
        self.retains.load(Ordering::Relaxed) > 0
    }

    fn reset(&self) {
        self.retains.store(0, Ordering::Relaxed);
    }
}

fn handle(c: &Context) -> CUcontext {
    c.handle()
}

/// The calling thread's current context (NULL for none, and for a thread whose locals are
/// being destroyed: libraries' destructors call in as the process exits).
pub fn current() -> CUcontext {
    STACK
        .try_with(|s| s.borrow().last().copied().unwrap_or(0))
        .unwrap_or(0) as CUcontext
}

fn set_current(ctx: CUcontext) {
    // A thread whose locals are being destroyed keeps none.
    let _ = STACK.try_with(|s| {
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
        self.wait_for(Command::ClientSync)
    }
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
        let other = contexts.create(0, 0);
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

    #[test]
    fn the_current_context_names_the_device_work_goes_to() {
        let contexts = Contexts::for_devices(2, 1);
        let own = contexts.primary();
        let other = contexts.primary_of(0).expect("device 0");
        let other_handle = handle(other);
        assert_eq!(contexts.get(own).map(|c| c.device).ok(), Some(1));
        assert_eq!(contexts.get(other_handle).map(|c| c.device).ok(), Some(0));
        assert!(contexts.primary_of(2).is_none(), "a device it does not see");
        assert!(contexts.destroy(other_handle).is_err(), "not destroyed");
        let created = contexts.create(0, 0);
        assert_ne!(created, other_handle);
        set_current(own);
        assert_eq!(contexts.current_device(), Some(1));
        set_current(other_handle);
        assert_eq!(contexts.current_device(), Some(0));
        set_current(created);
        assert_eq!(
            contexts.current_device(),
            Some(0),
            "a created context's device"
        );
        set_current(std::ptr::null_mut());
        assert_eq!(contexts.current_device(), None, "no context");
        other.retain();
        assert!(other.active());
        other.release();
        other.release();
        assert!(!other.active(), "never below zero");
    }
}
