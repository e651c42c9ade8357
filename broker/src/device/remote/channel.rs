//! One calling thread's channel to a device worker: a memfd both processes map, holding a page
//! of positions and sleep flags, a ring of requests and a ring of answers.
//!
//! ```text
//!  0      caller's line: tail (request bytes written), answers_read, req_seq, caller_sleeps,
//!         closed, spin_ns
//!  64     worker's line: head (request bytes done), answers_written, rep_seq, worker_sleeps
//!  4096   request ring (REQUEST_RING bytes)
//!  +      answer ring (ANSWER_RING bytes)
//! ```
//!
//! A message in either ring is `[len: u32][0: u32][len bytes]`, padded to 8 bytes; one that
//! would not fit before the ring's end leaves a wrap marker (`len = u32::MAX`) and starts at
//! its beginning. Positions are free-running byte counts. Every request gets one answer, in
//! order, so the caller can post many requests (work queued on a stream) without waiting, and
//! the worker runs them back to back; a request whose answer is needed waits for it behind
//! the others. Each side spins a while, then sleeps on a futex in the shared page; the other
//! side makes the wake-up system call only when the sleeper said it sleeps, so a busy channel
//! takes no system call and an idle one no CPU. Both processes are gpushared's own, but
//! lengths are still checked: a bad one ends the channel, never reads out of bounds.

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering, fence};
use std::time::{Duration, Instant};

use memmap2::{MmapOptions, MmapRaw};
use nix::sys::memfd::{MFdFlags, memfd_create};

/// The header page.
const HEADER: usize = 4096;
/// Bytes of the request ring.
pub const REQUEST_RING: usize = 2 << 20;
/// Bytes of the answer ring.
const ANSWER_RING: usize = 1 << 20;
const CHANNEL_BYTES: usize = HEADER + REQUEST_RING + ANSWER_RING;
/// Largest request: an encoded envelope and its inline payload (bigger payloads go as blobs).
pub const MAX_REQUEST: usize = REQUEST_RING / 8;
/// Largest answer the worker may write.
pub const MAX_ANSWER: usize = 64 << 10;
/// A message's header: its length and a reserved word.
const MSG_HEADER: usize = 8;
const WRAP: u32 = u32::MAX;

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
    tail: AtomicU64,
    answers_read: AtomicU64,
    req_seq: AtomicU32,
    caller_sleeps: AtomicU32,
    closed: AtomicU32,
    spin_ns: AtomicU64,
}

#[repr(C, align(64))]
struct WorkerLine {
    head: AtomicU64,
    answers_written: AtomicU64,
    rep_seq: AtomicU32,
    worker_sleeps: AtomicU32,
}

#[repr(C)]
struct Header {
    caller: CallerLine,
    worker: WorkerLine,
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
struct Mapped {
    map: MmapRaw,
}

// SAFETY: the mapping is plain shared memory; every access goes through atomics in the header
// or through the ring bytes the positions give one side to own.
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

    /// `len` bytes at `offset` of the mapping.
    ///
    /// # Safety
    /// `offset + len` is inside the mapping, and the ring protocol gives the calling side these
    /// bytes now (nobody else writes them meanwhile).
    // Shared memory: whose turn it is, not a Rust borrow, says who may write it.
    #[allow(clippy::mut_from_ref)]
    unsafe fn bytes(&self, offset: usize, len: usize) -> &mut [u8] {
        debug_assert!(offset + len <= CHANNEL_BYTES);
        // SAFETY: the caller's promise.
        unsafe { std::slice::from_raw_parts_mut(self.map.as_mut_ptr().add(offset), len) }
    }

    fn read_u32(&self, offset: usize) -> u32 {
        // SAFETY: 4 bytes inside the mapping (ring offsets are 8-aligned and leave 8 bytes).
        let b = unsafe { self.bytes(offset, 4) };
        u32::from_le_bytes([b[0], b[1], b[2], b[3]])
    }

    fn write_header(&self, offset: usize, len: u32) {
        // SAFETY: as for read_u32; the writer owns these bytes now.
        let b = unsafe { self.bytes(offset, MSG_HEADER) };
        b[..4].copy_from_slice(&len.to_le_bytes());
        b[4..].fill(0);
    }
}

fn padded(len: usize) -> u64 {
    (MSG_HEADER + len).next_multiple_of(8) as u64
}

