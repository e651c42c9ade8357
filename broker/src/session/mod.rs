//! One client's session: its handles, its accounting, and the data-plane thread that drains
//! its submission ring.
//!
//! Everything a client names (pointers, streams, events, functions, arena ranges) is looked
//! up in this session's own tables; nothing in the shared region is trusted. When the session
//! ends — goodbye, disconnect, kill, eviction or broker shutdown — [`SessionState::reclaim`]
//! releases everything it held.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use gpushare_protocol::command::ModuleLaunch;
use gpushare_protocol::ring::{BrokerRings, CompletionEntry};
use gpushare_protocol::{Command, DevicePtr, ErrorCode, EventId, StreamId};

use crate::device::{Device, DeviceError};
use crate::dispatch::GpuDispatch;
use crate::fault::{DeviceHealth, Verdict};
use crate::shm::SharedRegion;
use crate::wake::Wakeup;

mod allocations;
mod governed;
mod info;
mod modules;
mod reset;
mod serve;
mod turns;

pub use info::{Counters, Peer, SessionInfo};
pub use modules::{MAX_FUNCTIONS, MAX_MODULES, ModuleTable};

use allocations::Allocations;
use reset::Lost;

/// Most streams one client may hold at once.
pub const MAX_STREAMS: usize = 1024;
/// Most events one client may hold at once.
pub const MAX_EVENTS: usize = 16384;
/// Most live allocations one client may hold at once.
pub const MAX_ALLOCATIONS: usize = 1 << 20;

struct StreamSlot<S> {
    stream: S,
    /// Got work since the last [`SessionState::account`].
    touched: bool,
    /// Got work since it was last synchronized (for telling whether the session has work in
    /// flight without asking the driver, and which work a reset took unseen).
    unsynced: bool,
    /// Operations submitted so far: an event recorded after the last one covers them all.
    submitted: u64,
}

/// The data thread's state for one client.
pub struct SessionState<D: Device> {
    device: Arc<D>,
    info: Arc<SessionInfo>,
    region: Arc<SharedRegion>,
    rings: BrokerRings,
    complete_wake: Wakeup,
    modules: Arc<Mutex<ModuleTable<D>>>,
    spin: Duration,
    /// Base pointer → size of every live allocation.
    allocations: Allocations,
    streams: HashMap<StreamId, StreamSlot<D::Stream>>,
    next_stream: StreamId,
    events: HashMap<EventId, D::Event>,
    /// Where each event was last recorded: the stream, and its operations submitted then.
    event_marks: HashMap<EventId, (StreamId, u64)>,
    next_event: EventId,
    /// Service time of recent commands (ns), this thread's only: no lock on the hot path.
    latency: Option<hdrhistogram::Histogram<u64>>,
    latency_published: Instant,
    health: Arc<DeviceHealth>,
    /// The device epoch this session's handles belong to.
    epoch: u64,
    /// The outcome of a reset this session parked for while busy elsewhere.
    verdict: Option<Verdict>,
    /// Until when this session's work must run alone (suspect of a fault).
    probation_until: Option<Instant>,
    holding_turn: bool,
    /// Handles lost in device resets: commands naming them fail with `DeviceReset`.
    lost: Lost,
    dispatch: Arc<GpuDispatch>,
    /// The job profile the client declared (kept when its deadline changes).
    declared_job: Option<crate::sched::JobProfile>,
    /// Granted kernels not yet seen finished, oldest first, with the event after each.
    granted: std::collections::VecDeque<(crate::sched::RequestId, D::Event)>,
    spare_events: Vec<D::Event>,
    /// Placed allocations (`AllocAt`) that were charged more than their size: the device
    /// memory they took (whole granules on a GPU).
    placed_charges: HashMap<DevicePtr, u64>,
    /// A governed client's admission state (memory reserved, its launch lease).
    governed: governed::Governed,
}

/// What a session uses of its GPU besides the device: fault containment and the scheduler.
pub struct GpuServices {
    pub health: Arc<DeviceHealth>,
    pub dispatch: Arc<GpuDispatch>,
}

