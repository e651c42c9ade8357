//! The process-wide driver: connected at `cuInit`, kept for the process's life, gone in a
//! forked child (which, as with NVIDIA's driver, cannot use CUDA: `fork.rs`).

use std::ptr;
use std::sync::atomic::{AtomicI32, AtomicPtr, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use gpushare_conn::env::{CLASS_ENV, GPU_ENV, GPU_UUIDS_ENV, NAME_ENV, WEIGHT_ENV};
use gpushare_conn::{Error, Notices, Session, SessionOptions, process_name};
use gpushare_protocol::control::Role;
use gpushare_protocol::{Command, PriorityClass};

use crate::log::say;
use crate::status::{Cu, from_error};
use crate::transport::Transport;
use crate::types::{CUdevice, CUresult, result};

/// Submission entries asked for: launches are sent without waiting, so many are in flight.
const SQ_ENTRIES: u32 = 4096;
/// The arena: launch parameters and staged copies in flight.
const ARENA_BYTES: u64 = 64 << 20;
/// How long a waiting call spins before it sleeps: long enough to see a short kernel finish
/// after gpushared's data thread wakes up, so that a request after idle time costs one wake-up,
/// not two. CUDA's own synchronization spins too.
const SPIN: Duration = Duration::from_micros(250);

/// Everything the driver knows of one device's session. A process has one per device it has
/// run work on (`crate::route`); the first, opened at `cuInit`, is its bound device's.
pub struct Driver {
    /// The ordinal of the device this session runs work on.
    pub device: CUdevice,
    pub transport: Transport,
    /// The devices the program sees (the process's, shared by every device's driver).
    pub gpus: &'static crate::gpus::Gpus,
    pub memory_quota: Option<u64>,
    /// The virtual memory API's granule (0: not offered).
    pub memory_granularity: u64,
    pub memory: crate::memory::Memory,
    pub pools: crate::memory::pools::Pools,
    pub streams: crate::stream::Streams,
    pub events: crate::event::Events,
    /// The process's modules and kernels, shared by every device's driver.
    pub modules: &'static crate::module::Modules,
    /// The process's contexts, shared by every device's driver.
    pub contexts: &'static crate::context::Contexts,
    pub graphs: crate::graph::Graphs,
    pub occupancy: crate::occupancy::Cache,
    pub tensor_maps: crate::tensor_map::Cache,
    pub host_points: crate::host_point::HostPoints,
    /// A failure every later call reports (the device was reset under this process).
    sticky: AtomicI32,
}

/// The bound device's driver, made at `cuInit`; the others are `crate::route`'s.
static DRIVER: AtomicPtr<Driver> = AtomicPtr::new(ptr::null_mut());
/// What a failed `cuInit` said: later calls say it again (CUDA does the same).
static INIT_FAILED: AtomicI32 = AtomicI32::new(0);
static INIT: Mutex<()> = Mutex::new(());

/// The driver of the calling thread's current device (its current context's), once `cuInit`
/// has succeeded in this process; another device's is opened at its first call.
#[inline]
pub fn get() -> Cu<&'static Driver> {
    crate::route::current(first()?)
}

/// The bound device's driver, made at `cuInit`.
#[inline]
pub fn first() -> Cu<&'static Driver> {
    let p = DRIVER.load(Ordering::Acquire);
    if p.is_null() {
        return Err(match INIT_FAILED.load(Ordering::Relaxed) {
            0 => result::NOT_INITIALIZED,
            code => code,
        });
    }
    // SAFETY: a non-null pointer is a leaked `Box<Driver>`, never freed (a forked child only
    // forgets it).
    Ok(unsafe { &*p })
}

/// The driver for work on the current device: the error every call must report if the
/// device was lost under it.
#[inline]
pub fn live() -> Cu<&'static Driver> {
    unbroken()
}

