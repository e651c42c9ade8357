//! The arena as a client hands it out: a ring of payloads (launch parameters, staged copies).
//!
//! A payload the broker consumes while it runs the command (parameters it copies out, bytes a
//! staged copy reads or writes before it completes) comes free once that command's completion
//! has been read: the broker completes commands in the order they were submitted, so a
//! command is posted without waiting and its room is reused later. A payload the device
//! reads or writes after its command completed (DMA to or from the arena) is [`Held`] until
//! the caller has waited for the device.

use std::collections::VecDeque;
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::Duration;

use gpushare_protocol::Command;

use crate::error::{Error, Result};
use crate::ring::command_name;
use crate::session::Session;
use crate::state::lock;

/// Payloads start on cache lines.
const ALIGN: usize = 64;
/// Marks a reserved block that is not free at any completion yet (not submitted, its answer
/// still being read, or held for DMA).
const PENDING: u64 = u64::MAX;
/// How long a caller waiting for a block its owner holds sleeps before it looks again (it is
/// woken as soon as a held block comes free).
const HELD_RECHECK: Duration = Duration::from_millis(1);

/// A block of the arena in use: `[start, end)`, free once command `seq` has completed.
#[derive(Debug, Clone, Copy)]
struct Block {
    start: usize,
    end: usize,
    seq: u64,
}

/// A ring allocator over the arena: blocks are handed out in order and come back in order.
#[derive(Debug)]
pub struct PayloadRing {
    capacity: usize,
    /// Next free byte.
    tail: usize,
    live: VecDeque<Block>,
}

impl PayloadRing {
    pub fn new(capacity: usize) -> PayloadRing {
        PayloadRing {
            capacity,
            tail: 0,
            live: VecDeque::new(),
        }
    }

    /// The largest payload that can ever fit.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Frees every block whose command has completed (`completed`: the last completed
    /// sequence number).
    pub fn release(&mut self, completed: u64) {
        while let Some(front) = self.live.front() {
            if front.seq == PENDING || front.seq > completed {
                break;
            }
            self.live.pop_front();
        }
        if self.live.is_empty() {
            self.tail = 0;
        }
    }

    /// Reserves `len` bytes (rounded up to a cache line); `None` while the room is in use.
    pub fn reserve(&mut self, len: usize) -> Option<usize> {
        let len = len.max(1).div_ceil(ALIGN) * ALIGN;
        if len > self.capacity {
            return None;
        }
        let start = match self.live.front() {
            None => 0,
            Some(front) if self.tail > front.start => {
                // In use: [front.start, tail). Free: [tail, capacity) and [0, front.start).
                if self.capacity - self.tail >= len {
                    self.tail
                } else if front.start >= len {
                    0
                } else {
                    return None;
                }
            }
            // Wrapped: free is [tail, front.start).
            Some(front) if front.start - self.tail >= len => self.tail,
            Some(_) => return None,
        };
        self.live.push_back(Block {
            start,
            end: start + len,
            seq: PENDING,
        });
        self.tail = start + len;
        Some(start)
    }

    /// The block reserved last belongs to command `seq` (0: it was never submitted; free it
    /// with the next release).
    pub fn commit(&mut self, seq: u64) {
        if let Some(last) = self.live.back_mut() {
            last.seq = seq;
        }
    }

    /// The block at `start`, kept while its command's answer was read (or while the device
    /// used it), is free from the next release on.
    pub fn finish(&mut self, start: usize) {
        if let Some(b) = self
            .live
            .iter_mut()
            .find(|b| b.start == start && b.seq == PENDING)
        {
            b.seq = 0;
        }
    }

    /// The command the oldest block waits for: `None` when nothing is in use, `PENDING`
    /// when that block waits for its owner rather than for a completion.
    fn oldest(&self) -> Option<u64> {
        self.live.front().map(|b| b.seq)
    }

    /// Bytes in use (for tests and diagnostics).
    pub fn in_use(&self) -> usize {
        self.live.iter().map(|b| b.end - b.start).sum()
    }
}

