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
//! - `wire`: a call as it travels, and the control messages;
//! - `channel`: one calling thread's channel (the shared memory);
//! - `calls`: a thread's channels, calls that wait and calls that are posted;
//! - `spare`: the spare worker, and its promotion after a fault;
//! - `process`: starting, asking and killing a worker;
//! - `worker`: the worker process itself (an executor behind its channels);
//! - here: [`Remote`], the [`Link`] to a worker, and what its parts share.

mod calls;
mod channel;
mod peers;
pub mod process;
mod spare;
pub mod wire;
pub mod worker;

use std::collections::{BTreeMap, HashMap};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, RwLock};
use std::time::{Duration, Instant};

use gpushare_protocol::control::DeviceInfo;

use self::process::{WorkerError, WorkerProcess};
use self::spare::start_spare;
use self::wire::{FromWorker, ToWorker};
pub use self::wire::{WorkerBackend, WorkerSpec};
use super::call::{Answer, Call, Handle};
use super::front::Device;
use super::link::{Ledger, Link, Memory, Pace, Space};
use super::{DeviceError, DeviceResult};

/// How long a worker may take to open its device (the first CUDA start on a machine can be
/// slow).
pub(super) const READY_TIMEOUT: Duration = Duration::from_secs(120);
/// How long a promotion may wait for the spare to finish opening its device.
pub(super) const SPARE_WAIT: Duration = Duration::from_secs(20);
/// How long the guardian's fault check may wait for a worker's answer before taking its
/// silence for a fault.
pub(super) const FAULT_CHECK_TIMEOUT: Duration = Duration::from_secs(2);

/// Names each remote device, for the thread-local channel table.
static DEVICE_IDS: AtomicU64 = AtomicU64::new(1);
/// The built-in kernels a worker of this gpushared compiled: the others take them.
static COMPILED: Mutex<Option<wire::BuiltinKernels>> = Mutex::new(None);

/// A device in a worker process: the link to it.
pub struct Remote {
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
    /// The spare maps every chunk as it is made (else only when it takes over).
    pub(super) map_ahead: bool,
    pub(super) active: RwLock<Arc<Active>>,
    /// `active`'s generation, read without its lock (every call looks).
    pub(super) generation: AtomicU64,
    pub(super) spare: Mutex<SpareSlot>,
    pub(super) spare_ready: Condvar,
    /// Set from a fault until the reset is over: waits give up at once.
    pub(super) interrupted: AtomicBool,
    /// Client memory shared with the worker (a successor gets it too), by region id.
    pub(super) regions: Mutex<HashMap<u64, Shared_>>,
    /// Where clients' memory lives, the same in every worker of this device.
    pub(super) space: Space,
    /// Clients' memory: each chunk's size and descriptor, by address. The active worker and
    /// the spare map every one; gpushared's descriptor keeps it alive whatever they do.
    pub(super) chunks: Mutex<BTreeMap<u64, (u64, OwnedFd)>>,
    /// Other devices' memory mapped here for peer access (a successor maps it too).
    pub(super) peers: Mutex<crate::device::mirrors::PeerMemory>,
    /// The links of other devices that map this one's chunks (peer access): told of each
    /// chunk made or let go.
    pub(super) mirrors: crate::device::mirrors::Mirrors,
    /// What the spare makes ahead of a fault besides (modules, functions, their attributes),
    /// in order: (owner, the call, its payload).
    pub(super) mirrored: Mutex<Mirrored>,
    pub(super) next_mirror: AtomicU64,
    /// Whether the spare made every mirrored call (one that could not still maps memory:
    /// the sessions' modules are loaded again at takeover instead).
    pub(super) spare_mirrors: AtomicBool,
    /// Whether the worker serving now holds every mirrored object.
    pub(super) active_mirrors: AtomicBool,
    pub(super) next_blob: AtomicU64,
    pub(super) ledger: Ledger,
    /// Since when the worker, alive, has not answered the fault check (`None`: it answers).
    pub(super) unanswered_since: Mutex<Option<Instant>>,
}

