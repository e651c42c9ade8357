//! One command from the ring: decoded, checked against this client's own tables, and run on
//! the device. Nothing the client wrote is trusted; every failure is a typed error in the
//! command's completion.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use gpushare_protocol::ring::{CompletionEntry, SubmissionEntry};
use gpushare_protocol::{Command, DevicePtr, ErrorCode, StreamId};

use super::{MAX_EVENTS, MAX_STREAMS, SessionState, StreamSlot};
use crate::device::{Call, Device, DeviceError, EventKind, ProgressValue, Stream};
use crate::shm::Span;

impl SessionState {
    /// Decodes, validates and executes one entry; never panics on any input. Its completion,
    /// unless the command told the client already ([`SessionState::answer_early`]).
    pub(super) fn process(&mut self, entry: &SubmissionEntry) -> Option<CompletionEntry> {
        self.info.counters.commands.fetch_add(1, Ordering::Relaxed);
        self.answering = Some(entry.user_tag);
        let outcome = Command::decode(entry).and_then(|cmd| {
            let began = crate::timeline::begin();
            let outcome = self.execute(cmd).or_else(|code| self.on_failure(cmd, code));
            crate::timeline::note("data", &cmd, began);
            // Told of lost work by a command it waits for, the client knows: it may catch the
            // error and go on with new work, on any stream, which must then run.
            if outcome == Err(ErrorCode::WorkLost) && super::replay::waited_for(&cmd) {
                self.lost.told_all();
            }
            outcome
        });
        // Answered early, the command had succeeded.
        let user_tag = self.answering.take()?;
        let (status, result, result2) = match outcome {
            Ok((r1, r2)) => (0, r1, r2),
            Err(code) => {
                self.info.counters.errors.fetch_add(1, Ordering::Relaxed);
                (code.as_u32(), 0, 0)
            }
        };
        Some(CompletionEntry {
            user_tag,
            status,
            flags: 0,
            result,
            result2,
        })
    }

