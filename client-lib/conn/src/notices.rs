//! Device-reset notices: what the broker said a GPU reset took, kept until the client takes
//! them (shared by the sessions a client has over time).

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use gpushare_protocol::control::LostState;

use crate::state::lock;

/// The GPU was reset after a fault (another client's, or a hang): everything this client
/// held on the device is gone. The session goes on: new allocations work at once, and
/// commands naming lost handles fail with `DeviceReset`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceReset {
    pub gpu: u32,
    pub reason: String,
    pub lost: LostState,
}

/// Device-reset notices, shared by the sessions a client has over time.
pub struct Notices {
    /// Resets the broker told of and nobody has taken yet.
    pub resets: Mutex<Vec<DeviceReset>>,
    pub count: AtomicU64,
    /// With `track`: resets whose losses are not made again yet.
    pub unrebuilt: Mutex<Vec<DeviceReset>>,
    pub pending: AtomicBool,
    pub track: bool,
}

impl Notices {
    /// `track`: also keep the resets not yet made good (a client that rebuilds its state).
    pub fn new(track: bool) -> Notices {
        Notices {
            resets: Mutex::new(Vec::new()),
            count: AtomicU64::new(0),
            unrebuilt: Mutex::new(Vec::new()),
            pending: AtomicBool::new(false),
            track,
        }
    }

    /// The oldest reset not yet taken.
    pub fn take(&self) -> Option<DeviceReset> {
        let mut resets = lock(&self.resets);
        (!resets.is_empty()).then(|| resets.remove(0))
    }

    pub(crate) fn note(&self, reset: DeviceReset) {
        if self.track {
            lock(&self.unrebuilt).push(reset.clone());
            self.pending.store(true, Ordering::Release);
        }
        lock(&self.resets).push(reset);
        // Counted last: a thread that sees the new count also sees `pending`.
        self.count.fetch_add(1, Ordering::AcqRel);
    }
}
