//! What callers hold of the executor's objects: streams (with what is known of their device
//! time), and events, modules and functions, each released there when dropped. Every handle
//! names the context generation it was made in; after a reset it is inert.

use std::sync::Arc;
use std::time::Instant;

use super::call::{Call, Handle};
use super::link::Link;

/// A stream, with what the caller knows of its device time.
pub struct Stream {
    pub(super) generation: u64,
    pub(super) id: Handle,
    /// Device time answers reported and nobody took yet.
    pub(super) busy_ns: u64,
    /// Measurements still pending in the executor.
    pub(super) measuring: bool,
    /// Work was queued since the client last went idle (a measured span may be open).
    pub(super) dirty: bool,
    /// When a batch of it was last ended.
    pub(super) ended: Option<Instant>,
    /// An event that marks where the stream's next kernel starts: recorded with the kernel,
    /// in one step (or before anything else queued on the stream first).
    pub(super) pending_start: Option<Handle>,
}

impl Stream {
    pub(super) fn new(generation: u64, id: Handle) -> Stream {
        Stream {
            generation,
            id,
            busy_ns: 0,
            measuring: false,
            dirty: false,
            ended: None,
            pending_start: None,
        }
    }

    pub(super) fn learn(&mut self, news: Option<(u64, bool)>) {
        if let Some((busy, measuring)) = news {
            self.busy_ns += busy;
            self.measuring = measuring;
        }
    }
}

/// An object of the executor's that is released there when dropped (after a reset its
/// context is gone, and so is the object: nothing to do).
pub struct Held {
    pub(super) generation: u64,
    pub(super) id: Handle,
    link: Arc<dyn Link>,
    release: fn(Handle) -> Call,
}

impl Held {
    pub(super) fn new(
        link: &Arc<dyn Link>,
        generation: u64,
        id: Handle,
        release: fn(Handle) -> Call,
    ) -> Held {
        Held {
            generation,
            id,
            link: link.clone(),
            release,
        }
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        if self.link.generation() == self.generation {
            // Nobody needs the answer; a failure leaves only a handle its context drops.
            let _ = self.link.post(None, (self.release)(self.id), &[]);
        }
    }
}

/// An event.
pub struct Event(pub(super) Held);

/// A loaded module; dropping it unloads it.
pub struct Module(pub(super) Held);

/// A module function.
pub struct Function(pub(super) Held);

/// A handle that names an object of one context generation.
pub trait Named {
    fn held(&self) -> &Held;
}

impl Named for Event {
    fn held(&self) -> &Held {
        &self.0
    }
}

impl Named for Module {
    fn held(&self) -> &Held {
        &self.0
    }
}

impl Named for Function {
    fn held(&self) -> &Held {
        &self.0
    }
}