/// Where a payload goes in the arena, for the caller to fill (or read).
#[derive(Debug, Clone, Copy)]
pub struct Payload {
    pub offset: u64,
    pub ptr: *mut u8,
    pub len: usize,
}

/// The payload ring over the first `capacity` bytes of a session's arena, shared by the
/// session's threads.
#[derive(Debug)]
pub struct Payloads {
    ring: Mutex<PayloadRing>,
    /// Signalled when a block whose owner held it comes free.
    freed: Condvar,
}

impl Payloads {
    pub fn new(capacity: usize) -> Payloads {
        Payloads {
            ring: Mutex::new(PayloadRing::new(capacity)),
            freed: Condvar::new(),
        }
    }

    /// The largest payload one command can carry.
    pub fn capacity(&self) -> usize {
        lock(&self.ring).capacity()
    }

    /// The largest piece of a copy staged in pieces: several are in flight at once.
    pub fn piece(&self) -> usize {
        let capacity = self.capacity();
        (capacity / 4).max(4096).min(capacity)
    }

    /// Bytes in use (for tests and diagnostics).
    pub fn in_use(&self) -> usize {
        lock(&self.ring).in_use()
    }

    fn too_large(len: usize, capacity: usize) -> Error {
        Error::InvalidArgument(format!(
            "a {len}-byte payload does not fit the {capacity}-byte arena"
        ))
    }

    /// The ring is full: waits until its oldest block may have come free, its command
    /// completed (waiting without the lock) or, for a block its owner holds, its owner let it
    /// go.
    fn wait_for_oldest(&self, session: &Session, ring: MutexGuard<'_, PayloadRing>) -> Result<()> {
        match ring.oldest() {
            Some(PENDING) | None => {
                let _ = self.freed.wait_timeout(ring, HELD_RECHECK);
                Ok(())
            }
            Some(seq) => {
                drop(ring);
                session.wait_until(|s| s.reaped_seq() >= seq)
            }
        }
    }

    /// The blocks at `starts`, held by their owner, are free from the next release on.
    fn finish(&self, starts: impl IntoIterator<Item = usize>) {
        let mut ring = lock(&self.ring);
        for start in starts {
            ring.finish(start);
        }
        drop(ring);
        self.freed.notify_all();
    }

    /// Sends a command that carries `len` bytes of arena payload, which `fill` writes; waits
    /// for the answer when `wait`, and then lets `read` see the payload (the broker may have
    /// written it). The payload's room is reused once the command has completed: the broker
    /// must be done with it by then.
    pub fn send<R>(
        &self,
        session: &Session,
        len: usize,
        wait: bool,
        fill: impl FnOnce(Payload),
        make: impl Fn(u64) -> Command,
        read: impl FnOnce(Payload) -> R,
    ) -> Result<((u64, u64), R)> {
        let (mut ring, offset) = loop {
            let mut ring = lock(&self.ring);
            ring.release(session.reaped_seq());
            if let Some(offset) = ring.reserve(len) {
                break (ring, offset);
            }
            if len > ring.capacity() {
                return Err(Self::too_large(len, ring.capacity()));
            }
            // Full: wait for the oldest payload's command to complete, or for a caller still
            // reading its answer to let its block go.
            self.wait_for_oldest(session, ring)?;
        };
        let payload = Payload {
            offset: offset as u64,
            ptr: session.arena_ptr(offset),
            len,
        };
        fill(payload);
        let cmd = make(payload.offset);
        // A command whose answer is awaited keeps its block until the payload has been read.
        let submitted = session.submit_with(cmd.encode(0).opcode, wait, |seq| {
            if !wait {
                ring.commit(seq);
            }
            Ok(cmd)
        });
        let tag = match submitted {
            Ok(tag) => tag,
            Err(e) => {
                ring.commit(0);
                return Err(e);
            }
        };
        drop(ring);
        if !wait {
            return Ok(((0, 0), read(payload)));
        }
        let answer = session.finish(tag, command_name(&cmd));
        if answer.is_ok() {
            session.note_quiet(&cmd, tag);
        }
        let out = answer.map(|c| ((c.result, c.result2), read(payload)));
        self.finish([offset]);
        out
    }