/// Why a session's data thread ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SessionEnd {
    Stopped,
    Evicted(String),
    ProtocolViolation(String),
}

impl<D: Device> SessionState<D> {
    /// Sets up the session's rings and default stream.
    ///
    /// # Errors
    /// When the device cannot create the default stream or register the arena.
    pub fn new(
        device: Arc<D>,
        info: Arc<SessionInfo>,
        region: Arc<SharedRegion>,
        complete_wake: Wakeup,
        modules: Arc<Mutex<ModuleTable<D>>>,
        spin: Duration,
        gpu: GpuServices,
    ) -> Result<SessionState<D>, DeviceError> {
        let GpuServices { health, dispatch } = gpu;
        // A suspect carried over a restart starts on probation.
        let probation_until = health.probation_until(info.id);
        // SAFETY: one init per region; `region` is kept alive in `self` for as long as the
        // rings exist (fields drop after `reclaim` in `run`).
        let rings = unsafe { region.init_rings() };
        device.register_arena(region.arena())?;
        let default_stream = match device.create_stream(info.grant().class) {
            Ok(s) => s,
            Err(e) => {
                device.unregister_arena(region.arena());
                return Err(e);
            }
        };
        let mut streams = HashMap::new();
        streams.insert(
            0,
            StreamSlot {
                stream: default_stream,
                touched: false,
                unsynced: false,
                submitted: 0,
            },
        );
        info.counters.streams.store(1, Ordering::Relaxed);
        Ok(SessionState {
            device,
            info,
            region,
            rings,
            complete_wake,
            modules,
            spin,
            allocations: Allocations::default(),
            streams,
            next_stream: 1,
            events: HashMap::new(),
            event_marks: HashMap::new(),
            next_event: 1,
            latency: hdrhistogram::Histogram::new_with_bounds(1, 60_000_000_000, 2).ok(),
            latency_published: Instant::now(),
            epoch: health.epoch(),
            health,
            verdict: None,
            probation_until,
            holding_turn: false,
            lost: Lost::default(),
            dispatch,
            declared_job: None,
            granted: std::collections::VecDeque::new(),
            spare_events: Vec::new(),
            placed_charges: HashMap::new(),
            governed: governed::Governed::default(),
        })
    }

    /// Drains the submission ring until asked to stop or the client breaks the protocol;
    /// then releases everything the client held.
    pub fn run(mut self) -> SessionEnd {
        self.health.register(self.info.clone());
        let grant = self.info.grant();
        self.dispatch
            .add_client(self.info.id, grant.class, grant.weight, self.info.governed);
        let end = self.serve();
        self.dispatch.remove_client(self.info.id);
        self.granted.clear();
        self.reclaim();
        self.health.unregister(self.info.id);
        end
    }

    /// Decodes, validates and executes one entry; never panics on any input.
    fn process(&mut self, entry: &gpushare_protocol::ring::SubmissionEntry) -> CompletionEntry {
        self.info.counters.commands.fetch_add(1, Ordering::Relaxed);
        let outcome = Command::decode(entry)
            .and_then(|cmd| self.execute(cmd).or_else(|code| self.on_failure(cmd, code)));
        let (status, result, result2) = match outcome {
            Ok((r1, r2)) => (0, r1, r2),
            Err(code) => {
                self.info.counters.errors.fetch_add(1, Ordering::Relaxed);
                (code.as_u32(), 0, 0)
            }
        };
        CompletionEntry {
            user_tag: entry.user_tag,
            status,
            flags: 0,
            result,
            result2,
        }
    }

