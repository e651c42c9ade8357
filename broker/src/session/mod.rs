//! One client's session: its handles, its accounting, and the data-plane thread that drains
//! its submission ring.
//!
//! Everything a client names (pointers, streams, events, functions, arena ranges) is looked
//! up in this session's own tables; nothing in the shared region is trusted. When the session
//! ends — goodbye, disconnect, kill, eviction or broker shutdown — [`SessionState::reclaim`]
//! releases everything it held.
//!
//! - `info`: what the rest of the broker sees of a session ([`SessionInfo`], [`Counters`]).
//! - `modules`: the modules and functions it loaded ([`ModuleTable`]).
//! - `allocations`: its live device memory, and the range check every pointer meets.
//! - `serve`: the ring loop: drain, complete, charge device time, sleep.
//! - `execute`: one command, decoded, checked and run; `launch`: kernel launches; `graphs`:
//!   CUDA graphs, made by the control task and launched as one unit.
//! - `turns`: a kernel waiting for the scheduler's turn, and granted kernels reported done,
//!   each with the device time it took.
//! - `reset`: what a device reset took, and what the client is told of it.
//! - `reclaim`: releasing everything when the session ends.
//! - `governed`: admission for governed clients (their own CUDA context).

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use gpushare_protocol::ring::BrokerRings;
use gpushare_protocol::{DevicePtr, EventId, StreamId};

use crate::device::{Call, Device, DeviceError, DeviceResult, Event, Stream};
use crate::gpu::health::{DeviceHealth, Verdict};
use crate::gpu::scheduler::GpuScheduler;
use crate::shm::SharedRegion;
use gpushare_protocol::wake::Wakeup;

mod allocations;
mod execute;
mod governed;
pub mod graphs;
pub mod hosts;
mod info;
mod ipc;
mod launch;
mod legacy;
mod memory;
mod module_table;
mod ranges;
mod reclaim;
mod replay;
mod reset;
mod rhythm;
mod serve;
mod turns;
pub mod vmm;

pub use info::{Counters, Peer, SessionInfo};
pub use module_table::{MAX_FUNCTIONS, MAX_MODULES, ModuleTable};

use allocations::Allocations;
use reset::Lost;

pub use gpushare_protocol::{MAX_EVENTS, MAX_STREAMS};

/// A map keyed by ids the client picks (its streams, its events), looked up on every launch or
/// event record: a fast hash, seeded per map so that a client cannot choose keys that collide
/// (SipHash, std's, was a visible part of a launch's time in the data thread).
type ClientKeyed<K, V> = HashMap<K, V, foldhash::fast::RandomState>;

/// Most live allocations one client may hold at once.
pub const MAX_ALLOCATIONS: usize = 1 << 20;

/// One of the client's streams, and what the session tracks of the work on it.
struct StreamSlot {
    stream: Stream,
    /// Got work since the last [`SessionState::account`].
    touched: bool,
    /// Got work since it was last synchronized (for telling whether the session has work in
    /// flight without asking the driver, and which work a reset took unseen).
    unsynced: bool,
    /// Operations submitted so far: an event recorded after the last one covers them all.
    submitted: u64,
    /// For consolidated clients: the stream keeps CUDA's legacy order with stream 0 (it was
    /// made without CU_STREAM_NON_BLOCKING).
    blocking: bool,
    /// Got work stream 0 has not been ordered after yet.
    unordered: bool,
    /// Stream 0's work up to which this stream is ordered after.
    legacy_seen: u64,
    /// Its granted kernels waiting for a progress mark (`turns`).
    pending: u32,
    /// The progress mark of its unfinished work last told to the fault watchdog.
    published: Option<(u32, u32)>,
}

impl StreamSlot {
    fn new(stream: Stream) -> StreamSlot {
        StreamSlot {
            stream,
            touched: false,
            unsynced: false,
            submitted: 0,
            blocking: false,
            unordered: false,
            legacy_seen: 0,
            pending: 0,
            published: None,
        }
    }
}

