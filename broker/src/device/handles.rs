//! What callers hold of the executor's objects: streams (with what is known of their device
//! time), and events, modules and functions, each released there when dropped. A handle keeps
//! its name across a fault (the front makes it again, by its recipe, in the context that
//! takes over); only when that cannot be done does its epoch end, and it is inert.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use gpushare_protocol::PriorityClass;
use gpushare_protocol::control::ModuleFormat;

use super::call::{Call, EventKind, Handle};
use super::link::Link;
use super::progress::Episode;

/// How a handle's object is made again in a new context.
#[derive(Debug, Clone)]
pub enum Recipe {
    Stream {
        class: PriorityClass,
    },
    Event {
        kind: EventKind,
    },
    Module {
        format: ModuleFormat,
        image: Arc<[u8]>,
    },
    Function {
        module: Handle,
        name: String,
        /// Attributes set on it, in order.
        attributes: Vec<(u32, i32)>,
    },
    /// Its encoded nodes ([`super::Call::MakeGraph`]'s payload).
    Graph {
        nodes: Arc<[u8]>,
    },
}

/// Every live handle's recipe, by name: names grow, so a function comes after its module.
#[derive(Default)]
pub struct Recipes(Mutex<BTreeMap<Handle, Recipe>>);

impl Recipes {
    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<Handle, Recipe>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn add(&self, id: Handle, recipe: Recipe) {
        self.lock().insert(id, recipe);
    }

    pub fn remove(&self, id: Handle) {
        self.lock().remove(&id);
    }

    /// Whether handle `id` is live.
    pub fn contains(&self, id: Handle) -> bool {
        self.lock().contains_key(&id)
    }

    /// An attribute set on function `id`, to set again.
    pub fn note_attribute(&self, id: Handle, attribute: u32, value: i32) {
        if let Some(Recipe::Function { attributes, .. }) = self.lock().get_mut(&id) {
            attributes.retain(|&(a, _)| a != attribute);
            attributes.push((attribute, value));
        }
    }

    pub fn all(&self) -> Vec<(Handle, Recipe)> {
        self.lock().iter().map(|(&id, r)| (id, r.clone())).collect()
    }
}

/// A stream, with what the caller knows of its device time.
pub struct Stream {
    pub(super) epoch: u64,
    pub(super) id: Handle,
    /// Device time answers reported and nobody took yet.
    pub(super) busy_ns: u64,
    /// Measurements still pending in the executor.
    pub(super) measuring: bool,
    /// Work was queued since the client last went idle (a measured span may be open).
    pub(super) dirty: bool,
    /// Work was queued since the device last answered that the stream is not busy: only
    /// then is it asked again (a round trip, for every stream a framework keeps). Only that
    /// answer clears it: an event seen done does not, as the device may still hold a fault of
    /// the stream's work that nobody has seen.
    pub(super) unfinished: bool,
    /// When a batch of it was last ended.
    pub(super) ended: Option<Instant>,
    /// An event that marks where the stream's next kernel starts: recorded with the kernel,
    /// in one step (or before anything else queued on the stream first).
    pub(super) pending_start: Option<Handle>,
    /// Its slot in the progress page, if it got one.
    pub(super) slot: Option<u32>,
    /// Its second slot, for marks after work whose end gpushared watches ([`Device::mark_done`]),
    /// taken on first use.
    ///
    /// [`Device::mark_done`]: super::Device::mark_done
    pub(super) done_slot: Option<u32>,
    /// Work queued since it was last known idle ([`super::progress`]).
    pub(super) episode: Option<Episode>,
}

impl Stream {
    pub(super) fn new(epoch: u64, id: Handle, slot: Option<u32>) -> Stream {
        Stream {
            epoch,
            id,
            busy_ns: 0,
            measuring: false,
            dirty: false,
            unfinished: false,
            ended: None,
            pending_start: None,
            slot,
            done_slot: None,
            episode: None,
        }
    }

    pub(super) fn learn(&mut self, news: Option<(u64, bool)>) {
        if let Some((busy, measuring)) = news {
            self.busy_ns = self.busy_ns.saturating_add(busy);
            self.measuring = measuring;
        }
    }
}

/// What a held handle needs to let go of its object.
pub struct Owner {
    pub(super) link: Arc<dyn Link>,
    pub(super) recipes: Arc<Recipes>,
    pub(super) epoch: Arc<std::sync::atomic::AtomicU64>,
}

/// An object of the executor's that is released there when dropped (after its epoch ended,
/// its context is gone, and so is the object: nothing to do).
pub struct Held {
    pub(super) epoch: u64,
    pub(super) id: Handle,
    owner: Arc<Owner>,
    release: fn(Handle) -> Call,
}

impl Held {
    pub(super) fn new(
        owner: &Arc<Owner>,
        epoch: u64,
        id: Handle,
        release: fn(Handle) -> Call,
    ) -> Held {
        Held {
            epoch,
            id,
            owner: owner.clone(),
            release,
        }
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        let owner = &self.owner;
        owner.recipes.remove(self.id);
        if owner.epoch.load(std::sync::atomic::Ordering::Acquire) == self.epoch {
            let release = (self.release)(self.id);
            owner.link.forget_mirror(self.id, &release);
            // Nobody needs the answer; a failure leaves only a handle its context drops.
            let _ = owner.link.post(None, release, &[]);
        }
    }
}

/// An event.
pub struct Event(pub(super) Held);

/// A loaded module; dropping it unloads it.
pub struct Module(pub(super) Held);

/// A module function.
pub struct Function(pub(super) Held);

/// An instantiated CUDA graph.
pub struct Graph(pub(super) Held);

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

impl Named for Graph {
    fn held(&self) -> &Held {
        &self.0
    }
}