    /// Runs a stream-ordered device operation; its device time is charged at batch end.
    fn on_stream(
        &mut self,
        stream: StreamId,
        op: impl FnOnce(&D, &mut D::Stream) -> Result<(), DeviceError>,
    ) -> Result<(u64, u64), ErrorCode> {
        let device = self.device.clone();
        if !self.streams.contains_key(&stream) {
            return Err(ErrorCode::InvalidHandle);
        }
        if let Some(until) = self.probation_until
            && !self.holding_turn
        {
            if Instant::now() >= until {
                self.probation_until = None;
            } else if self.health.acquire_turn(self.info.id) {
                self.holding_turn = true;
            } else {
                return Err(ErrorCode::DeviceReset);
            }
        }
        let watch = &self.info.fault_watch;
        if watch.busy_since.load(Ordering::Relaxed) == 0 {
            watch
                .busy_since
                .store(self.health.now_ns(), Ordering::Release);
        }
        let slot = self
            .streams
            .get_mut(&stream)
            .ok_or(ErrorCode::InvalidHandle)?;
        slot.touched = true;
        slot.unsynced = true;
        slot.submitted += 1;
        op(&device, &mut slot.stream).map(|()| (0, 0)).map_err(|e| {
            tracing::debug!(error = %e, "device operation failed");
            e.code()
        })
    }

