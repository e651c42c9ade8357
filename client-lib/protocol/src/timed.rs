//! Lines of timings kept in memory and written to stderr in blocks (and when asked), so that
//! writing them hardly moves the times they show: the client driver's
//! `GPUSHARE_CUDA_TRACE=3` and gpushared's `GPUSHARE_TIMELINE=1`.
//!
//! A full block goes to a writer thread of its own: the thread whose line filled it, and
//! every thread waiting to add one, go on at once instead of waiting for stderr (a write of a
//! block to a file took the lock every thread notes under for as long as it took).

use std::sync::mpsc::{Receiver, SyncSender, TrySendError, sync_channel};
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

const BLOCK: usize = 64 * 1024;
/// Blocks waiting for the writer at most (16 MiB); past that a full block is written by the
/// thread that filled it, as when there is no writer.
const QUEUED: usize = 256;
/// How long `flush` waits for the writer to have written everything before it.
const DRAIN: Duration = Duration::from_secs(2);

pub struct TimedLines {
    kept: Mutex<Kept>,
    sink: fn(&[u8]),
}

struct Kept {
    lines: String,
    writer: Option<Writer>,
}

/// The writer thread of the process that started it.
struct Writer {
    to: SyncSender<Block>,
    pid: u32,
}

enum Block {
    Lines(String),
    /// Answered once everything sent before it is written.
    Drained(SyncSender<()>),
}

impl TimedLines {
    pub const fn new() -> TimedLines {
        TimedLines::with_sink(to_stderr)
    }

    /// Lines written to `sink` instead of stderr (tests).
    pub const fn with_sink(sink: fn(&[u8])) -> TimedLines {
        TimedLines {
            kept: Mutex::new(Kept {
                lines: String::new(),
                writer: None,
            }),
            sink,
        }
    }

    /// Adds one line (`write` writes it, without its newline).
    pub fn line(&self, write: impl FnOnce(&mut String)) {
        let mut kept = self.kept.lock().unwrap_or_else(PoisonError::into_inner);
        write(&mut kept.lines);
        kept.lines.push('\n');
        if kept.lines.len() >= BLOCK {
            let full = std::mem::take(&mut kept.lines);
            // Sent under the lock, so that blocks reach the writer in order.
            if let Err(full) = self.send(&mut kept, Block::Lines(full)) {
                drop(kept);
                self.write_block(full);
            }
        }
    }

    /// Writes what is kept, and waits (a while) for the writer to have written what it was
    /// given before.
    pub fn flush(&self) {
        let mut kept = self.kept.lock().unwrap_or_else(PoisonError::into_inner);
        let rest = std::mem::take(&mut kept.lines);
        let has_writer = kept
            .writer
            .as_ref()
            .is_some_and(|w| w.pid == std::process::id());
        if !has_writer {
            drop(kept);
            self.write_block(Block::Lines(rest));
            return;
        }
        let (done, drained) = sync_channel(1);
        let sent = self
            .send(&mut kept, Block::Lines(rest))
            .and_then(|()| self.send(&mut kept, Block::Drained(done)));
        drop(kept);
        match sent {
            Ok(()) => {
                let _ = drained.recv_timeout(DRAIN);
            }
            Err(block) => self.write_block(block),
        }
    }

    /// What is kept, taken (for tests).
    pub fn take(&self) -> String {
        std::mem::take(
            &mut self
                .kept
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .lines,
        )
    }

    /// Hands a block to this process's writer, starting one if there is none; gives the
    /// block back when it cannot, and in a forked child of a process that had one (the
    /// child writes its own blocks rather than start threads after a fork).
    fn send(&self, kept: &mut Kept, block: Block) -> Result<(), Block> {
        let pid = std::process::id();
        match &kept.writer {
            Some(w) if w.pid != pid => return Err(block),
            Some(_) => {}
            None => kept.writer = start_writer(self.sink).map(|to| Writer { to, pid }),
        }
        let Some(writer) = &kept.writer else {
            return Err(block);
        };
        match writer.to.try_send(block) {
            Ok(()) => Ok(()),
            Err(TrySendError::Full(block)) => Err(block),
            Err(TrySendError::Disconnected(block)) => {
                kept.writer = None;
                Err(block)
            }
        }
    }

    fn write_block(&self, block: Block) {
        if let Block::Lines(lines) = block {
            (self.sink)(lines.as_bytes());
        }
    }
}

impl Default for TimedLines {
    fn default() -> Self {
        TimedLines::new()
    }
}

fn start_writer(sink: fn(&[u8])) -> Option<SyncSender<Block>> {
    let (to, from) = sync_channel(QUEUED);
    std::thread::Builder::new()
        .name("gpushare-trace".into())
        .spawn(move || write_blocks(&from, sink))
        .ok()?;
    Some(to)
}

fn write_blocks(from: &Receiver<Block>, sink: fn(&[u8])) {
    while let Ok(block) = from.recv() {
        match block {
            Block::Lines(lines) => sink(lines.as_bytes()),
            Block::Drained(done) => {
                let _ = done.send(());
            }
        }
    }
}

fn to_stderr(bytes: &[u8]) {
    let _ = std::io::Write::write_all(&mut std::io::stderr(), bytes);
}

#[cfg(test)]
mod tests {
    use super::*;

    static WRITTEN: Mutex<Vec<u8>> = Mutex::new(Vec::new());

    fn to_written(bytes: &[u8]) {
        WRITTEN
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .extend_from_slice(bytes);
    }

    #[test]
    fn every_line_is_written_whole_and_in_each_thread_s_order_by_the_flush() {
        static LINES: TimedLines = TimedLines::with_sink(to_written);
        let threads = 4;
        let per_thread = 20_000; // about 1.5 MiB in all: many full blocks
        std::thread::scope(|s| {
            for t in 0..threads {
                s.spawn(move || {
                    for i in 0..per_thread {
                        LINES.line(|l| {
                            use std::fmt::Write as _;
                            let _ = write!(l, "thread {t} line {i}");
                        });
                    }
                });
            }
        });
        LINES.line(|l| l.push_str("last"));
        LINES.flush();
        let written = String::from_utf8(std::mem::take(
            &mut *WRITTEN.lock().unwrap_or_else(PoisonError::into_inner),
        ))
        .expect("whole lines");
        let mut next = vec![0; threads];
        for line in written.lines() {
            if line == "last" {
                continue;
            }
            let words: Vec<&str> = line.split(' ').collect();
            let [_, t, _, i] = words[..] else {
                panic!("a broken line: {line:?}");
            };
            let (t, i): (usize, usize) = (t.parse().expect("t"), i.parse().expect("i"));
            assert_eq!(i, next[t], "thread {t}'s lines out of order");
            next[t] += 1;
        }
        assert_eq!(next, vec![per_thread; threads]);
        assert!(written.ends_with("last\n"), "the flush wrote the rest last");
        assert!(LINES.take().is_empty());
    }
}
