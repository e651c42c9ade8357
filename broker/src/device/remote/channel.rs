//! One calling thread's channel to a device worker: a memfd both processes map, holding a page
//! of sequence words and sleep flags, a request area and a reply area.
//!
//! ```text
//!  0      caller's line: req_seq, req_len, caller_sleeps, closed, spin_ns
//!  64     worker's line: rep_seq, rep_len, worker_sleeps
//!  4096   request area (REQUEST_AREA bytes): the encoded envelope, then its inline payload
//!  +      reply area (REPLY_AREA bytes): the encoded answer
//! ```
//!
//! One request at a time: the caller writes it and bumps `req_seq`; the worker answers and
//! sets `rep_seq` to the same number. Each side spins a while, then sleeps on a futex in the
//! shared page; the other side makes the wake-up system call only when the sleeper said it
//! sleeps, so a busy channel takes no system call and an idle one no CPU. The caller may post a
//! request without waiting for its answer (a release that nobody waits for); the next request
//! first collects that answer.

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering, fence};
use std::time::{Duration, Instant};

use memmap2::{MmapOptions, MmapRaw};
use nix::sys::memfd::{MFdFlags, memfd_create};

/// The header page.
const HEADER: usize = 4096;
/// Bytes of encoded request and inline payload one request may carry (more goes as a blob).
pub const REQUEST_AREA: usize = 2 << 20;
/// Bytes of encoded answer.
pub const REPLY_AREA: usize = 1 << 20;
const CHANNEL_BYTES: usize = HEADER + REQUEST_AREA + REPLY_AREA;

/// How long a caller spins for an answer before yielding, and yields before sleeping (the
/// same shape as a wait on the GPU: short work answers within microseconds).
const CALLER_SPIN: Duration = Duration::from_micros(100);
const CALLER_YIELD: Duration = Duration::from_millis(20);
/// How long one sleep lasts before the sleeper looks at why it might stop waiting.
const NAP: Duration = Duration::from_millis(5);
/// How long a worker's channel thread spins for the next request unless told otherwise.
pub const DEFAULT_WORKER_SPIN: Duration = Duration::from_micros(50);

#[repr(C, align(64))]
struct CallerLine {
    req_seq: AtomicU32,
    req_len: AtomicU32,
    caller_sleeps: AtomicU32,
    closed: AtomicU32,
    spin_ns: AtomicU64,
}

#[repr(C, align(64))]
struct WorkerLine {
    rep_seq: AtomicU32,
    rep_len: AtomicU32,
    worker_sleeps: AtomicU32,
}

#[repr(C)]
struct Header {
    caller: CallerLine,
    worker: WorkerLine,
}

const _: () = assert!(std::mem::size_of::<Header>() <= HEADER);

/// Why a caller stopped waiting for an answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Gave {
    /// The reason the caller's `give_up` returned.
    Up(String),
}

/// A mapped channel (either end).
struct Mapped {
    map: MmapRaw,
}

// SAFETY: the mapping is plain shared memory; every access goes through atomics in the header
// or through one side's own area while the sequence words say it owns it.
unsafe impl Send for Mapped {}

impl Mapped {
    fn new(fd: BorrowedFd<'_>) -> std::io::Result<Mapped> {
        let map = MmapOptions::new().len(CHANNEL_BYTES).map_raw(&fd)?;
        Ok(Mapped { map })
    }

    fn header(&self) -> &Header {
        // SAFETY: the mapping is page-aligned and at least HEADER bytes; Header is atomics only,
        // valid for any bit pattern, and lives as long as `self`.
        unsafe { &*(self.map.as_ptr() as *const Header) }
    }

    /// `len` bytes of the area at `offset`.
    ///
    /// # Safety
    /// The caller owns that area now (the protocol's turn), so nobody writes it meanwhile.
    // Shared memory: whose turn it is, not a Rust borrow, says who may write it.
    #[allow(clippy::mut_from_ref)]
    unsafe fn area(&self, offset: usize, len: usize) -> &mut [u8] {
        // SAFETY: inside the mapping (offsets are constants, lengths are the area sizes); the
        // caller's promise covers aliasing.
        unsafe { std::slice::from_raw_parts_mut(self.map.as_mut_ptr().add(offset), len) }
    }
}

fn futex_wait(word: &AtomicU32, expected: u32, timeout: Duration) {
    let ts = libc::timespec {
        tv_sec: timeout.as_secs() as libc::time_t,
        tv_nsec: timeout.subsec_nanos() as libc::c_long,
    };
    // SAFETY: a futex wait on a live u32 of a shared mapping (not FUTEX_PRIVATE: the other
    // process wakes it), with a timeout on our stack; any outcome (woken, changed, timed out,
    // interrupted) just returns to the caller's loop.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAIT,
            expected,
            &ts as *const libc::timespec,
            0usize,
            0u32,
        );
    }
}

