//! [`Device`] for [`RemoteDevice`]: each call a request to the worker; work queued on a
//! stream is posted, everything else waits for its answer.

use std::os::fd::{AsRawFd, BorrowedFd};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use gpushare_protocol::command::{LaunchAttributes, ModuleLaunch};
use gpushare_protocol::control::{DeviceInfo, ModuleFormat};
use gpushare_protocol::{DevicePtr, Kernel, PriorityClass};

use super::calls::{spin_hint, unexpected};
use super::handles::{RemoteEvent, RemoteFunction, RemoteModule, RemoteStream};
use super::process::WorkerError;
use super::wire::{Answer, Reply, Request, ToWorker};
use super::{
    FAULT_CHECK_TIMEOUT, READY_TIMEOUT, RemoteDevice, SPAN_CHECK, SPARE_WAIT, Shared_, lock,
};
use crate::device::{Device, DeviceError, DeviceResult, FunctionShape, Occupancy};
use crate::shm::ArenaSlice;

impl Device for RemoteDevice {
    type Stream = RemoteStream;
    type Event = RemoteEvent;
    type Module = RemoteModule;
    type Function = RemoteFunction;

    fn backend(&self) -> &'static str {
        self.shared.backend
    }

    fn info(&self) -> &DeviceInfo {
        &self.shared.info
    }

    fn alloc(&self, bytes: u64) -> DeviceResult<DevicePtr> {
        let ptr = self.value(Request::Alloc { bytes }, &[])?;
        self.shared
            .high_water
            .fetch_max(ptr.saturating_add(bytes), Ordering::AcqRel);
        Ok(ptr)
    }

    fn alloc_at(&self, ptr: DevicePtr, bytes: u64) -> DeviceResult<u64> {
        let taken = self.value(Request::AllocAt { ptr, bytes }, &[])?;
        self.shared
            .high_water
            .fetch_max(ptr.saturating_add(bytes.max(taken)), Ordering::AcqRel);
        Ok(taken)
    }

    fn free(&self, ptr: DevicePtr) -> DeviceResult<()> {
        self.done(Request::Free { ptr }, &[])
    }

    fn share_memory(&self, region: u64, fd: BorrowedFd<'_>, len: u64, at: u64) -> DeviceResult<()> {
        let fd = fd.try_clone_to_owned().map_err(|e| {
            DeviceError::Failed(format!("cannot share memory with the device worker: {e}"))
        })?;
        // Under the lock, so that a promotion in progress hands every region on.
        let mut regions = lock(&self.shared.regions);
        let active = self.active();
        let sent = active.process.request(
            &ToWorker::ShareMemory { region, len, at },
            &[fd.as_raw_fd()],
        );
        regions.insert(region, Shared_ { fd, len, at });
        match sent {
            Ok(()) => Ok(()),
            Err(WorkerError::Refused(why)) => {
                regions.remove(&region);
                Err(DeviceError::Failed(format!(
                    "the device worker cannot map client memory: {why}"
                )))
            }
            // A worker that is gone: its successor gets the region.
            Err(e) => {
                tracing::debug!(error = %e, "sharing memory with a device worker that is gone");
                Ok(())
            }
        }
    }

    fn unshare_memory(&self, region: u64) {
        let mut regions = lock(&self.shared.regions);
        if regions.remove(&region).is_some() {
            let _ = self
                .active()
                .process
                .request(&ToWorker::UnshareMemory { region }, &[]);
        }
    }

    fn spin_hint(&self, spin: Duration) {
        spin_hint(self.shared.id, spin);
    }

    fn register_arena(&self, arena: ArenaSlice<'_>) -> DeviceResult<()> {
        self.done(
            Request::RegisterArena {
                span: self.span(arena),
            },
            &[],
        )
    }

    fn unregister_arena(&self, arena: ArenaSlice<'_>) {
        let _ = self.done(
            Request::UnregisterArena {
                span: self.span(arena),
            },
            &[],
        );
    }

    fn create_stream(&self, class: PriorityClass) -> DeviceResult<RemoteStream> {
        let generation = self.active().generation;
        let id = self.value(Request::CreateStream { class }, &[])?;
        Ok(RemoteStream {
            generation,
            id,
            busy_ns: 0,
            measuring: false,
            dirty: false,
            ended: None,
            pending_start: None,
        })
    }

    fn destroy_stream(&self, mut stream: RemoteStream) {
        let _ = self.take_deferred(&stream);
        self.take_news(&mut stream);
        if self.live(stream.generation).is_ok() {
            let _ = self.done(Request::DestroyStream { stream: stream.id }, &[]);
        }
    }

    fn copy_htod(
        &self,
        stream: &mut RemoteStream,
        src: ArenaSlice<'_>,
        dst: DevicePtr,
    ) -> DeviceResult<()> {
        let request = Request::CopyHtoD {
            stream: stream.id,
            src: self.span(src),
            dst,
            staged: false,
        };
        self.queue(stream, request, &[])
    }

    fn copy_dtoh(
        &self,
        stream: &mut RemoteStream,
        src: DevicePtr,
        dst: ArenaSlice<'_>,
    ) -> DeviceResult<()> {
        let request = Request::CopyDtoH {
            stream: stream.id,
            src,
            dst: self.span(dst),
            staged: false,
        };
        self.queue(stream, request, &[])
    }

    fn copy_dtod(
        &self,
        stream: &mut RemoteStream,
        src: DevicePtr,
        dst: DevicePtr,
        len: u64,
    ) -> DeviceResult<()> {
        let request = Request::CopyDtoD {
            stream: stream.id,
            src,
            dst,
            len,
        };
        self.queue(stream, request, &[])
    }

    fn memset(
        &self,
        stream: &mut RemoteStream,
        dst: DevicePtr,
        value: u8,
        len: u64,
    ) -> DeviceResult<()> {
        let request = Request::Memset {
            stream: stream.id,
            dst,
            value: value as u32,
            elem_bytes: 1,
            count: len,
        };
        self.queue(stream, request, &[])
    }

    fn launch(&self, stream: &mut RemoteStream, kernel: &Kernel) -> DeviceResult<()> {
        let request = Request::Launch {
            stream: stream.id,
            kernel: *kernel,
            start: None,
        };
        self.queue(stream, request, &[])
    }

    fn sm_partitions(&self) -> bool {
        self.shared.sm_partitions
    }

    fn limit_sms(&self, stream: &mut RemoteStream, sms: Option<u32>) -> DeviceResult<()> {
        let request = Request::LimitSms {
            stream: stream.id,
            sms,
        };
        self.queue(stream, request, &[])
    }

    fn launch_module(
        &self,
        stream: &mut RemoteStream,
        function: &RemoteFunction,
        launch: &ModuleLaunch,
        attributes: &LaunchAttributes,
        params: &[u8],
    ) -> DeviceResult<()> {
        self.live(function.0.generation)?;
        let request = Request::LaunchModule {
            stream: stream.id,
            function: function.0.id,
            launch: *launch,
            attributes: *attributes,
            start: None,
        };
        self.queue(stream, request, params)
    }

    fn sync_stream(&self, stream: &mut RemoteStream) -> DeviceResult<()> {
        let request = Request::SyncStream { stream: stream.id };
        let synced = self.on_stream(stream, request);
        // Work posted earlier that failed reports here, after the rest has finished.
        match self.take_deferred(stream) {
            Some(e) => Err(e),
            None => synced,
        }
    }

    fn end_batch(&self, stream: &mut RemoteStream, idle: bool) {
        self.take_news(stream);
        if self.live(stream.generation).is_err() || !(stream.dirty || stream.measuring) {
            return;
        }
        // A busy client's measured span closes only once it is old enough (the device's own
        // rule): asking the worker more often than that would only cost a round trip.
        if !idle && stream.ended.is_some_and(|at| at.elapsed() < SPAN_CHECK) {
            return;
        }
        let request = Request::EndBatch {
            stream: stream.id,
            idle,
        };
        if self.on_stream(stream, request).is_ok() {
            stream.ended = Some(Instant::now());
            if idle {
                stream.dirty = false;
            }
        }
    }

    fn take_busy_ns(&self, stream: &mut RemoteStream) -> u64 {
        self.take_news(stream);
        std::mem::take(&mut stream.busy_ns)
    }

    fn measuring(&self, stream: &RemoteStream) -> bool {
        stream.measuring
    }

    fn create_event(&self) -> DeviceResult<RemoteEvent> {
        let generation = self.active().generation;
        let id = self.value(
            Request::CreateEvent {
                marker: false,
                flags: None,
            },
            &[],
        )?;
        Ok(RemoteEvent::new(self, generation, id))
    }

    fn create_marker(&self) -> DeviceResult<RemoteEvent> {
        let generation = self.active().generation;
        let id = self.value(
            Request::CreateEvent {
                marker: true,
                flags: None,
            },
            &[],
        )?;
        Ok(RemoteEvent::new(self, generation, id))
    }

    fn create_event_flags(&self, flags: u32) -> DeviceResult<RemoteEvent> {
        let generation = self.active().generation;
        let id = self.value(
            Request::CreateEvent {
                marker: false,
                flags: Some(flags),
            },
            &[],
        )?;
        Ok(RemoteEvent::new(self, generation, id))
    }

    fn record_event(&self, event: &mut RemoteEvent, stream: &mut RemoteStream) -> DeviceResult<()> {
        self.live(event.0.generation)?;
        let request = Request::RecordEvent {
            event: event.0.id,
            stream: stream.id,
            start: false,
        };
        self.queue(stream, request, &[])
    }

    fn record_start(&self, event: &mut RemoteEvent, stream: &mut RemoteStream) -> DeviceResult<()> {
        self.live(event.0.generation)?;
        self.live(stream.generation)?;
        // Kept for the kernel it marks: recorded in a separate request, the worker could be
        // descheduled between it and the launch, and the span would count that as device time.
        self.flush_start(stream);
        stream.pending_start = Some(event.0.id);
        Ok(())
    }

    fn event_done(&self, event: &RemoteEvent) -> DeviceResult<bool> {
        self.live(event.0.generation)?;
        self.flag(Request::EventDone { event: event.0.id })
            .map(|(f, _)| f)
    }

    fn sync_event(&self, event: &RemoteEvent) -> DeviceResult<()> {
        self.live(event.0.generation)?;
        self.done(Request::SyncEvent { event: event.0.id }, &[])
    }

    fn elapsed_ns(&self, start: &RemoteEvent, end: &RemoteEvent) -> DeviceResult<u64> {
        self.live(start.0.generation)?;
        self.live(end.0.generation)?;
        self.value(
            Request::ElapsedNs {
                start: start.0.id,
                end: end.0.id,
            },
            &[],
        )
    }

    fn stream_busy(&self, stream: &RemoteStream) -> bool {
        if self.live(stream.generation).is_err() {
            return false;
        }
        // An error counts as busy, as on the device itself: the work's fate is unknown.
        self.flag(Request::StreamBusy { stream: stream.id })
            .map(|(f, _)| f)
            .unwrap_or(true)
    }

    fn interrupt(&self) {
        self.shared.interrupted.store(true, Ordering::Release);
    }

    fn fault(&self) -> Option<String> {
        let active = self.active();
        if let Some(why) = active.process.gone() {
            return Some(self.worker_lost(&why).to_string());
        }
        match self.call_within(Request::Fault, &[], Some(FAULT_CHECK_TIMEOUT)) {
            Ok(Answer {
                reply: Reply::Fault(f),
                ..
            }) => f,
            Ok(_) | Err(DeviceError::Cancelled) => None,
            Err(e) => Some(e.to_string()),
        }
    }

    fn reset(&self) -> DeviceResult<()> {
        self.promote_spare()
    }

    fn resets_in_place(&self) -> bool {
        true
    }

    fn reset_deadline(&self) -> Duration {
        SPARE_WAIT + READY_TIMEOUT
    }

    fn load_module(&self, format: ModuleFormat, image: &[u8]) -> DeviceResult<RemoteModule> {
        let generation = self.active().generation;
        let id = self.value(Request::LoadModule { format }, image)?;
        Ok(RemoteModule::new(self, generation, id))
    }

    fn get_function(&self, module: &RemoteModule, name: &str) -> DeviceResult<RemoteFunction> {
        self.live(module.0.generation)?;
        let id = self.value(
            Request::GetFunction {
                module: module.0.id,
            },
            name.as_bytes(),
        )?;
        Ok(RemoteFunction::new(self, module.0.generation, id))
    }

    fn stream_wait_event(
        &self,
        stream: &mut RemoteStream,
        event: &RemoteEvent,
    ) -> DeviceResult<()> {
        self.live(event.0.generation)?;
        let request = Request::StreamWaitEvent {
            stream: stream.id,
            event: event.0.id,
        };
        self.queue(stream, request, &[])
    }

    fn stream_done(&self, stream: &RemoteStream) -> DeviceResult<bool> {
        self.live(stream.generation)?;
        if let Some(e) = self.take_deferred(stream) {
            return Err(e);
        }
        // Device time learnt here waits for the next end of batch to be told (the stream is
        // not ours to change).
        self.flag(Request::StreamDone { stream: stream.id })
            .map(|(f, _)| f)
    }

    fn memset_wide(
        &self,
        stream: &mut RemoteStream,
        dst: DevicePtr,
        value: u32,
        elem_bytes: u8,
        count: u64,
    ) -> DeviceResult<()> {
        let request = Request::Memset {
            stream: stream.id,
            dst,
            value,
            elem_bytes,
            count,
        };
        self.queue(stream, request, &[])
    }

    fn copy_htod_staged(
        &self,
        stream: &mut RemoteStream,
        src: ArenaSlice<'_>,
        dst: DevicePtr,
    ) -> DeviceResult<()> {
        let request = Request::CopyHtoD {
            stream: stream.id,
            src: self.span(src),
            dst,
            staged: true,
        };
        stream.dirty = true;
        self.on_stream(stream, request)
    }

    fn copy_dtoh_staged(
        &self,
        stream: &mut RemoteStream,
        src: DevicePtr,
        dst: ArenaSlice<'_>,
    ) -> DeviceResult<()> {
        let request = Request::CopyDtoH {
            stream: stream.id,
            src,
            dst: self.span(dst),
            staged: true,
        };
        stream.dirty = true;
        self.on_stream(stream, request)
    }

    fn register_host(&self, region: ArenaSlice<'_>) -> DeviceResult<u64> {
        self.value(
            Request::RegisterHost {
                span: self.span(region),
            },
            &[],
        )
    }

    fn unregister_host(&self, region: ArenaSlice<'_>) {
        let _ = self.done(
            Request::UnregisterHost {
                span: self.span(region),
            },
            &[],
        );
    }

    fn memory_info(&self) -> DeviceResult<(u64, u64)> {
        match self.call(Request::MemoryInfo, &[])?.reply {
            Reply::Pair(free, total) => Ok((free, total)),
            other => Err(unexpected(other)),
        }
    }

    fn function_shape(&self, function: &RemoteFunction) -> DeviceResult<FunctionShape> {
        self.live(function.0.generation)?;
        match self
            .call(
                Request::FunctionShape {
                    function: function.0.id,
                },
                &[],
            )?
            .reply
        {
            Reply::Shape(s) => Ok(s),
            other => Err(unexpected(other)),
        }
    }

    fn set_function_attribute(
        &self,
        function: &RemoteFunction,
        attribute: u32,
        value: i32,
    ) -> DeviceResult<()> {
        self.live(function.0.generation)?;
        self.done(
            Request::SetFunctionAttribute {
                function: function.0.id,
                attribute,
                value,
            },
            &[],
        )
    }

    fn occupancy(&self, function: &RemoteFunction, question: &Occupancy) -> DeviceResult<u64> {
        self.live(function.0.generation)?;
        let request = Request::Occupancy {
            function: function.0.id,
            question: *question,
        };
        self.value(request, &[])
    }

    fn module_global(&self, module: &RemoteModule, name: &str) -> DeviceResult<(u64, u64)> {
        self.live(module.0.generation)?;
        match self
            .call(
                Request::ModuleGlobal {
                    module: module.0.id,
                },
                name.as_bytes(),
            )?
            .reply
        {
            Reply::Pair(a, b) => Ok((a, b)),
            other => Err(unexpected(other)),
        }
    }
}