    fn execute(&mut self, cmd: Command) -> Result<(u64, u64), ErrorCode> {
        let counters = &self.info.counters;
        match cmd {
            Command::Nop => Ok((0, 0)),
            Command::Alloc { bytes } => self.alloc(bytes, None),
            Command::AllocAt { bytes, ptr } => self.alloc(bytes, Some(ptr)),
            Command::Free { ptr } => {
                let size = self
                    .allocations
                    .size_of(ptr)
                    .ok_or(ErrorCode::InvalidPointer)?;
                self.device.free(ptr).map_err(|e| e.code())?;
                self.allocations.remove(ptr);
                let charged = self.placed_charges.remove(&ptr).unwrap_or(size);
                counters.memory_used.fetch_sub(charged, Ordering::Relaxed);
                Ok((0, 0))
            }
            Command::CopyHtoD {
                stream,
                arena_offset,
                dst,
                len,
            } => {
                self.allocations.check_range(dst, len)?;
                let region = self.region.clone();
                let src = region
                    .arena_slice(arena_offset, len)
                    .ok_or(ErrorCode::ArenaOutOfBounds)?;
                let r = self.on_stream(stream, |d, s| d.copy_htod(s, src, dst))?;
                self.info
                    .counters
                    .bytes_htod
                    .fetch_add(len, Ordering::Relaxed);
                Ok(r)
            }
            Command::CopyDtoH {
                stream,
                src,
                arena_offset,
                len,
            } => {
                self.allocations.check_range(src, len)?;
                let region = self.region.clone();
                let dst = region
                    .arena_slice(arena_offset, len)
                    .ok_or(ErrorCode::ArenaOutOfBounds)?;
                let r = self.on_stream(stream, |d, s| d.copy_dtoh(s, src, dst))?;
                self.info
                    .counters
                    .bytes_dtoh
                    .fetch_add(len, Ordering::Relaxed);
                Ok(r)
            }
            Command::CopyDtoD {
                stream,
                src,
                dst,
                len,
            } => {
                self.allocations.check_range(src, len)?;
                self.allocations.check_range(dst, len)?;
                let r = self.on_stream(stream, |d, s| d.copy_dtod(s, src, dst, len))?;
                self.info
                    .counters
                    .bytes_dtod
                    .fetch_add(len, Ordering::Relaxed);
                Ok(r)
            }
            Command::Memset {
                stream,
                dst,
                value,
                len,
            } => {
                self.allocations.check_range(dst, len)?;
                self.on_stream(stream, |d, s| d.memset(s, dst, value, len))
            }
            Command::StreamCreate => {
                if self.streams.len() >= MAX_STREAMS {
                    return Err(ErrorCode::TooManyHandles);
                }
                let stream = self
                    .device
                    .create_stream(self.info.grant().class)
                    .map_err(|e| e.code())?;
                let id = self.next_stream;
                self.next_stream = self
                    .next_stream
                    .checked_add(1)
                    .ok_or(ErrorCode::TooManyHandles)?;
                self.streams.insert(
                    id,
                    StreamSlot {
                        stream,
                        touched: false,
                        unsynced: false,
                        submitted: 0,
                    },
                );
                counters
                    .streams
                    .store(self.streams.len() as u64, Ordering::Relaxed);
                Ok((id as u64, 0))
            }
            Command::StreamDestroy { stream } => {
                if stream == 0 {
                    return Err(ErrorCode::InvalidHandle);
                }
                let mut slot = self
                    .streams
                    .remove(&stream)
                    .ok_or(ErrorCode::InvalidHandle)?;
                let _ = self.device.sync_stream(&mut slot.stream);
                self.device.end_batch(&mut slot.stream, true);
                let spent = self.device.take_busy_ns(&mut slot.stream);
                counters.gpu_time_ns.fetch_add(spent, Ordering::Relaxed);
                self.device.destroy_stream(slot.stream);
                counters
                    .streams
                    .store(self.streams.len() as u64, Ordering::Relaxed);
                Ok((0, 0))
            }
            Command::StreamSync { stream } => {
                // The default stream is made again after a reset; any other stream the
                // reset took is a lost handle, and fails with `DeviceReset` below.
                if self.lost.take_unsynced(stream) && stream == 0 {
                    return Err(ErrorCode::DeviceReset);
                }
                let device = self.device.clone();
                let slot = self
                    .streams
                    .get_mut(&stream)
                    .ok_or(ErrorCode::InvalidHandle)?;
                slot.touched = true; // the batch end closes its measurement
                device.sync_stream(&mut slot.stream).map_err(|e| e.code())?;
                slot.unsynced = false;
                self.settle_in_flight();
                Ok((0, 0))
            }
            Command::EventCreate => {
                if self.events.len() >= MAX_EVENTS {
                    return Err(ErrorCode::TooManyHandles);
                }
                let event = self.device.create_event().map_err(|e| e.code())?;
                let id = self.next_event;
                self.next_event = self
                    .next_event
                    .checked_add(1)
                    .ok_or(ErrorCode::TooManyHandles)?;
                self.events.insert(id, event);
                Ok((id as u64, 0))
            }
            Command::EventRecord { stream, event } => {
                let device = self.device.clone();
                let e = self
                    .events
                    .get_mut(&event)
                    .ok_or(ErrorCode::InvalidHandle)?;
                let slot = self
                    .streams
                    .get_mut(&stream)
                    .ok_or(ErrorCode::InvalidHandle)?;
                device
                    .record_event(e, &mut slot.stream)
                    .map_err(|e| e.code())?;
                self.event_marks.insert(event, (stream, slot.submitted));
                Ok((0, 0))
            }
            Command::EventQuery { event } => {
                let e = self.events.get(&event).ok_or(ErrorCode::InvalidHandle)?;
                let done = self.device.event_done(e).map_err(|e| e.code())?;
                if done {
                    self.settle_marked(event);
                }
                Ok((done as u64, 0))
            }
            Command::EventSync { event } => {
                let e = self.events.get(&event).ok_or(ErrorCode::InvalidHandle)?;
                self.device.sync_event(e).map_err(|e| e.code())?;
                self.settle_marked(event);
                self.settle_in_flight();
                Ok((0, 0))
            }
            Command::EventElapsed { start, end } => {
                let s = self.events.get(&start).ok_or(ErrorCode::InvalidHandle)?;
                let e = self.events.get(&end).ok_or(ErrorCode::InvalidHandle)?;
                let ns = self.device.elapsed_ns(s, e).map_err(|e| e.code())?;
                Ok((ns, 0))
            }
            Command::EventDestroy { event } => {
                self.events.remove(&event).ok_or(ErrorCode::InvalidHandle)?;
                self.event_marks.remove(&event);
                Ok((0, 0))
            }
            Command::ClientSync => {
                if self.lost.take_any_unsynced() {
                    return Err(ErrorCode::DeviceReset);
                }
                let device = self.device.clone();
                let mut first_error = None;
                for slot in self.streams.values_mut() {
                    slot.touched = true;
                    match device.sync_stream(&mut slot.stream) {
                        Ok(()) => slot.unsynced = false,
                        Err(e) => {
                            first_error.get_or_insert(e.code());
                        }
                    }
                }
                if first_error.is_none() {
                    self.settle_in_flight();
                }
                first_error.map_or(Ok((0, 0)), Err)
            }
            Command::IterationEnd => {
                let (latency, missed) = self.dispatch.iteration_boundary(self.info.id);
                Ok((latency, missed as u64))
            }
            Command::DeclareJob {
                remaining_ns,
                persistent_bytes,
                ephemeral_bytes,
            } => {
                let job = (remaining_ns, persistent_bytes, ephemeral_bytes) != (0, 0, 0);
                let job = job.then_some(crate::sched::JobProfile {
                    remaining_ns_estimate: remaining_ns,
                    persistent_bytes,
                    ephemeral_bytes,
                });
                self.declared_job = job;
                self.dispatch
                    .set_job(self.info.id, job)
                    .map(|()| (0, 0))
                    .map_err(|_| ErrorCode::InvalidArgument)
            }
            Command::DeclareDeadline {
                period_ns,
                deadline_ns,
            } => {
                let deadline = (deadline_ns != 0).then_some(crate::sched::DeadlineSpec {
                    period_ns,
                    deadline_ns,
                });
                let grant = self.info.grant();
                self.dispatch
                    .set_deadline(
                        (self.info.id, grant.class, grant.weight),
                        self.declared_job,
                        deadline,
                    )
                    .map(|()| (0, 0))
                    .map_err(|_| ErrorCode::InvalidArgument)
            }
            Command::Launch {
                kernel: gpushare_protocol::Kernel::Fault { .. },
                ..
            } if !self.health.config.allow_injection => Err(ErrorCode::NotSupported),
            Command::Launch { stream, kernel } => {
                for operand in kernel.operands()? {
                    if operand.bytes > 0 {
                        self.allocations.check_range(operand.ptr, operand.bytes)?;
                    }
                }
                if !self.streams.contains_key(&stream) {
                    return Err(ErrorCode::InvalidHandle);
                }
                let turn = self.acquire(|d| d.builtin_profile(&kernel));
                let sm_limit = turn.and_then(|t| t.sm_limit);
                let r = self.on_stream(stream, |d, s| {
                    d.limit_sms(s, sm_limit)?;
                    d.launch(s, &kernel)
                });
                if let Some(turn) = turn {
                    self.track_granted(stream, turn.request, r.is_ok());
                }
                let r = r?;
                self.info.counters.kernels.fetch_add(1, Ordering::Relaxed);
                Ok(r)
            }
            Command::LaunchModule { stream, launch } => self.launch_module(stream, launch),
            Command::GovernedReserve { bytes } => self.governed_reserve(bytes),
            Command::GovernedRelease { bytes } => self.governed_release(bytes),
            Command::GovernedTokens { launched, blocks } => self.governed_tokens(launched, blocks),
            Command::GovernedIdle { launched, blocks } => self.governed_idle(launched, blocks),
            Command::GovernedWeight { weight } => self.governed_weight(weight),
        }
    }

