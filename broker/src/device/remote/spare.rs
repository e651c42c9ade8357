//! The spare: a worker whose context is made before it is needed, started beside the one
//! serving and after every promotion, with every chunk of clients' memory mapped at the
//! addresses the serving worker has it; and the promotion itself (what a reset of a remote
//! device is).

use std::collections::BTreeMap;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use super::process::{WorkerError, WorkerProcess};
use super::wire::{FromWorker, ToWorker, WorkerSpec};
use super::{Active, Mirrored, READY_TIMEOUT, Remote, SPARE_WAIT, Shared, lock};
use super::{calls, peers};
use crate::device::call::Call;
use crate::device::link::Memory;
use crate::device::{DeviceError, DeviceResult};

/// Starts the next spare in the background.
pub(super) fn start_spare(shared: &Arc<Shared>) {
    let weak = Arc::downgrade(shared);
    let (exe, spec) = (shared.exe.clone(), shared.spec.clone());
    let spawned = std::thread::Builder::new()
        .name("gpushare-spare".into())
        .spawn(move || {
            let started = Instant::now();
            let made = WorkerProcess::spawn(&exe, &spec).and_then(|p| ready(p, &spec));
            let Some(shared) = weak.upgrade() else {
                return;
            };
            // Under the chunks', mirrors' and peers' locks: what is made from now on is mapped into it
            // (made in it) as it is made.
            let chunks = lock(&shared.chunks);
            let mirrored = lock(&shared.mirrored);
            let peers = lock(&shared.peers);
            let made = made.and_then(|p| {
                if shared.map_ahead {
                    map_every_chunk(&p, &chunks)?;
                    peers::map_every_peer(&p, &peers)?;
                    let made = make_every_mirror(&p, &mirrored);
                    if let Err(e) = &made {
                        tracing::warn!(error = %e, "the spare device worker cannot make the sessions' modules ahead of a fault; they are loaded again at takeover");
                    }
                    shared.spare_mirrors.store(made.is_ok(), Ordering::Release);
                }
                Ok(p)
            });
            match &made {
                Ok(p) => tracing::info!(device = %spec.label, pid = p.pid, chunks = chunks.len(), took = ?started.elapsed(), "spare device worker ready"),
                Err(e) => tracing::warn!(device = %spec.label, error = %e, "cannot start a spare device worker"),
            }
            *lock(&shared.spare) = Some(made);
            drop(peers);
            drop(mirrored);
            drop(chunks);
            shared.spare_ready.notify_all();
        });
    if let Err(e) = spawned {
        tracing::warn!(error = %e, "cannot start the thread that makes a spare device worker");
    }
}

/// Waits for a worker to be ready, at the same address range as the device's others.
fn ready(p: WorkerProcess, spec: &WorkerSpec) -> Result<WorkerProcess, WorkerError> {
    match p.ready(READY_TIMEOUT)? {
        FromWorker::Ready { space, .. } if Some(space) == spec.space => Ok(p),
        FromWorker::Ready { space, .. } => Err(WorkerError::DeviceFailed(format!(
            "it reserved clients' memory at {:#x}, not at {:#x}",
            space.base,
            spec.space.map_or(0, |s| s.base)
        ))),
        other => Err(WorkerError::Socket(format!(
            "expected ready, got {other:?}"
        ))),
    }
}

/// Maps every chunk of clients' memory into a worker that is to serve.
fn map_every_chunk(
    p: &WorkerProcess,
    chunks: &BTreeMap<u64, (u64, OwnedFd)>,
) -> Result<(), WorkerError> {
    for (&at, (size, fd)) in chunks {
        p.request(
            &ToWorker::ImportChunk { at, size: *size },
            &[fd.as_fd().as_raw_fd()],
        )?;
    }
    Ok(())
}

/// Runs `call` in `p` (with its payload in a memfd).
fn send_mirror(p: &WorkerProcess, call: &Call, payload: &[u8]) -> Result<(), WorkerError> {
    let msg = ToWorker::Mirror {
        call: call.clone(),
        len: payload.len() as u64,
    };
    if payload.is_empty() {
        return p.request(&msg, &[]);
    }
    let fd = calls::payload_memfd(payload)
        .map_err(|e| WorkerError::Socket(format!("cannot hand over a payload: {e}")))?;
    p.request(&msg, &[fd.as_raw_fd()])
}

/// Makes every mirrored module, function and attribute in a worker that is to serve.
fn make_every_mirror(p: &WorkerProcess, mirrored: &Mirrored) -> Result<(), WorkerError> {
    for (_, call, payload) in mirrored.values() {
        send_mirror(p, call, payload)?;
    }
    Ok(())
}

/// Runs a mirrored call in the spare, if one is ready (one that cannot does without: the
/// sessions' modules are then loaded again at takeover).
pub(super) fn mirror_into_spare(shared: &Arc<Shared>, call: &Call, payload: &[u8]) {
    let slot = lock(&shared.spare);
    if let Some(Ok(p)) = slot.as_ref()
        && shared.spare_mirrors.load(Ordering::Acquire)
        && let Err(e) = send_mirror(p, call, payload)
    {
        tracing::warn!(error = %e, "the spare device worker cannot make a module ahead of a fault; it is loaded again at takeover");
        shared.spare_mirrors.store(false, Ordering::Release);
    }
}

