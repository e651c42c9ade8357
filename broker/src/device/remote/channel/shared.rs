//! What both ends of a channel share: the layout of its memfd (a page of positions and sleep
//! flags, a ring of requests, a ring of answers), where a message goes in a ring and where the
//! next one is, and the futex waits.

use std::os::fd::BorrowedFd;
use std::sync::atomic::{AtomicI32, AtomicU32, AtomicU64, Ordering, fence};
use std::time::Duration;

use gpushare_protocol::wake::SpinClock;

/// The header page.
pub(super) const HEADER: usize = 4096;
/// Bytes of the request ring.
pub const REQUEST_RING: usize = 2 << 20;
/// Bytes of the answer ring.
pub(super) const ANSWER_RING: usize = 1 << 20;
pub(super) const CHANNEL_BYTES: usize = HEADER + REQUEST_RING + ANSWER_RING;
/// Largest request: an encoded envelope and its inline payload (bigger payloads go as blobs).
pub const MAX_REQUEST: usize = REQUEST_RING / 8;
/// Largest answer the worker may write.
pub const MAX_ANSWER: usize = 64 << 10;
/// A message's header: its length and a reserved word.
pub(super) const MSG_HEADER: usize = 8;
pub(super) const WRAP: u32 = u32::MAX;

/// How long a caller spins for an answer before sleeping (the same shape as a wait on the
/// GPU: short work answers within microseconds), while the machine has a core to spare
/// (`gpushare_protocol::wake::spin_turn`).
pub(super) const CALLER_SPIN: Duration = Duration::from_millis(20);
/// How long one sleep lasts before the sleeper looks at why it might stop waiting.
pub(super) const NAP: Duration = Duration::from_millis(5);
/// How long a worker's channel thread spins for the next request unless told otherwise.
pub const DEFAULT_WORKER_SPIN: Duration = Duration::from_micros(50);

#[repr(C, align(64))]
pub(super) struct CallerLine {
    pub(super) tail: AtomicU64,
    pub(super) answers_read: AtomicU64,
    pub(super) req_seq: AtomicU32,
    pub(super) closed: AtomicU32,
    pub(super) spin_ns: AtomicU64,
    /// What the worker's thread moves its nice value by (`crate::thread_nice`).
    pub(super) nice: AtomicI32,
}

#[repr(C, align(64))]
pub(super) struct WorkerLine {
    pub(super) head: AtomicU64,
    pub(super) answers_written: AtomicU64,
    pub(super) rep_seq: AtomicU32,
}

/// A side's "I sleep" flag, on a line of its own: written only when that side goes to sleep
/// or wakes, so the other side's look at it after every message stays in its cache (beside
/// the positions, which move with every message, it cost a transfer between cores each time).
#[repr(C, align(64))]
pub(super) struct SleepLine {
    pub(super) sleeps: AtomicU32,
}

#[repr(C)]
pub(super) struct Header {
    pub(super) caller: CallerLine,
    pub(super) worker: WorkerLine,
    pub(super) caller_sleeps: SleepLine,
    pub(super) worker_sleeps: SleepLine,
}

const _: () = assert!(std::mem::size_of::<Header>() <= HEADER);
const _: () = assert!(REQUEST_RING.is_power_of_two() && ANSWER_RING.is_power_of_two());

/// Why a side stopped waiting.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Gave {
    /// The reason the caller's `give_up` returned.
    Up(String),
    /// The other side broke the ring's rules (a length out of bounds).
    Broken(String),
}

/// A mapped channel (either end).
pub(super) struct Mapped {
    base: std::ptr::NonNull<u8>,
}

// SAFETY: the mapping is plain shared memory; every access goes through atomics in the header
// or through the ring bytes the positions give one side to own.
unsafe impl Send for Mapped {}

impl Drop for Mapped {
    fn drop(&mut self) {
        // SAFETY: our own mapping of CHANNEL_BYTES, unmapped once; nothing borrows it past
        // `self`.
        unsafe { libc::munmap(self.base.as_ptr().cast(), CHANNEL_BYTES) };
    }
}

impl Mapped {
    /// Maps the channel at `at` when that is free there (0: wherever the kernel puts it).
    pub(super) fn new(fd: BorrowedFd<'_>, at: u64) -> std::io::Result<Mapped> {
        use std::os::fd::AsRawFd;
        let prot = libc::PROT_READ | libc::PROT_WRITE;
        let map = |at: u64, flags| {
            // SAFETY: a new shared mapping of the channel's memfd; MAP_FIXED_NOREPLACE never
            // replaces a mapping.
            let p =
                unsafe { libc::mmap(at as *mut _, CHANNEL_BYTES, prot, flags, fd.as_raw_fd(), 0) };
            (p != libc::MAP_FAILED).then_some(p)
        };
        let placed = (at != 0)
            .then(|| map(at, libc::MAP_SHARED | libc::MAP_FIXED_NOREPLACE))
            .flatten()
            .filter(|&p| p as u64 == at);
        let p = match placed {
            Some(p) => p,
            None => map(0, libc::MAP_SHARED).ok_or_else(std::io::Error::last_os_error)?,
        };
        let base = std::ptr::NonNull::new(p.cast::<u8>())
            .ok_or_else(|| std::io::Error::other("a channel mapped at address 0"))?;
        Ok(Mapped { base })
    }

    pub(super) fn header(&self) -> &Header {
        // SAFETY: the mapping is page-aligned and at least HEADER bytes; Header is atomics only,
        // valid for any bit pattern, and lives as long as `self`.
        unsafe { &*(self.base.as_ptr() as *const Header) }
    }

