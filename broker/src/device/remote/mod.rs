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
//! - `channel`: one calling thread's channel;
//! - `process`: starting, asking and killing a worker;
//! - `worker`: the worker process itself;
//! - here: [`RemoteDevice`], the [`Device`] gpushared's sessions use, its handles, and the
//!   spare.

mod channel;
pub mod process;
pub mod wire;
pub mod worker;

use std::cell::RefCell;
use std::collections::HashMap;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, RwLock};
use std::time::{Duration, Instant};

use gpushare_protocol::command::{LaunchAttributes, ModuleLaunch};
use gpushare_protocol::control::{DeviceInfo, ModuleFormat, decode, encode_into};
use gpushare_protocol::{DevicePtr, Kernel, PriorityClass};

use self::channel::{CallerEnd, Gave, REQUEST_AREA};
use self::process::{WorkerError, WorkerProcess};
use self::wire::{Answer, Envelope, FromWorker, Handle, Payload, Reply, Request, Span, ToWorker};
pub use self::wire::{WorkerBackend, WorkerSpec};
use super::{Device, DeviceError, DeviceResult, FunctionShape, Occupancy};
use crate::shm::ArenaSlice;

/// How long a worker may take to open its device (the first CUDA start on a machine can be
/// slow).
const READY_TIMEOUT: Duration = Duration::from_secs(120);
/// How long a promotion may wait for the spare to finish opening its device.
const SPARE_WAIT: Duration = Duration::from_secs(20);
/// A busy stream's batch is ended in the worker at most this often (the CUDA device closes a
/// measured span once it is 2 ms old).
const SPAN_CHECK: Duration = Duration::from_millis(2);
/// How long the guardian's fault check may wait for a worker's answer before taking its
/// silence for a fault.
const FAULT_CHECK_TIMEOUT: Duration = Duration::from_secs(2);

/// Names each remote device, for the thread-local channel table.
static DEVICE_IDS: AtomicU64 = AtomicU64::new(1);
/// The built-in kernels a worker of this gpushared compiled: the others take them.
static COMPILED: Mutex<Option<wire::BuiltinKernels>> = Mutex::new(None);

/// A device in a worker process.
pub struct RemoteDevice {
    shared: Arc<Shared>,
}

/// The worker serving now.
struct Active {
    generation: u64,
    process: WorkerProcess,
    channels: AtomicU64,
}

/// What the next promotion takes: a worker starting or ready, or why none could start.
type SpareSlot = Option<Result<WorkerProcess, WorkerError>>;

struct Shared {
    id: u64,
    exe: PathBuf,
    spec: WorkerSpec,
    backend: &'static str,
    info: DeviceInfo,
    sm_partitions: bool,
    use_spare: bool,
    active: RwLock<Arc<Active>>,
    spare: Mutex<SpareSlot>,
    spare_ready: Condvar,
    /// Set from a fault until the reset is over: waits give up at once.
    interrupted: AtomicBool,
    /// Client memory shared with the worker (a successor gets it too), by region id.
    regions: Mutex<HashMap<u64, Shared_>>,
    /// Where the highest allocation ever handed out ends: a successor allocates above it.
    high_water: AtomicU64,
    next_blob: AtomicU64,
    /// Failures of posted work, by (generation, stream), until the stream's next
    /// synchronization reports them.
    deferred: Mutex<HashMap<(u64, Handle), DeviceError>>,
    any_deferred: AtomicBool,
}

/// One region shared with the worker.
struct Shared_ {
    fd: OwnedFd,
    len: u64,
    at: u64,
}

/// One thread's channel to one device's worker.
struct Caller {
    device: u64,
    generation: u64,
    end: CallerEnd,
    worker: Arc<Active>,
    /// The stream whose work the outstanding posted request is, if any.
    posted_for: Option<Handle>,
}

/// Whether a request waits for its answer (with an optional bound) or is posted.
#[derive(Clone, Copy)]
enum Send_ {
    Wait(Option<Duration>),
    Post(Option<Handle>),
}

