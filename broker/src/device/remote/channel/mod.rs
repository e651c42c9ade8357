//! One calling thread's channel to a device worker: a memfd both processes map, holding a page
//! of positions and sleep flags, a ring of requests and a ring of answers.
//!
//! ```text
//!  0      caller's line: tail (request bytes written), answers_read, req_seq, closed, spin_ns
//!  64     worker's line: head (request bytes done), answers_written, rep_seq
//!  128    caller_sleeps; 192 worker_sleeps (each on a line of its own)
//!  4096   request ring (REQUEST_RING bytes)
//!  +      answer ring (ANSWER_RING bytes)
//! ```
//!
//! A message in either ring is `[len: u32][0: u32][len bytes]`, padded to 8 bytes; one that
//! would not fit before the ring's end leaves a wrap marker (`len = u32::MAX`) and starts at
//! its beginning. Positions are free-running byte counts. Every request gets one answer, in
//! order, so the caller can post many requests (work queued on a stream) without waiting, and
//! the worker runs them back to back; a request whose answer is needed waits for it behind
//! the others. Each side reads the other's positions only when the ones it last read are not
//! enough, and while requests are queued the worker publishes their answers together (at
//! most 16 at a time, and always before it looks for more or sleeps). Each side spins a
//! while, then sleeps on a futex in the shared page; the other
//! side makes the wake-up system call only when the sleeper said it sleeps, so a busy channel
//! takes no system call and an idle one no CPU. Both processes are gpushared's own, but
//! lengths are still checked: a bad one ends the channel, never reads out of bounds.

mod shared;

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{Ordering, fence};
use std::time::Duration;

use gpushare_protocol::wake::SpinClock;

use nix::sys::memfd::{MFdFlags, memfd_create};

use crate::device::Pace;

use self::shared::{
    ANSWER_RING, CHANNEL_BYTES, HEADER, MSG_HEADER, Mapped, WRAP, caller_wait, futex_wait,
    futex_wake, padded, place, take,
};
pub use self::shared::{DEFAULT_WORKER_SPIN, Gave, MAX_ANSWER, MAX_REQUEST, REQUEST_RING};

/// Bytes of a channel's mapping.
pub const CHANNEL_LEN: u64 = CHANNEL_BYTES as u64;

/// The caller's end (in gpushared).
pub struct CallerEnd {
    mapped: Mapped,
    /// Until the worker has its own copy (then the mapping is all this side needs).
    memfd: Option<OwnedFd>,
    tail: u64,
    /// The worker's `head` as last read: room is looked for there first, and the worker's
    /// line read again only when that is not enough.
    head_seen: u64,
    answers_read: u64,
    /// Requests sent whose answers have not been read.
    outstanding: usize,
}

