//! The spare: a worker whose context is made before it is needed, started beside the one
//! serving and after every promotion, and the promotion itself (what a reset of a remote
//! device is).

use std::os::fd::{AsFd, AsRawFd};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use super::process::{WorkerError, WorkerProcess};
use super::wire::{FromWorker, ToWorker};
use super::{Active, READY_TIMEOUT, Remote, SPARE_WAIT, Shared, lock};
use crate::device::{DeviceError, DeviceResult};

/// Starts the next spare in the background.
pub(super) fn start_spare(shared: &Arc<Shared>) {
    let weak = Arc::downgrade(shared);
    let (exe, spec) = (shared.exe.clone(), shared.spec.clone());
    let spawned = std::thread::Builder::new()
        .name("gpushare-spare".into())
        .spawn(move || {
            let started = Instant::now();
            let made = WorkerProcess::spawn(&exe, &spec).and_then(|p| match p.ready(READY_TIMEOUT)? {
                FromWorker::Ready { .. } => Ok(p),
                other => Err(WorkerError::Socket(format!("expected ready, got {other:?}"))),
            });
            match &made {
                Ok(p) => tracing::info!(device = %spec.label, pid = p.pid, took = ?started.elapsed(), "spare device worker ready"),
                Err(e) => tracing::warn!(device = %spec.label, error = %e, "cannot start a spare device worker"),
            }
            if let Some(shared) = weak.upgrade() {
                *lock(&shared.spare) = Some(made);
                shared.spare_ready.notify_all();
            }
        });
    if let Err(e) = spawned {
        tracing::warn!(error = %e, "cannot start the thread that makes a spare device worker");
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
                Some(Ok(p)) if p.alive() => return Ok(p),
                Some(Ok(_)) => tracing::warn!("the spare device worker died; starting another"),
                Some(Err(e)) => tracing::warn!(error = %e, "no spare device worker; starting one"),
                None => tracing::warn!("the spare device worker is not ready; starting another"),
            }
        }
        let p = WorkerProcess::spawn(&self.exe, &self.spec)?;
        match p.ready(READY_TIMEOUT)? {
            FromWorker::Ready { .. } => Ok(p),
            other => Err(WorkerError::Socket(format!(
                "expected ready, got {other:?}"
            ))),
        }
    }
}

impl Remote {
    /// Replaces the worker serving now, whose context is lost (or that hangs), with the spare:
    /// kills it, hands the spare every region the clients share, and starts the next spare.
    pub(super) fn promote_spare(&self) -> DeviceResult<()> {
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
                },
                &[r.fd.as_fd().as_raw_fd()],
            ) {
                tracing::warn!(region, error = %e, "the new device worker cannot map a client's memory");
            }
        }
        let floor = shared.high_water.load(Ordering::Acquire);
        if floor > 0 {
            let _ = process.request(&ToWorker::AddressFloor { end: floor }, &[]);
        }
        let pid = process.pid;
        *shared.active.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(Active {
            generation: old.generation + 1,
            process,
            channels: AtomicU64::new(1),
        });
        drop(regions);
        shared.interrupted.store(false, Ordering::Release);
        tracing::info!(device = %shared.spec.label, pid, old_pid = old.process.pid, took = ?started.elapsed(), "a new device worker took over");
        if shared.use_spare {
            start_spare(shared);
        }
        Ok(())
    }
}
