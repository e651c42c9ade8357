//! Kernels and the GPU's scheduler: a launch waits for its turn, and the scheduler hears when
//! each granted kernel has finished and how long it ran on the device (timed with events), so
//! that its profiles and fair shares rest on measurements, not estimates.
//!
//! A kernel is timed from an event recorded just before it, or, when it was launched right
//! behind the previous granted kernel of its stream while that one still ran (back-to-back
//! work, the common case), from the event after that one: one event per kernel, not two.
//!
//! Whether a granted kernel finished is read from the progress page, where its stream writes
//! a mark after it (`Device::mark_done`), not asked of the worker: a question waits for its
//! answer behind everything the session posted before it, and asked on every launch it made
//! each launch wait for the worker to catch up (on the H200, FAIR with nothing held ran 4 and
//! 16 PyTorch programs at 0.71 and 0.33 of FIFO's throughput; 0.91-1.04 and 0.59-0.60 with
//! marks). For the same reason the device time of only one granted kernel in `MEASURE_EVERY`
//! is asked for while the client is busy (the others are charged their profile's estimate,
//! which those measurements keep true); every one is measured while it is idle or held.

use std::sync::atomic::Ordering;

use gpushare_protocol::StreamId;

use super::SessionState;
use crate::device::{Event, EventKind};
use crate::gpu::scheduler::{Finished, Profiles, Turn, Waiting};
use crate::sched::{KernelProfile, RequestId};

/// While the client is busy, one granted kernel in this many is timed (see the docs).
const MEASURE_EVERY: u32 = 8;

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
    /// The progress mark its stream writes after it (`None`: ask the end event).
    mark: Option<(u32, u32)>,
}

impl SessionState {
    /// Waits for the scheduler to grant a kernel of this profile (not at all under FIFO),
    /// telling it in the same step which granted kernels have finished.
    pub(super) fn acquire(
        &mut self,
        profile: impl FnOnce(&mut Profiles<'_>) -> KernelProfile,
    ) -> Option<Turn> {
        if !self.dispatch.schedules(self.info.grant().class) {
            return None;
        }
        let dispatch = self.dispatch.clone();
        let id = self.info.id;
        let info = self.info.clone();
        let health = self.health.clone();
        let epoch = self.epoch;
        self.with_finished(false, |this, finished| {
            dispatch.acquire(
                id,
                profile,
                finished,
                |waiting| match waiting {
                    Waiting::Held(finished) => {
                        this.take_finished(true, finished);
                        this.off_the_device_while_held();
                    }
                    // Close the measured spans: time spent waiting for others is not ours.
                    // Every stream's, and as idle: an ordinary batch end leaves a young span
                    // open, and the wait would be charged to this client.
                    Waiting::Begins => {
                        for slot in this.streams.values_mut() {
                            this.device.end_batch(&mut slot.stream, true);
                        }
                    }
                },
                || info.stopping() || health.epoch() != epoch,
            )
        })
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
            .is_some_and(|g| g.submitted == submitted && !self.finished(g, false));
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
                Ok(()) => Ok((e, slot.submitted, self.device.mark_done(&mut slot.stream))),
                Err(_) => Err(Some(e)),
            },
            (_, Ok(e), _) => Err(Some(e)),
            (_, Err(_), _) => Err(None),
        };
        match recorded {
            Ok((end, submitted, mark)) => self.granted.push_back(Granted {
                request,
                stream,
                start,
                end,
                submitted,
                mark,
            }),
            Err(spare) => {
                self.spare_events.extend(spare.into_iter().chain(start));
                self.dispatch.complete(self.info.id, &[(request, None)]);
            }
        }
    }

    /// Whether a granted kernel finished: its progress mark says so, else (`ask`, or without
    /// a mark) its end event does. An error (a fault) counts as finished: the guardian deals
    /// with the fault.
    fn finished(&self, g: &Granted, ask: bool) -> bool {
        if g.mark.is_some_and(|m| self.device.passed(m)) {
            return true;
        }
        (ask || g.mark.is_none()) && !matches!(self.device.event_done(&g.end), Ok(false))
    }

    /// Reports granted kernels that have finished to the scheduler, with the device time they
    /// took where it is measured. `quiet`: the client is idle or held, so asking the worker
    /// delays nothing (see the module docs).
    pub(super) fn reap_granted(&mut self, quiet: bool) {
        self.with_finished(quiet, |this, finished| {
            if !finished.is_empty() {
                this.dispatch.complete(this.info.id, finished);
            }
        });
    }

    /// Runs `f` with the granted kernels seen finished now ([`Self::take_finished`]), in the
    /// session's buffer for them, which it keeps for its room.
    fn with_finished<T>(&mut self, quiet: bool, f: impl FnOnce(&mut Self, &[Finished]) -> T) -> T {
        let mut finished = std::mem::take(&mut self.seen_finished);
        self.take_finished(quiet, &mut finished);
        let out = f(self, &finished);
        finished.clear();
        self.seen_finished = finished;
        out
    }

    /// Takes the granted kernels that have finished off the list, oldest first, into `out`
    /// with the device time each took where it is measured.
    fn take_finished(&mut self, quiet: bool, out: &mut Vec<Finished>) {
        while let Some(g) = self.granted.front() {
            if !self.finished(g, quiet) {
                break;
            }
            let Some(g) = self.granted.pop_front() else {
                break;
            };
            let request = g.request;
            self.reaped = self.reaped.wrapping_add(1);
            let measure = quiet || g.mark.is_none() || self.reaped.is_multiple_of(MEASURE_EVERY);
            out.push((request, self.time_granted(g, measure)));
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

    /// How long a finished granted kernel ran (if `measure`); keeps its end event as where
    /// the stream's next granted kernel starts.
    fn time_granted(&mut self, g: Granted, measure: bool) -> Option<u64> {
        let Some(slot) = self.streams.get_mut(&g.stream) else {
            self.spare_events.extend(g.start.into_iter().chain([g.end]));
            return None;
        };
        let from = g.start.as_ref().or(slot.last_end.as_ref());
        let measured = from
            .filter(|_| measure)
            .and_then(|s| self.device.elapsed_ns(s, &g.end).ok());
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