/// Maps a chunk just made into the spare, if one is ready (one that cannot is replaced).
pub(super) fn import_into_spare(shared: &Arc<Shared>, at: u64, size: u64, fd: &OwnedFd) {
    map_in_spare(
        shared,
        &ToWorker::ImportChunk { at, size },
        Some(fd.as_fd()),
    );
}

/// Sends the spare, if one is ready and maps ahead, a request that maps memory (`msg`, with
/// `fd`); a spare that cannot is replaced (the next one maps everything as it starts).
pub(super) fn map_in_spare(shared: &Arc<Shared>, msg: &ToWorker, fd: Option<BorrowedFd<'_>>) {
    if !shared.map_ahead {
        return;
    }
    let fds: Vec<_> = fd.iter().map(|f| f.as_raw_fd()).collect();
    let mut slot = lock(&shared.spare);
    if let Some(Ok(p)) = slot.as_ref()
        && let Err(e) = p.request(msg, &fds)
    {
        tracing::warn!(error = %e, "the spare device worker cannot map clients' memory; starting another");
        if let Some(Ok(p)) = slot.take() {
            p.kill();
        }
        drop(slot);
        start_spare(shared);
    }
}

/// Unmaps a chunk from the spare, if one is ready.
pub(super) fn release_in_spare(shared: &Shared, at: u64, size: u64) {
    if !shared.map_ahead {
        return;
    }
    if let Some(Ok(p)) = lock(&shared.spare).as_ref() {
        let _ = p.request(&ToWorker::ReleaseChunk { at, size }, &[]);
    }
}

impl Shared {
    /// The spare, once ready (a fresh worker when there is none, or it failed).
    pub(super) fn take_spare(self: &Arc<Self>) -> Result<WorkerProcess, WorkerError> {
        if self.use_spare {
            let slot = lock(&self.spare);
            let (mut slot, _) = self
                .spare_ready
                .wait_timeout_while(slot, SPARE_WAIT, |s| s.is_none())
                .unwrap_or_else(|e| e.into_inner());
            match slot.take() {
                Some(Ok(p)) if p.alive() => {
                    drop(slot);
                    self.active_mirrors.store(
                        self.spare_mirrors.load(Ordering::Acquire),
                        Ordering::Release,
                    );
                    if !self.map_ahead {
                        // Mapped now, at takeover: the time it takes is part of the recovery.
                        let started = std::time::Instant::now();
                        let chunks = lock(&self.chunks);
                        map_every_chunk(&p, &chunks)?;
                        peers::map_every_peer(&p, &lock(&self.peers))?;
                        tracing::info!(chunks = chunks.len(), took = ?started.elapsed(), "clients' memory mapped into the worker taking over");
                    }
                    return Ok(p);
                }
                Some(Ok(_)) => tracing::warn!("the spare device worker died; starting another"),
                Some(Err(e)) => tracing::warn!(error = %e, "no spare device worker; starting one"),
                None => tracing::warn!("the spare device worker is not ready; starting another"),
            }
        }
        let p = ready(WorkerProcess::spawn(&self.exe, &self.spec)?, &self.spec)?;
        map_every_chunk(&p, &lock(&self.chunks))?;
        peers::map_every_peer(&p, &lock(&self.peers))?;
        let made = self.map_ahead && make_every_mirror(&p, &lock(&self.mirrored)).is_ok();
        self.active_mirrors.store(made, Ordering::Release);
        Ok(p)
    }
}

impl Remote {
    /// Replaces the worker serving now, whose context is lost (or that hangs), with the spare:
    /// kills it, hands the spare every region the clients share (it maps their device memory
    /// already), and starts the next spare.
    pub(super) fn promote_spare(&self) -> DeviceResult<Memory> {
        let shared = &self.shared;
        let old = self.active();
        let started = Instant::now();
        // Its context is lost (or it hangs): only its end gives the GPU back.
        old.process.kill();
        let process = shared
            .take_spare()
            .map_err(|e| DeviceError::Failed(format!("no device worker can take over: {e}")))?;
        let regions = lock(&shared.regions);
        for (&region, r) in regions.iter() {
            if let Err(e) = process.request(
                &ToWorker::ShareMemory {
                    region,
                    len: r.len,
                    at: r.at,
                    offset: r.offset,
                },
                &[r.fd.as_fd().as_raw_fd()],
            ) {
                tracing::warn!(region, error = %e, "the new device worker cannot map a client's memory");
            }
        }
        let pid = process.pid;
        *shared.active.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(Active {
            generation: old.generation + 1,
            process,
            channels: AtomicU64::new(1),
        });
        shared
            .generation
            .store(old.generation + 1, Ordering::Release);
        drop(regions);
        shared.interrupted.store(false, Ordering::Release);
        tracing::info!(device = %shared.spec.label, pid, old_pid = old.process.pid, took = ?started.elapsed(), "a new device worker took over");
        if shared.use_spare {
            start_spare(shared);
        }
        Ok(Memory::Kept)
    }
}
