//! [`Device`]: one GPU context as the broker's sessions, dispatcher and guardian use it. Its
//! interface is the [`Call`]: work queued on a stream is posted (its failure reported at the
//! stream's next synchronization, as CUDA reports asynchronous errors), everything else waits
//! for its answer. Handles are checked against the context generation they were made in.
//! Here too: what it takes to keep a stream's device time and start markers, the same for
//! every link.

use std::os::fd::BorrowedFd;
use std::sync::Arc;
use std::time::{Duration, Instant};

use gpushare_protocol::control::{DeviceInfo, ModuleFormat};
use gpushare_protocol::{DevicePtr, PriorityClass};

use super::call::{Call, EventKind, Handle, Reply};
use super::handles::{Event, Function, Held, Module, Named, Stream};
use super::link::Link;
use super::{DeviceError, DeviceResult};

/// A busy stream's batch is ended at most this often (the CUDA backend closes a measured span
/// once it is 2 ms old: asking more often would only cost a round trip).
const SPAN_CHECK: Duration = Duration::from_millis(2);

/// One GPU context, through its link.
pub struct Device {
    link: Arc<dyn Link>,
}

impl Device {
    pub fn new(link: Arc<dyn Link>) -> Device {
        Device { link }
    }

    pub fn link(&self) -> &Arc<dyn Link> {
        &self.link
    }

