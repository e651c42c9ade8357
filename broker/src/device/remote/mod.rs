//! `remote`: a device whose context lives in a worker process of gpushared's own.
//!
//! On CUDA a fault such as an illegal address poisons every context of the process that holds
//! it, for the life of that process (measured on the H100, driver 580: even a context created
//! after the fault fails). So gpushared keeps no context itself. Each device (a GPU, or a
//! GPU's trust domain) is a worker process; gpushared keeps the sockets, sessions, policy,
//! scheduler and telemetry, and forwards each device call to the worker over a channel of the
//! calling thread (shared memory and futexes: `channel`). After a fault gpushared kills the
//! worker and promotes a spare whose context is already made, which is a device reset in
//! place as far as the sessions can tell: they lose their device state, are told so, and go
//! on, and only the culprit is evicted.
//!
//! - `wire`: the requests, answers and control messages;
//! - `channel`: one calling thread's channel (the shared memory);
//! - `calls`: a thread's channels, requests that wait and requests that are posted;
//! - `handles`: streams, events, modules and functions as gpushared holds them;
//! - `device`: [`Device`] for [`RemoteDevice`];
//! - `spare`: the spare worker, and its promotion after a fault;
//! - `process`: starting, asking and killing a worker;
//! - `worker`: the worker process itself;
//! - here: [`RemoteDevice`] and what its parts share.

mod calls;
mod channel;
mod device;
mod handles;
pub mod process;
mod spare;
pub mod wire;
pub mod worker;

use std::collections::HashMap;
use std::os::fd::OwnedFd;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, RwLock};
use std::time::{Duration, Instant};

use gpushare_protocol::control::DeviceInfo;

pub use self::handles::{RemoteEvent, RemoteFunction, RemoteModule, RemoteStream};
use self::process::{WorkerError, WorkerProcess};
use self::spare::start_spare;
use self::wire::{FromWorker, Handle, Span};
pub use self::wire::{WorkerBackend, WorkerSpec};
use super::{DeviceError, DeviceResult};
use crate::shm::ArenaSlice;

/// How long a worker may take to open its device (the first CUDA start on a machine can be
/// slow).
pub(super) const READY_TIMEOUT: Duration = Duration::from_secs(120);
/// How long a promotion may wait for the spare to finish opening its device.
pub(super) const SPARE_WAIT: Duration = Duration::from_secs(20);
/// A busy stream's batch is ended in the worker at most this often (the CUDA device closes a
/// measured span once it is 2 ms old).
pub(super) const SPAN_CHECK: Duration = Duration::from_millis(2);
/// How long the guardian's fault check may wait for a worker's answer before taking its
/// silence for a fault.
pub(super) const FAULT_CHECK_TIMEOUT: Duration = Duration::from_secs(2);

/// Names each remote device, for the thread-local channel table.
static DEVICE_IDS: AtomicU64 = AtomicU64::new(1);
/// The built-in kernels a worker of this gpushared compiled: the others take them.
static COMPILED: Mutex<Option<wire::BuiltinKernels>> = Mutex::new(None);

/// A device in a worker process.
pub struct RemoteDevice {
    pub(super) shared: Arc<Shared>,
}

/// The worker serving now.
pub(super) struct Active {
    pub(super) generation: u64,
    pub(super) process: WorkerProcess,
    pub(super) channels: AtomicU64,
}

/// What the next promotion takes: a worker starting or ready, or why none could start.
type SpareSlot = Option<Result<WorkerProcess, WorkerError>>;

pub(super) struct Shared {
    pub(super) id: u64,
    pub(super) exe: PathBuf,
    pub(super) spec: WorkerSpec,
    pub(super) backend: &'static str,
    pub(super) info: DeviceInfo,
    pub(super) sm_partitions: bool,
    pub(super) use_spare: bool,
    pub(super) active: RwLock<Arc<Active>>,
    pub(super) spare: Mutex<SpareSlot>,
    pub(super) spare_ready: Condvar,
    /// Set from a fault until the reset is over: waits give up at once.
    pub(super) interrupted: AtomicBool,
    /// Client memory shared with the worker (a successor gets it too), by region id.
    pub(super) regions: Mutex<HashMap<u64, Shared_>>,
    /// Where the highest allocation ever handed out ends: a successor allocates above it.
    pub(super) high_water: AtomicU64,
    pub(super) next_blob: AtomicU64,
    /// Failures of posted work, by (generation, stream), until the stream's next
    /// synchronization reports them.
    pub(super) deferred: Mutex<HashMap<(u64, Handle), DeviceError>>,
    pub(super) any_deferred: AtomicBool,
    /// What answers to posted work said of streams' device time (measured since, pending
    /// still), by (generation, stream), until the stream's next account takes it.
    pub(super) news: Mutex<HashMap<(u64, Handle), (u64, bool)>>,
    pub(super) any_news: AtomicBool,
}

