//! Kernels and the GPU's scheduler: a launch waits for its turn, and the scheduler hears when
//! each granted kernel has finished and, for some, how long it ran on the device (timed with
//! events), so that its profiles and fair shares rest on measurements, not estimates.
//!
//! Whether granted kernels finished is read from the progress page, where their stream writes
//! a mark after them (`Device::mark_done`), not asked of the worker, whose answer would wait
//! behind everything the session posted before the question. Every call a granted kernel adds
//! goes through the worker's CUDA context, which all clients' launches share, so a mark covers
//! up to `MARK_EVERY` kernels of a stream: one is posted at once when the session is about to
//! wait for the scheduler or goes quiet (and after every kernel for a while after a wait with
//! few kernels in flight, when each one finishing is what frees it), and a wait that saw the
//! stream finish settles its kernels without one. A kernel is timed between two events of its
//! own about one launch in 8 while its profile is young (and a high-priority client's), then
//! one in 64, picked at random; the others are charged their profile's estimate, which those
//! measurements keep true (docs/benchmarks.md, runs A1-A5 and H3).

use std::sync::atomic::Ordering;

use gpushare_protocol::StreamId;

use super::SessionState;
use crate::device::{Event, EventKind};
use crate::gpu::scheduler::{Finished, Profiles, Turn, Waiting};
use crate::sched::{KernelProfile, RequestId};

/// At most this many granted kernels of a stream, or batches of the client's commands, wait
/// for one progress mark.
const MARK_EVERY: u32 = 8;
/// After a wait with few kernels in flight, this many granted kernels get a mark each.
const MARK_EACH_AFTER_HOLD: u32 = 64;

/// A granted kernel not yet seen finished.
pub(super) struct Granted {
    request: RequestId,
    stream: StreamId,
    /// Recorded just before it, when it is timed.
    start: Option<Event>,
    /// Recorded just after it, when it is timed or its stream cannot be marked.
    end: Option<Event>,
    seen: Seen,
}

