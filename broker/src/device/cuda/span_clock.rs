//! Where a stream's measured spans take their times once the program times its own work on it
//! (it recorded a timing event of its own there): streams of their own beside the client's,
//! so the client's stream carries only an untimed mark of ours where a span ends.
//!
//! A timed event costs the stream it is recorded on about 1.25 µs of GPU time even with
//! nothing to wait for (H200, `scripts/probes/candidate_gate.cu`). On the client's stream, a
//! span's end and the next one's start landed inside the program's own timed interval whenever
//! it paused between two commands long enough for its data thread to go idle: XLA's autotuner
//! then measured a candidate 2.5 µs long and picked another kernel than it picks directly.
//!
//! A span's end is an untimed mark on the client's stream that one stream beside it waits for
//! before recording the timed end: one such mark costs nothing measurable. A second waited
//! mark, or a second timed event queued behind the wait, cost the client's next kernel about
//! 1 µs; a timed event on a stream that waits for nothing cost nothing. So a span's start is a
//! timed event on a third stream, recorded as the span's first work is queued. Where the span
//! before was still running, that start comes before the span's end; the overlap is taken off
//! when the spans are measured (`Spans::harvest`). On an idle client stream the start passes
//! as the work is queued, a launch's latency before it runs, and an end a cross-stream wait's
//! latency after the work: a short span is measured a few microseconds longer than events on
//! the client's stream measured it (how much is not measured yet).
//!
//! Why only for streams a program times: the two streams are more streams on the context's
//! few hardware queues, and an end's wait holds its queue until the client's work before it is
//! done. Where streams outnumber the queues, other work queued behind that wait would wait for
//! another client's work. No run with many clients has measured whether that costs anything,
//! so streams nobody times keep their events on the stream, as before.

use cudarc::driver::result as cu;
use cudarc::driver::sys::{self, CUevent, CUstream};

use super::error::driver;
use crate::device::DeviceResult;

/// Streams for a client stream's timed events, and the untimed mark the ends follow.
pub(super) struct SpanClock {
    /// Where spans end: each end waits for a mark on the client's stream.
    ends: CUstream,
    /// Where spans start: nothing to wait for.
    starts: CUstream,
    mark: CUevent,
}

impl SpanClock {
    /// Makes the two streams (with `priority`, the client stream's) and the mark, in the bound
    /// context.
    pub(super) fn create(priority: i32) -> DeviceResult<SpanClock> {
        let make = || {
            cu::stream::create_with_priority(cu::stream::StreamKind::NonBlocking, priority)
                .map_err(|e| driver("cuStreamCreateWithPriority", e))
        };
        let mark = cu::event::create(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING)
            .map_err(|e| driver("cuEventCreate", e))?;
        let made = make().and_then(|ends| match make() {
            Ok(starts) => Ok((ends, starts)),
            Err(e) => {
                // SAFETY: made above, used by nothing.
                let _ = unsafe { cu::stream::destroy(ends) };
                Err(e)
            }
        });
        match made {
            Ok((ends, starts)) => Ok(SpanClock { ends, starts, mark }),
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
    unsafe fn stamp_start(&self, timed: CUevent) -> DeviceResult<()> {
        // SAFETY: the caller's contract, and our own live stream.
        unsafe { cu::event::record(timed, self.starts) }.map_err(|e| driver("cuEventRecord", e))
    }

    /// Records `timed` once the work queued on `on` so far is done: a span's end.
    ///
    /// # Safety
    /// `timed` is a live event and `on` a live stream, of the bound context.
    unsafe fn stamp_end(&self, timed: CUevent, on: CUstream) -> DeviceResult<()> {
        // SAFETY: the caller's contract, and our own live mark and stream. The wait takes the
        // mark's state at this call, so the mark may be recorded again at once.
        unsafe {
            cu::event::record(self.mark, on).map_err(|e| driver("cuEventRecord", e))?;
            cu::stream::wait_event(
                self.ends,
                self.mark,
                sys::CUevent_wait_flags::CU_EVENT_WAIT_DEFAULT,
            )
            .map_err(|e| driver("cuStreamWaitEvent", e))?;
            cu::event::record(timed, self.ends).map_err(|e| driver("cuEventRecord", e))
        }
    }

    /// Waits for the timed events recorded so far (so they may be destroyed), then destroys
    /// the streams and the mark. The client's stream must be done or destroyed first.
    pub(super) fn destroy(self) {
        // SAFETY: our streams and event, destroyed once; the marks it waits for were recorded
        // on a stream whose work is done, so the wait ends.
        unsafe {
            for s in [self.ends, self.starts] {
                let _ = cu::stream::synchronize(s);
                let _ = cu::stream::destroy(s);
            }
            let _ = cu::event::destroy(self.mark);
        }
    }
}

/// Records `timed` where a span of the stream `on` starts: beside it with a `clock`, else on it.
///
/// # Safety
/// `timed` is a live event and `on` a live stream, of the bound context.
pub(super) unsafe fn stamp_start(
    clock: Option<&SpanClock>,
    timed: CUevent,
    on: CUstream,
) -> DeviceResult<()> {
    match clock {
        // SAFETY: the caller's contract.
        Some(clock) => unsafe { clock.stamp_start(timed) },
        // SAFETY: as above.
        None => unsafe { cu::event::record(timed, on) }.map_err(|e| driver("cuEventRecord", e)),
    }
}

/// Records `timed` where a span of the stream `on` ends, after the work queued on it so far:
/// beside it with a `clock`, else on it.
///
/// # Safety
/// `timed` is a live event and `on` a live stream, of the bound context.
pub(super) unsafe fn stamp_end(
    clock: Option<&SpanClock>,
    timed: CUevent,
    on: CUstream,
) -> DeviceResult<()> {
    match clock {
        // SAFETY: the caller's contract.
        Some(clock) => unsafe { clock.stamp_end(timed, on) },
        // SAFETY: as above.
        None => unsafe { cu::event::record(timed, on) }.map_err(|e| driver("cuEventRecord", e)),
    }
}