    pub(super) fn execute(&mut self, cmd: Command) -> Result<(u64, u64), ErrorCode> {
        let counters = &self.info.counters;
        match cmd {
            Command::Nop => Ok((0, 0)),
            Command::Alloc { bytes } => self.alloc(bytes, None),
            Command::AllocAt { bytes, ptr } => self.alloc(bytes, Some(ptr)),
            Command::MemReserve { size, align, hint } => self.mem_reserve(size, align, hint),
            Command::MemUnreserve { ptr, size } => self.mem_unreserve(ptr, size),
            Command::MemCreate { size } => self.mem_create(size),
            Command::MemRelease { handle } => self.mem_release(handle),
            Command::MemMap { ptr, size, handle } => self.mem_map(ptr, size, handle),
            Command::MemUnmap { ptr, size } => self.mem_unmap(ptr, size),
            Command::IpcExportMemory { ptr } => self.ipc_export_memory(ptr),
            Command::IpcOpenMemory { token_lo, token_hi } => {
                self.ipc_open_memory(token_lo, token_hi)
            }
            Command::IpcCloseMemory { ptr } => self.ipc_close_memory(ptr),
            Command::IpcExportEvent { event } => self.ipc_export_event(event),
            Command::LaunchGraph { stream, graph } => self.launch_graph(stream, graph),
            Command::StreamHostPoint {
                stream,
                done,
                go,
                value,
            } => self.host_point(stream, done, go, value),
            Command::DropGraph { graph } => self.drop_graph(graph),
            Command::UpdateGraph {
                graph,
                params_offset,
                params_len,
            } => self.update_graph(graph, params_offset, params_len),
            Command::IpcOpenEvent {
                token_lo,
                token_hi,
                event,
            } => self.ipc_open_event(token_lo, token_hi, event),
            Command::Free { ptr } => self.free(ptr),
            Command::CopyHtoD {
                stream,
                arena_offset,
                dst,
                len,
            } => {
                self.check_write(dst, len)?;
                let src = self
                    .region
                    .arena_slice(arena_offset, len)
                    .ok_or(ErrorCode::ArenaOutOfBounds)?
                    .span();
                self.queue_htod(stream, src, dst, len)
            }
            Command::CopyDtoH {
                stream,
                src,
                arena_offset,
                len,
            } => {
                self.check_device(src, len)?;
                let dst = self
                    .region
                    .arena_slice(arena_offset, len)
                    .ok_or(ErrorCode::ArenaOutOfBounds)?
                    .span();
                self.queue_dtoh(stream, src, dst, len)
            }
            Command::CopyDtoD {
                stream,
                src,
                dst,
                len,
            } => {
                self.check_device(src, len)?;
                self.check_write(dst, len)?;
                let copy = |stream| Call::CopyDtoD {
                    stream,
                    src,
                    dst,
                    len,
                };
                let r = self.on_stream(stream, |d, s| d.queue(s, copy, &[]))?;
                self.info
                    .counters
                    .bytes_dtod
                    .fetch_add(len, Ordering::Relaxed);
                Ok(r)
            }
            Command::Memset {
                stream,
                dst,
                value,
                len,
            } => {
                self.check_write(dst, len)?;
                let memset = |stream| Call::Memset {
                    stream,
                    dst,
                    value: value as u32,
                    elem_bytes: 1,
                    count: len,
                };
                self.on_stream(stream, |d, s| d.queue(s, memset, &[]))
            }
            Command::StreamCreate => {
                if self.streams.len() >= MAX_STREAMS {
                    return Err(ErrorCode::TooManyHandles);
                }
                let (id, next) = fresh_id(self.next_stream, |id| self.streams.contains_key(&id))?;
                let stream = self
                    .device
                    .create_stream(self.info.grant().class)
                    .map_err(|e| e.code())?;
                self.next_stream = next;
                self.streams.insert(id, StreamSlot::new(stream));
                counters
                    .streams
                    .store(self.streams.len() as u64, Ordering::Relaxed);
                Ok((id as u64, 0))
            }
            Command::StreamDestroy { stream } => {
                if stream == 0 {
                    return Err(ErrorCode::InvalidHandle);
                }
                // It is waited for below, and its granted kernels cannot be marked after.
                self.granted_seen_finished(stream);
                let mut slot = self
                    .streams
                    .remove(&stream)
                    .ok_or(ErrorCode::InvalidHandle)?;
                let _ = self.device.sync_stream(&mut slot.stream);
                self.device.end_batch(&mut slot.stream, true);
                let spent = self.device.take_busy_ns(&mut slot.stream);
                self.charge_device_time(spent);
                self.device.destroy_stream(slot.stream);
                self.info
                    .counters
                    .streams
                    .store(self.streams.len() as u64, Ordering::Relaxed);
                Ok((0, 0))
            }
            Command::StreamSync { stream } => {
                // The default stream is made again after a reset; any other stream the
                // reset took is a lost handle, and fails with `DeviceReset` below.
                if self.lost.take_unsynced(stream) && stream == 0 {
                    return Err(ErrorCode::DeviceReset);
                }
                if self.lost.take_work(stream) {
                    return Err(ErrorCode::WorkLost);
                }
                let device = self.device.clone();
                let slot = self
                    .streams
                    .get_mut(&stream)
                    .ok_or(ErrorCode::InvalidHandle)?;
                slot.touched = true; // the batch end closes its measurement
                // The client looks at its sync word first: the tag it waits for is written
                // there as soon as the work is seen finished.
                let told = self.answering.map(|tag| ProgressValue {
                    page: self.region.sync_word(),
                    slot: 0,
                    value: gpushare_protocol::ring::sync_value(tag),
                });
                device
                    .sync_stream_telling(&mut slot.stream, told)
                    .map_err(|e| e.code())?;
                slot.unsynced = false;
                // The client waits on this: it goes on while the bookkeeping below runs.
                self.answer_early();
                self.granted_seen_finished(stream);
                self.publish_mark(stream);
                self.settle_in_flight();
                Ok((0, 0))
            }
            Command::EventCreate => {
                if self.events.len() >= MAX_EVENTS {
                    return Err(ErrorCode::TooManyHandles);
                }
                let (id, next) = fresh_id(self.next_event, |id| self.events.contains_key(&id))?;
                let event = self
                    .device
                    .create_event(EventKind::Timing)
                    .map_err(|e| e.code())?;
                self.next_event = next;
                self.events.insert(id, Arc::new(event));
                Ok((id as u64, 0))
            }
            Command::EventRecord { stream, event } => {
                if !self.events.contains_key(&event) || !self.streams.contains_key(&stream) {
                    return Err(ErrorCode::InvalidHandle);
                }
                // A record is an operation on its stream: in CUDA's legacy order like any.
                if self.info.consolidated {
                    self.order_legacy(stream)?;
                }
                let device = self.device.clone();
                let e = self.events.get(&event).ok_or(ErrorCode::InvalidHandle)?;
                let slot = self
                    .streams
                    .get_mut(&stream)
                    .ok_or(ErrorCode::InvalidHandle)?;
                device
                    .record_event(e, &mut slot.stream)
                    .map_err(|e| e.code())?;
                self.event_marks.insert(event, (stream, slot.submitted));
                self.lost.note_record(event, stream);
                if self.info.consolidated {
                    self.note_legacy(stream);
                }
                Ok((0, 0))
            }
            Command::EventQuery { event } => {
                if self.lost.take_work_event(event) {
                    return Err(ErrorCode::WorkLost);
                }
                let e = self.events.get(&event).ok_or(ErrorCode::InvalidHandle)?;
                let done = self.device.event_done(e).map_err(|e| e.code())?;
                if done {
                    self.settle_marked(event);
                }
                Ok((done as u64, 0))
            }
            Command::EventSync { event } => {
                if self.lost.take_work_event(event) {
                    return Err(ErrorCode::WorkLost);
                }
                let e = self.events.get(&event).ok_or(ErrorCode::InvalidHandle)?;
                self.device.sync_event(e).map_err(|e| e.code())?;
                self.settle_marked(event);
                self.settle_in_flight();
                Ok((0, 0))
            }
            Command::EventElapsed { start, end } => {
                let s = self.events.get(&start).ok_or(ErrorCode::InvalidHandle)?;
                let e = self.events.get(&end).ok_or(ErrorCode::InvalidHandle)?;
                let ns = self.device.elapsed_ns(s, e).map_err(|e| e.code())?;
                Ok((ns, 0))
            }
            Command::EventDestroy { event } => {
                self.events.remove(&event).ok_or(ErrorCode::InvalidHandle)?;
                self.event_marks.remove(&event);
                Ok((0, 0))
            }
            Command::ClientSync => {
                if self.lost.take_any_unsynced() {
                    return Err(ErrorCode::DeviceReset);
                }
                if self.lost.take_any_work() {
                    return Err(ErrorCode::WorkLost);
                }
                self.sync_all().map(|()| (0, 0))
            }
            Command::IterationEnd => {
                let (latency, missed) = self.dispatch.iteration_boundary(self.info.id);
                Ok((latency, missed as u64))
            }
            Command::DeclareJob {
                remaining_ns,
                persistent_bytes,
                ephemeral_bytes,
            } => {
                let job = (remaining_ns, persistent_bytes, ephemeral_bytes) != (0, 0, 0);
                let job = job.then_some(crate::sched::JobProfile {
                    remaining_ns_estimate: remaining_ns,
                    persistent_bytes,
                    ephemeral_bytes,
                });
                self.declared_job = job;
                self.dispatch
                    .set_job(self.info.id, job)
                    .map(|()| (0, 0))
                    .map_err(|_| ErrorCode::InvalidArgument)
            }
            Command::DeclareDeadline {
                period_ns,
                deadline_ns,
            } => {
                let deadline = (deadline_ns != 0).then_some(crate::sched::DeadlineSpec {
                    period_ns,
                    deadline_ns,
                });
                let grant = self.info.grant();
                self.dispatch
                    .set_deadline(
                        (self.info.id, grant.class, grant.weight),
                        self.declared_job,
                        deadline,
                    )
                    .map(|()| (0, 0))
                    .map_err(|_| ErrorCode::InvalidArgument)
            }
            Command::Launch {
                kernel: gpushare_protocol::Kernel::Fault { .. },
                ..
            } if !self.health.config.allow_injection => Err(ErrorCode::NotSupported),
            Command::Launch { stream, kernel } => self.launch(stream, kernel),
            Command::LaunchModule { stream, launch } => self.launch_module(stream, launch, false),
            Command::LaunchEx { stream, launch } => self.launch_module(stream, launch, true),
            Command::StreamCreateAs { .. }
            | Command::EventCreateAs { .. }
            | Command::StreamWaitEvent { .. }
            | Command::StreamQuery { .. }
            | Command::MemsetWide { .. }
            | Command::CopyHtoDStaged { .. }
            | Command::CopyDtoHStaged { .. }
            | Command::CopyHtoDHost { .. }
            | Command::CopyDtoHHost { .. }
            | Command::MemInfo
            | Command::FunctionSetAttribute { .. }
            | Command::Occupancy { .. } => self
                .execute_consolidated(cmd)
                .unwrap_or(Err(ErrorCode::InvalidCommand)),
            Command::GovernedReserve { bytes } => self.governed_reserve(bytes),
            Command::GovernedRelease { bytes } => self.governed_release(bytes),
            Command::GovernedTokens { launched, blocks } => self.governed_tokens(launched, blocks),
            Command::GovernedIdle { launched, blocks } => self.governed_idle(launched, blocks),
            Command::GovernedWeight { weight } => self.governed_weight(weight),
            Command::GovernedHeld { bytes } => self.governed_held(bytes),
        }
    }