/// How a granted kernel is seen finished.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Seen {
    /// Not yet marked: a later mark on its stream tells, or a wait that saw the stream finish.
    Pending,
    /// The progress mark its stream writes after it (or after later work of the stream).
    Mark((u32, u32)),
    /// Its stream cannot be marked: its end event is asked.
    Event,
    /// Known finished: its stream was seen finished since.
    Done,
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
                    // Its kernels that wait for a mark get one: their finishing may be what
                    // frees it. With few in flight, each one's does: for a while each of its
                    // kernels gets its own.
                    Waiting::Begins => {
                        for slot in this.streams.values_mut() {
                            this.device.end_batch(&mut slot.stream, true);
                        }
                        this.mark_all_pending();
                        if this.granted.len() < 2 * MARK_EVERY as usize {
                            this.mark_each = MARK_EACH_AFTER_HOLD;
                        }
                    }
                },
                || info.stopping() || health.epoch() != epoch,
            )
        })
    }

    /// Before a granted kernel is launched on `stream`: an event that marks where it starts,
    /// when it is drawn to be timed, with chance one in `time_every` (its turn's). Drawn at
    /// random (xorshift), so that every kernel of a program's repeating sequence gets timed
    /// now and then, each as often as its turn says.
    pub(super) fn start_granted(&mut self, stream: StreamId, time_every: u32) -> Option<Event> {
        let mut x = self.timing_seed;
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        self.timing_seed = x;
        if !(x >> 8).is_multiple_of(time_every.max(1)) {
            return None;
        }
        self.record(stream, true)
    }

    /// After a granted launch: how it will be seen finished (a progress mark now, or one
    /// later that covers the stream's next kernels too) and, when it is timed, an event after
    /// it.
    pub(super) fn track_granted(
        &mut self,
        stream: StreamId,
        request: RequestId,
        start: Option<Event>,
        launched: bool,
    ) {
        if !launched {
            return self.untracked(request, start);
        }
        let marks = self
            .streams
            .get_mut(&stream)
            .is_some_and(|slot| self.device.can_mark(&mut slot.stream));
        // An end event times it, or tells when it finished where its stream has no marks.
        let end = match start.is_some() || !marks {
            true => match self.record(stream, false) {
                Some(e) => Some(e),
                None => return self.untracked(request, start),
            },
            false => None,
        };
        let seen = if marks { Seen::Pending } else { Seen::Event };
        let mark_now = marks
            && (start.is_some()
                || self.mark_each > 0
                || self.streams.get(&stream).map_or(0, |s| s.pending) + 1 >= MARK_EVERY);
        self.mark_each = self.mark_each.saturating_sub(1);
        self.granted.push_back(Granted {
            request,
            stream,
            start,
            end,
            seen,
        });
        if mark_now {
            self.mark_pending(stream);
        } else if let (true, Some(slot)) = (marks, self.streams.get_mut(&stream)) {
            slot.pending += 1;
            self.pending_kernels += 1;
        }
    }

    /// An event recorded on `stream`: where its next work starts (`start`), or after the
    /// work queued on it so far.
    fn record(&mut self, stream: StreamId, start: bool) -> Option<Event> {
        let event = self.spare_event().ok()?;
        let recorded = self.streams.get_mut(&stream).is_some_and(|slot| {
            let r = match start {
                true => self.device.record_start(&event, &mut slot.stream),
                false => self.device.record_event(&event, &mut slot.stream),
            };
            r.is_ok()
        });
        if !recorded {
            self.spare_events.push(event);
            return None;
        }
        Some(event)
    }

    /// A granted kernel that cannot be seen finished (it failed to launch, or no event could
    /// be recorded after it): reported finished now, so that it holds nobody back.
    fn untracked(&mut self, request: RequestId, start: Option<Event>) {
        self.spare_events.extend(start);
        self.dispatch.complete(self.info.id, &[(request, None)]);
    }

    /// Marks the granted kernels of `stream` that wait for a mark: one progress mark after
    /// the stream's work so far tells of them all. If none can be posted, they are taken as
    /// finished (a reset is under way, which forgets them anyway).
    fn mark_pending(&mut self, stream: StreamId) {
        let mark = self
            .streams
            .get_mut(&stream)
            .and_then(|slot| self.device.mark_done(&mut slot.stream));
        self.settle_pending(stream, mark.map_or(Seen::Done, Seen::Mark));
    }

    /// Gives every granted kernel of `stream` waiting for a mark `seen` (they are the
    /// stream's latest).
    fn settle_pending(&mut self, stream: StreamId, seen: Seen) {
        if let Some(slot) = self.streams.get_mut(&stream) {
            self.pending_kernels = self.pending_kernels.saturating_sub(slot.pending);
            slot.pending = 0;
        }
        for g in self.granted.iter_mut().rev().filter(|g| g.stream == stream) {
            if g.seen != Seen::Pending {
                break;
            }
            g.seen = seen;
        }
    }

    /// The session is about to wait for the policy, or goes quiet: every stream's kernels
    /// waiting for a mark get one now, so that the scheduler hears when they finish.
    pub(super) fn mark_all_pending(&mut self) {
        self.batches_pending = 0;
        if self.pending_kernels == 0 {
            return;
        }
        while let Some(stream) = self
            .streams
            .iter()
            .find(|(_, s)| s.pending > 0)
            .map(|(&id, _)| id)
        {
            self.mark_pending(stream);
        }
    }

    /// Forgets every granted kernel (the scheduler forgets them too).
    pub(super) fn forget_granted(&mut self) {
        self.granted.clear();
        self.no_pending();
    }

    /// Every stream was seen finished: so were the granted kernels.
    pub(super) fn all_granted_seen_finished(&mut self) {
        for g in self.granted.iter_mut() {
            if g.seen == Seen::Pending {
                g.seen = Seen::Done;
            }
        }
        self.no_pending();
    }

    /// No granted kernel waits for a mark any more.
    fn no_pending(&mut self) {
        self.pending_kernels = 0;
        for slot in self.streams.values_mut() {
            slot.pending = 0;
        }
    }

    /// A wait saw all of `stream`'s work finish: so did its granted kernels.
    pub(super) fn granted_seen_finished(&mut self, stream: StreamId) {
        if self.pending_kernels > 0 && self.streams.get(&stream).is_some_and(|s| s.pending > 0) {
            self.settle_pending(stream, Seen::Done);
        }
    }

    /// Whether a granted kernel finished: its progress mark says so, or (`ask`, or without a
    /// mark) its end event does. An error (a fault) counts as finished: the guardian deals
    /// with the fault.
    fn finished(&self, g: &Granted, ask: bool) -> bool {
        let ask_end = || {
            g.end
                .as_ref()
                .is_some_and(|e| !matches!(self.device.event_done(e), Ok(false)))
        };
        match g.seen {
            Seen::Done => true,
            Seen::Pending => false,
            Seen::Mark(m) => self.device.passed(m) || (ask && ask_end()),
            Seen::Event => ask_end(),
        }
    }

    /// Reports granted kernels that have finished to the scheduler, with the device time they
    /// took where it is measured. `quiet`: the client is idle or held, so asking the worker
    /// delays nothing, and its kernels waiting for a mark get one (see the module docs).
    pub(super) fn reap_granted(&mut self, quiet: bool) {
        // Kernels wait for a mark at most MARK_EVERY batches, whatever else the client sends
        // (the scheduler counts them in flight until then).
        if self.pending_kernels > 0 {
            self.batches_pending += 1;
        }
        if quiet || self.batches_pending >= MARK_EVERY {
            self.mark_all_pending();
        }
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
    /// with the device time each took where it is timed.
    fn take_finished(&mut self, quiet: bool, out: &mut Vec<Finished>) {
        while let Some(g) = self.granted.front() {
            if !self.finished(g, quiet) {
                break;
            }
            let Some(g) = self.granted.pop_front() else {
                break;
            };
            let measured = match (&g.start, &g.end) {
                (Some(start), Some(end)) => self.device.elapsed_ns(start, end).ok(),
                _ => None,
            };
            self.spare_events.extend(g.start.into_iter().chain(g.end));
            out.push((g.request, measured));
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

    /// A timing event from the spares, or a new one.
    fn spare_event(&mut self) -> crate::device::DeviceResult<Event> {
        match self.spare_events.pop() {
            Some(e) => Ok(e),
            None => self.device.create_event(EventKind::Timing),
        }
    }
}
