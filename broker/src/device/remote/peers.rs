//! Another device's memory mapped into this device's workers for peer access
//! (`crate::device::mirrors`): its ranges reserved and its chunks mapped in the worker serving
//! and in the spare, and kept for a worker that takes over.

use std::os::fd::{AsFd, AsRawFd, BorrowedFd};

use super::process::{WorkerError, WorkerProcess};
use super::spare::{map_in_spare, release_in_spare};
use super::wire::ToWorker;
use super::{Remote, lock};
use crate::device::link::Space;
use crate::device::mirrors::PeerMemory;
use crate::device::{DeviceError, DeviceResult};

/// Reserves every peer range and maps every peer chunk into a worker that is to serve.
pub(super) fn map_every_peer(p: &WorkerProcess, peers: &PeerMemory) -> Result<(), WorkerError> {
    for space in &peers.spaces {
        let (base, size) = (space.base, space.size);
        p.request(&ToWorker::ReservePeer { base, size }, &[])?;
    }
    for (&at, (size, fd)) in &peers.chunks {
        let msg = ToWorker::ImportPeerChunk { at, size: *size };
        p.request(&msg, &[fd.as_fd().as_raw_fd()])?;
    }
    Ok(())
}

impl Remote {
    pub(super) fn reserve_peer_space(&self, space: Space) -> DeviceResult<()> {
        let mut peers = lock(&self.shared.peers);
        let (base, size) = (space.base, space.size);
        if peers.spaces.contains(&space) {
            return Ok(());
        }
        let msg = ToWorker::ReservePeer { base, size };
        self.active()
            .process
            .request(&msg, &[])
            .map_err(|e| self.memory_refused(e))?;
        map_in_spare(&self.shared, &msg, None);
        peers.spaces.push(space);
        Ok(())
    }

    pub(super) fn map_peer(&self, at: u64, size: u64, fd: BorrowedFd<'_>) -> DeviceResult<()> {
        let fd = fd.try_clone_to_owned().map_err(|e| {
            DeviceError::Failed(format!(
                "cannot keep another GPU's memory's descriptor: {e}"
            ))
        })?;
        let mut peers = lock(&self.shared.peers);
        let msg = ToWorker::ImportPeerChunk { at, size };
        self.active()
            .process
            .request(&msg, &[fd.as_raw_fd()])
            .map_err(|e| self.memory_refused(e))?;
        map_in_spare(&self.shared, &msg, Some(fd.as_fd()));
        peers.chunks.insert(at, (size, fd));
        Ok(())
    }

    /// Lets go of every peer chunk inside `space` (the reservation stays, for a next time).
    pub(super) fn forget_peer_space(&self, space: Space) {
        let inside = lock(&self.shared.peers).inside(space);
        for (at, size) in inside {
            self.release_peer(at, size);
        }
    }

    pub(super) fn release_peer(&self, at: u64, size: u64) {
        let mut peers = lock(&self.shared.peers);
        if peers.chunks.remove(&at).is_none() {
            return;
        }
        let msg = ToWorker::ReleaseChunk { at, size };
        let _ = self.active().process.request(&msg, &[]);
        release_in_spare(&self.shared, at, size);
    }
}