    /// Queues a copy of client memory at `src` (checked by the caller) to `dst` on `stream`,
    /// counted for the client's figures.
    pub(super) fn queue_htod(
        &mut self,
        stream: StreamId,
        src: Span,
        dst: DevicePtr,
        len: u64,
    ) -> Result<(u64, u64), ErrorCode> {
        let copy = |stream| Call::CopyHtoD {
            stream,
            src,
            dst,
            staged: false,
        };
        let r = self.on_stream(stream, |d, s| d.queue(s, copy, &[]))?;
        self.info
            .counters
            .bytes_htod
            .fetch_add(len, Ordering::Relaxed);
        Ok(r)
    }

    /// Queues a copy of device memory at `src` to client memory at `dst` (both checked by
    /// the caller) on `stream`, counted for the client's figures.
    pub(super) fn queue_dtoh(
        &mut self,
        stream: StreamId,
        src: DevicePtr,
        dst: Span,
        len: u64,
    ) -> Result<(u64, u64), ErrorCode> {
        let copy = |stream| Call::CopyDtoH {
            stream,
            src,
            dst,
            staged: false,
            close: None,
        };
        let r = self.on_stream(stream, |d, s| d.queue(s, copy, &[]))?;
        self.info
            .counters
            .bytes_dtoh
            .fetch_add(len, Ordering::Relaxed);
        Ok(r)
    }