/// The current device's driver, and the error every call must report if the device was lost
/// under it.
#[inline]
pub fn unbroken() -> Cu<&'static Driver> {
    get()?.intact()
}

/// Connects to gpushared (once per process image).
pub fn init() -> Cu<()> {
    let _serial = INIT.lock().unwrap_or_else(|p| p.into_inner());
    if !DRIVER.load(Ordering::Acquire).is_null() {
        return Ok(());
    }
    match INIT_FAILED.load(Ordering::Relaxed) {
        0 => {}
        code => return Err(code),
    }
    match connect() {
        Ok(driver) => {
            DRIVER.store(Box::into_raw(Box::new(driver)), Ordering::Release);
            crate::fork::install();
            Ok(())
        }
        Err(code) => {
            INIT_FAILED.store(code, Ordering::Relaxed);
            Err(code)
        }
    }
}

fn options() -> SessionOptions {
    let mut opts = SessionOptions::new(Role::Consolidated);
    if let Some(name) = std::env::var(NAME_ENV).ok().filter(|n| !n.is_empty()) {
        opts.name = name;
    } else {
        opts.name = process_name();
    }
    opts.class = std::env::var(CLASS_ENV)
        .ok()
        .and_then(|c| c.parse::<PriorityClass>().ok());
    opts.gpu = asked_gpu(&opts.socket);
    opts.sq_entries = SQ_ENTRIES;
    opts.arena_size = ARENA_BYTES;
    opts.spin = SPIN;
    opts
}

/// The GPU to ask gpushared for: where `gpushare run` placed the program (`GPUSHARE_GPU`),
/// unless the program named another in `CUDA_VISIBLE_DEVICES` since (it no longer holds the
/// UUID `gpushare run` put there, `GPUSHARE_GPU_UUIDS`): then its first entry, as CUDA takes
/// it, by index or UUID. Without `GPUSHARE_GPU`, `CUDA_VISIBLE_DEVICES` naming one index.
fn asked_gpu(socket: &std::path::Path) -> Option<u32> {
    let placed = std::env::var(GPU_ENV)
        .ok()
        .and_then(|g| g.trim().parse().ok());
    match own_visible_devices() {
        Some(v) => {
            let first = v.split(',').map(str::trim).next().unwrap_or_default();
            match first.parse() {
                Ok(index) => Some(index),
                Err(_) => gpu_by_uuid(socket, first).or(placed),
            }
        }
        None => placed.or_else(visible_device),
    }
}

/// `CUDA_VISIBLE_DEVICES` where the program named GPUs there itself since `gpushare run`
/// started it (it no longer holds the UUIDs `gpushare run` put there, `GPUSHARE_GPU_UUIDS`).
fn own_visible_devices() -> Option<String> {
    let visible = std::env::var("CUDA_VISIBLE_DEVICES").ok()?;
    let set_by_run = std::env::var(GPU_UUIDS_ENV).ok()?;
    (visible.trim() != set_by_run.trim() && !visible.trim().is_empty()).then_some(visible)
}

/// gpushared's index of the GPU whose UUID (or a unique start of it) is `text`; `None`, said
/// once, where there is none or gpushared cannot say.
fn gpu_by_uuid(socket: &std::path::Path, text: &str) -> Option<u32> {
    let found = gpushare_conn::ControlSocket::monitor(socket)
        .and_then(|(monitor, _)| monitor.status(1))
        .map_err(|e| e.to_string())
        .and_then(|report| {
            gpushare_protocol::control::device_by_uuid(&report.devices, text).map(|d| d.index)
        });
    match found {
        Ok(index) => Some(index),
        Err(why) => {
            say(&format!(
                "CUDA_VISIBLE_DEVICES={text}: {why}; this program runs where gpushare placed it"
            ));
            None
        }
    }
}

