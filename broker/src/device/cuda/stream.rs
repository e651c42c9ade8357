//! A client's stream on the GPU: where its work goes (the whole device or an SM partition)
//! and how much device time it took, measured with events around spans of continuous work.

use cudarc::driver::result as cu;
use cudarc::driver::sys::{self, CUevent, CUstream};
use gpushare_protocol::PriorityClass;

use super::CudaDevice;
use super::error::driver;
use super::span_clock::{self, SpanClock};
use super::sync_words::SyncWord;
use super::timing::{Measured, Spans, ms_to_ns};
use crate::device::{DeviceError, DeviceResult};

/// A measured span of continuous work is closed at least this often, so accounting of a
/// client that never synchronizes stays current.
const MAX_SPAN: std::time::Duration = std::time::Duration::from_millis(2);

/// A wait that reads the stream's done word asks the driver once in this many looks (a fault
/// stops the stream before the word is written).
const ASK_EVERY: u32 = 64;

/// A client stream on the GPU.
pub struct CudaStream {
    /// Where its work goes now: `home`, or a lane on an SM partition.
    pub(super) raw: CUstream,
    /// The stream on the whole device, made with the client's priority.
    home: CUstream,
    /// Its CUDA priority, which the lanes get too.
    priority: i32,
    /// Streams on SM partitions, by partition size, made on first use.
    lanes: Vec<(u32, CUstream)>,
    /// Orders a lane after the work queued on the stream it takes over from.
    handoff: Option<CUevent>,
    /// Device time, from events around spans of continuous work.
    spans: Spans<CUevent>,
    /// Where the spans' events are recorded once the program has timed its own work on the
    /// stream (`timed_by_program`); until then on the stream itself. Boxed: it keeps the
    /// stream small.
    clock: Option<Box<SpanClock>>,
    /// Its cuBLAS handle, made on its first cuBLAS GEMM.
    pub(super) blas: Option<cudarc::cublas::sys::cublasHandle_t>,
    /// Its GEMM shapes cuBLAS has run.
    pub(super) gemm_shapes: super::gemm::Shapes,
    /// The word it writes when its work is done, and the value it wrote last.
    done_word: Option<(SyncWord, u32)>,
    /// Work was queued (`begin`) since the last wait that saw it all done: a wait then reads
    /// the done word; otherwise one question to the driver is quicker.
    queued: bool,
}

// SAFETY: used by one session thread at a time; the handles are thread-agnostic with the
// context bound.
unsafe impl Send for CudaStream {}

impl CudaStream {
    /// A stream on the whole device with the priority of `class`.
    pub(super) fn create(dev: &CudaDevice, class: PriorityClass) -> DeviceResult<CudaStream> {
        dev.bind()?;
        let priority = priority_for(class, dev.priorities);
        let raw = cu::stream::create_with_priority(cu::stream::StreamKind::NonBlocking, priority)
            .map_err(|e| driver("cuStreamCreateWithPriority", e))?;
        Ok(CudaStream {
            raw,
            home: raw,
            priority,
            lanes: Vec::new(),
            handoff: None,
            spans: Spans::new(),
            clock: None,
            blas: None,
            gemm_shapes: Default::default(),
            done_word: dev.sync_words.take().map(|w| (w, 0)),
            queued: false,
        })
    }

    /// Waits for the stream's work, then destroys it with everything made for it.
    pub(super) fn destroy(mut self, dev: &CudaDevice) {
        if dev.bind().is_err() {
            return;
        }
        // SAFETY: live stream; waiting makes every event and copy on it complete.
        let _ = unsafe { cu::stream::synchronize(self.raw) };
        // Its timed events complete after the stream's work, on the clock's stream.
        if let Some(clock) = self.clock.take() {
            clock.destroy();
        }
        for e in self.spans.drain() {
            // SAFETY: our events, destroyed once.
            let _ = unsafe { cu::event::destroy(e) };
        }
        if let Some(h) = self.blas.take() {
            // SAFETY: created by us for this stream.
            let _ = unsafe { cudarc::cublas::result::destroy_handle(h) };
        }
        if let Some(e) = self.handoff.take() {
            // SAFETY: our event, destroyed once.
            let _ = unsafe { cu::event::destroy(e) };
        }
        // The work on the lanes and home was ordered before the stream's last work, which
        // the synchronize above waited for.
        for (_, lane) in self.lanes.drain(..) {
            // SAFETY: made by us for this stream; destroyed once.
            let _ = unsafe { cu::stream::destroy(lane) };
        }
        // SAFETY: synchronized above; destroyed once.
        let _ = unsafe { cu::stream::destroy(self.home) };
        // Nothing of the stream writes it any more.
        if let Some((word, _)) = self.done_word.take() {
            dev.sync_words.give_back(word);
        }
    }

