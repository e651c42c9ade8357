//! Where a client stream's measured spans take their times: a stream of their own that follows
//! the client's, so the client's stream carries only untimed marks of ours.
//!
//! A timed event costs the stream it is recorded on about 1.25 µs of GPU time even with
//! nothing to wait for; an untimed one costs nothing measurable (H200,
//! `scripts/probes/candidate_gate.cu`). On the client's stream, a span's end and the next one's
//! start landed inside the program's own timed interval whenever it paused between two
//! commands long enough for its data thread to go idle: XLA's autotuner then measured a
//! candidate 2.5 µs long and picked another kernel than it picks directly.

use cudarc::driver::result as cu;
use cudarc::driver::sys::{self, CUevent, CUstream};

use super::error::driver;
use crate::device::DeviceResult;

/// Streams for a client stream's timed events, and the untimed mark the ends follow.
pub(super) struct SpanClock {
    /// Where spans end: each end waits for a mark on the client's stream.
    stream: CUstream,
    /// Where spans start: nothing to wait for.
    starts: CUstream,
    mark: CUevent,
}

impl SpanClock {
    /// Makes the clock's streams (with `priority`, the client stream's) and its mark, in the
    /// bound context.
    pub(super) fn create(priority: i32) -> DeviceResult<SpanClock> {
        let stream = || {
            cu::stream::create_with_priority(cu::stream::StreamKind::NonBlocking, priority)
                .map_err(|e| driver("cuStreamCreateWithPriority", e))
        };
        let mark = cu::event::create(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING)
            .map_err(|e| driver("cuEventCreate", e))?;
        let made = stream().and_then(|ends| match stream() {
            Ok(starts) => Ok((ends, starts)),
            Err(e) => {
                // SAFETY: made above, used by nothing.
                let _ = unsafe { cu::stream::destroy(ends) };
                Err(e)
            }
        });
        match made {
            Ok((stream, starts)) => Ok(SpanClock {
                stream,
                starts,
                mark,
            }),
            Err(e) => {
                // SAFETY: made above, recorded nowhere.
                let _ = unsafe { cu::event::destroy(mark) };
                Err(e)
            }
        }
    }

    /// Records `timed` as soon as the GPU gets to it: a span's start.
    ///
    /// # Safety
    /// `timed` is a live event of the bound context.
    pub(super) unsafe fn stamp_now(&self, timed: CUevent) -> DeviceResult<()> {
        // SAFETY: the caller's contract, and our own live stream.
        unsafe { cu::event::record(timed, self.starts) }.map_err(|e| driver("cuEventRecord", e))
    }

    /// Records `timed` on the clock once the work queued on `on` so far is done: a span's end.
    ///
    /// # Safety
    /// `timed` is a live event and `on` a live stream, of the bound context.
    pub(super) unsafe fn stamp(&self, timed: CUevent, on: CUstream) -> DeviceResult<()> {
        // SAFETY: the caller's contract, and our own live mark and stream. The wait takes the
        // mark's state at this call, so the mark may be recorded again at once.
        unsafe {
            cu::event::record(self.mark, on).map_err(|e| driver("cuEventRecord", e))?;
            cu::stream::wait_event(
                self.stream,
                self.mark,
                sys::CUevent_wait_flags::CU_EVENT_WAIT_DEFAULT,
            )
            .map_err(|e| driver("cuStreamWaitEvent", e))?;
            cu::event::record(timed, self.stream).map_err(|e| driver("cuEventRecord", e))
        }
    }

    /// Waits for the timed events recorded so far (so they may be destroyed), then destroys
    /// the clock. The stream it follows must be done or destroyed first.
    pub(super) fn destroy(self) {
        // SAFETY: our stream and event, destroyed once; the marks it waits for were recorded
        // on a stream whose work is done, so the wait ends.
        unsafe {
            for s in [self.stream, self.starts] {
                let _ = cu::stream::synchronize(s);
                let _ = cu::stream::destroy(s);
            }
            let _ = cu::event::destroy(self.mark);
        }
    }
}