/// What a spare makes ahead of a fault, in order: (owner, the call, its payload).
pub(super) type Mirrored = BTreeMap<u64, (Handle, Call, Arc<[u8]>)>;

/// One region shared with the worker.
pub(super) struct Shared_ {
    pub(super) fd: OwnedFd,
    pub(super) len: u64,
    pub(super) at: u64,
    pub(super) offset: u64,
}

pub(super) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Remote {
    /// Starts a worker for `spec` from gpushared's executable `exe` and waits until its device
    /// is open; then starts its spare beside it (when `spare`), which maps clients' memory as
    /// it is made (`map_ahead`) or when it takes over.
    pub fn open(
        exe: PathBuf,
        mut spec: WorkerSpec,
        spare: bool,
        map_ahead: bool,
    ) -> Result<Remote, WorkerError> {
        let started = Instant::now();
        if spec.builtins.is_none() {
            spec.builtins = lock(&COMPILED).clone();
        }
        let process = WorkerProcess::spawn(&exe, &spec)?;
        let (info, backend, sm_partitions, space) = match process.ready(READY_TIMEOUT)? {
            FromWorker::Ready {
                info,
                backend,
                sm_partitions,
                builtins,
                space,
            } => {
                // Every worker after this one (its spares, its successors, other domains')
                // takes the kernels it compiled.
                if let Some(k) = builtins {
                    *lock(&COMPILED) = Some(k.clone());
                    spec.builtins = Some(k);
                }
                // Its spares and successors reserve the same addresses for clients' memory.
                spec.space = Some(space);
                (info, backend, sm_partitions, space)
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
            map_ahead,
            active: RwLock::new(Arc::new(Active {
                generation: 0,
                process,
                channels: AtomicU64::new(1),
            })),
            generation: AtomicU64::new(0),
            spare: Mutex::new(None),
            spare_ready: Condvar::new(),
            interrupted: AtomicBool::new(false),
            regions: Mutex::default(),
            space,
            chunks: Mutex::default(),
            peers: Mutex::default(),
            mirrors: Default::default(),
            mirrored: Mutex::default(),
            next_mirror: AtomicU64::new(1),
            spare_mirrors: AtomicBool::new(false),
            active_mirrors: AtomicBool::new(true),
            next_blob: AtomicU64::new(1),
            ledger: Ledger::default(),
            unanswered_since: Mutex::new(None),
        });
        if spare {
            start_spare(&shared);
        }
        Ok(Remote { shared })
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

    /// What a worker's refusal to make or map memory means to the caller.
    fn memory_refused(&self, e: WorkerError) -> DeviceError {
        match e {
            WorkerError::Refused(why) if why.contains("out of memory") => DeviceError::OutOfMemory,
            WorkerError::Refused(why) if why.contains("are outside the reservation or in use") => {
                DeviceError::AddressUnavailable(why)
            }
            WorkerError::Refused(why) => {
                DeviceError::Failed(format!("cannot make or map device memory: {why}"))
            }
            other => self.worker_lost(&other.to_string()),
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

impl Link for Remote {
    fn backend(&self) -> &'static str {
        self.shared.backend
    }

    fn info(&self) -> &DeviceInfo {
        &self.shared.info
    }

    fn sm_partitions(&self) -> bool {
        self.shared.sm_partitions
    }

    fn generation(&self) -> u64 {
        self.shared.generation.load(Ordering::Acquire)
    }

    fn ledger(&self) -> &Ledger {
        &self.shared.ledger
    }

    fn call(&self, call: Call, payload: &[u8], deadline: Option<Duration>) -> DeviceResult<Answer> {
        self.call_within(call, payload, deadline)
    }

    fn post(&self, stream: Option<Handle>, call: Call, payload: &[u8]) -> DeviceResult<()> {
        self.post_call(stream, call, payload)
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
            DeviceError::Failed(format!("cannot share memory with the device worker: {e}"))
        })?;
        // Under the lock, so that a promotion in progress hands every region on.
        let mut regions = lock(&self.shared.regions);
        let active = self.active();
        let sent = active.process.request(
            &ToWorker::ShareMemory {
                region,
                len,
                at,
                offset,
            },
            &[fd.as_raw_fd()],
        );
        regions.insert(
            region,
            Shared_ {
                fd,
                len,
                at,
                offset,
            },
        );
        match sent {
            Ok(()) => Ok(()),
            Err(WorkerError::Refused(why)) => {
                regions.remove(&region);
                Err(DeviceError::Failed(format!(
                    "the device worker cannot map client memory: {why}"
                )))
            }
            // A worker that is gone: its successor gets the region.
            Err(e) => {
                tracing::debug!(error = %e, "sharing memory with a device worker that is gone");
                Ok(())
            }
        }
    }

    fn unshare_memory(&self, region: u64) {
        let mut regions = lock(&self.shared.regions);
        if regions.remove(&region).is_some() {
            let _ = self
                .active()
                .process
                .request(&ToWorker::UnshareMemory { region }, &[]);
        }
    }

    fn pace_hint(&self, pace: Pace) {
        calls::pace_hint(self.shared.id, pace);
    }

    fn space(&self) -> Space {
        self.shared.space
    }

    fn create_chunk(&self, at: u64, size: u64) -> DeviceResult<()> {
        let shared = &self.shared;
        // Under the lock, so that a spare that gets ready meanwhile maps it too.
        let mut chunks = lock(&shared.chunks);
        let active = self.active();
        let fd = active
            .process
            .request_fd(&ToWorker::CreateChunk { at, size }, &[])
            .map_err(|e| self.memory_refused(e))?;
        spare::import_into_spare(shared, at, size, &fd);
        shared.mirrors.made(at, size, fd.as_fd());
        chunks.insert(at, (size, fd));
        Ok(())
    }

    fn make_memory(&self, size: u64) -> DeviceResult<OwnedFd> {
        self.active()
            .process
            .request_fd(&ToWorker::MakeMemory { size }, &[])
            .map_err(|e| self.memory_refused(e))
    }

    fn map_chunk(&self, at: u64, size: u64, fd: BorrowedFd<'_>) -> DeviceResult<()> {
        let shared = &self.shared;
        let fd = fd.try_clone_to_owned().map_err(|e| {
            DeviceError::Failed(format!("cannot keep device memory's descriptor: {e}"))
        })?;
        // Under the lock, so that a spare that gets ready meanwhile maps it too.
        let mut chunks = lock(&shared.chunks);
        self.active()
            .process
            .request(&ToWorker::ImportChunk { at, size }, &[fd.as_raw_fd()])
            .map_err(|e| self.memory_refused(e))?;
        spare::import_into_spare(shared, at, size, &fd);
        shared.mirrors.made(at, size, fd.as_fd());
        chunks.insert(at, (size, fd));
        Ok(())
    }

    fn mirror_into(&self, peer: std::sync::Weak<dyn Link>, holder: u64) -> DeviceResult<()> {
        // Under the chunks' lock: none is made or let go meanwhile.
        let chunks = lock(&self.shared.chunks);
        let each = chunks
            .iter()
            .map(|(&at, (size, fd))| (at, *size, fd.as_fd()));
        self.shared
            .mirrors
            .add(peer, holder, self.shared.space, each)
    }

    fn stop_mirroring(&self, peer: &std::sync::Weak<dyn Link>, holder: u64) {
        let _chunks = lock(&self.shared.chunks);
        self.shared
            .mirrors
            .drop_holder(peer, holder, self.shared.space);
    }

    fn forget_peer(&self, space: Space) {
        self.forget_peer_space(space)
    }

    fn reserve_peer(&self, space: Space) -> DeviceResult<()> {
        self.reserve_peer_space(space)
    }

    fn map_peer_chunk(&self, at: u64, size: u64, fd: BorrowedFd<'_>) -> DeviceResult<()> {
        self.map_peer(at, size, fd)
    }

    fn release_peer_chunk(&self, at: u64, size: u64) {
        self.release_peer(at, size)
    }

    fn mirror(&self, owner: Handle, call: &Call, payload: &Arc<[u8]>) {
        if !(self.shared.use_spare && self.shared.map_ahead) {
            return;
        }
        let shared = &self.shared;
        let mut mirrored = lock(&shared.mirrored);
        let seq = shared.next_mirror.fetch_add(1, Ordering::Relaxed);
        mirrored.insert(seq, (owner, call.clone(), payload.clone()));
        spare::mirror_into_spare(shared, call, payload);
    }

    fn forget_mirror(&self, owner: Handle, release: &Call) {
        if !(self.shared.use_spare && self.shared.map_ahead) {
            return;
        }
        let shared = &self.shared;
        let mut mirrored = lock(&shared.mirrored);
        let before = mirrored.len();
        mirrored.retain(|_, (o, _, _)| *o != owner);
        if mirrored.len() != before {
            spare::mirror_into_spare(shared, release, &Arc::from(&[][..]));
        }
    }

    fn mirrors(&self) -> bool {
        self.shared.active_mirrors.load(Ordering::Acquire)
    }

    fn release_chunk(&self, at: u64, size: u64) {
        let shared = &self.shared;
        let mut chunks = lock(&shared.chunks);
        if chunks.remove(&at).is_none() {
            return;
        }
        shared.mirrors.released(at, size);
        let _ = self
            .active()
            .process
            .request(&ToWorker::ReleaseChunk { at, size }, &[]);
        spare::release_in_spare(shared, at, size);
    }

    fn interrupt(&self) {
        self.shared.interrupted.store(true, Ordering::Release);
    }

    fn fault(&self) -> Option<String> {
        let active = self.active();
        if let Some(why) = active.process.gone() {
            return Some(self.worker_lost(&why).to_string());
        }
        let checked = self.call_within(Call::Fault, &[], Some(FAULT_CHECK_TIMEOUT));
        {
            let mut since = lock(&self.shared.unanswered_since);
            match &checked {
                Err(DeviceError::NoAnswer(_)) => {
                    since.get_or_insert_with(Instant::now);
                }
                _ => *since = None,
            }
        }
        match checked {
            Ok(answer) => match answer.reply.ok() {
                Ok(super::call::Reply::Fault(f)) => f,
                Ok(_) | Err(DeviceError::Cancelled) => None,
                Err(e) => Some(e.to_string()),
            },
            Err(DeviceError::Cancelled) => None,
            // Busy with a long call (a large copy, an allocation): slow is not poisoned. The
            // guardian examines a worker that stays silent (`unresponsive`); a GPU that makes
            // no progress is the hang watchdog's to find, with whoever caused it.
            Err(DeviceError::NoAnswer(why)) => {
                tracing::debug!(%why, "the fault check waits on a busy device worker");
                None
            }
            Err(e) => Some(e.to_string()),
        }
    }

    fn unresponsive(&self) -> Option<Duration> {
        lock(&self.shared.unanswered_since).map(|t| t.elapsed())
    }

    fn reset(&self) -> DeviceResult<Memory> {
        *lock(&self.shared.unanswered_since) = None;
        self.promote_spare()
    }

    fn resets_in_place(&self) -> bool {
        true
    }

    fn reset_deadline(&self) -> Duration {
        SPARE_WAIT + READY_TIMEOUT
    }
}

impl Device {
    /// A device served by a worker process; fresh memory goes at or above `floor`.
    pub fn remote(remote: Remote, floor: u64) -> Device {
        Device::new(Arc::new(remote), floor)
    }
}