    /// Allocates `bytes`, anywhere or at exactly `at` (a client rebuilding after a reset).
    fn alloc(&mut self, bytes: u64, at: Option<DevicePtr>) -> Result<(u64, u64), ErrorCode> {
        if bytes == 0 {
            return Err(ErrorCode::InvalidArgument);
        }
        if self.allocations.len() >= MAX_ALLOCATIONS {
            return Err(ErrorCode::TooManyHandles);
        }
        let counters = &self.info.counters;
        let used = counters.memory_used.load(Ordering::Relaxed);
        if let Some(quota) = self.info.grant().memory_quota
            && used.saturating_add(bytes) > quota
        {
            return Err(ErrorCode::OutOfQuota);
        }
        let mut charge = bytes;
        let ptr = match at {
            None => self.device.alloc(bytes).map_err(|e| e.code())?,
            Some(ptr) => {
                let end = ptr
                    .checked_add(bytes)
                    .ok_or(ErrorCode::AddressUnavailable)?;
                if self.allocations.overlaps(ptr, end) {
                    return Err(ErrorCode::AddressUnavailable);
                }
                let took = self.device.alloc_at(ptr, bytes).map_err(|e| {
                    tracing::debug!(ptr = format_args!("{ptr:#x}"), bytes, error = %e, "cannot allocate at the address asked for");
                    e.code()
                })?;
                // Placed memory costs whole granules on a GPU: the quota counts what it took.
                if took > bytes {
                    if let Some(quota) = self.info.grant().memory_quota
                        && used.saturating_add(took) > quota
                    {
                        let _ = self.device.free(ptr);
                        return Err(ErrorCode::OutOfQuota);
                    }
                    charge = took;
                    self.placed_charges.insert(ptr, took);
                }
                // Memory lost at this address in a reset is there again.
                self.lost.forget_buffers_in(ptr, end);
                ptr
            }
        };
        self.allocations.insert(ptr, bytes);
        let now = used + charge;
        counters.memory_used.store(now, Ordering::Relaxed);
        counters.memory_peak.fetch_max(now, Ordering::Relaxed);
        counters.allocations.fetch_add(1, Ordering::Relaxed);
        Ok((ptr, 0))
    }

