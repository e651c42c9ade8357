//! Contexts. All of a process's contexts share its one session with the broker (whose context
//! is the real one): the primary context, and any the program creates, differ only in their
//! flags and their context-local storage. Each thread has its own stack of current contexts.

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
use crate::types::{CUcontext, limit, result};

use storage::Storage;
pub use storage::StorageDtor;

/// One context, as the program holds it.
pub struct Context {
    pub id: u64,
    pub flags: AtomicU32,
}

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
        Contexts {
            primary: Box::leak(Box::new(Context {
                id: 1,
                flags: AtomicU32::new(0),
            })),
            primary_retains: AtomicI32::new(0),
            created: Mutex::new(HashSet::new()),
            next_id: AtomicU64::new(2),
            storage: Mutex::new(HashMap::new()),
            limits: Mutex::new(limits::defaults()),
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
}
