//! Mappings of files a client may shrink under us: a tmpfs file it registers as page-locked
//! memory (`cuMemHostRegister` of a `/dev/shm` mapping, as NCCL's shared-memory transport
//! does) cannot be sealed like the memfds the client library makes. Touching a page past the
//! file's new end raises SIGBUS; a handler here maps zeroed private memory over the whole
//! guarded mapping and marks it spoiled, so the access completes and the process lives. Only
//! the client that shrank its own file sees the difference (its copies through it read zeros
//! or go nowhere). Wayland compositors guard their clients' shm pools the same way.

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

/// How many guarded mappings one process holds at once.
pub const SLOTS: usize = 1024;

/// Each slot's range; a start of 0 is a free slot. The handler reads these without a lock.
static STARTS: [AtomicUsize; SLOTS] = [const { AtomicUsize::new(0) }; SLOTS];
static ENDS: [AtomicUsize; SLOTS] = [const { AtomicUsize::new(0) }; SLOTS];
static SPOILED: [AtomicBool; SLOTS] = [const { AtomicBool::new(false) }; SLOTS];
/// Taking and giving back slots (never in the handler).
static TAKING: Mutex<()> = Mutex::new(());
/// The SIGBUS action found when the handler went in, for faults that are not ours.
static PREVIOUS: std::sync::OnceLock<Option<libc::sigaction>> = std::sync::OnceLock::new();

/// A guarded mapping; dropping it ends the guard (after the mapping is gone).
#[derive(Debug)]
pub struct Guard {
    slot: usize,
}

#[derive(Debug, thiserror::Error)]
pub enum GuardError {
    #[error("more than {SLOTS} shrinkable host mappings at once")]
    Full,
    #[error("cannot install the SIGBUS handler: {0}")]
    Handler(std::io::Error),
}

/// Guards `[start, start + len)`, a shared mapping of a file that may shrink.
pub fn guard(start: usize, len: usize) -> Result<Guard, GuardError> {
    install()?;
    let _taking = TAKING.lock().unwrap_or_else(|p| p.into_inner());
    let slot = STARTS
        .iter()
        .position(|s| s.load(Ordering::Acquire) == 0)
        .ok_or(GuardError::Full)?;
    SPOILED[slot].store(false, Ordering::Release);
    ENDS[slot].store(start.saturating_add(len), Ordering::Release);
    STARTS[slot].store(start, Ordering::Release);
    Ok(Guard { slot })
}

impl Guard {
    /// Whether the file shrank under the mapping and its pages were replaced.
    pub fn spoiled(&self) -> bool {
        SPOILED[self.slot].load(Ordering::Acquire)
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        let _taking = TAKING.lock().unwrap_or_else(|p| p.into_inner());
        STARTS[self.slot].store(0, Ordering::Release);
        ENDS[self.slot].store(0, Ordering::Release);
    }
}

fn install() -> Result<(), GuardError> {
    let mut failed = None;
    PREVIOUS.get_or_init(|| {
        // SAFETY: a zeroed sigaction is a valid value to fill in; `on_sigbus` has the
        // SA_SIGINFO signature and only does async-signal-safe work (atomics, mmap).
        unsafe {
            let mut action: libc::sigaction = std::mem::zeroed();
            action.sa_sigaction = on_sigbus as *const () as usize;
            action.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK;
            libc::sigemptyset(&mut action.sa_mask);
            let mut old: libc::sigaction = std::mem::zeroed();
            if libc::sigaction(libc::SIGBUS, &action, &mut old) != 0 {
                failed = Some(std::io::Error::last_os_error());
                return None;
            }
            Some(old)
        }
    });
    match (failed, PREVIOUS.get()) {
        (Some(e), _) => Err(GuardError::Handler(e)),
        (None, Some(Some(_))) => Ok(()),
        _ => Err(GuardError::Handler(std::io::Error::other(
            "an earlier attempt failed",
        ))),
    }
}

extern "C" fn on_sigbus(
    signal: libc::c_int,
    info: *mut libc::siginfo_t,
    context: *mut libc::c_void,
) {
    // SAFETY: the kernel passes a valid siginfo for a SA_SIGINFO handler.
    let addr = unsafe { (*info).si_addr() } as usize;
    for slot in 0..SLOTS {
        let start = STARTS[slot].load(Ordering::Acquire);
        let end = ENDS[slot].load(Ordering::Acquire);
        if start == 0 || addr < start || addr >= end {
            continue;
        }
        // SAFETY: replaces a guarded mapping (ours, shared with a client) with private zeroed
        // memory of the same extent; mmap is async-signal-safe.
        unsafe {
            libc::mmap(
                start as *mut libc::c_void,
                end - start,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED,
                -1,
                0,
            );
        }
        SPOILED[slot].store(true, Ordering::Release);
        return;
    }
    // Not ours: what was there before, or the default (the access faults again, and kills).
    match PREVIOUS.get() {
        Some(Some(old))
            if old.sa_sigaction != libc::SIG_DFL && old.sa_sigaction != libc::SIG_IGN =>
        {
            if old.sa_flags & libc::SA_SIGINFO != 0 {
                // SAFETY: the handler installed before ours, called as it expects.
                let f: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void) =
                    unsafe { std::mem::transmute(old.sa_sigaction) };
                f(signal, info, context);
            } else {
                // SAFETY: as above, a one-argument handler.
                let f: extern "C" fn(libc::c_int) =
                    unsafe { std::mem::transmute(old.sa_sigaction) };
                f(signal);
            }
        }
        _ => {
            // SAFETY: a zeroed sigaction with SIG_DFL restores the default action.
            unsafe {
                let mut default: libc::sigaction = std::mem::zeroed();
                default.sa_sigaction = libc::SIG_DFL;
                libc::sigaction(libc::SIGBUS, &default, std::ptr::null_mut());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsRawFd;

    #[test]
    fn a_file_shrunk_under_a_guarded_mapping_costs_the_mapper_nothing() {
        let page = 4096usize;
        let file = tempfile::tempfile_in("/dev/shm").expect("a tmpfs file");
        file.set_len(2 * page as u64).expect("size");
        // SAFETY: a fresh shared mapping of the file, used only here.
        let at = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                2 * page,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                0,
            )
        };
        assert_ne!(at, libc::MAP_FAILED);
        let at = at as usize;
        let g = guard(at, 2 * page).expect("guarded");
        // SAFETY: inside the mapping.
        unsafe { ((at + page) as *mut u8).write_volatile(7) };
        assert!(!g.spoiled());
        file.set_len(0).expect("shrunk by its owner");
        // SAFETY: inside the mapping; past the file's end now, so the guard steps in.
        let read = unsafe { ((at + page) as *const u8).read_volatile() };
        assert_eq!(read, 0, "zeroed memory in place of the file's pages");
        assert!(g.spoiled());
        // SAFETY: still mapped (privately now); writable.
        unsafe { (at as *mut u8).write_volatile(1) };
        drop(g);
        // SAFETY: the mapping made above.
        unsafe { libc::munmap(at as *mut libc::c_void, 2 * page) };
    }
}