fn futex_wake(word: &AtomicU32) {
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

/// The caller's end (in gpushared).
pub struct CallerEnd {
    mapped: Mapped,
    /// Until the worker has its own copy (then the mapping is all this side needs).
    memfd: Option<OwnedFd>,
    seq: u32,
    /// A posted request whose answer has not been collected.
    outstanding: bool,
}

impl CallerEnd {
    pub fn create() -> std::io::Result<CallerEnd> {
        let memfd = memfd_create("gpushare-worker-channel", MFdFlags::MFD_CLOEXEC)?;
        nix::unistd::ftruncate(&memfd, CHANNEL_BYTES as libc::off_t)?;
        let mapped = Mapped::new(memfd.as_fd())?;
        mapped
            .header()
            .caller
            .spin_ns
            .store(DEFAULT_WORKER_SPIN.as_nanos() as u64, Ordering::Relaxed);
        Ok(CallerEnd {
            mapped,
            memfd: Some(memfd),
            seq: 0,
            outstanding: false,
        })
    }

    /// The memfd, for the worker; `None` once [`CallerEnd::handed_over`].
    pub fn fd(&self) -> Option<BorrowedFd<'_>> {
        self.memfd.as_ref().map(|f| f.as_fd())
    }

    /// The worker has mapped the channel: this side keeps only its mapping, no descriptor.
    pub fn handed_over(&mut self) {
        self.memfd = None;
    }

    /// How long the worker's thread stays awake for the next request.
    pub fn set_spin(&self, spin: Duration) {
        self.mapped.header().caller.spin_ns.store(
            spin.as_nanos().min(u64::MAX as u128) as u64,
            Ordering::Relaxed,
        );
    }

    /// Wakes the worker's thread if it sleeps, so that it spins for the next request again
    /// (the caller just woke up itself, and a request is likely to follow).
    pub fn nudge(&self) {
        let h = self.mapped.header();
        if h.worker.worker_sleeps.load(Ordering::Relaxed) != 0 {
            futex_wake(&h.caller.req_seq);
        }
    }

    /// Whether a posted request's answer is still to be collected.
    pub fn outstanding(&self) -> bool {
        self.outstanding
    }

    /// The request area, to encode the next request into. Only between requests.
    pub fn request_area(&mut self) -> &mut [u8] {
        debug_assert!(!self.outstanding);
        // SAFETY: no request is outstanding, so the worker does not read the area now.
        unsafe { self.mapped.area(HEADER, REQUEST_AREA) }
    }

    /// Publishes the `len` bytes written to the request area and wakes the worker if it
    /// sleeps.
    pub fn post(&mut self, len: usize) {
        let h = self.mapped.header();
        self.seq = self.seq.wrapping_add(1);
        h.caller.req_len.store(len as u32, Ordering::Relaxed);
        h.caller.req_seq.store(self.seq, Ordering::Release);
        self.outstanding = true;
        // Pairs with the worker's fence between saying it sleeps and looking at req_seq.
        fence(Ordering::SeqCst);
        if h.worker.worker_sleeps.load(Ordering::Relaxed) != 0 {
            futex_wake(&h.caller.req_seq);
        }
    }

    /// Waits for the answer to the posted request and returns it. `give_up` is asked now and
    /// then while waiting and ends the wait when it says why (the worker died, the device is
    /// being reset); the request then stays outstanding forever (the channel is dead).
    pub fn wait(&mut self, give_up: &dyn Fn() -> Option<String>) -> Result<&[u8], Gave> {
        let h = self.mapped.header();
        let started = Instant::now();
        let mut checked = started;
        loop {
            if h.worker.rep_seq.load(Ordering::Acquire) == self.seq {
                break;
            }
            let waited = started.elapsed();
            if waited < CALLER_SPIN {
                std::hint::spin_loop();
                continue;
            }
            if checked.elapsed() >= NAP || waited >= CALLER_YIELD {
                checked = Instant::now();
                if let Some(why) = give_up() {
                    return Err(Gave::Up(why));
                }
            }
            if waited < CALLER_YIELD {
                std::thread::yield_now();
                continue;
            }
            h.caller.caller_sleeps.store(1, Ordering::Relaxed);
            fence(Ordering::SeqCst);
            let seen = h.worker.rep_seq.load(Ordering::Acquire);
            if seen != self.seq {
                futex_wait(&h.worker.rep_seq, seen, NAP);
            }
            h.caller.caller_sleeps.store(0, Ordering::Relaxed);
        }
        self.outstanding = false;
        let len = (h.worker.rep_len.load(Ordering::Relaxed) as usize).min(REPLY_AREA);
        // SAFETY: the worker answered (rep_seq == seq, acquired), so it no longer writes the
        // reply area until the next request.
        Ok(unsafe { self.mapped.area(HEADER + REQUEST_AREA, len) })
    }
}

impl Drop for CallerEnd {
    fn drop(&mut self) {
        let h = self.mapped.header();
        h.caller.closed.store(1, Ordering::Release);
        futex_wake(&h.caller.req_seq);
    }
}

