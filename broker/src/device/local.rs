//! [`Local`]: a device whose context lives in gpushared's own process
//! (`--in-process-device`): the link runs each call on its executor at once, on the calling
//! thread. The same executor serves a device worker; only the carrying differs.

use std::collections::BTreeMap;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use gpushare_protocol::control::DeviceInfo;

use super::backend::Backend;
use super::call::{Answer, Call, Handle};
use super::executor::{Executor, lock};
use super::front::Device;
use super::link::{Ledger, Link, Memory, Space};
use super::{DeviceError, DeviceResult};

/// A backend in this process.
pub struct Local<B: Backend> {
    executor: Executor<B>,
    ledger: Ledger,
    generation: AtomicU64,
    space: Space,
    /// Clients' memory: every chunk's descriptor, to map it again after a reset.
    chunks: Mutex<BTreeMap<u64, (u64, OwnedFd)>>,
    /// Other devices' chunks mapped here for peer access, and their reserved ranges.
    peers: Mutex<super::mirrors::PeerMemory>,
    /// The devices that map this one's chunks.
    mirrors: super::mirrors::Mirrors,
}

impl<B: Backend> Local<B> {
    /// Reserves the device's address space (at `hint`, where an earlier image had it).
    pub fn new(backend: B, hint: u64) -> DeviceResult<Local<B>> {
        let granularity = backend.granularity()?;
        let size = Space::size_for(backend.info().total_memory);
        let base = backend.reserve(hint, size)?;
        Ok(Local {
            executor: Executor::new(backend),
            ledger: Ledger::default(),
            generation: AtomicU64::new(0),
            space: Space {
                base,
                size,
                granularity,
            },
            chunks: Mutex::default(),
            peers: Mutex::default(),
            mirrors: Default::default(),
        })
    }

    pub fn backend(&self) -> &B {
        self.executor.backend()
    }
}

impl Device {
    /// A device served by `backend` in this process. `handover`: where an earlier image of
    /// gpushared had its address space (the base, and where fresh memory went from).
    pub fn local<B: Backend>(backend: B, handover: Option<(u64, u64)>) -> DeviceResult<Device> {
        let (hint, floor) = handover.unwrap_or((0, 0));
        let local = match Local::new(backend, hint) {
            Ok(l) => l,
            Err(DeviceError::AddressUnavailable(_)) if hint != 0 => {
                return Err(DeviceError::Failed(format!(
                    "the address range the previous gpushared used ({hint:#x}) is taken"
                )));
            }
            Err(e) => return Err(e),
        };
        Ok(Device::new(Arc::new(local), floor))
    }
}