/// The data thread's state for one client.
pub struct SessionState {
    device: Arc<Device>,
    info: Arc<SessionInfo>,
    region: Arc<SharedRegion>,
    rings: BrokerRings,
    complete_wake: Wakeup,
    modules: Arc<Mutex<ModuleTable>>,
    pacing: Pacing,
    /// Base pointer → size of every live allocation.
    allocations: Allocations,
    /// Physical memory, reservations and mappings of the virtual memory API.
    vmm: vmm::Vmm,
    /// Memory other sessions shared that this one opened (CUDA IPC): base → (size, token).
    ipc_opened: std::collections::BTreeMap<DevicePtr, (u64, u128)>,
    streams: ClientKeyed<StreamId, StreamSlot>,
    next_stream: StreamId,
    /// Shared with other sessions when opened through CUDA IPC.
    events: ClientKeyed<EventId, Arc<Event>>,
    /// Where each event was last recorded: the stream, and its operations submitted then.
    event_marks: ClientKeyed<EventId, (StreamId, u64)>,
    next_event: EventId,
    /// Service time of recent commands (ns), this thread's only: no lock on the hot path.
    latency: Option<hdrhistogram::Histogram<u64>>,
    latency_published: Instant,
    health: Arc<DeviceHealth>,
    /// The device epoch this session's handles belong to.
    epoch: u64,
    /// The outcome of a reset this session parked for while busy elsewhere.
    verdict: Option<Verdict>,
    /// How the session ends, decided in the middle of a command (a reset that could not
    /// set it up again): the serve loop ends it next.
    ended: Option<SessionEnd>,
    /// Until when this session's work must run alone (suspect of a fault).
    probation_until: Option<Instant>,
    holding_turn: bool,
    /// The tag of the command being run, until it is answered ([`SessionState::answer_early`]).
    answering: Option<u64>,
    /// A batch ended whose accounting waits for the client to pause
    /// ([`SessionState::end_of_batch`]), and when the last accounting ran.
    unaccounted: bool,
    accounted_at: Instant,
    /// Handles lost in device resets: commands naming them fail with `DeviceReset`.
    lost: Lost,
    dispatch: Arc<GpuScheduler>,
    /// The job profile the client declared (kept when its deadline changes).
    declared_job: Option<crate::sched::JobProfile>,
    /// Granted kernels not yet seen finished, oldest first, with the events that time them.
    granted: std::collections::VecDeque<turns::Granted>,
    /// The generator that draws which granted kernels are timed (`turns`).
    timing_seed: u32,
    /// Granted kernels still to get a progress mark each, after a wait for the scheduler.
    mark_each: u32,
    /// Granted kernels waiting for a progress mark, and batches ended since they began to.
    pending_kernels: u32,
    batches_pending: u32,
    /// Granted kernels seen finished, on their way to the scheduler (kept for its room).
    seen_finished: Vec<crate::gpu::scheduler::Finished>,
    spare_events: Vec<Event>,
    /// Placed allocations (`AllocAt`) that were charged more than their size: the device
    /// memory they took (whole granules on a GPU).
    placed_charges: HashMap<DevicePtr, u64>,
    /// A governed client's admission state (memory reserved, its launch lease).
    governed: governed::Governed,
    /// A consolidated client's stream-order markers and stream 0's work count.
    legacy: legacy::Legacy,
    /// A launch's parameter block, copied out of the arena (kept to reuse its allocation).
    launch_params: Vec<u8>,
}

fn register_arena(device: &Device, region: &SharedRegion) -> DeviceResult<()> {
    let span = region.arena().span();
    device.call(Call::RegisterArena { span }, &[])?.done()
}

/// How a data thread waits for its client.
#[derive(Debug, Clone, Copy)]
pub struct Pacing {
    /// How long it spins on an empty submission ring before sleeping.
    pub spin: Duration,
    /// The longest that spin grows to for a client whose requests come closer together than
    /// this (`rhythm.rs`); at `spin` or below, it never grows.
    pub spin_ceiling: Duration,
    /// The same for a client of the high class, whose next request should find its data
    /// thread awake.
    pub high_spin: Duration,
    /// What the nice value of this client's threads is moved by while it is of the high
    /// class (`crate::thread_nice`).
    pub high_nice: i32,
    /// How long a client may leave its completion ring full (not reading) before it is
    /// evicted.
    pub stall_limit: Duration,
}

/// What a client is told when serving it panicked (a bug in gpushared).
fn internal_error(payload: &(dyn std::any::Any + Send)) -> String {
    let what = payload
        .downcast_ref::<&str>()
        .map(|s| (*s).to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "no message".into());
    format!(
        "gpushared hit an internal error while serving this client ({what}); the session was ended and everything it held released"
    )
}

/// What a session uses of its GPU besides the device: fault containment and the scheduler.
pub struct GpuServices {
    pub health: Arc<DeviceHealth>,
    pub dispatch: Arc<GpuScheduler>,
}

/// Why a session's data thread ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SessionEnd {
    Stopped,
    Evicted(String),
    ProtocolViolation(String),
}