    /// `"sim"` or `"cuda"`.
    pub fn backend(&self) -> &'static str {
        self.link.backend()
    }

    pub fn info(&self) -> &DeviceInfo {
        self.link.info()
    }

    pub fn sm_partitions(&self) -> bool {
        self.link.sm_partitions()
    }

    /// Checks that a handle's context still serves.
    fn live(&self, generation: u64) -> DeviceResult<()> {
        if generation == self.link.generation() {
            Ok(())
        } else {
            Err(DeviceError::Cancelled)
        }
    }

    /// The executor's number for a live handle (`Cancelled` for one from before a reset).
    pub fn id(&self, handle: &impl Named) -> DeviceResult<Handle> {
        let held = handle.held();
        self.live(held.generation)?;
        Ok(held.id)
    }

    /// Runs `call` and waits for its reply; a failure is the error.
    pub fn call(&self, call: Call, payload: &[u8]) -> DeviceResult<Reply> {
        self.link.call(call, payload, None)?.reply.ok()
    }

    /// [`Device::call`], giving up after `deadline`.
    pub fn call_within(&self, call: Call, deadline: Duration) -> DeviceResult<Reply> {
        self.link.call(call, &[], Some(deadline))?.reply.ok()
    }

    pub fn alloc(&self, bytes: u64) -> DeviceResult<DevicePtr> {
        let ptr = self.call(Call::Alloc { bytes }, &[])?.value()?;
        self.link.note_allocated(ptr.saturating_add(bytes));
        Ok(ptr)
    }

    /// Allocates at exactly `ptr`; returns the memory it took.
    pub fn alloc_at(&self, ptr: DevicePtr, bytes: u64) -> DeviceResult<u64> {
        let taken = self.call(Call::AllocAt { ptr, bytes }, &[])?.value()?;
        self.link
            .note_allocated(ptr.saturating_add(bytes.max(taken)));
        Ok(taken)
    }

    pub fn share_memory(
        &self,
        region: u64,
        fd: BorrowedFd<'_>,
        len: u64,
        at: u64,
    ) -> DeviceResult<()> {
        self.link.share_memory(region, fd, len, at)
    }

    pub fn unshare_memory(&self, region: u64) {
        self.link.unshare_memory(region)
    }

    pub fn spin_hint(&self, spin: Duration) {
        self.link.spin_hint(spin)
    }

    // ---- streams ---------------------------------------------------------------------

    pub fn create_stream(&self, class: PriorityClass) -> DeviceResult<Stream> {
        let generation = self.link.generation();
        let id = self.call(Call::CreateStream { class }, &[])?.value()?;
        Ok(Stream::new(generation, id))
    }

    /// Waits for the stream's work, then releases it.
    pub fn destroy_stream(&self, mut stream: Stream) {
        let _ = self.take_deferred(&stream);
        self.take_news(&mut stream);
        if self.live(stream.generation).is_ok() {
            let _ = self.call(Call::DestroyStream { stream: stream.id }, &[]);
        }
    }

    /// Queues work on `stream` without waiting for it: `call` gets the stream's number.
    pub fn queue(
        &self,
        stream: &mut Stream,
        call: impl FnOnce(Handle) -> Call,
        payload: &[u8],
    ) -> DeviceResult<()> {
        self.live(stream.generation)?;
        stream.dirty = true;
        let mut call = call(stream.id);
        let keeps_start = call.keeps_start();
        match call.start_marker() {
            // A kernel takes the start marker recorded for it along.
            Some(start) => *start = stream.pending_start.take(),
            None if keeps_start => {}
            None => self.flush_start(stream),
        }
        self.link.post(Some(stream.id), call, payload)
    }

    /// Runs a call on `stream` and waits for its reply, learning what it says of the stream's
    /// device time.
    pub fn on_stream(
        &self,
        stream: &mut Stream,
        call: impl FnOnce(Handle) -> Call,
        payload: &[u8],
    ) -> DeviceResult<Reply> {
        self.live(stream.generation)?;
        self.flush_start(stream);
        let answer = self.link.call(call(stream.id), payload, None)?;
        stream.learn(answer.news);
        answer.reply.ok()
    }

    /// Stream work whose effect the caller needs at once (a staged copy): it waits.
    pub fn on_stream_now(
        &self,
        stream: &mut Stream,
        call: impl FnOnce(Handle) -> Call,
        payload: &[u8],
    ) -> DeviceResult<()> {
        stream.dirty = true;
        self.on_stream(stream, call, payload)?.done()
    }

    /// Waits for all work on the stream; reports the first error it met (work posted earlier
    /// that failed reports here, after the rest has finished).
    pub fn sync_stream(&self, stream: &mut Stream) -> DeviceResult<()> {
        let synced = self
            .on_stream(stream, |stream| Call::SyncStream { stream }, &[])
            .and_then(Reply::done);
        match self.take_deferred(stream) {
            Some(e) => Err(e),
            None => synced,
        }
    }

    /// The session finished a batch of commands that queued work on this stream; `idle` says
    /// the client has gone quiet. A point where the backend may close a measurement.
    pub fn end_batch(&self, stream: &mut Stream, idle: bool) {
        self.take_news(stream);
        if self.live(stream.generation).is_err() || !(stream.dirty || stream.measuring) {
            return;
        }
        if !idle && stream.ended.is_some_and(|at| at.elapsed() < SPAN_CHECK) {
            return;
        }
        let ended = self.on_stream(stream, |stream| Call::EndBatch { stream, idle }, &[]);
        if ended.is_ok() {
            stream.ended = Some(Instant::now());
            if idle {
                stream.dirty = false;
            }
        }
    }

    /// Device time of this stream's work measured since the last call, in ns. Work still
    /// running is counted by a later call.
    pub fn take_busy_ns(&self, stream: &mut Stream) -> u64 {
        self.take_news(stream);
        std::mem::take(&mut stream.busy_ns)
    }

    /// Whether measurements of finished work are still to be read.
    pub fn measuring(&self, stream: &Stream) -> bool {
        stream.measuring
    }

    /// Whether work queued on the stream has not finished yet (an error counts as busy, as
    /// on the device itself: the work's fate is unknown).
    pub fn stream_busy(&self, stream: &Stream) -> bool {
        if self.live(stream.generation).is_err() {
            return false;
        }
        self.call(Call::StreamBusy { stream: stream.id }, &[])
            .and_then(Reply::flag)
            .unwrap_or(true)
    }

    /// Whether all work queued on the stream has finished (a failure of posted work reports
    /// here).
    pub fn stream_done(&self, stream: &Stream) -> DeviceResult<bool> {
        self.live(stream.generation)?;
        if let Some(e) = self.take_deferred(stream) {
            return Err(e);
        }
        // Device time learnt here waits for the next end of batch to be told.
        self.call(Call::StreamDone { stream: stream.id }, &[])?
            .flag()
    }

    fn take_news(&self, stream: &mut Stream) {
        let news = self.link.ledger().take_news(stream.generation, stream.id);
        stream.learn(news);
    }

    fn take_deferred(&self, stream: &Stream) -> Option<DeviceError> {
        self.link
            .ledger()
            .take_deferred(stream.generation, stream.id)
    }

    /// Records a start marker no kernel took along (something else came first).
    fn flush_start(&self, stream: &mut Stream) {
        if let Some(event) = stream.pending_start.take() {
            let call = Call::RecordEvent {
                event,
                stream: stream.id,
                start: true,
            };
            // Its event may be gone by now: nothing to record then, and nothing to report.
            let _ = self.link.post(None, call, &[]);
        }
    }

    // ---- events ----------------------------------------------------------------------

    pub fn create_event(&self, kind: EventKind) -> DeviceResult<Event> {
        let generation = self.link.generation();
        let id = self.call(Call::CreateEvent { kind }, &[])?.value()?;
        Ok(Event(Held::new(&self.link, generation, id, |event| {
            Call::DestroyEvent { event }
        })))
    }

    /// Records `event` after the stream's work so far.
    pub fn record_event(&self, event: &Event, stream: &mut Stream) -> DeviceResult<()> {
        let event = self.id(event)?;
        self.queue(
            stream,
            |stream| Call::RecordEvent {
                event,
                stream,
                start: false,
            },
            &[],
        )
    }

    /// Marks where the stream's next work starts (for timing it). Kept for the kernel it
    /// marks: recorded in a call of its own, the executor could be descheduled between it
    /// and the launch, and the span would count that as device time.
    pub fn record_start(&self, event: &Event, stream: &mut Stream) -> DeviceResult<()> {
        let event = self.id(event)?;
        self.live(stream.generation)?;
        self.flush_start(stream);
        stream.pending_start = Some(event);
        Ok(())
    }

    pub fn event_done(&self, event: &Event) -> DeviceResult<bool> {
        let event = self.id(event)?;
        self.call(Call::EventDone { event }, &[])?.flag()
    }

    pub fn sync_event(&self, event: &Event) -> DeviceResult<()> {
        let event = self.id(event)?;
        self.call(Call::SyncEvent { event }, &[])?.done()
    }

    pub fn elapsed_ns(&self, start: &Event, end: &Event) -> DeviceResult<u64> {
        let (start, end) = (self.id(start)?, self.id(end)?);
        self.call(Call::ElapsedNs { start, end }, &[])?.value()
    }

    // ---- modules ---------------------------------------------------------------------

    pub fn load_module(&self, format: ModuleFormat, image: &[u8]) -> DeviceResult<Module> {
        let generation = self.link.generation();
        let id = self.call(Call::LoadModule { format }, image)?.value()?;
        Ok(Module(Held::new(&self.link, generation, id, |module| {
            Call::DropModule { module }
        })))
    }

    pub fn get_function(&self, module: &Module, name: &str) -> DeviceResult<Function> {
        let generation = module.0.generation;
        let module = self.id(module)?;
        let id = self
            .call(Call::GetFunction { module }, name.as_bytes())?
            .value()?;
        Ok(Function(Held::new(
            &self.link,
            generation,
            id,
            |function| Call::DropFunction { function },
        )))
    }

    // ---- faults ----------------------------------------------------------------------

    pub fn interrupt(&self) {
        self.link.interrupt()
    }

    pub fn fault(&self) -> Option<String> {
        self.link.fault()
    }

    pub fn reset(&self) -> DeviceResult<()> {
        self.link.reset()
    }

    pub fn resets_in_place(&self) -> bool {
        self.link.resets_in_place()
    }

    pub fn reset_deadline(&self) -> Duration {
        self.link.reset_deadline()
    }
}