/// What a worker's channel thread gets next.
pub enum Next {
    /// A request: [`WorkerEnd::areas`] holds it.
    Request,
    Closed,
}

/// The worker's end.
pub struct WorkerEnd {
    mapped: Mapped,
    seen: u32,
    /// Bytes of the request being served.
    len: usize,
}

impl WorkerEnd {
    /// Maps a channel gpushared made.
    pub fn open(fd: &OwnedFd) -> std::io::Result<WorkerEnd> {
        let len = nix::sys::stat::fstat(fd).map(|s| s.st_size as usize)?;
        if len < CHANNEL_BYTES {
            return Err(std::io::Error::other(format!(
                "a channel of {len} bytes, not {CHANNEL_BYTES}"
            )));
        }
        let mapped = Mapped::new(fd.as_fd())?;
        let seen = mapped.header().caller.req_seq.load(Ordering::Acquire);
        Ok(WorkerEnd {
            mapped,
            seen,
            len: 0,
        })
    }

    /// Waits for the next request: spins for the caller's spin time, then sleeps until woken
    /// (or, now and then, to see whether `stop` says the worker is ending); spins again after
    /// each wake-up.
    pub fn next(&mut self, stop: &dyn Fn() -> bool) -> Next {
        let h = self.mapped.header();
        let mut started = Instant::now();
        let spin = Duration::from_nanos(h.caller.spin_ns.load(Ordering::Relaxed));
        loop {
            let seq = h.caller.req_seq.load(Ordering::Acquire);
            if seq != self.seen {
                self.seen = seq;
                self.len = (h.caller.req_len.load(Ordering::Relaxed) as usize).min(REQUEST_AREA);
                return Next::Request;
            }
            if h.caller.closed.load(Ordering::Acquire) != 0 || stop() {
                return Next::Closed;
            }
            if started.elapsed() < spin {
                std::hint::spin_loop();
                continue;
            }
            h.worker.worker_sleeps.store(1, Ordering::Relaxed);
            fence(Ordering::SeqCst);
            let now = h.caller.req_seq.load(Ordering::Acquire);
            if now == self.seen && h.caller.closed.load(Ordering::Acquire) == 0 {
                futex_wait(&h.caller.req_seq, now, Duration::from_millis(100));
            }
            h.worker.worker_sleeps.store(0, Ordering::Relaxed);
            // Woken (by a request, a nudge or the timeout): spin again before sleeping.
            started = Instant::now();
        }
    }

    /// The request being served, and the reply area to encode its answer into (only between
    /// `next` and `answer`).
    pub fn areas(&mut self) -> (&[u8], &mut [u8]) {
        // SAFETY: the caller published this request (req_seq acquired in `next`) and touches
        // neither area until `answer` publishes the reply; the two areas do not overlap.
        unsafe {
            (
                &*self.mapped.area(HEADER, self.len),
                self.mapped.area(HEADER + REQUEST_AREA, REPLY_AREA),
            )
        }
    }

    /// Publishes the `len` bytes written to the reply area.
    pub fn answer(&mut self, len: usize) {
        let h = self.mapped.header();
        h.worker.rep_len.store(len as u32, Ordering::Relaxed);
        h.worker.rep_seq.store(self.seen, Ordering::Release);
        fence(Ordering::SeqCst);
        if h.caller.caller_sleeps.load(Ordering::Relaxed) != 0 {
            futex_wake(&h.worker.rep_seq);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pair() -> (CallerEnd, WorkerEnd) {
        let caller = CallerEnd::create().expect("channel");
        let fd = caller
            .fd()
            .expect("not handed over")
            .try_clone_to_owned()
            .expect("dup");
        let worker = WorkerEnd::open(&fd).expect("open");
        (caller, worker)
    }

    #[test]
    fn requests_and_answers_alternate_across_threads() {
        let (mut caller, mut worker) = pair();
        let server = std::thread::spawn(move || {
            let mut served = 0u32;
            loop {
                if let Next::Closed = worker.next(&|| false) {
                    return served;
                }
                let (request, reply) = worker.areas();
                reply[0] = request[0].wrapping_mul(2);
                worker.answer(1);
                served += 1;
            }
        });
        caller.set_spin(Duration::from_micros(10));
        for i in 0..200u32 {
            caller.request_area()[0] = i as u8;
            caller.post(1);
            if i % 3 == 0 {
                // Now and then the worker goes to sleep between requests.
                std::thread::sleep(Duration::from_millis(1));
            }
            let answer = caller.wait(&|| None).expect("answered");
            assert_eq!(answer, [(i as u8).wrapping_mul(2)]);
        }
        drop(caller);
        assert_eq!(server.join().expect("server"), 200);
    }

    #[test]
    fn a_caller_gives_up_when_told_why() {
        let (mut caller, _worker) = pair();
        caller.request_area()[0] = 1;
        caller.post(1);
        let gave = caller.wait(&|| Some("the worker died".into()));
        assert_eq!(gave, Err(Gave::Up("the worker died".into())));
        assert!(caller.outstanding());
    }
}