/// One region shared with the worker.
pub(super) struct Shared_ {
    pub(super) fd: OwnedFd,
    pub(super) len: u64,
    pub(super) at: u64,
}

pub(super) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl RemoteDevice {
    /// Starts a worker for `spec` from gpushared's executable `exe` and waits until its device
    /// is open; then starts its spare beside it (when `spare`).
    pub fn open(
        exe: PathBuf,
        mut spec: WorkerSpec,
        spare: bool,
    ) -> Result<RemoteDevice, WorkerError> {
        let started = Instant::now();
        if spec.builtins.is_none() {
            spec.builtins = lock(&COMPILED).clone();
        }
        let process = WorkerProcess::spawn(&exe, &spec)?;
        let (info, backend, sm_partitions) = match process.ready(READY_TIMEOUT)? {
            FromWorker::Ready {
                info,
                backend,
                sm_partitions,
                builtins,
            } => {
                // Every worker after this one (its spares, its successors, other domains')
                // takes the kernels it compiled.
                if let Some(k) = builtins {
                    *lock(&COMPILED) = Some(k.clone());
                    spec.builtins = Some(k);
                }
                (info, backend, sm_partitions)
            }
            other => {
                return Err(WorkerError::Socket(format!(
                    "expected the worker to be ready, it said {other:?}"
                )));
            }
        };
        tracing::debug!(device = %spec.label, pid = process.pid, took = ?started.elapsed(), "device worker ready");
        let shared = Arc::new(Shared {
            id: DEVICE_IDS.fetch_add(1, Ordering::Relaxed),
            exe,
            backend: wire::static_backend(&backend),
            spec,
            info,
            sm_partitions,
            use_spare: spare,
            active: RwLock::new(Arc::new(Active {
                generation: 0,
                process,
                channels: AtomicU64::new(1),
            })),
            spare: Mutex::new(None),
            spare_ready: Condvar::new(),
            interrupted: AtomicBool::new(false),
            regions: Mutex::default(),
            high_water: AtomicU64::new(0),
            next_blob: AtomicU64::new(1),
            deferred: Mutex::default(),
            any_deferred: AtomicBool::new(false),
            news: Mutex::default(),
            any_news: AtomicBool::new(false),
        });
        if spare {
            start_spare(&shared);
        }
        Ok(RemoteDevice { shared })
    }

    /// The pid of the worker serving now (for tests and logs).
    pub fn worker_pid(&self) -> i32 {
        self.active().process.pid
    }

    pub(super) fn active(&self) -> Arc<Active> {
        self.active_now().clone()
    }

    fn active_now(&self) -> std::sync::RwLockReadGuard<'_, Arc<Active>> {
        self.shared.active.read().unwrap_or_else(|e| e.into_inner())
    }

    pub(super) fn worker_lost(&self, why: &str) -> DeviceError {
        DeviceError::Fault(format!(
            "the device worker of {} stopped serving: {why}",
            self.shared.spec.label
        ))
    }

    /// A live handle of the worker serving now, or the error for one from before a reset.
    pub(super) fn live(&self, generation: u64) -> DeviceResult<()> {
        // Read under the lock: every queued call asks, and needs no reference of its own.
        if generation == self.active_now().generation {
            Ok(())
        } else {
            Err(DeviceError::Cancelled)
        }
    }

    pub(super) fn span(&self, slice: ArenaSlice<'_>) -> Span {
        let (region, offset) = slice.place();
        Span {
            region,
            offset,
            len: slice.len() as u64,
        }
    }
}

impl Drop for Shared {
    fn drop(&mut self) {
        // The spare goes with its device (the active worker is killed as it drops).
        if let Some(Ok(p)) = lock(&self.spare).take() {
            p.kill();
        }
    }
}