    /// Payloads for DMA, held until the caller has waited for the device.
    pub fn held<'a>(&'a self, session: &'a Session) -> Held<'a> {
        Held {
            payloads: self,
            session,
            starts: Vec::new(),
        }
    }
}

/// Payloads the device reads or writes after their commands complete (DMA to or from the
/// arena): held until the caller has waited for the device (an event, a stream), then given
/// back together with [`Held::clear`], or when this is dropped.
pub struct Held<'a> {
    payloads: &'a Payloads,
    session: &'a Session,
    starts: Vec<usize>,
}

impl Held<'_> {
    /// Reserves `len` bytes. `None` when the ring is full while payloads are held here:
    /// wait for the device to be done with them and [`Held::clear`] first (waiting here for
    /// room they fill would never end).
    pub fn reserve(&mut self, len: usize) -> Result<Option<Payload>> {
        let offset = loop {
            let mut ring = lock(&self.payloads.ring);
            ring.release(self.session.reaped_seq());
            if let Some(offset) = ring.reserve(len) {
                break offset;
            }
            if len > ring.capacity() {
                return Err(Payloads::too_large(len, ring.capacity()));
            }
            if !self.starts.is_empty() {
                return Ok(None);
            }
            self.payloads.wait_for_oldest(self.session, ring)?;
        };
        self.starts.push(offset);
        Ok(Some(Payload {
            offset: offset as u64,
            ptr: self.session.arena_ptr(offset),
            len,
        }))
    }

    /// Whether no payload is held.
    pub fn is_empty(&self) -> bool {
        self.starts.is_empty()
    }

    /// The device is done with every payload held here: they come free.
    pub fn clear(&mut self) {
        if !self.starts.is_empty() {
            self.payloads.finish(self.starts.drain(..));
        }
    }
}

impl Drop for Held<'_> {
    fn drop(&mut self) {
        self.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_come_back_in_order_once_their_commands_complete() {
        let mut r = PayloadRing::new(1024);
        let a = r.reserve(300).expect("room");
        r.commit(1);
        let b = r.reserve(300).expect("room");
        r.commit(2);
        let c = r.reserve(300).expect("room");
        r.commit(3);
        assert_eq!((a, b, c), (0, 320, 640));
        assert_eq!(r.reserve(100), None, "full");
        r.release(1);
        // The front is free again; a block that fits there wraps around.
        assert_eq!(r.reserve(300), Some(0));
        r.commit(4);
        r.release(3);
        assert_eq!(r.in_use(), 320);
        r.release(4);
        assert_eq!(r.in_use(), 0);
        assert_eq!(r.reserve(1024), Some(0), "an empty ring starts over");
    }

    #[test]
    fn a_pending_block_holds_everything_after_it() {
        let mut r = PayloadRing::new(256);
        r.reserve(64).expect("room"); // never committed yet
        r.reserve(64).expect("room");
        r.commit(9);
        r.release(100);
        assert_eq!(r.in_use(), 128, "the pending front block keeps both");
    }

    #[test]
    fn a_finished_block_is_free_at_the_next_release() {
        let mut r = PayloadRing::new(256);
        let a = r.reserve(64).expect("room");
        r.release(u64::MAX - 1);
        assert_eq!(r.in_use(), 64, "kept while its answer is read");
        r.finish(a);
        r.release(0);
        assert_eq!(r.in_use(), 0);
    }

    #[test]
    fn too_large_never_fits() {
        let mut r = PayloadRing::new(256);
        assert_eq!(r.reserve(257), None);
        assert_eq!(r.reserve(0), Some(0), "empty payloads still get a line");
    }
}