    /// Opens a measured span, unless one is open, before queuing work: its start event goes
    /// on the stream, or beside it once the program times its own work there.
    #[inline]
    pub(super) fn begin(&mut self, dev: &CudaDevice) -> DeviceResult<()> {
        dev.bind()?;
        self.queued = true;
        let (raw, clock) = (self.raw, self.clock.as_deref());
        self.spans.begin(timed_event, |e| {
            // SAFETY: live event (ours) and stream, context bound.
            unsafe { span_clock::stamp_start(clock, e, raw) }
        })
    }

    /// The program recorded a timing event of its own on the stream: from now on the spans'
    /// events go beside the stream (`span_clock.rs`), where they cannot lengthen what the
    /// program times. Other streams keep them on the stream, where they cost the GPU about
    /// 1.25 µs each and need no second stream.
    pub(super) fn timed_by_program(&mut self) {
        if self.clock.is_none() {
            match SpanClock::create(self.priority) {
                Ok(clock) => self.clock = Some(Box::new(clock)),
                Err(e) => tracing::debug!(error = %e, "spans stay on the stream"),
            }
        }
    }

    /// Closes the open span: its end event goes after the work queued so far.
    fn close(&mut self) {
        let (raw, clock) = (self.raw, self.clock.as_deref());
        self.spans.close(timed_event, |end| {
            // SAFETY: live event (ours) and stream, context bound.
            unsafe { span_clock::stamp_end(clock, end, raw) }.is_ok()
        });
    }

    /// Adds the time of every finished span to the stream's total.
    fn harvest(&mut self) {
        // Only a start stamped beside the stream can come before the span before it ends.
        let beside = self.clock.is_some();
        self.spans.harvest(|before, start, end| {
            // SAFETY: both events are live and were recorded.
            match unsafe { cu::event::query(end) } {
                Err(e) if e.0 == sys::cudaError_enum::CUDA_ERROR_NOT_READY => Measured::Pending,
                done => {
                    // SAFETY: as above; both completed (or failed, and then elapsed fails too).
                    match (done, unsafe { cu::event::elapsed(start, end) }) {
                        (Ok(()), Ok(ms)) => {
                            // A start stamped while the span before was still running: that
                            // part was counted with it.
                            // SAFETY: `before` is live (kept by `spans`) and completed.
                            let counted = before
                                .filter(|_| beside)
                                .and_then(|b| unsafe { cu::event::elapsed(start, b) }.ok())
                                .map_or(0.0, |ms| ms.max(0.0));
                            Measured::Took(ms_to_ns(ms - counted))
                        }
                        (query, elapsed) => {
                            tracing::debug!(?query, ?elapsed, "dropping a device-time measurement");
                            Measured::Lost
                        }
                    }
                }
            }
        });
    }

    /// The session finished a batch of work on the stream; `idle`: the client went quiet.
    pub(super) fn end_batch(&mut self, dev: &CudaDevice, idle: bool) {
        if self.spans.due(idle, MAX_SPAN) && dev.bind().is_ok() {
            self.close();
            self.harvest();
        }
    }

    /// Whether measured spans wait to be harvested.
    pub(super) fn measuring(&self) -> bool {
        self.spans.measuring()
    }

    /// Device time measured since the last call.
    pub(super) fn take_busy_ns(&mut self, dev: &CudaDevice) -> u64 {
        if dev.bind().is_ok() {
            self.harvest();
        }
        self.spans.take_busy_ns()
    }

    /// Waits until the work queued on the stream is done.
    pub(super) fn sync(&mut self, dev: &CudaDevice) -> DeviceResult<()> {
        dev.bind()?;
        let raw = self.raw;
        if let (true, Some((word, last))) = (self.queued, self.done_word.as_mut()) {
            let value = last.wrapping_add(1);
            // SAFETY: the word is page-locked host memory mapped for this context; live stream.
            if unsafe { super::progress::write_value(raw, word.device, value) }.is_ok() {
                *last = value;
                let word = *word;
                // The word comes once the work before it is done. A fault stops the stream
                // before it: the driver is asked now and then, and reports it.
                let mut looks = 0u32;
                let waited = dev.wait_until(|| {
                    if word.load() == value {
                        return Ok(true);
                    }
                    looks = looks.wrapping_add(1);
                    if !looks.is_multiple_of(ASK_EVERY) {
                        return Ok(false);
                    }
                    finished(raw)
                });
                self.queued = waited.is_err();
                return waited;
            }
        }
        dev.wait_until(|| finished(raw))
    }

    /// Whether work queued on the stream may still be running.
    pub(super) fn is_busy(&self, dev: &CudaDevice) -> bool {
        if dev.bind().is_err() {
            return false;
        }
        // SAFETY: live stream. An error counts as busy: after a fault the work's fate is
        // unknown, and its owner stays a suspect.
        let r = unsafe { sys::cuStreamQuery(self.raw) };
        r != sys::cudaError_enum::CUDA_SUCCESS
    }

    /// Whether its work goes to an SM partition now.
    pub(super) fn on_partition(&self) -> bool {
        self.raw != self.home
    }

