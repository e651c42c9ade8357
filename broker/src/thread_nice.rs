//! A thread's CPU priority by the class of the client it serves (`gpushared --high-nice`):
//! the threads that carry a high-priority client's work (its data thread in gpushared, its
//! channel's thread in the device worker) run at a better nice value than the process, so
//! that when every core is wanted they are the ones that get one. Linux keeps a nice value
//! per thread; a thread's is set relative to the one it had when first set here, so a
//! gpushared started under `nice` keeps its place.

use std::cell::Cell;
use std::sync::atomic::{AtomicBool, Ordering};

thread_local! {
    /// The thread's nice before it was first set here, and the offset last asked.
    static SET: Cell<Option<(i32, i32)>> = const { Cell::new(None) };
}

/// Gives the calling thread its first nice value plus `offset` (clamped to -20..=19). A
/// better (lower) value than the process's needs `CAP_SYS_NICE`, or an `RLIMIT_NICE` that
/// allows it; the error says when it is refused, and the thread keeps the nice it had. The
/// offset asked last is remembered either way: asking it again costs no system call (a device
/// worker's thread asks before every request), and a refused one is not tried again until
/// another is asked.
pub fn set_offset(offset: i32) -> std::io::Result<()> {
    let set = SET.get();
    if set.is_some_and(|(_, asked)| asked == offset) {
        return Ok(());
    }
    // SAFETY: gettid has no preconditions.
    let tid = unsafe { libc::gettid() } as libc::id_t;
    let base = match set {
        Some((base, _)) => base,
        None => current(tid)?,
    };
    SET.set(Some((base, offset)));
    if set.is_none() && offset == 0 {
        return Ok(()); // at its first value already
    }
    let want = base.saturating_add(offset).clamp(-20, 19);
    // SAFETY: sets the nice value of this thread (a tid is a PRIO_PROCESS id on Linux).
    if unsafe { libc::setpriority(libc::PRIO_PROCESS, tid, want) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// [`set_offset`], saying once per process when the kernel refuses it.
pub fn follow(offset: i32) {
    static TOLD: AtomicBool = AtomicBool::new(false);
    if let Err(e) = set_offset(offset)
        && !TOLD.swap(true, Ordering::Relaxed)
    {
        tracing::warn!(
            offset,
            %e,
            "cannot move the nice value of the threads that serve high-priority clients \
             (a better one needs CAP_SYS_NICE): they stay as the process is"
        );
    }
}

/// The thread's nice value now.
fn current(tid: libc::id_t) -> std::io::Result<i32> {
    // getpriority may return -1 as a value: errno, cleared first, tells an error apart.
    // SAFETY: errno is this thread's; getpriority reads the thread's nice value.
    unsafe {
        *libc::__errno_location() = 0;
        let nice = libc::getpriority(libc::PRIO_PROCESS, tid);
        if nice == -1 && *libc::__errno_location() != 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(nice)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn own() -> i32 {
        // SAFETY: gettid has no preconditions.
        current(unsafe { libc::gettid() } as libc::id_t).expect("getpriority")
    }

    #[test]
    fn a_thread_s_nice_moves_by_the_offset_from_its_first_and_back() {
        std::thread::spawn(|| {
            let base = own();
            if base + 3 > 19 {
                return; // already as nice as can be: nothing to see
            }
            set_offset(3).expect("a worse nice is always allowed");
            assert_eq!(own(), base + 3);
            set_offset(3).expect("the same again");
            assert_eq!(own(), base + 3);
            // Back to the first value: allowed without privilege only where RLIMIT_NICE
            // says so (root may); when refused, the thread keeps its nice.
            match set_offset(0) {
                Ok(()) => assert_eq!(own(), base),
                Err(_) => assert_eq!(own(), base + 3),
            }
        })
        .join()
        .expect("the thread");
    }

    #[test]
    fn the_offset_is_the_thread_s_own_not_the_process_s() {
        let before = own();
        std::thread::spawn(|| {
            if own() + 2 <= 19 {
                set_offset(2).expect("a worse nice is always allowed");
            }
        })
        .join()
        .expect("the thread");
        assert_eq!(own(), before);
    }
}