    /// Runs a stream-ordered device operation; its device time is charged at batch end.
    pub(super) fn on_stream(
        &mut self,
        stream: StreamId,
        op: impl FnOnce(&Device, &mut Stream) -> Result<(), DeviceError>,
    ) -> Result<(u64, u64), ErrorCode> {
        let device = self.device.clone();
        if !self.streams.contains_key(&stream) {
            return Err(ErrorCode::InvalidHandle);
        }
        // Work queued after work a reset took would run on what that work never wrote (a
        // training step's update on gradients never computed): as after a failure in CUDA,
        // nothing more runs on the stream until a sync has told the client of the loss.
        if self.lost.refuse(stream) {
            return Err(ErrorCode::WorkLost);
        }
        if !self.take_probation_turn() {
            // A reset began while this suspect waited for its turn: the command never ran,
            // so it runs after the reset if the client's state is kept
            // (`replay::run_again_after_reset`), else fails as lost to the reset.
            tracing::debug!("a reset began while this suspect waited for its turn");
            self.health
                .wait_for_recovery_start(self.epoch, Duration::from_secs(2));
            return Err(ErrorCode::DeviceReset);
        }
        let watch = &self.info.fault_watch;
        if watch.busy_since.load(Ordering::Relaxed) == 0 {
            self.health.mark_busy(watch);
        }
        let slot = self
            .streams
            .get_mut(&stream)
            .ok_or(ErrorCode::InvalidHandle)?;
        slot.touched = true;
        slot.unsynced = true;
        slot.submitted += 1;
        if self.info.consolidated {
            self.order_legacy(stream)?;
        }
        let slot = self
            .streams
            .get_mut(&stream)
            .ok_or(ErrorCode::InvalidHandle)?;
        let r = op(&device, &mut slot.stream).map(|()| (0, 0)).map_err(|e| {
            tracing::debug!(error = %e, "device operation failed");
            e.code()
        });
        if self.info.consolidated && r.is_ok() {
            self.note_legacy(stream);
        }
        self.publish_mark(stream);
        r
    }

