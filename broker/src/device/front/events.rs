//! Events: made, recorded after a stream's work (or where its next kernel starts, for timing
//! it), asked about and waited for.

use super::Device;
use crate::device::DeviceResult;
use crate::device::call::{Call, EventKind};
use crate::device::handles::{Event, Held, Recipe, Stream};

impl Device {
    pub fn create_event(&self, kind: EventKind) -> DeviceResult<Event> {
        let (epoch, id) = (self.epoch(), self.name());
        self.call(Call::CreateEvent { id, kind }, &[])?.done()?;
        self.owner.recipes.add(id, Recipe::Event { kind });
        Ok(Event(Held::new(&self.owner, epoch, id, |event| {
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
        self.live(stream.epoch)?;
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
}
