//! Done-marks (`device::progress`, [`Backend::write_done_mark`]): a mark says the work before
//! it finished, so in `realtime` mode it appears at that work's modelled end, as it would on
//! a GPU: a thread (started on first use) sleeps until each is due and writes it. Otherwise
//! work ends when it is accepted, and so does the mark.
//!
//! [`Backend::write_done_mark`]: crate::device::Backend::write_done_mark

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use super::{SimDevice, SimStream};
use crate::device::DeviceResult;
use crate::device::progress::slot_word;
use crate::shm::ArenaSlice;

impl SimDevice {
    /// Writes `value` into slot `slot` of the progress page once the stream's work before has
    /// ended: now, or in `realtime` mode at that work's modelled end. Marks land after an
    /// unseen fault too, until it is seen: a GPU goes on with a faulted context's other
    /// streams until its driver sees the fault (run B4 in docs/benchmarks.md).
    pub(super) fn write_mark(
        &self,
        stream: &mut SimStream,
        page: ArenaSlice<'_>,
        slot: u32,
        value: u32,
    ) -> DeviceResult<()> {
        let at = slot_word(page, slot)?;
        self.run_on(stream, 0, |_| Ok(()))?;
        if !self.options.realtime {
            at.write_from(&value.to_le_bytes());
            return Ok(());
        }
        // Through the writer even when due now: a stream's marks land in order. The page is
        // gpushared's progress page, mapped for as long as the worker lives.
        self.marks
            .schedule(self.origin, stream.ready_ns, at.as_ptr() as usize, value);
        Ok(())
    }
}

/// A mark due at modelled time `.0` (ns): `.2` into the 32-bit word at address `.1`.
type Due = Reverse<(u64, usize, u32)>;

#[derive(Default)]
struct State {
    due: BinaryHeap<Due>,
    writer: bool,
}

#[derive(Default)]
pub(super) struct TimedMarks {
    state: Mutex<State>,
    changed: Condvar,
}

impl TimedMarks {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Writes `value` at `word` when the clock that started at `origin` reaches `at_ns`.
    ///
    /// `word` must stay a writable, 4-byte-aligned word for as long as this process lives:
    /// a slot of gpushared's progress page, which a worker never unmaps.
    pub(super) fn schedule(self: &Arc<Self>, origin: Instant, at_ns: u64, word: usize, value: u32) {
        let mut st = self.lock();
        st.due.push(Reverse((at_ns, word, value)));
        if !st.writer {
            st.writer = true;
            let marks = self.clone();
            let started = std::thread::Builder::new()
                .name("sim-marks".into())
                .spawn(move || marks.write_when_due(origin));
            if started.is_err() {
                // No thread: write them all now (early, never lost).
                st.writer = false;
                while let Some(Reverse((_, word, value))) = st.due.pop() {
                    write(word, value);
                }
            }
        }
        self.changed.notify_one();
    }

    /// Forgets marks not yet due (a reset: the work they follow is gone).
    pub(super) fn clear(&self) {
        self.lock().due.clear();
    }

    fn write_when_due(&self, origin: Instant) {
        let mut st = self.lock();
        loop {
            let now = origin.elapsed().as_nanos() as u64;
            while let Some(&Reverse((at, word, value))) = st.due.peek() {
                if at > now {
                    break;
                }
                st.due.pop();
                write(word, value);
            }
            let wait = st
                .due
                .peek()
                .map_or(Duration::from_secs(3600), |Reverse((at, ..))| {
                    Duration::from_nanos(at.saturating_sub(now))
                });
            st = self
                .changed
                .wait_timeout(st, wait)
                .map(|(g, _)| g)
                .unwrap_or_else(|e| e.into_inner().0);
        }
    }
}

fn write(word: usize, value: u32) {
    // SAFETY: `schedule`'s contract: a live, aligned word of the progress page, which
    // gpushared reads as another process's atomic writes.
    let at = unsafe { AtomicU32::from_ptr(word as *mut u32) };
    at.store(value, Ordering::Release);
}
