//! A device's progress page as sessions use it (`device::progress`): the marks that say how
//! far a stream got, for a fault's reckoning of what ran and for telling when granted work
//! finished without asking the worker.

use super::Device;
use crate::device::call::ProgressValue;
use crate::device::handles::Stream;
use crate::device::progress::Fate;

impl Device {
    /// For a call that waits for the stream's work: the closing value it writes when it has
    /// seen that work finish, so that a fault after it loses none of it.
    pub(super) fn close(&self, stream: &mut Stream) -> Option<ProgressValue> {
        self.live(stream.epoch).ok()?;
        self.progress.as_ref()?.close(stream)
    }

    /// The stream's work is known finished (an event recorded after it completed): nothing of
    /// it need be kept for a fault.
    pub fn settled(&self, stream: &mut Stream) {
        stream.episode = None;
    }

    /// Where the stream's unfinished work begins: its progress slot and the value it writes
    /// there on getting to that work (`None`: unknown).
    pub fn mark(&self, stream: &Stream) -> Option<(u32, u32)> {
        self.progress.as_ref()?;
        Some((stream.slot?, stream.episode.as_ref()?.mark()?))
    }

    /// Whether a stream got to the work `mark` begins (true when it cannot be told).
    pub fn reached(&self, (slot, value): (u32, u32)) -> bool {
        self.progress
            .as_ref()
            .is_none_or(|p| p.reached(slot, value))
    }

    /// After the work queued on `stream` so far: the stream writes a mark into gpushared's
    /// progress page when it gets past it, so that whether that work finished is read from
    /// memory ([`Device::passed`]) instead of asked of the worker, whose answer would wait
    /// behind everything posted before it. `None` without a page or a free slot.
    pub fn mark_done(&self, stream: &mut Stream) -> Option<(u32, u32)> {
        let progress = self.progress.as_ref()?;
        self.live(stream.epoch).ok()?;
        let slot = self.done_slot(stream)?;
        let (call, value) = progress.done_mark(stream.id, slot);
        // Posted, not kept in the stream's episode to queue again after a fault: it tells when
        // this context's work ended, which the context that takes over has no use for (the
        // session forgets its granted work at a reset), and kept it would fill the episode.
        self.link.post(Some(stream.id), call, &[]).ok()?;
        Some((slot, value))
    }

    /// Whether [`Device::mark_done`] can mark the stream's work (its done-slot is taken now
    /// if it has none).
    pub fn can_mark(&self, stream: &mut Stream) -> bool {
        self.live(stream.epoch).is_ok() && self.done_slot(stream).is_some()
    }

    fn done_slot(&self, stream: &mut Stream) -> Option<u32> {
        let progress = self.progress.as_ref()?;
        if stream.done_slot.is_none() {
            stream.done_slot = progress.take_slot();
        }
        stream.done_slot
    }

    /// Whether the stream got past the work a [`Device::mark_done`] marked (false when the
    /// page does not say so yet: ask the event).
    pub fn passed(&self, (slot, value): (u32, u32)) -> bool {
        self.progress
            .as_ref()
            .is_some_and(|p| p.passed(slot, value))
    }

    /// After a fault: what became of the stream's work not known finished.
    pub fn fate(&self, stream: &mut Stream) -> Fate {
        match &self.progress {
            Some(p) => p.fate(stream),
            None => Fate::Lost(Vec::new()),
        }
    }
}