    /// `len` bytes at `offset` of the mapping.
    ///
    /// # Safety
    /// `offset + len` is inside the mapping, and the ring protocol gives the calling side these
    /// bytes now (nobody else writes them meanwhile).
    // Shared memory: whose turn it is, not a Rust borrow, says who may write it.
    #[allow(clippy::mut_from_ref)]
    pub(super) unsafe fn bytes(&self, offset: usize, len: usize) -> &mut [u8] {
        debug_assert!(offset + len <= CHANNEL_BYTES);
        // SAFETY: the caller's promise.
        unsafe { std::slice::from_raw_parts_mut(self.base.as_ptr().add(offset), len) }
    }

    pub(super) fn read_u32(&self, offset: usize) -> u32 {
        // SAFETY: 4 bytes inside the mapping (ring offsets are 8-aligned and leave 8 bytes).
        let b = unsafe { self.bytes(offset, 4) };
        u32::from_le_bytes([b[0], b[1], b[2], b[3]])
    }

    pub(super) fn write_header(&self, offset: usize, len: u32) {
        // SAFETY: as for read_u32; the writer owns these bytes now.
        let b = unsafe { self.bytes(offset, MSG_HEADER) };
        b[..4].copy_from_slice(&len.to_le_bytes());
        b[4..].fill(0);
    }
}

pub(super) fn padded(len: usize) -> u64 {
    (MSG_HEADER + len).next_multiple_of(8) as u64
}

/// One ring as its writer sees it: where the next message goes, given how far the reader is.
/// Returns the byte position to write the message at (after any wrap marker), or `None` when
/// there is no room yet.
pub(super) fn place(tail: u64, read: u64, cap: usize, len: usize) -> Option<(u64, bool)> {
    let need = padded(len);
    let pos = (tail % cap as u64) as usize;
    let to_end = (cap - pos) as u64;
    let (at, wraps) = if to_end < need {
        (tail + to_end, true)
    } else {
        (tail, false)
    };
    let used = at + need - read;
    (used <= cap as u64).then_some((at, wraps))
}

/// The next message of a ring from `read` up to `written`: (its start position, length), or
/// `None` when there is none; positions past wrap markers are skipped.
pub(super) fn take(
    mapped: &Mapped,
    base: usize,
    cap: usize,
    mut read: u64,
    written: u64,
) -> Result<Option<(u64, usize)>, Gave> {
    loop {
        if read >= written {
            return Ok(None);
        }
        let pos = (read % cap as u64) as usize;
        let len = mapped.read_u32(base + pos);
        if len == WRAP {
            read += (cap - pos) as u64;
            continue;
        }
        let len = len as usize;
        if pos + MSG_HEADER + len > cap || read + padded(len) > written {
            return Err(Gave::Broken(format!(
                "a message of {len} bytes at {pos} leaves its ring"
            )));
        }
        return Ok(Some((read, len)));
    }
}

/// Sleeps while `word` is `expected`, until woken or `timeout` (`None`: no timeout) passes.
pub(super) fn futex_wait(word: &AtomicU32, expected: u32, timeout: Option<Duration>) {
    let ts = timeout.map(|t| libc::timespec {
        tv_sec: t.as_secs() as libc::time_t,
        tv_nsec: t.subsec_nanos() as libc::c_long,
    });
    let ts_ptr = ts
        .as_ref()
        .map_or(std::ptr::null(), |t| t as *const libc::timespec);
    // SAFETY: a futex wait on a live u32 of a shared mapping (not FUTEX_PRIVATE: the other
    // process wakes it), with a timeout on our stack or none (NULL); any outcome (woken,
    // changed, timed out, interrupted) just returns to the caller's loop.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAIT,
            expected,
            ts_ptr,
            0usize,
            0u32,
        );
    }
}

pub(super) fn futex_wake(word: &AtomicU32) {
    // SAFETY: a futex wake on a live u32 of a shared mapping; it touches no memory.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAKE,
            i32::MAX,
            0usize,
            0usize,
            0u32,
        );
    }
}

/// Waits in the caller's rhythm (spin, yield, sleep on `word` while it holds `seen`) until
/// `ready`, asking `give_up` now and then.
pub(super) fn caller_wait(
    h: &Header,
    word: &AtomicU32,
    mut ready: impl FnMut() -> bool,
    give_up: &dyn Fn() -> Option<String>,
) -> Result<(), Gave> {
    let mut clock = SpinClock::new();
    let mut checked = Duration::ZERO;
    loop {
        if ready() {
            return Ok(());
        }
        let waited = clock.spun();
        let spin = waited < CALLER_SPIN && gpushare_protocol::wake::spin_turn(waited);
        if !spin || waited.saturating_sub(checked) >= NAP {
            checked = waited;
            if let Some(why) = give_up() {
                return Err(Gave::Up(why));
            }
        }
        if spin {
            continue;
        }
        let seen = word.load(Ordering::Acquire);
        h.caller_sleeps.sleeps.store(1, Ordering::Relaxed);
        fence(Ordering::SeqCst);
        if !ready() {
            futex_wait(word, seen, Some(NAP));
        }
        h.caller_sleeps.sleeps.store(0, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lengths_that_leave_the_ring_are_refused() {
        assert!(place(0, 0, 64, 100).is_none(), "larger than the ring");
        assert_eq!(place(0, 0, 64, 8), Some((0, false)));
        assert_eq!(place(56, 40, 64, 8), Some((64, true)), "wraps to the start");
        assert!(place(56, 0, 64, 8).is_none(), "the reader is behind");
    }
}