    /// Moves the stream's future work onto a partition of at least `sms` SMs (`None`: the
    /// whole GPU), ordered after the work queued so far.
    pub(super) fn limit_sms(&mut self, dev: &CudaDevice, sms: Option<u32>) -> DeviceResult<()> {
        let size = sms.and_then(|n| dev.partitions.size_for(n));
        let target = match size {
            None => self.home,
            Some(size) => match self.lanes.iter().find(|(s, _)| *s == size) {
                Some(&(_, lane)) => lane,
                None => {
                    dev.bind()?;
                    match dev.partitions.stream(size, self.priority) {
                        Ok(Some(lane)) => {
                            self.lanes.push((size, lane));
                            lane
                        }
                        // The client's work matters more than its partition: run it on the
                        // whole GPU rather than fail it (said once, when the driver refused).
                        Ok(None) => self.home,
                        Err(e) => {
                            tracing::warn!(sms = size, error = %e, "cannot make an SM partition; running on the whole GPU");
                            self.home
                        }
                    }
                }
            },
        };
        if target == self.raw {
            return Ok(());
        }
        dev.bind()?;
        let handoff = match self.handoff {
            Some(e) => e,
            None => {
                let e = cu::event::create(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING)
                    .map_err(|e| driver("cuEventCreate", e))?;
                self.handoff = Some(e);
                e
            }
        };
        // SAFETY: live event and streams; the wait takes the event's state at this call, so
        // the event may be recorded again at the next handoff.
        unsafe {
            cu::event::record(handoff, self.raw).map_err(|e| driver("cuEventRecord", e))?;
            cu::stream::wait_event(
                target,
                handoff,
                sys::CUevent_wait_flags::CU_EVENT_WAIT_DEFAULT,
            )
            .map_err(|e| driver("cuStreamWaitEvent", e))?;
        }
        if let Some(h) = self.blas {
            // SAFETY: our handle; the new stream is live.
            unsafe { cudarc::cublas::result::set_stream(h, target as _) }
                .map_err(|e| DeviceError::Failed(format!("cublasSetStream: {e:?}")))?;
        }
        self.raw = target;
        Ok(())
    }
}

impl CudaStream {
    /// Work queued after this waits for `event`.
    pub(super) fn wait_event(&mut self, dev: &CudaDevice, event: CUevent) -> DeviceResult<()> {
        self.begin(dev)?;
        // SAFETY: live stream and event.
        unsafe {
            cu::stream::wait_event(
                self.raw,
                event,
                sys::CUevent_wait_flags::CU_EVENT_WAIT_DEFAULT,
            )
        }
        .map_err(|e| driver("cuStreamWaitEvent", e))
    }

    /// Whether all queued work has finished.
    pub(super) fn done(&self, dev: &CudaDevice) -> DeviceResult<bool> {
        dev.bind()?;
        // SAFETY: live stream.
        match unsafe { sys::cuStreamQuery(self.raw) } {
            sys::cudaError_enum::CUDA_SUCCESS => Ok(true),
            sys::cudaError_enum::CUDA_ERROR_NOT_READY => Ok(false),
            e => Err(driver("cuStreamQuery", cudarc::driver::DriverError(e))),
        }
    }
}

/// Whether the work queued on `raw` (a live stream of the bound context) has finished; a
/// wait's error if it failed.
fn finished(raw: CUstream) -> DeviceResult<bool> {
    // SAFETY: a live stream, by the caller's contract.
    match unsafe { sys::cuStreamQuery(raw) } {
        sys::cudaError_enum::CUDA_ERROR_NOT_READY => Ok(false),
        r => r
            .result()
            .map(|()| true)
            .map_err(|e| driver("kernel or copy on this stream failed", e)),
    }
}

/// The CUDA stream priority of `class`, given the device's (least, greatest) priority;
/// numerically smaller is more important.
fn priority_for(class: PriorityClass, (least, greatest): (i32, i32)) -> i32 {
    match class {
        PriorityClass::High => greatest,
        PriorityClass::Normal => (least + greatest) / 2,
        PriorityClass::BestEffort => least,
    }
}

/// An event for timing spans.
fn timed_event() -> DeviceResult<CUevent> {
    cu::event::create(sys::CUevent_flags::CU_EVENT_DEFAULT).map_err(|e| driver("cuEventCreate", e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classes_map_onto_the_device_priority_range_in_order() {
        // The range a recent GPU reports: 0 is least important, -5 most.
        let range = (0, -5);
        assert_eq!(priority_for(PriorityClass::High, range), -5);
        assert_eq!(priority_for(PriorityClass::Normal, range), -2);
        assert_eq!(priority_for(PriorityClass::BestEffort, range), 0);
    }

    #[test]
    fn without_priorities_every_class_gets_the_one_there_is() {
        for class in [
            PriorityClass::High,
            PriorityClass::Normal,
            PriorityClass::BestEffort,
        ] {
            assert_eq!(priority_for(class, (0, 0)), 0);
        }
    }
}