thread_local! {
    static CALLERS: RefCell<Vec<Caller>> = const { RefCell::new(Vec::new()) };
    /// The spin each device's channel of this thread should have (kept across new channels).
    static SPINS: RefCell<HashMap<u64, Duration>> = RefCell::new(HashMap::new());
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
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

    fn active(&self) -> Arc<Active> {
        self.shared
            .active
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Sends a request on this thread's channel and waits for its answer.
    fn call(&self, request: Request, payload: &[u8]) -> DeviceResult<Answer> {
        self.call_within(request, payload, None)
    }

    fn call_within(
        &self,
        request: Request,
        payload: &[u8],
        deadline: Option<Duration>,
    ) -> DeviceResult<Answer> {
        match self.send(request, payload, Send_::Wait(deadline))? {
            Some(answer) => Ok(answer),
            None => Err(DeviceError::Failed(
                "no answer from the device worker".into(),
            )),
        }
    }

    /// Posts work for `stream` without waiting for its answer: the channel's next request
    /// collects it, and a failure is kept for the stream's next synchronization (as CUDA
    /// reports asynchronous errors), so the worker runs it while this thread goes on.
    fn post_work(&self, stream: Handle, request: Request, payload: &[u8]) -> DeviceResult<()> {
        self.send(request, payload, Send_::Post(Some(stream)))
            .map(drop)
    }

    /// Posts a release whose answer nobody needs (an event, module or function of
    /// `generation`; nothing to do if that worker is gone).
    fn post_release(&self, generation: u64, request: Request) {
        let active = self.active();
        if active.generation != generation || active.process.gone().is_some() {
            return; // released with its worker
        }
        // On a thread that is ending this may find no channel table left: nothing is lost, the
        // worker frees everything when it goes.
        let _ = self.send(request, &[], Send_::Post(None));
    }

    /// Sends a request on this thread's channel: waits for its answer, or posts it.
    fn send(&self, request: Request, payload: &[u8], how: Send_) -> DeviceResult<Option<Answer>> {
        let shared = &self.shared;
        if shared.interrupted.load(Ordering::Acquire) {
            return Err(DeviceError::Cancelled);
        }
        let active = self.active();
        if let Some(why) = active.process.gone() {
            return Err(self.worker_lost(&why));
        }
        let envelope_payload = if payload.len() > REQUEST_AREA / 2 {
            Payload::Blob(self.send_blob(&active, payload)?)
        } else if payload.is_empty() {
            Payload::None
        } else {
            Payload::Inline(payload.len() as u32)
        };
        let envelope = Envelope {
            request,
            payload: envelope_payload,
        };
        let sent = CALLERS.try_with(|callers| {
            let Ok(mut callers) = callers.try_borrow_mut() else {
                return Err(DeviceError::Failed(
                    "a device call from within another (a bug)".into(),
                ));
            };
            let caller = self.caller(&mut callers, &active)?;
            self.collect(caller)?;
            let area = caller.end.request_area();
            let used = encode_into(&envelope, area)
                .map_err(|e| DeviceError::Failed(format!("a request too big to send: {e}")))?;
            let len = match envelope.payload {
                Payload::Inline(n) => {
                    let dst = area
                        .get_mut(used..used + n as usize)
                        .ok_or_else(|| DeviceError::Failed("a payload too big to send".into()))?;
                    dst.copy_from_slice(payload);
                    used + n as usize
                }
                _ => used,
            };
            caller.end.post(len);
            match how {
                Send_::Post(stream) => {
                    caller.posted_for = stream;
                    Ok(None)
                }
                Send_::Wait(deadline) => {
                    let bytes = self.wait(caller, deadline)?;
                    decode::<Answer>(&bytes).map(Some).map_err(|e| {
                        DeviceError::Failed(format!("an answer that does not decode: {e}"))
                    })
                }
            }
        });
        sent.unwrap_or_else(|_| Err(DeviceError::Failed("the thread is ending".into())))
    }

    /// Collects the answer of the channel's posted request, if one is outstanding; a failure
    /// of posted work is kept for its stream's next synchronization.
    fn collect(&self, caller: &mut Caller) -> DeviceResult<()> {
        if !caller.end.outstanding() {
            return Ok(());
        }
        let bytes = self.wait(caller, None)?;
        if let (
            Some(stream),
            Ok(Answer {
                reply: Reply::Failed(e),
                ..
            }),
        ) = (caller.posted_for.take(), decode::<Answer>(&bytes))
        {
            let shared = &self.shared;
            lock(&shared.deferred)
                .entry((caller.generation, stream))
                .or_insert_with(|| e.into());
            shared.any_deferred.store(true, Ordering::Release);
        }
        Ok(())
    }

    /// The failure of work posted earlier for `stream`, once.
    fn take_deferred(&self, stream: &RemoteStream) -> Option<DeviceError> {
        let shared = &self.shared;
        if !shared.any_deferred.load(Ordering::Acquire) {
            return None;
        }
        let mut deferred = lock(&shared.deferred);
        let e = deferred.remove(&(stream.generation, stream.id));
        if deferred.is_empty() {
            shared.any_deferred.store(false, Ordering::Release);
        }
        e
    }

    /// Waits for the answer to the channel's posted request (a copy of its bytes).
    fn wait(&self, caller: &mut Caller, deadline: Option<Duration>) -> DeviceResult<Vec<u8>> {
        let shared = &self.shared;
        let worker = caller.worker.clone();
        let started = Instant::now();
        let give_up = || -> Option<String> {
            if shared.interrupted.load(Ordering::Acquire) {
                return Some(String::new());
            }
            if let Some(why) = worker.process.gone() {
                return Some(why);
            }
            deadline
                .filter(|d| started.elapsed() >= *d)
                .map(|d| format!("the device worker did not answer within {d:?}"))
        };
        match caller.end.wait(&give_up) {
            Ok(bytes) => Ok(bytes.to_vec()),
            Err(Gave::Up(why)) if why.is_empty() => Err(DeviceError::Cancelled),
            Err(Gave::Up(why)) => Err(self.worker_lost(&why)),
        }
    }

    /// This thread's channel to `active`, opened on first use; channels to replaced workers
    /// are dropped.
    fn caller<'c>(
        &self,
        callers: &'c mut Vec<Caller>,
        active: &Arc<Active>,
    ) -> DeviceResult<&'c mut Caller> {
        let id = self.shared.id;
        callers.retain(|c| c.device != id || c.generation == active.generation);
        if let Some(i) = callers.iter().position(|c| c.device == id) {
            return Ok(&mut callers[i]);
        }
        let mut end = CallerEnd::create().map_err(|e| {
            DeviceError::Failed(format!("cannot make a channel to the device worker: {e}"))
        })?;
        if let Some(spin) = SPINS.with(|s| s.borrow().get(&id).copied()) {
            end.set_spin(spin);
        }
        let channel = active.channels.fetch_add(1, Ordering::Relaxed);
        let fd = end.fd().map(|f| f.as_raw_fd()).unwrap_or(-1);
        active
            .process
            .request(&ToWorker::OpenChannel { id: channel }, &[fd])
            .map_err(|e| self.worker_lost(&e.to_string()))?;
        end.handed_over();
        callers.push(Caller {
            device: id,
            generation: active.generation,
            end,
            worker: active.clone(),
            posted_for: None,
        });
        let last = callers.len() - 1;
        Ok(&mut callers[last])
    }

    /// Sends a payload too big for a channel as a memfd of its own.
    fn send_blob(&self, active: &Active, payload: &[u8]) -> DeviceResult<u64> {
        use nix::fcntl::{FcntlArg, SealFlag, fcntl};
        use nix::sys::memfd::{MFdFlags, memfd_create};
        let fail = |what: &str, e: &dyn std::fmt::Display| {
            DeviceError::Failed(format!(
                "cannot hand a large payload to the device worker: {what}: {e}"
            ))
        };
        let fd = memfd_create(
            "gpushare-worker-blob",
            MFdFlags::MFD_CLOEXEC | MFdFlags::MFD_ALLOW_SEALING,
        )
        .map_err(|e| fail("memfd", &e))?;
        let mut file = std::fs::File::from(fd);
        std::io::Write::write_all(&mut file, payload).map_err(|e| fail("write", &e))?;
        // The worker maps it in whole pages; it reads only `payload.len()` bytes of them.
        let len = (payload.len() as u64).div_ceil(4096) * 4096;
        file.set_len(len).map_err(|e| fail("size", &e))?;
        fcntl(
            &file,
            FcntlArg::F_ADD_SEALS(SealFlag::F_SEAL_SHRINK | SealFlag::F_SEAL_GROW),
        )
        .map_err(|e| fail("seal", &e))?;
        let id = self.shared.next_blob.fetch_add(1, Ordering::Relaxed);
        active
            .process
            .request(&ToWorker::Blob { id, len }, &[file.as_raw_fd()])
            .map_err(|e| self.worker_lost(&e.to_string()))?;
        Ok(id)
    }

    fn worker_lost(&self, why: &str) -> DeviceError {
        DeviceError::Fault(format!(
            "the device worker of {} stopped serving: {why}",
            self.shared.spec.label
        ))
    }

    /// The reply of a request that answers with nothing.
    fn done(&self, request: Request, payload: &[u8]) -> DeviceResult<()> {
        match self.call(request, payload)?.reply {
            Reply::Done => Ok(()),
            other => Err(unexpected(other)),
        }
    }

    fn value(&self, request: Request, payload: &[u8]) -> DeviceResult<u64> {
        match self.call(request, payload)?.reply {
            Reply::Value(v) => Ok(v),
            other => Err(unexpected(other)),
        }
    }

    fn flag(&self, request: Request) -> DeviceResult<(bool, Option<(u64, bool)>)> {
        let answer = self.call(request, &[])?;
        match answer.reply {
            Reply::Flag(f) => Ok((f, answer.news)),
            other => Err(unexpected(other)),
        }
    }

    /// A live handle of the worker serving now, or the error for one from before a reset.
    fn live(&self, generation: u64) -> DeviceResult<()> {
        if generation == self.active().generation {
            Ok(())
        } else {
            Err(DeviceError::Cancelled)
        }
    }

    /// A stream request that waits for its answer: checks the stream is live and learns what
    /// the answer says of its device time.
    fn on_stream(&self, stream: &mut RemoteStream, request: Request) -> DeviceResult<()> {
        self.live(stream.generation)?;
        let answer = self.call(request, &[])?;
        stream.learn(answer.news);
        match answer.reply {
            Reply::Done => Ok(()),
            other => Err(unexpected(other)),
        }
    }

    /// Work queued on a stream: posted, not waited for (see [`RemoteDevice::post_work`]).
    fn queue(
        &self,
        stream: &mut RemoteStream,
        request: Request,
        payload: &[u8],
    ) -> DeviceResult<()> {
        self.live(stream.generation)?;
        stream.dirty = true;
        self.post_work(stream.id, request, payload)
    }

    fn span(&self, slice: ArenaSlice<'_>) -> Span {
        let (region, offset) = slice.place();
        Span {
            region,
            offset,
            len: slice.len() as u64,
        }
    }

    fn event(&self, generation: u64, id: Handle) -> RemoteEvent {
        RemoteEvent {
            generation,
            id,
            device: RemoteDevice {
                shared: self.shared.clone(),
            },
        }
    }
}

