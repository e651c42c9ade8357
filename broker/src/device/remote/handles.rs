//! What gpushared holds of the worker's objects: streams (with what it knows of their device
//! time), and events, modules and functions, each released in the worker when dropped.

use std::time::Instant;

use super::RemoteDevice;
use super::wire::{Handle, Request};

/// A client stream on the worker, with what gpushared knows of its device time.
pub struct RemoteStream {
    pub(super) generation: u64,
    pub(super) id: Handle,
    /// Device time the worker reported and nobody took yet.
    pub(super) busy_ns: u64,
    /// Measurements still pending in the worker.
    pub(super) measuring: bool,
    /// Work was queued since the client last went idle (a measured span may be open).
    pub(super) dirty: bool,
    /// When the worker last ended a batch of it.
    pub(super) ended: Option<Instant>,
    /// An event that marks where the stream's next kernel starts: recorded with the kernel,
    /// in one step in the worker (or before anything else queued on the stream first).
    pub(super) pending_start: Option<Handle>,
}

impl RemoteStream {
    pub(super) fn learn(&mut self, news: Option<(u64, bool)>) {
        if let Some((busy, measuring)) = news {
            self.busy_ns += busy;
            self.measuring = measuring;
        }
    }
}

/// A worker's object that is released there when dropped (after a reset, its worker is gone
/// and so is the object: nothing to do).
pub(super) struct Held {
    pub(super) generation: u64,
    pub(super) id: Handle,
    device: RemoteDevice,
    release: fn(Handle) -> Request,
}

impl Held {
    pub(super) fn new(
        device: &RemoteDevice,
        generation: u64,
        id: Handle,
        release: fn(Handle) -> Request,
    ) -> Held {
        Held {
            generation,
            id,
            device: RemoteDevice {
                shared: device.shared.clone(),
            },
            release,
        }
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        self.device
            .post_release(self.generation, (self.release)(self.id));
    }
}

/// An event on the worker.
pub struct RemoteEvent(pub(super) Held);

/// A module on the worker; dropping it unloads it there.
pub struct RemoteModule(pub(super) Held);

/// A module function on the worker.
pub struct RemoteFunction(pub(super) Held);

impl RemoteEvent {
    pub(super) fn new(device: &RemoteDevice, generation: u64, id: Handle) -> RemoteEvent {
        RemoteEvent(Held::new(device, generation, id, |event| {
            Request::DestroyEvent { event }
        }))
    }
}

impl RemoteModule {
    pub(super) fn new(device: &RemoteDevice, generation: u64, id: Handle) -> RemoteModule {
        RemoteModule(Held::new(device, generation, id, |module| {
            Request::DropModule { module }
        }))
    }
}

impl RemoteFunction {
    pub(super) fn new(device: &RemoteDevice, generation: u64, id: Handle) -> RemoteFunction {
        RemoteFunction(Held::new(device, generation, id, |function| {
            Request::DropFunction { function }
        }))
    }
}