impl CallerEnd {
    pub fn create() -> std::io::Result<CallerEnd> {
        let memfd = memfd_create("gpushare-worker-channel", MFdFlags::MFD_CLOEXEC)?;
        nix::unistd::ftruncate(&memfd, CHANNEL_BYTES as libc::off_t)?;
        let mapped = Mapped::new(memfd.as_fd(), 0)?;
        mapped
            .header()
            .caller
            .spin_ns
            .store(DEFAULT_WORKER_SPIN.as_nanos() as u64, Ordering::Relaxed);
        Ok(CallerEnd {
            mapped,
            memfd: Some(memfd),
            tail: 0,
            head_seen: 0,
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

    /// How long the worker's thread stays awake for the next request, and what it moves
    /// its nice value by (from its next request on).
    pub fn set_pace(&self, pace: Pace) {
        let caller = &self.mapped.header().caller;
        caller.spin_ns.store(
            pace.spin.as_nanos().min(u64::MAX as u128) as u64,
            Ordering::Relaxed,
        );
        caller.nice.store(pace.nice, Ordering::Relaxed);
    }

    /// Wakes the worker's thread if it sleeps, so that it spins for the next request again
    /// (the caller just woke up itself, and a request is likely to follow).
    pub fn nudge(&self) {
        let h = self.mapped.header();
        // A new sequence number tells the worker it was woken on purpose, not by its timeout.
        h.caller.req_seq.fetch_add(1, Ordering::Release);
        if h.worker_sleeps.sleeps.load(Ordering::Relaxed) != 0 {
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
        let tail = self.tail;
        let mut placed = place(tail, self.head_seen, REQUEST_RING, max);
        if placed.is_none() {
            let mut seen = self.head_seen;
            caller_wait(
                h,
                &h.worker.rep_seq,
                || {
                    seen = h.worker.head.load(Ordering::Acquire);
                    placed = place(tail, seen, REQUEST_RING, max);
                    placed.is_some()
                },
                give_up,
            )?;
            self.head_seen = seen;
        }
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
        if h.worker_sleeps.sleeps.load(Ordering::Relaxed) != 0 {
            futex_wake(&h.caller.req_seq);
        }
        Ok(())
    }

    /// The next answer, as `make` makes it of its bytes (in place: no copy), in the order the
    /// requests were sent: waits for it when `wait`, else `None` when it has not come yet.
    pub fn answer<T>(
        &mut self,
        wait: bool,
        give_up: &dyn Fn() -> Option<String>,
        make: impl FnOnce(&[u8]) -> T,
    ) -> Result<Option<T>, Gave> {
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
        let value = make(unsafe { self.mapped.bytes(pos, len) });
        self.answers_read = at + padded(len);
        self.outstanding = self.outstanding.saturating_sub(1);
        h.caller
            .answers_read
            .store(self.answers_read, Ordering::Release);
        Ok(Some(value))
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
    /// A request: [`WorkerEnd::request`] holds it.
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
    /// The caller's `tail` and `answers_read` as last read: requests known to be there are
    /// served, and answers written, without reading the caller's line again.
    tail_seen: u64,
    answers_read_seen: u64,
    /// Answers written since the last publication: while more requests are known to be
    /// there, answers go out together, at most [`PUBLISH_EVERY`] at a time.
    unpublished: u32,
}

/// Answers that wait at most for others to go out together (posted work's, whose caller
/// collects them when it can).
const PUBLISH_EVERY: u32 = 16;

impl WorkerEnd {
    /// Maps a channel gpushared made, at `at` when that is free (0: anywhere).
    pub fn open(fd: &OwnedFd, at: u64) -> std::io::Result<WorkerEnd> {
        let len = nix::sys::stat::fstat(fd).map(|s| s.st_size as usize)?;
        if len < CHANNEL_BYTES {
            return Err(std::io::Error::other(format!(
                "a channel of {len} bytes, not {CHANNEL_BYTES}"
            )));
        }
        let mapped = Mapped::new(fd.as_fd(), at)?;
        let h = mapped.header();
        let head = h.worker.head.load(Ordering::Acquire);
        let answers_written = h.worker.answers_written.load(Ordering::Acquire);
        let answers_read_seen = h.caller.answers_read.load(Ordering::Acquire);
        Ok(WorkerEnd {
            mapped,
            current: None,
            head,
            answers_written,
            answer_at: 0,
            tail_seen: head,
            answers_read_seen,
            unpublished: 0,
        })
    }

    /// Waits for the next request: spins for the caller's spin time, then sleeps until the
    /// caller wakes it (a request, a nudge, or the channel's close); spins again after each
    /// wake-up. `stop` is asked at each look, not on a timer: the worker's process ends as
    /// soon as it says so, so an idle session's thread needs no wake-ups of its own. A request
    /// that breaks the ring's rules ends the channel.
    pub fn next(&mut self, stop: &dyn Fn() -> bool) -> Next {
        // The nice the caller asks (`CallerEnd::set_pace`): a look at its line per request;
        // `thread_nice` makes a system call only when it changed.
        crate::thread_nice::follow(self.mapped.header().caller.nice.load(Ordering::Relaxed));
        // A request known to be there already (read with the tail last time).
        if let Some(next) = look(&self.mapped, self.head, self.tail_seen, &mut self.current) {
            return next;
        }
        self.publish();
        let h = self.mapped.header();
        let mut clock = SpinClock::new();
        let spin = Duration::from_nanos(h.caller.spin_ns.load(Ordering::Relaxed));
        loop {
            let seq = h.caller.req_seq.load(Ordering::Acquire);
            let tail = h.caller.tail.load(Ordering::Acquire);
            self.tail_seen = tail;
            if let Some(next) = look(&self.mapped, self.head, tail, &mut self.current) {
                return next;
            }
            if h.caller.closed.load(Ordering::Acquire) != 0 || stop() {
                return Next::Closed;
            }
            let spun = clock.spun();
            if spun < spin && gpushare_protocol::wake::spin_turn(spun) {
                continue;
            }
            h.worker_sleeps.sleeps.store(1, Ordering::Relaxed);
            fence(Ordering::SeqCst);
            if h.caller.tail.load(Ordering::Acquire) == self.head
                && h.caller.closed.load(Ordering::Acquire) == 0
            {
                futex_wait(&h.caller.req_seq, seq, None);
            }
            h.worker_sleeps.sleeps.store(0, Ordering::Relaxed);
            // Woken by a request or a nudge: spin again before sleeping. Not after the
            // timeout: a hundred idle sessions of the high class each spinning 10 ms of every
            // 100 took two cores of a 2-core machine (`gpushare-demo cost`).
            if h.caller.req_seq.load(Ordering::Acquire) != seq {
                clock.restart();
            }
        }
    }

    /// The request being served (between `next` and `answer`).
    pub fn request(&self) -> Option<&[u8]> {
        let (at, len) = self.current?;
        let req = HEADER + (at % REQUEST_RING as u64) as usize + MSG_HEADER;
        // SAFETY: the request was published by the caller (tail acquired) and stays untouched
        // until `head` passes it, which only `answer` moves.
        Some(unsafe { &*self.mapped.bytes(req, len) })
    }

    /// Room for the answer to the request being served (at most [`MAX_ANSWER`] bytes),
    /// waiting until the caller has read enough answers to make that room (`None` if the
    /// channel closes meanwhile). Looked for once the request has run: the caller's reads
    /// move that line between cores, which a launch need not wait for.
    pub fn reply(&mut self) -> Option<&mut [u8]> {
        self.current?;
        let placed = loop {
            let seen = self.answers_read_seen;
            if let Some(p) = place(self.answers_written, seen, ANSWER_RING, MAX_ANSWER) {
                break p;
            }
            // The caller reads answers only once they are published.
            self.publish();
            let h = self.mapped.header();
            self.answers_read_seen = h.caller.answers_read.load(Ordering::Acquire);
            if self.answers_read_seen == seen {
                if h.caller.closed.load(Ordering::Acquire) != 0 {
                    return None;
                }
                std::thread::yield_now();
            }
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
        let ans = base + (answer_at % ANSWER_RING as u64) as usize + MSG_HEADER;
        // SAFETY: the answer's room was found free (answers_read acquired) and the caller
        // reads nothing past answers_written; it does not overlap the request ring.
        Some(unsafe { self.mapped.bytes(ans, MAX_ANSWER) })
    }

    /// Takes the `len` bytes written as the request's answer, and lets the request go:
    /// published at once unless more requests are known to be there (then with theirs, at
    /// most [`PUBLISH_EVERY`] answers later, and before this side looks for more or sleeps).
    pub fn answer(&mut self, len: usize) {
        let Some((at, req_len)) = self.current.take() else {
            return;
        };
        let base = HEADER + REQUEST_RING;
        let len = len.min(MAX_ANSWER);
        self.mapped.write_header(
            base + (self.answer_at % ANSWER_RING as u64) as usize,
            len as u32,
        );
        self.answers_written = self.answer_at + padded(len);
        self.head = at + padded(req_len);
        self.unpublished += 1;
        if self.unpublished >= PUBLISH_EVERY || self.tail_seen <= self.head {
            self.publish();
        }
    }

    /// Publishes the answers written and the requests served since the last time, and wakes
    /// the caller if it sleeps.
    fn publish(&mut self) {
        if self.unpublished == 0 {
            return;
        }
        self.unpublished = 0;
        let h = self.mapped.header();
        h.worker.head.store(self.head, Ordering::Release);
        h.worker
            .answers_written
            .store(self.answers_written, Ordering::Release);
        h.worker.rep_seq.fetch_add(1, Ordering::Release);
        fence(Ordering::SeqCst);
        if h.caller_sleeps.sleeps.load(Ordering::Relaxed) != 0 {
            futex_wake(&h.worker.rep_seq);
        }
    }
}

/// The request at `head` when the caller's `tail` says one is there: it becomes `current`
/// (`Next::Request`); one that breaks the ring's rules ends the channel (`Next::Closed`).
fn look(mapped: &Mapped, head: u64, tail: u64, current: &mut Option<(u64, usize)>) -> Option<Next> {
    match take(mapped, HEADER, REQUEST_RING, head, tail) {
        Ok(Some(m)) => {
            *current = Some(m);
            Some(Next::Request)
        }
        Ok(None) => None,
        Err(e) => {
            tracing::warn!(error = ?e, "ending a broken channel");
            Some(Next::Closed)
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
        let worker = WorkerEnd::open(&fd, 0).expect("open");
        (caller, worker)
    }

    /// A worker that answers each request with its bytes reversed, until the channel closes;
    /// returns how many it served.
    fn echo(mut worker: WorkerEnd) -> std::thread::JoinHandle<usize> {
        std::thread::spawn(move || {
            let mut served = 0;
            while let Next::Request = worker.next(&|| false) {
                let Some(request) = worker.request().map(<[u8]>::to_vec) else {
                    break;
                };
                let Some(answer) = worker.reply() else {
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
        caller.set_pace(Pace {
            spin: Duration::from_micros(10),
            nice: 0,
        });
        let mut expect = std::collections::VecDeque::new();
        // Enough bytes to go round the request ring several times, in odd sizes.
        for i in 0..6000u32 {
            let len = 1 + (i as usize * 37) % 3000;
            let msg: Vec<u8> = (0..len).map(|j| (i as usize + j) as u8).collect();
            send(&mut caller, &msg);
            expect.push_back(msg.into_iter().rev().collect::<Vec<u8>>());
            if i % 7 == 0 {
                // Now and then the caller collects what has come, and once in a while waits.
                while let Some(a) = caller
                    .answer(i % 700 == 0, &|| None, <[u8]>::to_vec)
                    .expect("answer")
                {
                    assert_eq!(Some(a), expect.pop_front());
                    if expect.is_empty() {
                        break;
                    }
                }
            }
        }
        while let Some(want) = expect.pop_front() {
            let got = caller
                .answer(true, &|| None, <[u8]>::to_vec)
                .expect("answer");
            assert_eq!(got, Some(want));
        }
        assert_eq!(caller.outstanding(), 0);
        drop(caller);
        assert_eq!(server.join().expect("server"), 6000);
    }

    #[test]
    fn answers_to_requests_that_queued_up_go_out_together_and_all_arrive() {
        let (mut caller, worker) = pair();
        // Forty requests wait before the worker starts: it serves them back to back and
        // publishes their answers in groups, not one by one, and the last at once.
        for i in 0..40u8 {
            send(&mut caller, &[i, i]);
        }
        let published = |c: &CallerEnd| c.mapped.header().worker.rep_seq.load(Ordering::Acquire);
        let before = published(&caller);
        let server = echo(worker);
        for i in 0..40u8 {
            let got = caller
                .answer(true, &|| None, <[u8]>::to_vec)
                .expect("answer");
            assert_eq!(got, Some(vec![i, i]));
        }
        let publications = published(&caller).wrapping_sub(before);
        assert!(
            publications <= 40 / PUBLISH_EVERY + 2,
            "{publications} publications for 40 queued answers"
        );
        drop(caller);
        assert_eq!(server.join().expect("server"), 40);
    }

    #[test]
    fn a_caller_gives_up_when_told_why() {
        let (mut caller, _worker) = pair();
        send(&mut caller, &[1]);
        let gave = caller.answer(true, &|| Some("the worker died".into()), <[u8]>::to_vec);
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
            let got = caller
                .answer(true, &|| None, <[u8]>::to_vec)
                .expect("answer");
            assert_eq!(got.map(|a| a.len()), Some(MAX_ANSWER));
        }
        drop(caller);
        let _ = server.join();
    }
}