/// `CUDA_VISIBLE_DEVICES` naming one device by index: the GPU to ask the broker for.
fn visible_device() -> Option<u32> {
    let v = std::env::var("CUDA_VISIBLE_DEVICES").ok()?;
    let mut ids = v.split(',').map(str::trim).filter(|s| !s.is_empty());
    let first = ids.next()?.parse().ok()?;
    ids.next().is_none().then_some(first)
}

fn connect() -> Cu<Driver> {
    // As CUDA: a CUDA_VISIBLE_DEVICES that hides every GPU leaves no device, without a word.
    if std::env::var("CUDA_VISIBLE_DEVICES").is_ok_and(|v| gpushare_conn::env::hides_every_gpu(&v))
    {
        return Err(result::NO_DEVICE);
    }
    let mut opts = options();
    let several = several_gpus(&mut opts);
    let session = open(&opts)?;
    let device = session.welcome().device.clone();
    let gpus = match several {
        Some(mut gpus) => {
            // The session's own view of its GPU, exactly.
            if let Some(slot) = gpus.visible.get_mut(gpus.bound) {
                *slot = device;
            }
            gpus
        }
        None => crate::gpus::Gpus::one(device),
    };
    let gpus: &'static crate::gpus::Gpus = Box::leak(Box::new(gpus));
    let contexts = Box::leak(Box::new(crate::context::Contexts::for_devices(
        gpus.visible.len(),
        gpus.bound,
    )));
    let modules = Box::leak(Box::new(crate::module::Modules::for_devices(
        gpus.visible.len(),
    )));
    crate::route::prepare(gpus.visible.len());
    Ok(Driver::new(
        gpus.bound as CUdevice,
        session,
        Shared {
            gpus,
            contexts,
            modules,
        },
    ))
}

/// Opens the session of another device the process sees (`crate::route`, at its first work).
pub(crate) fn connect_device(first: &Driver, dev: CUdevice) -> Cu<Driver> {
    let info = first.gpus.get(dev).ok_or(result::INVALID_DEVICE)?;
    let mut opts = options();
    opts.gpu = Some(info.index);
    let session = open(&opts)?;
    let shared = Shared {
        gpus: first.gpus,
        contexts: first.contexts,
        modules: first.modules,
    };
    Ok(Driver::new(dev, session, shared))
}

/// A session with gpushared as `opts` ask; a refusal is said once per call.
fn open(opts: &SessionOptions) -> Cu<Session> {
    let session = Session::open(opts, Arc::new(Notices::new(false))).map_err(|e| {
        let code = match &e {
            Error::Connect { .. } | Error::Rejected(_) => result::NO_DEVICE,
            other => from_error(other),
        };
        // Said once: a failed cuInit is remembered, and later calls fail without a word.
        let fix = match &e {
            Error::Connect { .. } => {
                ". gpushare's CUDA driver runs all GPU work in gpushared; to use the GPU directly while gpushared is not running, start the program with `gpushare run --fallback direct`"
            }
            _ => "",
        };
        say(&format!("CUDA has no device for this program: {e}{fix}"));
        code
    })?;
    let welcome = session.welcome();
    if let Some(asked) = opts.class
        && asked != welcome.class
    {
        say(&format!(
            "asked to run as {asked}, but the policy grants this user {}: running as {}",
            welcome.class, welcome.class
        ));
    }
    ask_weight(&session, welcome.weight);
    Ok(session)
}

/// What every device's driver of a process shares.
struct Shared {
    gpus: &'static crate::gpus::Gpus,
    contexts: &'static crate::context::Contexts,
    modules: &'static crate::module::Modules,
}