/// An answer of the wrong kind (a bug on one side).
fn unexpected(reply: Reply) -> DeviceError {
    match reply {
        Reply::Failed(e) => e.into(),
        other => DeviceError::Failed(format!("the device worker answered {other:?}")),
    }
}

/// Starts the next spare in the background.
fn start_spare(shared: &Arc<Shared>) {
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
    fn take_spare(self: &Arc<Self>) -> Result<WorkerProcess, WorkerError> {
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

/// A client stream on the worker, with what gpushared knows of its device time.
pub struct RemoteStream {
    generation: u64,
    id: Handle,
    /// Device time the worker reported and nobody took yet.
    busy_ns: u64,
    /// Measurements still pending in the worker.
    measuring: bool,
    /// Work was queued since the client last went idle (a measured span may be open).
    dirty: bool,
    /// When the worker last ended a batch of it.
    ended: Option<Instant>,
}

impl RemoteStream {
    fn learn(&mut self, news: Option<(u64, bool)>) {
        if let Some((busy, measuring)) = news {
            self.busy_ns += busy;
            self.measuring = measuring;
        }
    }
}

/// An event on the worker; dropping it releases it there.
pub struct RemoteEvent {
    generation: u64,
    id: Handle,
    device: RemoteDevice,
}

impl Drop for RemoteEvent {
    fn drop(&mut self) {
        self.device
            .post_release(self.generation, Request::DestroyEvent { event: self.id });
    }
}

/// A module on the worker; dropping it unloads it there.
pub struct RemoteModule {
    generation: u64,
    id: Handle,
    device: RemoteDevice,
}

impl Drop for RemoteModule {
    fn drop(&mut self) {
        self.device
            .post_release(self.generation, Request::DropModule { module: self.id });
    }
}

/// A module function on the worker.
pub struct RemoteFunction {
    generation: u64,
    id: Handle,
    device: RemoteDevice,
}

impl Drop for RemoteFunction {
    fn drop(&mut self) {
        self.device
            .post_release(self.generation, Request::DropFunction { function: self.id });
    }
}

impl Device for RemoteDevice {
    type Stream = RemoteStream;
    type Event = RemoteEvent;
    type Module = RemoteModule;
    type Function = RemoteFunction;

    fn backend(&self) -> &'static str {
        self.shared.backend
    }

    fn info(&self) -> &DeviceInfo {
        &self.shared.info
    }

    fn alloc(&self, bytes: u64) -> DeviceResult<DevicePtr> {
        let ptr = self.value(Request::Alloc { bytes }, &[])?;
        self.shared
            .high_water
            .fetch_max(ptr.saturating_add(bytes), Ordering::AcqRel);
        Ok(ptr)
    }

    fn alloc_at(&self, ptr: DevicePtr, bytes: u64) -> DeviceResult<u64> {
        let taken = self.value(Request::AllocAt { ptr, bytes }, &[])?;
        self.shared
            .high_water
            .fetch_max(ptr.saturating_add(bytes.max(taken)), Ordering::AcqRel);
        Ok(taken)
    }

    fn free(&self, ptr: DevicePtr) -> DeviceResult<()> {
        self.done(Request::Free { ptr }, &[])
    }

    fn share_memory(&self, region: u64, fd: BorrowedFd<'_>, len: u64, at: u64) -> DeviceResult<()> {
        let fd = fd.try_clone_to_owned().map_err(|e| {
            DeviceError::Failed(format!("cannot share memory with the device worker: {e}"))
        })?;
        // Under the lock, so that a promotion in progress hands every region on.
        let mut regions = lock(&self.shared.regions);
        let active = self.active();
        let sent = active.process.request(
            &ToWorker::ShareMemory { region, len, at },
            &[fd.as_raw_fd()],
        );
        regions.insert(region, Shared_ { fd, len, at });
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

    fn spin_hint(&self, spin: Duration) {
        let id = self.shared.id;
        SPINS.with(|s| s.borrow_mut().insert(id, spin));
        let _ = CALLERS.try_with(|callers| {
            if let Ok(callers) = callers.try_borrow() {
                for c in callers.iter().filter(|c| c.device == id) {
                    c.end.set_spin(spin);
                    c.end.nudge();
                }
            }
        });
    }

    fn register_arena(&self, arena: ArenaSlice<'_>) -> DeviceResult<()> {
        self.done(
            Request::RegisterArena {
                span: self.span(arena),
            },
            &[],
        )
    }

    fn unregister_arena(&self, arena: ArenaSlice<'_>) {
        let _ = self.done(
            Request::UnregisterArena {
                span: self.span(arena),
            },
            &[],
        );
    }

    fn create_stream(&self, class: PriorityClass) -> DeviceResult<RemoteStream> {
        let generation = self.active().generation;
        let id = self.value(Request::CreateStream { class }, &[])?;
        Ok(RemoteStream {
            generation,
            id,
            busy_ns: 0,
            measuring: false,
            dirty: false,
            ended: None,
        })
    }

    fn destroy_stream(&self, stream: RemoteStream) {
        let _ = self.take_deferred(&stream);
        if self.live(stream.generation).is_ok() {
            let _ = self.done(Request::DestroyStream { stream: stream.id }, &[]);
        }
    }

    fn copy_htod(
        &self,
        stream: &mut RemoteStream,
        src: ArenaSlice<'_>,
        dst: DevicePtr,
    ) -> DeviceResult<()> {
        let request = Request::CopyHtoD {
            stream: stream.id,
            src: self.span(src),
            dst,
            staged: false,
        };
        self.queue(stream, request, &[])
    }

    fn copy_dtoh(
        &self,
        stream: &mut RemoteStream,
        src: DevicePtr,
        dst: ArenaSlice<'_>,
    ) -> DeviceResult<()> {
        let request = Request::CopyDtoH {
            stream: stream.id,
            src,
            dst: self.span(dst),
            staged: false,
        };
        self.queue(stream, request, &[])
    }

    fn copy_dtod(
        &self,
        stream: &mut RemoteStream,
        src: DevicePtr,
        dst: DevicePtr,
        len: u64,
    ) -> DeviceResult<()> {
        let request = Request::CopyDtoD {
            stream: stream.id,
            src,
            dst,
            len,
        };
        self.queue(stream, request, &[])
    }

    fn memset(
        &self,
        stream: &mut RemoteStream,
        dst: DevicePtr,
        value: u8,
        len: u64,
    ) -> DeviceResult<()> {
        let request = Request::Memset {
            stream: stream.id,
            dst,
            value: value as u32,
            elem_bytes: 1,
            count: len,
        };
        self.queue(stream, request, &[])
    }

    fn launch(&self, stream: &mut RemoteStream, kernel: &Kernel) -> DeviceResult<()> {
        let request = Request::Launch {
            stream: stream.id,
            kernel: *kernel,
        };
        self.queue(stream, request, &[])
    }

    fn sm_partitions(&self) -> bool {
        self.shared.sm_partitions
    }

    fn limit_sms(&self, stream: &mut RemoteStream, sms: Option<u32>) -> DeviceResult<()> {
        let request = Request::LimitSms {
            stream: stream.id,
            sms,
        };
        self.queue(stream, request, &[])
    }

    fn launch_module(
        &self,
        stream: &mut RemoteStream,
        function: &RemoteFunction,
        launch: &ModuleLaunch,
        attributes: &LaunchAttributes,
        params: &[u8],
    ) -> DeviceResult<()> {
        self.live(function.generation)?;
        let request = Request::LaunchModule {
            stream: stream.id,
            function: function.id,
            launch: *launch,
            attributes: *attributes,
        };
        self.queue(stream, request, params)
    }

    fn sync_stream(&self, stream: &mut RemoteStream) -> DeviceResult<()> {
        let request = Request::SyncStream { stream: stream.id };
        let synced = self.on_stream(stream, request);
        // Work posted earlier that failed reports here, after the rest has finished.
        match self.take_deferred(stream) {
            Some(e) => Err(e),
            None => synced,
        }
    }

    fn end_batch(&self, stream: &mut RemoteStream, idle: bool) {
        if self.live(stream.generation).is_err() || !(stream.dirty || stream.measuring) {
            return;
        }
        // A busy client's measured span closes only once it is old enough (the device's own
        // rule): asking the worker more often than that would only cost a round trip.
        if !idle && stream.ended.is_some_and(|at| at.elapsed() < SPAN_CHECK) {
            return;
        }
        let request = Request::EndBatch {
            stream: stream.id,
            idle,
        };
        if self.on_stream(stream, request).is_ok() {
            stream.ended = Some(Instant::now());
            if idle {
                stream.dirty = false;
            }
        }
    }

    fn take_busy_ns(&self, stream: &mut RemoteStream) -> u64 {
        std::mem::take(&mut stream.busy_ns)
    }

    fn measuring(&self, stream: &RemoteStream) -> bool {
        stream.measuring
    }

    fn create_event(&self) -> DeviceResult<RemoteEvent> {
        let generation = self.active().generation;
        let id = self.value(
            Request::CreateEvent {
                marker: false,
                flags: None,
            },
            &[],
        )?;
        Ok(self.event(generation, id))
    }

    fn create_marker(&self) -> DeviceResult<RemoteEvent> {
        let generation = self.active().generation;
        let id = self.value(
            Request::CreateEvent {
                marker: true,
                flags: None,
            },
            &[],
        )?;
        Ok(self.event(generation, id))
    }

    fn create_event_flags(&self, flags: u32) -> DeviceResult<RemoteEvent> {
        let generation = self.active().generation;
        let id = self.value(
            Request::CreateEvent {
                marker: false,
                flags: Some(flags),
            },
            &[],
        )?;
        Ok(self.event(generation, id))
    }

    fn record_event(&self, event: &mut RemoteEvent, stream: &mut RemoteStream) -> DeviceResult<()> {
        self.live(event.generation)?;
        let request = Request::RecordEvent {
            event: event.id,
            stream: stream.id,
            start: false,
        };
        self.queue(stream, request, &[])
    }

    fn record_start(&self, event: &mut RemoteEvent, stream: &mut RemoteStream) -> DeviceResult<()> {
        self.live(event.generation)?;
        let request = Request::RecordEvent {
            event: event.id,
            stream: stream.id,
            start: true,
        };
        self.queue(stream, request, &[])
    }

    fn event_done(&self, event: &RemoteEvent) -> DeviceResult<bool> {
        self.live(event.generation)?;
        self.flag(Request::EventDone { event: event.id })
            .map(|(f, _)| f)
    }

    fn sync_event(&self, event: &RemoteEvent) -> DeviceResult<()> {
        self.live(event.generation)?;
        self.done(Request::SyncEvent { event: event.id }, &[])
    }

    fn elapsed_ns(&self, start: &RemoteEvent, end: &RemoteEvent) -> DeviceResult<u64> {
        self.live(start.generation)?;
        self.live(end.generation)?;
        self.value(
            Request::ElapsedNs {
                start: start.id,
                end: end.id,
            },
            &[],
        )
    }

    fn stream_busy(&self, stream: &RemoteStream) -> bool {
        if self.live(stream.generation).is_err() {
            return false;
        }
        // An error counts as busy, as on the device itself: the work's fate is unknown.
        self.flag(Request::StreamBusy { stream: stream.id })
            .map(|(f, _)| f)
            .unwrap_or(true)
    }

    fn interrupt(&self) {
        self.shared.interrupted.store(true, Ordering::Release);
    }

    fn fault(&self) -> Option<String> {
        let active = self.active();
        if let Some(why) = active.process.gone() {
            return Some(self.worker_lost(&why).to_string());
        }
        match self.call_within(Request::Fault, &[], Some(FAULT_CHECK_TIMEOUT)) {
            Ok(Answer {
                reply: Reply::Fault(f),
                ..
            }) => f,
            Ok(_) | Err(DeviceError::Cancelled) => None,
            Err(e) => Some(e.to_string()),
        }
    }

    fn reset(&self) -> DeviceResult<()> {
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

    fn resets_in_place(&self) -> bool {
        true
    }

    fn reset_deadline(&self) -> Duration {
        SPARE_WAIT + READY_TIMEOUT
    }

    fn load_module(&self, format: ModuleFormat, image: &[u8]) -> DeviceResult<RemoteModule> {
        let generation = self.active().generation;
        let id = self.value(Request::LoadModule { format }, image)?;
        Ok(RemoteModule {
            generation,
            id,
            device: RemoteDevice {
                shared: self.shared.clone(),
            },
        })
    }

    fn get_function(&self, module: &RemoteModule, name: &str) -> DeviceResult<RemoteFunction> {
        self.live(module.generation)?;
        let id = self.value(Request::GetFunction { module: module.id }, name.as_bytes())?;
        Ok(RemoteFunction {
            generation: module.generation,
            id,
            device: RemoteDevice {
                shared: self.shared.clone(),
            },
        })
    }

    fn stream_wait_event(
        &self,
        stream: &mut RemoteStream,
        event: &RemoteEvent,
    ) -> DeviceResult<()> {
        self.live(event.generation)?;
        let request = Request::StreamWaitEvent {
            stream: stream.id,
            event: event.id,
        };
        self.queue(stream, request, &[])
    }

    fn stream_done(&self, stream: &RemoteStream) -> DeviceResult<bool> {
        self.live(stream.generation)?;
        if let Some(e) = self.take_deferred(stream) {
            return Err(e);
        }
        // Device time learnt here waits for the next end of batch to be told (the stream is
        // not ours to change).
        self.flag(Request::StreamDone { stream: stream.id })
            .map(|(f, _)| f)
    }

    fn memset_wide(
        &self,
        stream: &mut RemoteStream,
        dst: DevicePtr,
        value: u32,
        elem_bytes: u8,
        count: u64,
    ) -> DeviceResult<()> {
        let request = Request::Memset {
            stream: stream.id,
            dst,
            value,
            elem_bytes,
            count,
        };
        self.queue(stream, request, &[])
    }

    fn copy_htod_staged(
        &self,
        stream: &mut RemoteStream,
        src: ArenaSlice<'_>,
        dst: DevicePtr,
    ) -> DeviceResult<()> {
        let request = Request::CopyHtoD {
            stream: stream.id,
            src: self.span(src),
            dst,
            staged: true,
        };
        stream.dirty = true;
        self.on_stream(stream, request)
    }

    fn copy_dtoh_staged(
        &self,
        stream: &mut RemoteStream,
        src: DevicePtr,
        dst: ArenaSlice<'_>,
    ) -> DeviceResult<()> {
        let request = Request::CopyDtoH {
            stream: stream.id,
            src,
            dst: self.span(dst),
            staged: true,
        };
        stream.dirty = true;
        self.on_stream(stream, request)
    }

    fn register_host(&self, region: ArenaSlice<'_>) -> DeviceResult<u64> {
        self.value(
            Request::RegisterHost {
                span: self.span(region),
            },
            &[],
        )
    }

    fn unregister_host(&self, region: ArenaSlice<'_>) {
        let _ = self.done(
            Request::UnregisterHost {
                span: self.span(region),
            },
            &[],
        );
    }

    fn memory_info(&self) -> DeviceResult<(u64, u64)> {
        match self.call(Request::MemoryInfo, &[])?.reply {
            Reply::Pair(free, total) => Ok((free, total)),
            other => Err(unexpected(other)),
        }
    }

    fn function_shape(&self, function: &RemoteFunction) -> DeviceResult<FunctionShape> {
        self.live(function.generation)?;
        match self
            .call(
                Request::FunctionShape {
                    function: function.id,
                },
                &[],
            )?
            .reply
        {
            Reply::Shape(s) => Ok(s),
            other => Err(unexpected(other)),
        }
    }

    fn set_function_attribute(
        &self,
        function: &RemoteFunction,
        attribute: u32,
        value: i32,
    ) -> DeviceResult<()> {
        self.live(function.generation)?;
        self.done(
            Request::SetFunctionAttribute {
                function: function.id,
                attribute,
                value,
            },
            &[],
        )
    }

    fn occupancy(&self, function: &RemoteFunction, question: &Occupancy) -> DeviceResult<u64> {
        self.live(function.generation)?;
        self.value(
            Request::Occupancy {
                function: function.id,
                query: question.query,
                block_size: question.block_size,
                dynamic_smem: question.dynamic_smem,
                flags: question.flags,
                cluster: question.cluster,
            },
            &[],
        )
    }

    fn module_global(&self, module: &RemoteModule, name: &str) -> DeviceResult<(u64, u64)> {
        self.live(module.generation)?;
        match self
            .call(Request::ModuleGlobal { module: module.id }, name.as_bytes())?
            .reply
        {
            Reply::Pair(a, b) => Ok((a, b)),
            other => Err(unexpected(other)),
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