    /// On probation, waits for this suspect's turn to run work (a no-op off probation, or
    /// holding the turn already); false when a reset began meanwhile.
    pub(super) fn take_probation_turn(&mut self) -> bool {
        let Some(until) = self.probation_until else {
            return true;
        };
        if self.holding_turn {
            return true;
        }
        if Instant::now() >= until {
            self.probation_until = None;
            return true;
        }
        if !self.health.acquire_turn(self.info.id) {
            return false;
        }
        tracing::debug!("on probation: this suspect's turn");
        self.holding_turn = true;
        true
    }

    /// Waits for every stream's work; the first error any met. A stream with no work since
    /// its last synchronization is skipped: a program may hold dozens of idle streams
    /// (PyTorch makes its stream pools whole), each a round trip to the device.
    pub(super) fn sync_all(&mut self) -> Result<(), ErrorCode> {
        let device = self.device.clone();
        let mut first_error = None;
        for slot in self.streams.values_mut() {
            if !slot.unsynced {
                continue;
            }
            slot.touched = true;
            match device.sync_stream(&mut slot.stream) {
                Ok(()) => slot.unsynced = false,
                Err(e) => {
                    first_error.get_or_insert(e.code());
                }
            }
        }
        if first_error.is_none() {
            self.all_granted_seen_finished();
            self.settle_in_flight();
        }
        first_error.map_or(Ok(()), Err)
    }
}

/// The first id from `next` on that is not `taken`, and the next one to try after it: a
/// consolidated client names its own streams and events (`StreamCreateAs`), and a handle made
/// the other way must not displace one (a displaced device stream would never be destroyed).
/// Ends within as many steps as there are live handles.
fn fresh_id(next: u32, taken: impl Fn(u32) -> bool) -> Result<(u32, u32), ErrorCode> {
    let mut id = next;
    while taken(id) {
        id = id.checked_add(1).ok_or(ErrorCode::TooManyHandles)?;
    }
    Ok((id, id.checked_add(1).ok_or(ErrorCode::TooManyHandles)?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fresh_ids_skip_the_ones_in_use() {
        assert_eq!(fresh_id(1, |_| false), Ok((1, 2)));
        assert_eq!(fresh_id(1, |id| id <= 3), Ok((4, 5)));
        assert_eq!(fresh_id(1, |id| id == 2), Ok((1, 2)));
        assert_eq!(
            fresh_id(u32::MAX, |_| false),
            Err(ErrorCode::TooManyHandles)
        );
        assert_eq!(
            fresh_id(u32::MAX - 1, |id| id == u32::MAX - 1),
            Err(ErrorCode::TooManyHandles)
        );
    }
}