impl Driver {
    fn new(device: CUdevice, session: Session, shared: Shared) -> Driver {
        let Shared {
            gpus,
            contexts,
            modules,
        } = shared;
        let welcome = session.welcome();
        let (memory_quota, memory_granularity) = (welcome.memory_quota, welcome.memory_granularity);
        Driver {
            device,
            transport: Transport::new(session),
            memory_quota,
            memory_granularity,
            memory: crate::memory::Memory::default(),
            pools: crate::memory::pools::Pools::default(),
            streams: crate::stream::Streams::default(),
            events: crate::event::Events::default(),
            modules,
            contexts,
            graphs: crate::graph::Graphs::default(),
            host_points: crate::host_point::HostPoints::default(),
            occupancy: crate::occupancy::Cache::default(),
            tensor_maps: crate::tensor_map::Cache::default(),
            gpus,
            sticky: AtomicI32::new(0),
        }
    }

    /// This driver, or the error every call must report if its device was lost under it.
    #[inline]
    pub fn intact(&'static self) -> Cu<&'static Driver> {
        match self.sticky.load(Ordering::Relaxed) {
            0 => Ok(self),
            code => Err(code),
        }
    }

    /// This device's primary context.
    pub fn primary(&self) -> crate::types::CUcontext {
        self.contexts
            .primary_of(self.device)
            .map_or(std::ptr::null_mut(), |c| c.handle())
    }

    /// What this device is, as gpushared told it.
    pub fn device_info(&self) -> &gpushare_protocol::control::DeviceInfo {
        self.gpus
            .get(self.device)
            .unwrap_or_else(|| self.gpus.bound_device())
    }
}

/// Under `gpushare run --gpus N`: the devices the program sees, and the session asked for on
/// the one this process runs on. `None` (one device, as asked otherwise) when the list
/// cannot be had, said once.
fn several_gpus(opts: &mut SessionOptions) -> Option<crate::gpus::Gpus> {
    use crate::gpus;
    // A program that named its own GPU in `CUDA_VISIBLE_DEVICES` since (as scripts that pick
    // their rank's GPU do) sees that one (`asked_gpu`).
    if own_visible_devices().is_some() {
        return None;
    }
    let list = match gpus::listed()? {
        Ok(list) => list,
        Err(why) => {
            say(&format!("{why}: this program sees one GPU"));
            return None;
        }
    };
    let (bound, why) = gpus::choose(list.len(), gpus::local_rank());
    let seen = gpus::resolve(&opts.socket, &list, bound)
        .inspect_err(|why| say(&format!("{why}: this program sees one GPU")))
        .ok()?;
    opts.gpu = list.get(bound).copied();
    if std::env::var(gpushare_conn::env::CUDA_TRACE_ENV).is_ok() {
        say(&format!(
            "sees {} GPUs; runs its work on device {bound} (gpushared's GPU {}): {why}",
            list.len(),
            opts.gpu.unwrap_or_default()
        ));
    }
    Some(seen)
}

/// `GPUSHARE_WEIGHT` (`gpushare run --weight`): a fair-share weight below the granted one.
fn ask_weight(session: &Session, granted: u32) {
    let Ok(text) = std::env::var(WEIGHT_ENV) else {
        return;
    };
    let weight = match text.trim().parse::<u32>() {
        Ok(w) if w > 0 => w,
        _ => {
            say(&format!(
                "{WEIGHT_ENV}={text:?} is not a weight (a whole number from 1): running with weight {granted}"
            ));
            return;
        }
    };
    if weight == granted {
        return;
    }
    if let Err(e) = session.call(Command::GovernedWeight { weight }, "ask for a weight") {
        say(&format!(
            "asked for weight {weight}, but {e}: running with weight {granted}"
        ));
    }
}

impl Driver {
    /// From now on every call fails with `code` (the device's state is gone).
    pub fn fail_for_good(&self, code: CUresult, why: &str) {
        if self
            .sticky
            .compare_exchange(0, code, Ordering::Relaxed, Ordering::Relaxed)
            .is_ok()
        {
            say(why);
        }
    }