    fn launch_module(
        &mut self,
        stream: StreamId,
        launch: ModuleLaunch,
    ) -> Result<(u64, u64), ErrorCode> {
        let function = self
            .modules
            .lock()
            .map_err(|_| ErrorCode::Internal)?
            .function(launch.function)
            .ok_or(ErrorCode::InvalidHandle)?;
        // Copy the parameters out of shared memory so the client cannot change them mid-launch.
        let params_slice = self
            .region
            .arena_slice(launch.params_offset, launch.params_len as u64)
            .ok_or(ErrorCode::ArenaOutOfBounds)?;
        let mut params = vec![0u8; params_slice.len()];
        params_slice.read_into(&mut params);
        if !self.streams.contains_key(&stream) {
            return Err(ErrorCode::InvalidHandle);
        }
        let blocks = launch.grid.iter().fold(1u32, |a, &g| a.saturating_mul(g));
        let id = self.info.id;
        let turn = self.acquire(|d| d.module_profile(id, launch.function, blocks));
        let sm_limit = turn.and_then(|t| t.sm_limit);
        let r = self.on_stream(stream, |d, s| {
            d.limit_sms(s, sm_limit)?;
            d.launch_module(s, &function, &launch, &params)
        });
        if let Some(turn) = turn {
            self.track_granted(stream, turn.request, r.is_ok());
        }
        let r = r?;
        self.info.counters.kernels.fetch_add(1, Ordering::Relaxed);
        Ok(r)
    }

    /// Releases everything the client held: waits for its streams, then frees.
    fn reclaim(&mut self) {
        let streams = self.streams.len();
        let allocations = self.allocations.len();
        let bytes = self.allocations.total_bytes();
        for slot in self.streams.values_mut() {
            let _ = self.device.sync_stream(&mut slot.stream);
        }
        if self.health.epoch() != self.epoch {
            // A reset came meanwhile: everything is already gone (and its addresses may be
            // someone else's now), so forget rather than free.
            self.park_if_resetting();
            self.streams.clear();
            self.events.clear();
            self.event_marks.clear();
            self.allocations.clear();
            if let Ok(mut m) = self.modules.lock() {
                m.clear();
            }
        }
        self.account(true);
        for (_, slot) in self.streams.drain() {
            self.device.destroy_stream(slot.stream);
        }
        self.events.clear();
        self.event_marks.clear();
        if let Ok(mut m) = self.modules.lock() {
            m.clear();
        }
        for (ptr, _) in self.allocations.take() {
            if let Err(e) = self.device.free(ptr) {
                tracing::warn!(ptr = format_args!("{ptr:#x}"), error = %e, "could not free allocation of departed client");
            }
        }
        self.device.unregister_arena(self.region.arena());
        let c = &self.info.counters;
        c.memory_used.store(0, Ordering::Relaxed);
        c.streams.store(0, Ordering::Relaxed);
        tracing::info!(
            streams,
            allocations,
            bytes,
            "released everything the client held"
        );
    }
}
