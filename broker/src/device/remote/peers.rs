//! Another device's memory mapped into this device's workers for peer access
//! (`crate::device::mirrors`): its ranges reserved and its chunks mapped in the worker serving
//! and in the spare, and kept for a worker that takes over.

use std::os::fd::{AsFd, AsRawFd, BorrowedFd};
use std::sync::Arc;

use super::process::{WorkerError, WorkerProcess};
use super::wire::ToWorker;
use super::{Remote, Shared, lock};
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

/// Sends `msg` (with `fd`) to the spare too, if one is ready and maps ahead; a spare that
/// cannot is replaced (the next one maps everything as it starts).
fn into_spare(shared: &Arc<Shared>, msg: &ToWorker, fd: Option<BorrowedFd<'_>>) {
    if !shared.map_ahead {
        return;
    }
    let fds: Vec<_> = fd.iter().map(|f| f.as_raw_fd()).collect();
    let mut slot = lock(&shared.spare);
    if let Some(Ok(p)) = slot.as_ref()
        && let Err(e) = p.request(msg, &fds)
    {
        tracing::warn!(error = %e, "the spare device worker cannot map another GPU's memory; starting another");
        if let Some(Ok(p)) = slot.take() {
            p.kill();
        }
        drop(slot);
        super::spare::start_spare(shared);
    }
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
        into_spare(&self.shared, &msg, None);
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
        into_spare(&self.shared, &msg, Some(fd.as_fd()));
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
        if self.shared.map_ahead
            && let Some(Ok(p)) = lock(&self.shared.spare).as_ref()
        {
            let _ = p.request(&msg, &[]);
        }
    }
}