    /// Sends a synchronizing command (a stream's, an event's, the client's) and waits for it;
    /// reports the first error of the work before it, and notes a lost device. One with
    /// nothing to wait for is not sent.
    pub fn wait_for(&self, sync: Command) -> Cu<()> {
        if self.nothing_to_wait_for(&sync) {
            return self.deferred();
        }
        // A sync that fails on its own leaves the work's error for the next call.
        let outcome = self.transport.call(sync).and_then(|_| self.deferred());
        if let Err(code) = outcome {
            self.notice_loss(code);
        }
        outcome
    }

    /// Whether `sync` (a stream's or the client's synchronization, a stream's query) has
    /// nothing to wait for: a wait that covered it succeeded and nothing was sent since
    /// ([`gpushare_conn::Session::quiet`]). It is then answered here.
    pub(crate) fn nothing_to_wait_for(&self, sync: &Command) -> bool {
        let stream = match *sync {
            Command::StreamSync { stream } | Command::StreamQuery { stream } => Some(stream),
            Command::ClientSync => None,
            _ => return false,
        };
        self.transport.session.quiet(stream)
    }

    /// Reports the first error of work sent without waiting, and notes a lost device.
    pub fn deferred(&self) -> Cu<()> {
        self.transport.deferred_error().inspect_err(|&code| {
            self.notice_loss(code);
        })
    }

    /// A broker answer that means this process's device state is gone makes every later
    /// call fail too.
    pub fn notice_loss(&self, code: CUresult) {
        let session = &self.transport.session;
        if code == result::LAUNCH_FAILED && session.handles_lost() > 0 {
            if self.sticky.load(Ordering::Relaxed) != 0 {
                return;
            }
            // gpushared stops the program whose work faulted: its eviction may still be on
            // the way, behind the reset.
            for _ in 0..3 {
                if session.is_dead() {
                    break;
                }
                session.read_news(nix::poll::PollTimeout::from(20u8));
            }
            let why = match session.check_alive() {
                Err(e @ Error::Evicted(_)) => format!(
                    "{e}: this program's GPU memory, modules and streams on this GPU are gone"
                ),
                _ => "another client's fault reset the GPU: this program's GPU memory, modules and streams are gone; restart it".into(),
            };
            self.fail_for_good(code, &why);
        } else if code == result::DEVICE_UNAVAILABLE {
            let why = match self.transport.session.check_alive() {
                Err(e) => e.to_string(),
                Ok(()) => "the connection to gpushared is gone".into(),
            };
            self.fail_for_good(
                code,
                &format!("{why}: this program's GPU work cannot go on"),
            );
        }
    }
}

/// In a forked child: the parent's session is the parent's. Its socket is closed here (so
/// that the session ends when the parent does, however long the child lives), the driver is
/// leaked, never used, and every call says `CUDA_ERROR_NOT_INITIALIZED`, `cuInit` too.
pub(crate) fn forget_in_child() {
    let p = DRIVER.swap(ptr::null_mut(), Ordering::AcqRel);
    if p.is_null() {
        return;
    }
    // SAFETY: a leaked `Box<Driver>`, never freed.
    let first: &'static Driver = unsafe { &*p };
    for d in crate::route::opened(first) {
        // SAFETY: the child's copy of the socket; the leaked session never uses it again.
        unsafe { libc::close(d.transport.session.control_fd()) };
    }
    INIT_FAILED.store(result::NOT_INITIALIZED, Ordering::Relaxed);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn visible_devices_pick_a_gpu_only_when_they_name_one_index() {
        let cases = [
            ("1", Some(1)),
            (" 2 ", Some(2)),
            ("0,1", None),
            ("GPU-abc", None),
            ("", None),
        ];
        for (value, want) in cases {
            // SAFETY: tests in this module do not read the environment concurrently.
            unsafe { std::env::set_var("CUDA_VISIBLE_DEVICES", value) };
            assert_eq!(visible_device(), want, "{value:?}");
        }
        // SAFETY: as above.
        unsafe { std::env::remove_var("CUDA_VISIBLE_DEVICES") };
    }
}