impl<B: Backend> Link for Local<B> {
    fn backend(&self) -> &'static str {
        self.executor.backend().backend()
    }

    fn info(&self) -> &DeviceInfo {
        self.executor.backend().info()
    }

    fn sm_partitions(&self) -> bool {
        self.executor.backend().sm_partitions()
    }

    fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    fn ledger(&self) -> &Ledger {
        &self.ledger
    }

    fn call(
        &self,
        call: Call,
        payload: &[u8],
        _deadline: Option<Duration>,
    ) -> DeviceResult<Answer> {
        Ok(self.executor.run(call, payload))
    }

    fn post(&self, stream: Option<Handle>, call: Call, payload: &[u8]) -> DeviceResult<()> {
        let mut answer = self.executor.run(call, payload);
        // Run already: a failure is known now, and said now.
        if let super::call::Reply::Failed(e) = answer.reply {
            answer.reply = super::call::Reply::Done;
            self.ledger.note(self.generation(), stream, answer);
            return Err(e);
        }
        self.ledger.note(self.generation(), stream, answer);
        Ok(())
    }

    fn share_memory(
        &self,
        region: u64,
        fd: BorrowedFd<'_>,
        len: u64,
        at: u64,
        offset: u64,
    ) -> DeviceResult<()> {
        let fd = fd.try_clone_to_owned().map_err(|e| {
            DeviceError::Failed(format!("cannot share client memory with the device: {e}"))
        })?;
        self.executor.share_region(region, &fd, len, at, offset)
    }

    fn unshare_memory(&self, region: u64) {
        self.executor.unshare_region(region);
    }

    fn space(&self) -> Space {
        self.space
    }

    fn create_chunk(&self, at: u64, size: u64) -> DeviceResult<()> {
        let mut chunks = lock(&self.chunks);
        let fd = self.executor.create_chunk(at, size)?;
        self.mirrors.made(at, size, fd.as_fd());
        chunks.insert(at, (size, fd));
        Ok(())
    }

    fn release_chunk(&self, at: u64, size: u64) {
        let mut chunks = lock(&self.chunks);
        self.mirrors.released(at, size);
        let _ = self.executor.release_chunk(at, size);
        chunks.remove(&at);
    }

    fn mirror_into(&self, peer: std::sync::Weak<dyn Link>, holder: u64) -> DeviceResult<()> {
        let chunks = lock(&self.chunks);
        let each = chunks
            .iter()
            .map(|(&at, (size, fd))| (at, *size, fd.as_fd()));
        self.mirrors.add(peer, holder, self.space, each)
    }

    fn stop_mirroring(&self, peer: &std::sync::Weak<dyn Link>, holder: u64) {
        let _chunks = lock(&self.chunks);
        self.mirrors.drop_holder(peer, holder, self.space);
    }

    fn forget_peer(&self, space: Space) {
        let inside = lock(&self.peers).inside(space);
        for (at, size) in inside {
            self.release_peer_chunk(at, size);
        }
    }

    fn reserve_peer(&self, space: Space) -> DeviceResult<()> {
        let mut peers = lock(&self.peers);
        if !peers.spaces.contains(&space) {
            self.executor.reserve_peer(space.base, space.size)?;
            peers.spaces.push(space);
        }
        Ok(())
    }

    fn map_peer_chunk(&self, at: u64, size: u64, fd: BorrowedFd<'_>) -> DeviceResult<()> {
        let kept = fd.try_clone_to_owned().map_err(|e| {
            DeviceError::Failed(format!(
                "cannot keep another GPU's memory's descriptor: {e}"
            ))
        })?;
        let mut peers = lock(&self.peers);
        self.executor.import_peer_chunk(at, size, fd)?;
        peers.chunks.insert(at, (size, kept));
        Ok(())
    }

    fn release_peer_chunk(&self, at: u64, size: u64) {
        if lock(&self.peers).chunks.remove(&at).is_some() {
            let _ = self.executor.release_chunk(at, size);
        }
    }

    fn make_memory(&self, size: u64) -> DeviceResult<OwnedFd> {
        self.executor.make_memory(size)
    }

    fn map_chunk(&self, at: u64, size: u64, fd: BorrowedFd<'_>) -> DeviceResult<()> {
        let kept = fd.try_clone_to_owned().map_err(|e| {
            DeviceError::Failed(format!("cannot keep device memory's descriptor: {e}"))
        })?;
        let mut chunks = lock(&self.chunks);
        self.executor.import_chunk(at, size, fd)?;
        self.mirrors.made(at, size, fd);
        chunks.insert(at, (size, kept));
        Ok(())
    }

    fn interrupt(&self) {
        self.executor.backend().interrupt();
    }

    fn fault(&self) -> Option<String> {
        self.executor.backend().fault()
    }

    fn reset(&self) -> DeviceResult<Memory> {
        self.executor.backend().reset()?;
        // Whatever was made before belongs to the context that went; the memory does not.
        self.executor.forget_handles();
        self.generation.fetch_add(1, Ordering::AcqRel);
        let chunks = lock(&self.chunks);
        for (&at, (size, fd)) in chunks.iter() {
            if let Err(e) = self.executor.import_chunk(at, *size, fd.as_fd()) {
                tracing::warn!(at = format_args!("{at:#x}"), error = %e, "a chunk cannot be mapped again after the reset");
                return Ok(Memory::Lost);
            }
        }
        let peers = lock(&self.peers);
        for space in &peers.spaces {
            let _ = self.executor.reserve_peer(space.base, space.size);
        }
        for (&at, (size, fd)) in &peers.chunks {
            if let Err(e) = self.executor.import_peer_chunk(at, *size, fd.as_fd()) {
                tracing::warn!(at = format_args!("{at:#x}"), error = %e, "another GPU's memory cannot be mapped again after the reset: peer access no longer reaches it");
            }
        }
        Ok(Memory::Kept)
    }

    fn resets_in_place(&self) -> bool {
        self.executor.backend().resets_in_place()
    }

    fn reset_deadline(&self) -> Duration {
        self.executor.backend().reset_deadline()
    }
}
