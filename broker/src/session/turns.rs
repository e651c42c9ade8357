//! Kernels and the GPU's scheduler: a launch waits for its turn, and the scheduler hears when
//! each granted kernel has finished and how long it ran on the device (timed with events), so
//! that its profiles and fair shares rest on measurements, not estimates.
//!
//! A kernel is timed from an event recorded just before it, or, when it was launched right
//! behind the previous granted kernel of its stream while that one still ran (back-to-back
//! work, the common case), from the event after that one: one event per kernel, not two.

use std::sync::atomic::Ordering;

use gpushare_protocol::StreamId;

use super::SessionState;
use crate::device::{Event, EventKind};
use crate::gpu::scheduler::{GpuScheduler, Turn, Waiting};
use crate::sched::{KernelProfile, RequestId};

/// A granted kernel not yet seen finished.
pub(super) struct Granted {
    request: RequestId,
    stream: StreamId,
    /// Recorded just before the kernel; `None`: it started when the previous granted kernel
    /// of its stream ended.
    start: Option<Event>,
    end: Event,
    /// The stream's operation count after the kernel (nothing else came between two granted
    /// kernels when the next one is launched at the count after this).
    submitted: u64,
}

impl SessionState {
    /// Waits for the scheduler to grant a kernel of this profile (not at all under FIFO).
    pub(super) fn acquire(
        &mut self,
        profile: impl FnOnce(&GpuScheduler) -> KernelProfile,
    ) -> Option<Turn> {
        if !self.dispatch.schedules(self.info.grant().class) {
            return None;
        }
        let dispatch = self.dispatch.clone();
        let profile = profile(&dispatch);
        let id = self.info.id;
        let info = self.info.clone();
        let health = self.health.clone();
        let epoch = self.epoch;
        dispatch.acquire(
            id,
            profile,
            |waiting| match waiting {
                Waiting::Reap => {
                    self.reap_granted();
                    self.off_the_device_while_held();
                }
                // Close the measured spans: time spent waiting for others is not ours. Every
                // stream's, and as idle: an ordinary batch end leaves a young span open, and
                // the wait would be charged to this client.
                Waiting::Begins => {
                    for slot in self.streams.values_mut() {
                        self.device.end_batch(&mut slot.stream, true);
                    }
                }
            },
            || info.stopping() || health.epoch() != epoch,
        )
    }

    /// Before a granted kernel is launched on `stream`: an event that marks where it starts,
    /// unless it will start where the stream's previous granted kernel ends (that one is
    /// still running and nothing was queued between them).
    pub(super) fn start_granted(&mut self, stream: StreamId) -> Option<Event> {
        let submitted = self.streams.get(&stream)?.submitted;
        let behind = self
            .granted
            .iter()
            .rev()
            .find(|g| g.stream == stream)
            .is_some_and(|g| {
                g.submitted == submitted && matches!(self.device.event_done(&g.end), Ok(false))
            });
        if behind {
            return None;
        }
        let event = self.spare_event().ok()?;
        let Some(slot) = self.streams.get_mut(&stream) else {
            self.spare_events.push(event);
            return None;
        };
        match self.device.record_start(&event, &mut slot.stream) {
            Ok(()) => Some(event),
            Err(_) => {
                self.spare_events.push(event);
                None
            }
        }
    }

    /// After a granted launch: an event marks when the kernel is done, and times it.
    pub(super) fn track_granted(
        &mut self,
        stream: StreamId,
        request: RequestId,
        start: Option<Event>,
        launched: bool,
    ) {
        let event = self.spare_event();
        let recorded = match (launched, event, self.streams.get_mut(&stream)) {
            (true, Ok(e), Some(slot)) => match self.device.record_event(&e, &mut slot.stream) {
                Ok(()) => Ok((e, slot.submitted)),
                Err(_) => Err(Some(e)),
            },
            (_, Ok(e), _) => Err(Some(e)),
            (_, Err(_), _) => Err(None),
        };
        match recorded {
            Ok((end, submitted)) => self.granted.push_back(Granted {
                request,
                stream,
                start,
                end,
                submitted,
            }),
            Err(spare) => {
                self.spare_events.extend(spare.into_iter().chain(start));
                self.dispatch.complete(self.info.id, request, None);
            }
        }
    }

    /// Reports granted kernels that have finished to the scheduler, each with the device
    /// time it took.
    pub(super) fn reap_granted(&mut self) {
        while let Some(g) = self.granted.front() {
            // An error (a fault) ends the wait too: the guardian deals with the fault.
            if matches!(self.device.event_done(&g.end), Ok(false)) {
                break;
            }
            let Some(g) = self.granted.pop_front() else {
                break;
            };
            let request = g.request;
            let measured = self.time_granted(g);
            self.dispatch.complete(self.info.id, request, measured);
        }
    }

    /// Held by the policy with no granted work of its own left: the watchdog's stamp goes
    /// once nothing of it is on the device, so that a hold the policy keeps (SRTF's long job
    /// behind a shorter one, a turn owed to others) is not taken for a hung kernel.
    fn off_the_device_while_held(&mut self) {
        let stamped = self.info.fault_watch.busy_since.load(Ordering::Relaxed) != 0;
        if stamped && self.granted.is_empty() {
            self.unstamp_if_off_the_device();
        }
    }

    /// How long a finished granted kernel ran; keeps its end event as where the stream's
    /// next granted kernel starts.
    fn time_granted(&mut self, g: Granted) -> Option<u64> {
        let Some(slot) = self.streams.get_mut(&g.stream) else {
            self.spare_events.extend(g.start.into_iter().chain([g.end]));
            return None;
        };
        let from = g.start.as_ref().or(slot.last_end.as_ref());
        let measured = from.and_then(|s| self.device.elapsed_ns(s, &g.end).ok());
        let previous = slot.last_end.replace(g.end);
        self.spare_events
            .extend(g.start.into_iter().chain(previous));
        measured
    }

    /// A timing event from the spares, or a new one.
    fn spare_event(&mut self) -> crate::device::DeviceResult<Event> {
        match self.spare_events.pop() {
            Some(e) => Ok(e),
            None => self.device.create_event(EventKind::Timing),
        }
    }
}
