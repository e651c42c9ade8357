//! The driver's side of its session: commands that need no answer go without waiting, and
//! the arena is a ring of payloads (launch parameters, staged copies) that come free once the
//! broker has consumed them — when their completion has been read, since the broker completes
//! commands in the order they were submitted.

use std::collections::VecDeque;
use std::sync::Mutex;

use gpushare_conn::{Session, command_name};
use gpushare_protocol::Command;

use crate::status::{Cu, from_error};
use crate::types::result;

/// Payloads start on cache lines.
const ALIGN: usize = 64;
/// Marks a reserved block whose command has not been submitted yet.
const PENDING: u64 = u64::MAX;

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

    /// The block at `start`, kept while its command's answer was read, is free from the next
    /// release on.
    pub fn finish(&mut self, start: usize) {
        if let Some(b) = self
            .live
            .iter_mut()
            .find(|b| b.start == start && b.seq == PENDING)
        {
            b.seq = 0;
        }
    }

    /// Bytes in use (for tests and diagnostics).
    pub fn in_use(&self) -> usize {
        self.live.iter().map(|b| b.end - b.start).sum()
    }
}

/// The session and its payload ring.
pub struct Transport {
    pub session: Session,
    payload: Mutex<PayloadRing>,
}

/// Where a payload goes in the arena, for the caller to fill.
#[derive(Debug, Clone, Copy)]
pub struct Payload {
    pub offset: u64,
    pub ptr: *mut u8,
    pub len: usize,
}

impl Transport {
    pub fn new(session: Session) -> Transport {
        let capacity = session.layout().arena_size as usize;
        Transport {
            session,
            payload: Mutex::new(PayloadRing::new(capacity)),
        }
    }

    /// The largest payload one command can carry.
    pub fn payload_capacity(&self) -> usize {
        self.payload
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .capacity()
    }

    /// Sends a command without waiting; an error it meets comes with the next sync.
    pub fn post(&self, cmd: Command) -> Cu<()> {
        self.session
            .submit(cmd, false)
            .map(drop)
            .map_err(|e| from_error(&e))
    }

    /// Sends a command and waits for its answer.
    pub fn call(&self, cmd: Command) -> Cu<(u64, u64)> {
        self.session
            .call(cmd, command_name(&cmd))
            .map(|c| (c.result, c.result2))
            .map_err(|e| from_error(&e))
    }

    /// Reports (and clears) the first error of work sent without waiting.
    pub fn deferred_error(&self) -> Cu<()> {
        self.session.take_async_error().map_err(|e| from_error(&e))
    }

    /// Sends a command that carries `len` bytes of arena payload, which `fill` writes; waits
    /// for the answer when `wait`, and then lets `read` see the payload (the broker may have
    /// written it). The payload's room is reused once the command has completed.
    pub fn send_with_payload<R>(
        &self,
        len: usize,
        wait: bool,
        fill: impl FnOnce(Payload),
        make: impl Fn(u64) -> Command,
        read: impl FnOnce(Payload) -> R,
    ) -> Cu<((u64, u64), R)> {
        let (mut ring, offset) = loop {
            let mut ring = self.payload.lock().unwrap_or_else(|p| p.into_inner());
            ring.release(self.session.reaped_seq());
            if let Some(offset) = ring.reserve(len) {
                break (ring, offset);
            }
            if len > ring.capacity() {
                return Err(result::INVALID_VALUE);
            }
            // Full: wait (without the lock) for the oldest payload's command to complete, or
            // for a caller still reading its answer to let its block go.
            let oldest = ring.live.front().map_or(0, |b| b.seq);
            drop(ring);
            if oldest == PENDING {
                std::thread::yield_now();
            } else {
                self.session
                    .wait_until(|s| s.reaped_seq() >= oldest)
                    .map_err(|e| from_error(&e))?;
            }
        };
        let payload = Payload {
            offset: offset as u64,
            ptr: self.session.arena_ptr(offset),
            len,
        };
        fill(payload);
        let cmd = make(payload.offset);
        // A command whose answer is awaited keeps its block until the payload has been read.
        let submitted = self.session.submit_with(cmd.encode(0).opcode, wait, |seq| {
            if !wait {
                ring.commit(seq);
            }
            Ok(cmd)
        });
        let tag = match submitted {
            Ok(tag) => tag,
            Err(e) => {
                ring.commit(0);
                return Err(from_error(&e));
            }
        };
        drop(ring);
        if !wait {
            return Ok(((0, 0), read(payload)));
        }
        let answer = self.session.finish(tag, command_name(&cmd));
        let out = answer.map(|c| ((c.result, c.result2), read(payload)));
        self.payload
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .finish(offset);
        out.map_err(|e| from_error(&e))
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