/// One ring as its writer sees it: where the next message goes, given how far the reader is.
/// Returns the byte position to write the message at (after any wrap marker), or `None` when
/// there is no room yet.
fn place(tail: u64, read: u64, cap: usize, len: usize) -> Option<(u64, bool)> {
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
fn take(
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

/// Waits in the caller's rhythm (spin, yield, sleep on `word` while it holds `seen`) until
/// `ready`, asking `give_up` now and then.
fn caller_wait(
    h: &Header,
    word: &AtomicU32,
    mut ready: impl FnMut() -> bool,
    give_up: &dyn Fn() -> Option<String>,
) -> Result<(), Gave> {
    let started = Instant::now();
    let mut checked = started;
    loop {
        if ready() {
            return Ok(());
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
        let seen = word.load(Ordering::Acquire);
        h.caller.caller_sleeps.store(1, Ordering::Relaxed);
        fence(Ordering::SeqCst);
        if !ready() {
            futex_wait(word, seen, NAP);
        }
        h.caller.caller_sleeps.store(0, Ordering::Relaxed);
    }
}

/// The caller's end (in gpushared).
pub struct CallerEnd {
    mapped: Mapped,
    /// Until the worker has its own copy (then the mapping is all this side needs).
    memfd: Option<OwnedFd>,
    tail: u64,
    answers_read: u64,
    /// Requests sent whose answers have not been read.
    outstanding: usize,
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
            tail: 0,
            answers_read: 0,
            outstanding: 0,
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

    /// Requests sent whose answers have not been read.
    pub fn outstanding(&self) -> usize {
        self.outstanding
    }

    /// Sends one request of at most `max` bytes: waits for room, lets `write` fill it (it
    /// returns the bytes it used), publishes it and wakes the worker if it sleeps.
    pub fn send(
        &mut self,
        max: usize,
        write: impl FnOnce(&mut [u8]) -> Result<usize, String>,
        give_up: &dyn Fn() -> Option<String>,
    ) -> Result<(), Gave> {
        if max > MAX_REQUEST {
            return Err(Gave::Broken(format!(
                "a request of {max} bytes (at most {MAX_REQUEST})"
            )));
        }
        let h = self.mapped.header();
        let mut placed = None;
        let tail = self.tail;
        caller_wait(
            h,
            &h.worker.rep_seq,
            || {
                let read = h.worker.head.load(Ordering::Acquire);
                placed = place(tail, read, REQUEST_RING, max);
                placed.is_some()
            },
            give_up,
        )?;
        let Some((at, wraps)) = placed else {
            return Err(Gave::Broken("no room".into()));
        };
        if wraps {
            self.mapped
                .write_header(HEADER + (tail % REQUEST_RING as u64) as usize, WRAP);
        }
        let pos = HEADER + (at % REQUEST_RING as u64) as usize;
        // SAFETY: `place` found `max` bytes (and the header) free at `pos`, inside the ring;
        // the worker reads nothing past `tail`, which is not published yet.
        let area = unsafe { self.mapped.bytes(pos + MSG_HEADER, max) };
        let used = write(area).map_err(Gave::Broken)?.min(max);
        self.mapped.write_header(pos, used as u32);
        self.tail = at + padded(used);
        self.outstanding += 1;
        h.caller.tail.store(self.tail, Ordering::Release);
        h.caller.req_seq.fetch_add(1, Ordering::Release);
        // Pairs with the worker's fence between saying it sleeps and looking at the tail.
        fence(Ordering::SeqCst);
        if h.worker.worker_sleeps.load(Ordering::Relaxed) != 0 {
            futex_wake(&h.caller.req_seq);
        }
        Ok(())
    }

    /// The next answer (a copy), in the order the requests were sent: waits for it when
    /// `wait`, else `None` when it has not come yet.
    pub fn answer(
        &mut self,
        wait: bool,
        give_up: &dyn Fn() -> Option<String>,
    ) -> Result<Option<Vec<u8>>, Gave> {
        let h = self.mapped.header();
        let base = HEADER + REQUEST_RING;
        let read = self.answers_read;
        let mut found = None;
        let mut broken = None;
        let mut look = || match take(
            &self.mapped,
            base,
            ANSWER_RING,
            read,
            h.worker.answers_written.load(Ordering::Acquire),
        ) {
            Ok(Some(m)) => {
                found = Some(m);
                true
            }
            Ok(None) => false,
            Err(e) => {
                broken = Some(e);
                true
            }
        };
        if wait {
            caller_wait(h, &h.worker.rep_seq, look, give_up)?;
        } else {
            look();
        }
        if let Some(e) = broken {
            return Err(e);
        }
        let Some((at, len)) = found else {
            return Ok(None);
        };
        let pos = base + (at % ANSWER_RING as u64) as usize + MSG_HEADER;
        // SAFETY: the worker published this answer (answers_written acquired) and writes
        // nothing there until answers_read passes it.
        let bytes = unsafe { self.mapped.bytes(pos, len) }.to_vec();
        self.answers_read = at + padded(len);
        self.outstanding = self.outstanding.saturating_sub(1);
        h.caller
            .answers_read
            .store(self.answers_read, Ordering::Release);
        Ok(Some(bytes))
    }
}

impl Drop for CallerEnd {
    fn drop(&mut self) {
        let h = self.mapped.header();
        h.caller.closed.store(1, Ordering::Release);
        h.caller.req_seq.fetch_add(1, Ordering::Release);
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
    /// The request being served: its start position and length.
    current: Option<(u64, usize)>,
    head: u64,
    answers_written: u64,
    /// Where the answer being made goes (after any wrap marker).
    answer_at: u64,
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
        let h = mapped.header();
        let head = h.worker.head.load(Ordering::Acquire);
        let answers_written = h.worker.answers_written.load(Ordering::Acquire);
        Ok(WorkerEnd {
            mapped,
            current: None,
            head,
            answers_written,
            answer_at: 0,
        })
    }

    /// Waits for the next request: spins for the caller's spin time, then sleeps until woken
    /// (or, now and then, to see whether `stop` says the worker is ending); spins again after
    /// each wake-up. A request that breaks the ring's rules ends the channel.
    pub fn next(&mut self, stop: &dyn Fn() -> bool) -> Next {
        let h = self.mapped.header();
        let mut started = Instant::now();
        let spin = Duration::from_nanos(h.caller.spin_ns.load(Ordering::Relaxed));
        loop {
            let seq = h.caller.req_seq.load(Ordering::Acquire);
            let tail = h.caller.tail.load(Ordering::Acquire);
            match take(&self.mapped, HEADER, REQUEST_RING, self.head, tail) {
                Ok(Some(m)) => {
                    self.current = Some(m);
                    return Next::Request;
                }
                Ok(None) => {}
                Err(e) => {
                    tracing::warn!(error = ?e, "ending a broken channel");
                    return Next::Closed;
                }
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
            if h.caller.tail.load(Ordering::Acquire) == self.head
                && h.caller.closed.load(Ordering::Acquire) == 0
            {
                futex_wait(&h.caller.req_seq, seq, Duration::from_millis(100));
            }
            h.worker.worker_sleeps.store(0, Ordering::Relaxed);
            // Woken (by a request, a nudge or the timeout): spin again before sleeping.
            started = Instant::now();
        }
    }

    /// The request being served, and room for its answer (at most [`MAX_ANSWER`] bytes),
    /// waiting until the caller has read enough answers to make that room (`None` if the
    /// channel closes meanwhile). Only between `next` and `answer`.
    pub fn areas(&mut self) -> Option<(&[u8], &mut [u8])> {
        let (at, len) = self.current?;
        let h = self.mapped.header();
        let placed = loop {
            let read = h.caller.answers_read.load(Ordering::Acquire);
            if let Some(p) = place(self.answers_written, read, ANSWER_RING, MAX_ANSWER) {
                break p;
            }
            if h.caller.closed.load(Ordering::Acquire) != 0 {
                return None;
            }
            std::thread::yield_now();
        };
        let (answer_at, wraps) = placed;
        let base = HEADER + REQUEST_RING;
        if wraps {
            self.mapped.write_header(
                base + (self.answers_written % ANSWER_RING as u64) as usize,
                WRAP,
            );
        }
        self.answer_at = answer_at;
        let req = HEADER + (at % REQUEST_RING as u64) as usize + MSG_HEADER;
        let ans = base + (answer_at % ANSWER_RING as u64) as usize + MSG_HEADER;
        // SAFETY: the request was published by the caller (tail acquired) and stays untouched
        // until `head` passes it; the answer's room was found free (answers_read acquired) and
        // the caller reads nothing past answers_written. The two rings do not overlap.
        unsafe {
            Some((
                &*self.mapped.bytes(req, len),
                self.mapped.bytes(ans, MAX_ANSWER),
            ))
        }
    }

    /// Publishes the `len` bytes written as the request's answer, and lets the request go.
    pub fn answer(&mut self, len: usize) {
        let Some((at, req_len)) = self.current.take() else {
            return;
        };
        let h = self.mapped.header();
        let base = HEADER + REQUEST_RING;
        let len = len.min(MAX_ANSWER);
        self.mapped.write_header(
            base + (self.answer_at % ANSWER_RING as u64) as usize,
            len as u32,
        );
        self.answers_written = self.answer_at + padded(len);
        self.head = at + padded(req_len);
        h.worker.head.store(self.head, Ordering::Release);
        h.worker
            .answers_written
            .store(self.answers_written, Ordering::Release);
        h.worker.rep_seq.fetch_add(1, Ordering::Release);
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

    /// A worker that answers each request with its bytes reversed, until the channel closes;
    /// returns how many it served.
    fn echo(mut worker: WorkerEnd) -> std::thread::JoinHandle<usize> {
        std::thread::spawn(move || {
            let mut served = 0;
            while let Next::Request = worker.next(&|| false) {
                let Some((request, answer)) = worker.areas() else {
                    break;
                };
                let n = request.len().min(answer.len());
                for (i, b) in request.iter().rev().take(n).enumerate() {
                    answer[i] = *b;
                }
                worker.answer(n);
                served += 1;
            }
            served
        })
    }

    fn send(caller: &mut CallerEnd, bytes: &[u8]) {
        caller
            .send(
                bytes.len(),
                |area| {
                    area[..bytes.len()].copy_from_slice(bytes);
                    Ok(bytes.len())
                },
                &|| None,
            )
            .expect("sent");
    }

    #[test]
    fn posted_requests_are_answered_in_order_across_the_rings_wrap() {
        let (mut caller, worker) = pair();
        let server = echo(worker);
        caller.set_spin(Duration::from_micros(10));
        let mut expect = std::collections::VecDeque::new();
        // Enough bytes to go round the request ring several times, in odd sizes.
        for i in 0..6000u32 {
            let len = 1 + (i as usize * 37) % 3000;
            let msg: Vec<u8> = (0..len).map(|j| (i as usize + j) as u8).collect();
            send(&mut caller, &msg);
            expect.push_back(msg.into_iter().rev().collect::<Vec<u8>>());
            if i % 7 == 0 {
                // Now and then the caller collects what has come, and once in a while waits.
                while let Some(a) = caller.answer(i % 700 == 0, &|| None).expect("answer") {
                    assert_eq!(Some(a), expect.pop_front());
                    if expect.is_empty() {
                        break;
                    }
                }
            }
        }
        while let Some(want) = expect.pop_front() {
            let got = caller.answer(true, &|| None).expect("answer");
            assert_eq!(got, Some(want));
        }
        assert_eq!(caller.outstanding(), 0);
        drop(caller);
        assert_eq!(server.join().expect("server"), 6000);
    }

    #[test]
    fn a_caller_gives_up_when_told_why() {
        let (mut caller, _worker) = pair();
        send(&mut caller, &[1]);
        let gave = caller.answer(true, &|| Some("the worker died".into()));
        assert_eq!(gave, Err(Gave::Up("the worker died".into())));
        assert_eq!(caller.outstanding(), 1);
    }

    #[test]
    fn a_full_request_ring_waits_for_the_worker() {
        let (mut caller, worker) = pair();
        // Nobody serves yet: the ring takes what fits, then the next send waits (and gives up
        // when told to).
        let big = vec![7u8; MAX_REQUEST];
        let mut sent = 0;
        loop {
            let r = caller.send(
                big.len(),
                |area| {
                    area.copy_from_slice(&big);
                    Ok(big.len())
                },
                &|| Some("full".into()),
            );
            match r {
                Ok(()) => sent += 1,
                Err(Gave::Up(_)) => break,
                Err(e) => panic!("{e:?}"),
            }
        }
        assert!(sent >= 6, "{sent} requests of {MAX_REQUEST} bytes fit");
        let server = echo(worker);
        for _ in 0..sent {
            let got = caller.answer(true, &|| None).expect("answer");
            assert_eq!(got.map(|a| a.len()), Some(MAX_ANSWER));
        }
        drop(caller);
        let _ = server.join();
    }

    #[test]
    fn lengths_that_leave_the_ring_are_refused() {
        assert!(place(0, 0, 64, 100).is_none(), "larger than the ring");
        assert_eq!(place(0, 0, 64, 8), Some((0, false)));
        assert_eq!(place(56, 40, 64, 8), Some((64, true)), "wraps to the start");
        assert!(place(56, 0, 64, 8).is_none(), "the reader is behind");
    }
}