impl SessionState {
    /// Sets up the session's rings and default stream.
    ///
    /// # Errors
    /// When the device cannot create the default stream or register the arena.
    pub fn new(
        device: Arc<Device>,
        info: Arc<SessionInfo>,
        region: Arc<SharedRegion>,
        complete_wake: Wakeup,
        modules: Arc<Mutex<ModuleTable>>,
        pacing: Pacing,
        gpu: GpuServices,
    ) -> Result<SessionState, DeviceError> {
        let GpuServices { health, dispatch } = gpu;
        // A suspect carried over a restart starts on probation.
        let probation_until = health.probation_for(info.id, info.uid);
        // SAFETY: one init per region; `region` is kept alive in `self` for as long as the
        // rings exist (fields drop after `reclaim` in `run`).
        let rings = unsafe { region.init_rings() };
        {
            use std::os::fd::AsFd;
            let memfd = region.memfd();
            device.share_memory(region.id(), memfd.as_fd(), region.size(), 0, 0)?;
        }
        // A consolidated client's arena stays pageable: what it stages there is read (or
        // written) before the command completes, and its page-locked memory comes apart.
        if !info.consolidated
            && let Err(e) = register_arena(&device, &region)
        {
            device.unshare_memory(region.id());
            return Err(e);
        }
        let default_stream = match device.create_stream(info.grant().class) {
            Ok(s) => s,
            Err(e) => {
                let span = region.arena().span();
                let _ = device.call(Call::UnregisterArena { span }, &[]);
                device.unshare_memory(region.id());
                return Err(e);
            }
        };
        let mut streams = ClientKeyed::default();
        streams.insert(0, StreamSlot::new(default_stream));
        info.counters.streams.store(1, Ordering::Relaxed);
        // Sessions pick the kernels they time apart from each other (never 0: xorshift).
        let timing_seed = (info.id as u32).wrapping_mul(0x9E37_79B9) | 1;
        Ok(SessionState {
            device,
            info,
            region,
            rings,
            complete_wake,
            modules,
            pacing,
            allocations: Allocations::default(),
            vmm: vmm::Vmm::default(),
            ipc_opened: std::collections::BTreeMap::new(),
            streams,
            next_stream: 1,
            events: ClientKeyed::default(),
            event_marks: ClientKeyed::default(),
            next_event: 1,
            latency: hdrhistogram::Histogram::new_with_bounds(1, 60_000_000_000, 2).ok(),
            latency_published: Instant::now(),
            epoch: health.epoch(),
            health,
            verdict: None,
            ended: None,
            probation_until,
            holding_turn: false,
            answering: None,
            unaccounted: false,
            accounted_at: Instant::now(),
            lost: Lost::default(),
            dispatch,
            declared_job: None,
            granted: std::collections::VecDeque::new(),
            timing_seed,
            mark_each: 0,
            pending_kernels: 0,
            batches_pending: 0,
            seen_finished: Vec::new(),
            spare_events: Vec::new(),
            placed_charges: HashMap::new(),
            governed: governed::Governed::default(),
            legacy: legacy::Legacy::default(),
            launch_params: Vec::new(),
        })
    }

    /// Makes the client's arena usable for direct DMA (not a consolidated client's: what it
    /// stages there is read or written before the command completes).
    fn register_arena(&self) -> DeviceResult<()> {
        if self.info.consolidated {
            return Ok(());
        }
        register_arena(&self.device, &self.region)
    }

    /// Registers the client with its GPU's scheduler, as granted now and in its GPU context,
    /// and lets the policy see whether it has work on the device.
    fn register_with_scheduler(&self) {
        let grant = self.info.grant();
        self.dispatch.add_client(
            self.info.id,
            grant.class,
            grant.weight,
            crate::sched::user_account(self.info.uid),
            self.info.governed,
            &self.info.trust_domain,
        );
        self.dispatch.watch(self.info.id, self.info.clone());
    }

    /// Makes the session known to its GPU's fault watch and scheduler: before the client's
    /// connection is answered, so that other clients' kernels granted after it see it (a
    /// best-effort kernel granted beside a high-priority client waits at the priority gate).
    /// [`SessionState::run`] undoes it at the end.
    pub fn register(&self) {
        self.health.register(self.info.clone());
        self.register_with_scheduler();
    }

    /// Drains the submission ring until asked to stop or the client breaks the protocol;
    /// then releases everything the client held (it was registered first:
    /// [`SessionState::register`]).
    pub fn run(mut self) -> SessionEnd {
        // A bug that panics while serving one client ends that client's session, told why,
        // and still releases what it held: otherwise its kernels would stay in flight in the
        // scheduler, holding every other client back, and its memory would never be freed.
        let end = match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.serve())) {
            Ok(end) => end,
            Err(payload) => {
                let reason = internal_error(payload.as_ref());
                tracing::error!(%reason, "ending a session after an internal error");
                self.info.evict(reason.clone());
                SessionEnd::Evicted(reason)
            }
        };
        self.dispatch.remove_client(self.info.id);
        self.forget_granted();
        self.reclaim();
        self.health.unregister(self.info.id);
        end
    }
}

#[cfg(test)]
mod panic_tests {
    use super::internal_error;

    #[test]
    fn a_panic_becomes_a_sentence_for_the_client() {
        let caught = std::panic::catch_unwind(|| panic!("index out of bounds")).unwrap_err();
        let said = internal_error(caught.as_ref());
        assert!(
            said.contains("internal error") && said.contains("index out of bounds"),
            "{said}"
        );
        let formatted = std::panic::catch_unwind(|| panic!("{} of {}", 3, 4)).unwrap_err();
        assert!(internal_error(formatted.as_ref()).contains("3 of 4"));
        let other = std::panic::catch_unwind(|| std::panic::panic_any(7u8)).unwrap_err();
        assert!(internal_error(other.as_ref()).contains("no message"));
    }
}
