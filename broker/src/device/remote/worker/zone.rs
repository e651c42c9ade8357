//! Where a worker maps what it holds for clients: its channels, their threads' stacks, the
//! clients' shared regions and large payloads go at fixed addresses in a zone of their own,
//! never where the kernel would put them (bottom-up, after the libraries). That is where the
//! CUDA driver reserves the addresses of module data, so a worker's mappings there would move
//! a module's globals by however much the worker had mapped before it: a spare that takes
//! over then places a client's globals elsewhere than the worker it replaces
//! (docs/reliability.md, "Module globals that move").

use std::ffi::c_void;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

/// The zone: 8 TiB from 64 TiB, far above where the driver's bottom-up reservations grow and
/// below where gpushared's tests hold every worker mapping (0x5000_0000_0000).
pub(crate) const ZONE_START: u64 = 0x4000_0000_0000;
const ZONE_END: u64 = 0x4800_0000_0000;
const ALIGN: u64 = 2 << 20;

static NEXT: AtomicU64 = AtomicU64::new(ZONE_START);

/// An address in the zone for `len` bytes, never handed out before; 0 (anywhere) once the
/// zone is used up.
pub(super) fn place(len: u64) -> u64 {
    let len = len.max(1).div_ceil(ALIGN).saturating_mul(ALIGN);
    let at = NEXT.fetch_add(len, Ordering::Relaxed);
    if at.saturating_add(len) > ZONE_END {
        0
    } else {
        at
    }
}

/// Bytes of a channel thread's stack, and its guard page below.
const STACK: usize = 2 << 20;
const GUARD: usize = 4096;

/// Stacks of channel threads that have ended, for the next ones.
static SPARE_STACKS: Mutex<Vec<usize>> = Mutex::new(Vec::new());
/// Threads that have ended (or are ending) with the stack each ran on.
static ENDED: Mutex<Vec<(libc::pthread_t, usize)>> = Mutex::new(Vec::new());

/// Starts `f` on a thread called `name` whose stack lies in the zone (std's threads get
/// theirs wherever the kernel puts them).
pub(super) fn spawn(name: &str, f: Box<dyn FnOnce() + Send>) -> std::io::Result<()> {
    reap();
    let stack = match SPARE_STACKS.lock().unwrap_or_else(|p| p.into_inner()).pop() {
        Some(s) => s,
        None => new_stack()?,
    };
    let start = Box::into_raw(Box::new(Start { f, stack }));
    // SAFETY: `attr` is initialised before use and destroyed after; the stack is ours,
    // mapped read-write above its guard page, and outlives the thread (it goes back to
    // SPARE_STACKS only after the thread is joined); the name is NUL-terminated and the
    // thread, joinable, is not joined before this.
    let made = unsafe {
        let mut attr: libc::pthread_attr_t = std::mem::zeroed();
        libc::pthread_attr_init(&mut attr);
        libc::pthread_attr_setstack(&mut attr, (stack + GUARD) as *mut c_void, STACK);
        let mut thread: libc::pthread_t = 0;
        let made = libc::pthread_create(&mut thread, &attr, run, start.cast());
        libc::pthread_attr_destroy(&mut attr);
        // At most 15 bytes and a NUL, as the kernel keeps them; a name is only a label.
        let short: Vec<u8> = name.bytes().filter(|&b| b != 0).take(15).collect();
        if made == 0
            && let Ok(name) = std::ffi::CString::new(short)
        {
            libc::pthread_setname_np(thread, name.as_ptr());
        }
        made
    };
    if made != 0 {
        // SAFETY: the thread was not made, so `start` is still ours.
        drop(unsafe { Box::from_raw(start) });
        SPARE_STACKS
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(stack);
        return Err(std::io::Error::from_raw_os_error(made));
    }
    Ok(())
}

struct Start {
    f: Box<dyn FnOnce() + Send>,
    stack: usize,
}

extern "C" fn run(arg: *mut c_void) -> *mut c_void {
    // SAFETY: `spawn` passed a leaked `Box<Start>`, taken back once, here.
    let start = unsafe { Box::from_raw(arg.cast::<Start>()) };
    let Start { f, stack } = *start;
    // A panic must not unwind into C.
    let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f));
    // SAFETY: pthread_self is always safe to call.
    let me = unsafe { libc::pthread_self() };
    ENDED
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .push((me, stack));
    std::ptr::null_mut()
}

/// Joins the threads that ended and gives their stacks back.
fn reap() {
    let ended = std::mem::take(&mut *ENDED.lock().unwrap_or_else(|p| p.into_inner()));
    for (thread, stack) in ended {
        // SAFETY: a joinable thread of ours that has left its body; joined once.
        unsafe { libc::pthread_join(thread, std::ptr::null_mut()) };
        SPARE_STACKS
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(stack);
    }
}

/// A stack (and its guard page) at a fresh place in the zone, or wherever the kernel puts it
/// once the zone is used up.
fn new_stack() -> std::io::Result<usize> {
    let len = STACK + GUARD;
    let at = place(len as u64);
    let mut flags = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_STACK;
    if at != 0 {
        flags |= libc::MAP_FIXED_NOREPLACE;
    }
    let prot = libc::PROT_READ | libc::PROT_WRITE;
    // SAFETY: a new anonymous mapping; MAP_FIXED_NOREPLACE never replaces one.
    let p = unsafe { libc::mmap(at as *mut c_void, len, prot, flags, -1, 0) };
    if p == libc::MAP_FAILED {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: the first page of the mapping just made.
    unsafe { libc::mprotect(p, GUARD, libc::PROT_NONE) };
    Ok(p as usize)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn places_are_aligned_fresh_and_inside_the_zone() {
        let a = place(1);
        let b = place(3 << 20);
        let c = place(1);
        for p in [a, b, c] {
            assert!(
                (ZONE_START..ZONE_END).contains(&p) && p % ALIGN == 0,
                "{p:#x}"
            );
        }
        assert!(b >= a + ALIGN && c >= b + (4 << 20), "{a:#x} {b:#x} {c:#x}");
    }

    #[test]
    fn a_zone_thread_runs_on_a_zone_stack_and_its_stack_is_used_again() {
        let (tx, rx) = std::sync::mpsc::channel();
        for _ in 0..3 {
            let tx = tx.clone();
            spawn(
                "zone-test",
                Box::new(move || {
                    let local = 0u8;
                    let _ = tx.send(std::ptr::addr_of!(local) as u64);
                }),
            )
            .expect("spawn");
        }
        let seen: Vec<u64> = (0..3).map(|_| rx.recv().expect("ran")).collect();
        for s in &seen {
            assert!((ZONE_START..ZONE_END).contains(s), "stack at {s:#x}");
        }
    }
}
