//! The scheduler's decisions: per-client software queues, one dispatcher, pluggable policies,
//! and the controllers that gate opportunistic and lower-priority work.
//!
//! Pure logic, no clock and no I/O: every call takes `now` (ns, any monotonic origin) from
//! the caller, so the same code runs in the broker and in the tests' discrete-event
//! simulator (`simulate`). It carries out the scheduling of four papers:
//! Salus (FIFO, SRTF, PACK, FAIR and memory [`admission`]), Orion (the priority policy over
//! kernel [`profile`]s), TGS ([`rate`] control of best-effort launches) and CudaMon (SM
//! partitions for [`deadline`] clients).
//!
//! How a caller drives a [`Dispatcher`]:
//! - `add_client` when a session starts, `remove_client` when it ends (its queued and
//!   in-flight records go; nobody is left waiting on them);
//! - `submit` each kernel launch into its client's FIFO queue, then `poll`: the grants are
//!   the requests to hand to the device now, in order (with the SM partition to run them on);
//! - `complete` when the device reports a granted request done (with its measured time), then
//!   `poll` again; `iteration_boundary` when a client declares an iteration's end;
//! - when `next_wakeup` returns a time, `poll` again at that time even if nothing happened.
//!
//! Before a policy sees a client, the dispatcher applies the gates every policy shares; a
//! client's queue head is a candidate only if all pass:
//! - memory admission: its declared job footprint was admitted ([`admission`]);
//! - stream depth: fewer than `max_inflight_per_client` of its requests are in flight (its
//!   granted requests run in order on its own stream);
//! - rate ([`rate`]): a best-effort head needs tokens for its blocks. The limit is engaged
//!   while a high-priority client is registered or outside load is reported, and binds while
//!   high-priority work is queued or in flight (or outside load is non-zero);
//! - partition ([`deadline`]): while a deadline client is present, clients below it keep
//!   their SMs in flight within the partition (one request always fits), and their grants
//!   carry the partition size. On a device without SM partitions their grants carry none, and
//!   a pacer holds them to the partition's share of the device's SM-time instead.
//!
//! Policies ([`policy`]) pick among the candidates, one grant per `pick`.

pub mod admission;
pub mod deadline;
pub mod policy;
pub mod profile;
pub mod rate;
#[cfg(test)]
pub mod simulate;

use std::collections::{HashMap, VecDeque};

use gpushare_protocol::PriorityClass;

pub use self::admission::{Admit, MemoryAdmission, TooLarge};
pub use self::deadline::{DeadlineConfig, DeadlineController, SharePacer};
pub use self::policy::{
    FairConfig, FifoConfig, Pick, Policy, PolicyKind, PriorityConfig, build_policy,
};
pub use self::profile::{Bound, KernelKey, KernelProfile, ProfileTable, builtin_profile};
pub use self::rate::{RateConfig, RateController};

pub type ClientId = u64;
/// Unique per dispatcher, increasing in submission order.
pub type RequestId = u64;

/// What the dispatcher knows of the device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeviceShape {
    pub sms: u32,
    /// The device can run a client's kernels on a subset of its SMs (CUDA green contexts).
    /// Without, partitioned clients are rate-controlled instead.
    pub sm_partitions: bool,
}

/// A training-style job's declaration (Salus): for SRTF and memory admission.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct JobProfile {
    /// GPU time the job still needs, as declared when it was set.
    pub remaining_ns_estimate: u64,
    /// Memory held for the job's whole life (weights, optimizer state).
    pub persistent_bytes: u64,
    /// Memory needed during an iteration (activations).
    pub ephemeral_bytes: u64,
}

impl JobProfile {
    pub fn footprint(&self) -> u64 {
        self.persistent_bytes.saturating_add(self.ephemeral_bytes)
    }
}

/// A periodic client's deadline (CudaMon): each iteration should finish within
/// `deadline_ns` of its first submission.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeadlineSpec {
    pub period_ns: u64,
    pub deadline_ns: u64,
}

/// A client as the scheduler sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClientSpec {
    pub id: ClientId,
    pub class: PriorityClass,
    /// Fair-share weight, at least 1.
    pub weight: u32,
    pub job: Option<JobProfile>,
    pub deadline: Option<DeadlineSpec>,
}

impl ClientSpec {
    pub fn new(id: ClientId, class: PriorityClass, weight: u32) -> ClientSpec {
        ClientSpec {
            id,
            class,
            weight,
            job: None,
            deadline: None,
        }
    }
}

/// A queued launch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Request {
    pub id: RequestId,
    pub profile: KernelProfile,
    pub submitted_at: u64,
}

/// A granted launch not yet completed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Inflight {
    pub id: RequestId,
    pub profile: KernelProfile,
    pub submitted_at: u64,
    pub granted_at: u64,
    /// The SM partition it was granted on, if its client is partitioned.
    pub sm_limit: Option<u32>,
    /// Another client had work in flight at some point beside it.
    overlapped: bool,
    /// SMs it holds of the deadline partition's room (0: not partitioned below a deadline).
    deadline_sms: u32,
}

/// A decision: hand `request` of `client` to the device now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Grant {
    pub client: ClientId,
    pub request: RequestId,
    /// Run it on a partition of this many SMs (a green context), if set.
    pub sm_limit: Option<u32>,
}

/// What `iteration_boundary` measured.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IterationReport {
    /// From the iteration's first submission to its declared end.
    pub latency_ns: u64,
    pub deadline_missed: bool,
}

/// One client's scheduling figures, for status.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ClientSchedStats {
    pub granted: u64,
    pub completed: u64,
    /// Queued, not yet granted.
    pub waiting: usize,
    pub inflight: usize,
    /// Measured GPU time of its completed requests.
    pub gpu_ns: u64,
    /// Its fraction of all current clients' GPU time.
    pub share: f64,
    /// Blocks/s allowed to best-effort clients (all of them together) while the rate limit
    /// is engaged (a high client present, or outside load).
    pub rate_limit: Option<f64>,
    /// Fraction of the SMs it may use (1 unless partitioned below a deadline client).
    pub sm_share: f64,
    pub deadline_misses: u64,
    /// Admitted by memory admission (always, for clients that declared no footprint).
    pub admitted: bool,
    /// EWMA of its iteration latency.
    pub iteration_latency_ns: Option<u64>,
}

/// Tunables. `Default` gives the values the module docs describe.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SchedConfig {
    /// Granted-but-not-completed requests per client (its stream's depth).
    pub max_inflight_per_client: u32,
    /// Device memory for admission; `None`: no admission control.
    pub memory_capacity: Option<u64>,
    pub fifo: FifoConfig,
    pub priority: PriorityConfig,
    pub fair: FairConfig,
    /// `None`: best-effort clients are never rate-limited.
    pub rate: Option<RateConfig>,
    pub deadline: DeadlineConfig,
    /// EWMA weight of a new sample (kernel durations, iteration latencies).
    pub ewma_alpha: f64,
    /// Assumed duration of a kernel never seen and not declared.
    pub default_kernel_ns: u64,
}

impl Default for SchedConfig {
    fn default() -> Self {
        SchedConfig {
            max_inflight_per_client: 2,
            memory_capacity: None,
            fifo: FifoConfig::default(),
            priority: PriorityConfig::default(),
            fair: FairConfig::default(),
            rate: Some(RateConfig::default()),
            deadline: DeadlineConfig::default(),
            ewma_alpha: 0.2,
            default_kernel_ns: 100_000,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SchedError {
    #[error("client {0} is already registered with the scheduler")]
    DuplicateClient(ClientId),
    #[error("client {0} is not registered with the scheduler")]
    UnknownClient(ClientId),
    #[error("request {request} of client {client} is not in flight")]
    UnknownRequest {
        client: ClientId,
        request: RequestId,
    },
    #[error("client {client}: {source}; declare a smaller job")]
    TooLarge {
        client: ClientId,
        #[source]
        source: TooLarge,
    },
}

/// Everything the dispatcher tracks of one client.
#[derive(Debug, Clone)]
struct ClientState {
    spec: ClientSpec,
    /// Order of arrival among clients.
    arrival: u64,
    queue: VecDeque<Request>,
    inflight: Vec<Inflight>,
    granted: u64,
    completed: u64,
    gpu_ns: u64,
    /// `gpu_ns` when the job profile was declared (remaining = declared − since then).
    job_base_gpu_ns: u64,
    admitted: bool,
    /// Granted something since the last iteration boundary.
    iter_open: bool,
    iter_start: Option<u64>,
    iter_latency: Option<f64>,
    deadline_misses: u64,
}

/// A read-only view of the dispatcher's clients for a policy's decision.
#[derive(Clone, Copy)]
pub struct View<'a> {
    device: DeviceShape,
    clients: &'a [ClientState],
    eligible: &'a [bool],
    inflight_total: usize,
}

impl<'a> View<'a> {
    pub fn device(&self) -> DeviceShape {
        self.device
    }

    /// Every client, in arrival order.
    pub fn clients(&self) -> impl Iterator<Item = ClientView<'a>> + 'a {
        let eligible = self.eligible;
        self.clients
            .iter()
            .enumerate()
            .map(move |(i, state)| ClientView {
                state,
                eligible: eligible.get(i).copied().unwrap_or(false),
            })
    }

    /// Clients whose queue head may be granted now (every gate passed), in arrival order.
    pub fn candidates(&self) -> impl Iterator<Item = ClientView<'a>> + 'a {
        self.clients().filter(|c| c.eligible)
    }

    pub fn client(&self, id: ClientId) -> Option<ClientView<'a>> {
        self.clients().find(|c| c.id() == id)
    }

    /// Granted, not completed, over all clients.
    pub fn inflight_total(&self) -> usize {
        self.inflight_total
    }
}

/// One client in a [`View`].
#[derive(Clone, Copy)]
pub struct ClientView<'a> {
    state: &'a ClientState,
    eligible: bool,
}

impl<'a> ClientView<'a> {
    pub fn id(&self) -> ClientId {
        self.state.spec.id
    }

    pub fn spec(&self) -> &'a ClientSpec {
        &self.state.spec
    }

    pub fn class(&self) -> PriorityClass {
        self.state.spec.class
    }

    pub fn weight(&self) -> u32 {
        self.state.spec.weight.max(1)
    }

    /// Order of arrival among clients (smaller: earlier).
    pub fn arrival(&self) -> u64 {
        self.state.arrival
    }

    /// Its head may be granted now.
    pub fn eligible(&self) -> bool {
        self.eligible
    }

    pub fn head(&self) -> Option<&'a Request> {
        self.state.queue.front()
    }

    pub fn queued(&self) -> usize {
        self.state.queue.len()
    }

    pub fn inflight(&self) -> &'a [Inflight] {
        &self.state.inflight
    }

    /// Queued or in flight.
    pub fn backlogged(&self) -> bool {
        !self.state.queue.is_empty() || !self.state.inflight.is_empty()
    }

    /// The declared job's remaining GPU time, less what it has used since declaring it.
    pub fn remaining_ns(&self) -> Option<u64> {
        let used = self.state.gpu_ns - self.state.job_base_gpu_ns;
        self.state
            .spec
            .job
            .map(|j| j.remaining_ns_estimate.saturating_sub(used))
    }

    /// Granted something since its last iteration boundary.
    pub fn iteration_open(&self) -> bool {
        self.state.iter_open
    }

    /// EWMA of its iteration latency.
    pub fn iteration_latency_ns(&self) -> Option<u64> {
        self.state.iter_latency.map(|l| l.round() as u64)
    }
}

/// Values that change only with clients, class or outside load: computed once per call.
#[derive(Debug, Clone, Copy, Default)]
struct Context {
    high_present: bool,
    /// Most important class among clients with a deadline.
    deadline_class: Option<PriorityClass>,
    /// The rate limit is engaged (a high client is present, or outside load): its state
    /// carries on; it restarts from slow start when it engages.
    limiter_engaged: bool,
    /// ...and binds now: high has work queued or in flight (or there is outside load). While
    /// high is idle best-effort runs free, as there is nothing to protect.
    limiter_active: bool,
}

/// A [`View`] of a dispatcher, borrowing only the fields it needs (so the policy, another
/// field, can be borrowed mutably beside it).
macro_rules! view {
    ($d:expr) => {
        View {
            device: $d.device,
            clients: &$d.clients,
            eligible: &$d.eligible,
            inflight_total: $d.inflight_total,
        }
    };
}

/// Per-client queues in front of one device, and the policy that drains them.
pub struct Dispatcher {
    device: DeviceShape,
    cfg: SchedConfig,
    kind: PolicyKind,
    policy: Box<dyn Policy>,
    clients: Vec<ClientState>,
    index: HashMap<ClientId, usize>,
    eligible: Vec<bool>,
    profiles: ProfileTable,
    admission: Option<MemoryAdmission>,
    rate: Option<RateController>,
    deadline: DeadlineController,
    ctx: Context,
    next_request: RequestId,
    next_arrival: u64,
    queued_total: usize,
    inflight_total: usize,
    /// Partitioned clients' SMs in flight, and how many of their requests.
    restricted_sms: u32,
    restricted_count: u32,
    last_now: u64,
    /// Paces partitioned clients where the device cannot partition SMs.
    pacer: SharePacer,
    /// A best-effort head waits for tokens / a partitioned head for partition room / for
    /// the pacer.
    waiting_tokens: bool,
    waiting_partition: bool,
    waiting_pacer: bool,
}

impl Dispatcher {
    pub fn with_config(policy: PolicyKind, device: DeviceShape, cfg: SchedConfig) -> Dispatcher {
        let boxed = build_policy(policy, &cfg);
        Dispatcher::with_policy(boxed, policy, device, cfg)
    }

    /// A dispatcher with a policy built elsewhere (`kind` is what `policy_kind` reports).
    pub fn with_policy(
        policy: Box<dyn Policy>,
        kind: PolicyKind,
        device: DeviceShape,
        cfg: SchedConfig,
    ) -> Dispatcher {
        let device = DeviceShape {
            sms: device.sms.max(1),
            ..device
        };
        Dispatcher {
            device,
            cfg,
            kind,
            policy,
            clients: Vec::new(),
            index: HashMap::new(),
            eligible: Vec::new(),
            profiles: ProfileTable::new(device.sms, cfg.ewma_alpha, cfg.default_kernel_ns),
            admission: cfg.memory_capacity.map(MemoryAdmission::new),
            rate: cfg.rate.map(|r| RateController::new(r, 0)),
            deadline: DeadlineController::new(cfg.deadline, device.sms, 0),
            ctx: Context::default(),
            next_request: 1,
            next_arrival: 0,
            queued_total: 0,
            inflight_total: 0,
            restricted_sms: 0,
            restricted_count: 0,
            last_now: 0,
            pacer: SharePacer::default(),
            waiting_tokens: false,
            waiting_partition: false,
            waiting_pacer: false,
        }
    }

    #[cfg(test)]
    pub fn device(&self) -> DeviceShape {
        self.device
    }

    pub fn config(&self) -> &SchedConfig {
        &self.cfg
    }

    pub fn policy_kind(&self) -> PolicyKind {
        self.kind
    }

    pub fn policy_name(&self) -> &'static str {
        self.policy.name()
    }

    /// The kernel profiles, to build what `submit` takes ([`ProfileTable::profile`]).
    pub fn profiles(&self) -> &ProfileTable {
        &self.profiles
    }

    /// The priority policy's tunables from now on (takes effect at the next `set_policy`).
    pub fn set_priority_config(&mut self, priority: PriorityConfig) {
        self.cfg.priority = priority;
    }

    /// Switches policy at run time; queues, in-flight records and accounting are kept.
    pub fn set_policy(&mut self, kind: PolicyKind) {
        self.policy = build_policy(kind, &self.cfg);
        self.kind = kind;
    }

    /// Time never runs backwards here, whatever threads the callers' clocks were read on.
    fn clamp_now(&mut self, now: u64) -> u64 {
        self.last_now = self.last_now.max(now);
        self.last_now
    }

    fn idx(&self, id: ClientId) -> Result<usize, SchedError> {
        self.index
            .get(&id)
            .copied()
            .ok_or(SchedError::UnknownClient(id))
    }

    /// Registers a client. A declared job footprint goes through memory admission: the
    /// client's requests wait until it is admitted.
    pub fn add_client(&mut self, spec: ClientSpec) -> Result<(), SchedError> {
        if self.index.contains_key(&spec.id) {
            return Err(SchedError::DuplicateClient(spec.id));
        }
        let admitted = self.request_admission(spec.id, spec.job)?;
        self.index.insert(spec.id, self.clients.len());
        self.clients.push(ClientState {
            spec: ClientSpec {
                weight: spec.weight.max(1),
                ..spec
            },
            arrival: self.next_arrival,
            queue: VecDeque::new(),
            inflight: Vec::new(),
            granted: 0,
            completed: 0,
            gpu_ns: 0,
            job_base_gpu_ns: 0,
            admitted,
            iter_open: false,
            iter_start: None,
            iter_latency: None,
            deadline_misses: 0,
        });
        self.eligible.push(false);
        self.next_arrival += 1;
        self.refresh_context(self.last_now);
        Ok(())
    }

    fn request_admission(
        &mut self,
        client: ClientId,
        job: Option<JobProfile>,
    ) -> Result<bool, SchedError> {
        let (Some(adm), Some(job)) = (self.admission.as_mut(), job) else {
            return Ok(true);
        };
        if job.footprint() == 0 {
            return Ok(true);
        }
        match adm.admit(client, job.footprint()) {
            Ok(a) => Ok(a == Admit::Now),
            Err(source) => Err(SchedError::TooLarge { client, source }),
        }
    }

    /// Forgets a client: its queue and in-flight records go, its memory is released (which
    /// may admit waiting jobs), and no decision waits on it any more.
    pub fn remove_client(&mut self, id: ClientId) -> Result<(), SchedError> {
        let i = self.idx(id)?;
        let c = self.clients.remove(i);
        self.eligible.pop();
        for (j, s) in self.clients.iter().enumerate().skip(i) {
            self.index.insert(s.spec.id, j);
        }
        self.index.remove(&id);
        self.queued_total -= c.queue.len();
        self.inflight_total -= c.inflight.len();
        for f in &c.inflight {
            self.release_partition(f);
        }
        if let Some(adm) = self.admission.as_mut() {
            let mut newly = Vec::new();
            adm.release(id, &mut newly);
            self.mark_admitted(&newly);
        }
        self.policy.on_remove(id);
        self.refresh_context(self.last_now);
        Ok(())
    }

    fn mark_admitted(&mut self, ids: &[ClientId]) {
        for id in ids {
            if let Some(&i) = self.index.get(id) {
                self.clients[i].admitted = true;
            }
        }
    }

    /// Changes a client's class and weight (an admin's `gpushare set`).
    pub fn update_client(
        &mut self,
        id: ClientId,
        class: PriorityClass,
        weight: u32,
    ) -> Result<(), SchedError> {
        let i = self.idx(id)?;
        self.clients[i].spec.class = class;
        self.clients[i].spec.weight = weight.max(1);
        self.refresh_context(self.last_now);
        Ok(())
    }

    /// Declares (or withdraws) a client's job profile. Remaining time counts from now; a
    /// changed footprint is accounted (it cannot un-admit a running job).
    pub fn set_job(&mut self, id: ClientId, job: Option<JobProfile>) -> Result<(), SchedError> {
        let i = self.idx(id)?;
        let held =
            self.clients[i].admitted && self.clients[i].spec.job.is_some_and(|j| j.footprint() > 0);
        let mut newly = Vec::new();
        if held {
            // Running with its memory: the new footprint is accounted, never refused.
            if let Some(adm) = self.admission.as_mut() {
                adm.account(id, job.map_or(0, |j| j.footprint()), &mut newly);
            }
        } else {
            if let Some(adm) = self.admission.as_mut() {
                adm.release(id, &mut newly);
            }
            self.clients[i].admitted = self.request_admission(id, job)?;
        }
        self.mark_admitted(&newly);
        let c = &mut self.clients[i];
        c.spec.job = job;
        c.job_base_gpu_ns = c.gpu_ns;
        Ok(())
    }

    /// The memory a client really holds (learned footprint), for admission.
    pub fn observe_memory(&mut self, id: ClientId, bytes: u64) -> Result<(), SchedError> {
        self.idx(id)?;
        let Some(adm) = self.admission.as_mut() else {
            return Ok(());
        };
        let mut newly = Vec::new();
        adm.account(id, bytes, &mut newly);
        let admitted = adm.is_admitted(id);
        self.mark_admitted(&newly);
        if let Some(&i) = self.index.get(&id) {
            self.clients[i].admitted = admitted;
        }
        Ok(())
    }

    /// Fraction of the GPU busy with processes outside the broker (from telemetry).
    pub fn set_outside_load(&mut self, now: u64, busy: f64) {
        let now = self.clamp_now(now);
        if let Some(r) = self.rate.as_mut() {
            r.advance(now);
            r.set_outside_load(busy);
        }
        self.refresh_context(now);
    }

    /// Queues a launch at the tail of `client`'s queue.
    pub fn submit(
        &mut self,
        client: ClientId,
        profile: KernelProfile,
        now: u64,
    ) -> Result<RequestId, SchedError> {
        let now = self.clamp_now(now);
        let i = self.idx(client)?;
        let id = self.next_request;
        self.next_request += 1;
        let sms = self.device.sms;
        let c = &mut self.clients[i];
        c.queue.push_back(Request {
            id,
            profile: KernelProfile {
                sm_need: profile.sm_need.clamp(1, sms),
                ..profile
            },
            submitted_at: now,
        });
        c.iter_start.get_or_insert(now);
        self.queued_total += 1;
        let view = view!(self);
        self.policy.on_submit(&view, client, now);
        Ok(id)
    }

    /// The requests the policy lets run now, in order.
    pub fn poll(&mut self, now: u64) -> Vec<Grant> {
        let mut out = Vec::new();
        self.poll_into(now, &mut out);
        out
    }

    /// `poll` into a caller's buffer (appends).
    pub fn poll_into(&mut self, now: u64, out: &mut Vec<Grant>) {
        let now = self.clamp_now(now);
        self.refresh_context(now);
        // Each pass grants one request, so the queued count bounds the loop.
        for _ in 0..self.queued_total {
            self.compute_eligible();
            let view = view!(self);
            let Pick::Grant(id) = self.policy.pick(&view, now) else {
                break;
            };
            let Some(&i) = self.index.get(&id) else {
                break;
            };
            if !self.eligible[i] {
                tracing::error!(
                    client = id,
                    policy = self.policy.name(),
                    "scheduler policy picked a client that may not run now; holding"
                );
                break;
            }
            let policy_limit = self.policy.sm_limit(&view, id);
            let Some(grant) = self.grant(i, now, policy_limit) else {
                break;
            };
            out.push(grant);
            let view = view!(self);
            if let Some(f) = self.clients[i].inflight.last() {
                self.policy.on_grant(&view, id, f, now);
            }
        }
        // What is left waiting on a gate, for next_wakeup and the rate controller.
        self.compute_eligible();
        if self.waiting_tokens
            && let Some(r) = self.rate.as_mut()
        {
            r.note_limited();
        }
    }

    /// Recomputes what changes only with clients and load, and catches the controllers up.
    fn refresh_context(&mut self, now: u64) {
        let mut ctx = Context::default();
        let mut high_busy = false;
        for c in &self.clients {
            if c.spec.class == PriorityClass::High {
                ctx.high_present = true;
                high_busy |= !c.queue.is_empty() || !c.inflight.is_empty();
            }
            if c.spec.deadline.is_some() {
                ctx.deadline_class = Some(match ctx.deadline_class {
                    Some(d) => d.min(c.spec.class),
                    None => c.spec.class,
                });
            }
        }
        if let Some(r) = self.rate.as_mut() {
            r.advance(now);
            let outside = r.outside_load() > 0.0;
            ctx.limiter_engaged = ctx.high_present || outside;
            ctx.limiter_active = high_busy || outside;
            if ctx.limiter_engaged && !self.ctx.limiter_engaged {
                r.restart(now);
            }
        }
        self.deadline.set_active(ctx.deadline_class.is_some());
        self.deadline.advance(now);
        self.pacer.refill(now, self.pacing_rate());
        self.ctx = ctx;
    }

    /// Whether partitioned clients are paced (the device cannot partition SMs, and their
    /// share is below the whole device).
    fn pacing(&self) -> bool {
        !self.device.sm_partitions && self.deadline.share() < 1.0
    }

    /// SM-ns per ns the partitioned clients may use together.
    fn pacing_rate(&self) -> f64 {
        self.deadline.share() * f64::from(self.device.sms)
    }

    /// Partitioned below a deadline client: no deadline of its own, class not above it.
    fn is_restricted(ctx: &Context, spec: &ClientSpec) -> bool {
        match ctx.deadline_class {
            Some(d) => spec.deadline.is_none() && spec.class >= d,
            None => false,
        }
    }

    fn compute_eligible(&mut self) {
        let depth = self.cfg.max_inflight_per_client.max(1) as usize;
        let cap = self.deadline.cap_sms();
        let paced = self.pacing() && !self.pacer.ready();
        self.waiting_tokens = false;
        self.waiting_partition = false;
        self.waiting_pacer = false;
        for (i, c) in self.clients.iter().enumerate() {
            let Some(head) = c.queue.front() else {
                self.eligible[i] = false;
                continue;
            };
            let mut ok = c.admitted && c.inflight.len() < depth;
            if ok && Self::is_restricted(&self.ctx, &c.spec) {
                let need = head.profile.sm_need.min(cap);
                if self.restricted_count > 0 && self.restricted_sms + need > cap {
                    ok = false;
                    self.waiting_partition = true;
                } else if paced {
                    ok = false;
                    self.waiting_pacer = true;
                }
            }
            if ok
                && c.spec.class == PriorityClass::BestEffort
                && self.ctx.limiter_active
                && let Some(r) = &self.rate
                && !r.ready(head.profile.key.blocks)
            {
                ok = false;
                self.waiting_tokens = true;
            }
            self.eligible[i] = ok;
        }
    }

    /// Grants client `i`'s head; `policy_limit` is the SM partition its policy keeps it to.
    fn grant(&mut self, i: usize, now: u64, policy_limit: Option<u32>) -> Option<Grant> {
        let restricted = Self::is_restricted(&self.ctx, &self.clients[i].spec);
        let cap = self.deadline.cap_sms();
        let overlapped = self.inflight_total > self.clients[i].inflight.len();
        if overlapped {
            // Everything in flight beside this one now shares the GPU with it.
            let id = self.clients[i].spec.id;
            for c in self.clients.iter_mut().filter(|c| c.spec.id != id) {
                for f in &mut c.inflight {
                    f.overlapped = true;
                }
            }
        }
        let paced = restricted && self.pacing();
        let c = &mut self.clients[i];
        let req = c.queue.pop_front()?;
        let deadline_limit = restricted.then_some(cap);
        let sm_limit = match (deadline_limit, policy_limit) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
        .filter(|_| self.device.sm_partitions);
        if paced {
            let sms = req.profile.sm_need.clamp(1, self.device.sms);
            self.pacer.take(req.profile.est_ns as f64 * f64::from(sms));
        }
        let deadline_sms = if restricted {
            self.restricted_sms += req.profile.sm_need.min(cap);
            self.restricted_count += 1;
            req.profile.sm_need.min(cap)
        } else {
            0
        };
        if c.spec.class == PriorityClass::BestEffort
            && self.ctx.limiter_active
            && let Some(r) = self.rate.as_mut()
        {
            r.take(req.profile.key.blocks);
        }
        c.inflight.push(Inflight {
            id: req.id,
            profile: req.profile,
            submitted_at: req.submitted_at,
            granted_at: now,
            sm_limit,
            overlapped,
            deadline_sms,
        });
        c.granted += 1;
        c.iter_open = true;
        self.queued_total -= 1;
        self.inflight_total += 1;
        Some(Grant {
            client: c.spec.id,
            request: req.id,
            sm_limit,
        })
    }

    fn release_partition(&mut self, f: &Inflight) {
        if f.deadline_sms > 0 {
            self.restricted_sms = self.restricted_sms.saturating_sub(f.deadline_sms);
            self.restricted_count = self.restricted_count.saturating_sub(1);
        }
    }

    /// A granted request finished. `measured_ns` (device time from events) feeds the profile
    /// table and the fair-share accounting; without it the estimate is charged.
    pub fn complete(
        &mut self,
        client: ClientId,
        request: RequestId,
        measured_ns: Option<u64>,
        now: u64,
    ) -> Result<(), SchedError> {
        let now = self.clamp_now(now);
        let i = self.idx(client)?;
        let Some(pos) = self.clients[i]
            .inflight
            .iter()
            .position(|f| f.id == request)
        else {
            return Err(SchedError::UnknownRequest { client, request });
        };
        let f = self.clients[i].inflight.remove(pos);
        self.inflight_total -= 1;
        self.release_partition(&f);
        let charged = measured_ns.unwrap_or(f.profile.est_ns);
        let c = &mut self.clients[i];
        c.gpu_ns = c.gpu_ns.saturating_add(charged);
        c.completed += 1;
        let class = c.spec.class;
        if let Some(m) = measured_ns {
            self.profiles.observe(f.profile.key, m, !f.overlapped);
            if class == PriorityClass::High
                && let Some(r) = self.rate.as_mut()
            {
                r.advance(now);
                r.sample_high(f.profile.est_ns, m);
            }
        }
        let view = view!(self);
        self.policy.on_complete(&view, client, &f, charged, now);
        Ok(())
    }

    /// A client declared the end of an iteration: the only point where SRTF may switch it
    /// out. Measures the iteration's latency (first submission → now) and checks its
    /// deadline. `None` if it submitted nothing since its last boundary.
    pub fn iteration_boundary(
        &mut self,
        client: ClientId,
        now: u64,
    ) -> Result<Option<IterationReport>, SchedError> {
        let now = self.clamp_now(now);
        let i = self.idx(client)?;
        let alpha = self.cfg.ewma_alpha;
        let c = &mut self.clients[i];
        c.iter_open = false;
        // Work already queued belongs to the next iteration: it started when that was queued.
        let next_start = c.queue.front().map(|r| r.submitted_at);
        let Some(start) = std::mem::replace(&mut c.iter_start, next_start) else {
            return Ok(None);
        };
        let latency = now.saturating_sub(start);
        let l = latency as f64;
        c.iter_latency = Some(match c.iter_latency {
            Some(e) => e + alpha * (l - e),
            None => l,
        });
        let missed = c.spec.deadline.is_some_and(|d| latency > d.deadline_ns);
        if missed {
            c.deadline_misses += 1;
            self.deadline.report_miss(now);
        }
        let view = view!(self);
        self.policy.on_iteration(&view, client, latency, now);
        Ok(Some(IterationReport {
            latency_ns: latency,
            deadline_missed: missed,
        }))
    }

    /// When to `poll` again although nothing was submitted or completed: a best-effort head
    /// waiting for tokens, or a partitioned one for the partition to grow. `None`: only
    /// submissions and completions change anything now.
    pub fn next_wakeup(&self) -> Option<u64> {
        let mut at: Option<u64> = None;
        let mut consider = |t: u64| at = Some(at.map_or(t, |a| a.min(t)));
        if self.waiting_tokens
            && let Some(r) = &self.rate
        {
            for c in &self.clients {
                if c.spec.class == PriorityClass::BestEffort
                    && c.admitted
                    && let Some(h) = c.queue.front()
                    && !r.ready(h.profile.key.blocks)
                {
                    consider(r.ready_at(h.profile.key.blocks, self.last_now));
                }
            }
            // The rate may grow at the period's end.
            consider(r.next_period_at());
        }
        if self.waiting_partition {
            consider(self.deadline.next_period_at());
        }
        if self.waiting_pacer {
            consider(self.pacer.ready_at(self.pacing_rate()));
            // The share may grow at the period's end.
            consider(self.deadline.next_period_at());
        }
        if let Some(t) = self.policy.next_wakeup() {
            consider(t);
        }
        at.map(|t| t.max(self.last_now + 1))
    }

    /// How many of the client's requests are on the GPU (0 for an unknown client).
    pub fn inflight_of(&self, id: ClientId) -> usize {
        self.index
            .get(&id)
            .map_or(0, |&i| self.clients[i].inflight.len())
    }

    /// Scheduling figures of one client.
    pub fn stats(&self, id: ClientId) -> Option<ClientSchedStats> {
        let c = &self.clients[*self.index.get(&id)?];
        let total: u64 = self.clients.iter().map(|c| c.gpu_ns).sum();
        let rate_limit = match (&self.rate, c.spec.class) {
            (Some(r), PriorityClass::BestEffort) if self.ctx.limiter_engaged => Some(r.allowance()),
            _ => None,
        };
        let sm_share = if Self::is_restricted(&self.ctx, &c.spec) {
            self.deadline.share()
        } else {
            1.0
        };
        Some(ClientSchedStats {
            granted: c.granted,
            completed: c.completed,
            waiting: c.queue.len(),
            inflight: c.inflight.len(),
            gpu_ns: c.gpu_ns,
            share: if total == 0 {
                0.0
            } else {
                c.gpu_ns as f64 / total as f64
            },
            rate_limit,
            sm_share,
            deadline_misses: c.deadline_misses,
            admitted: c.admitted,
            iteration_latency_ns: c.iter_latency.map(|l| l.round() as u64),
        })
    }

    /// Clients registered, in arrival order.
    pub fn clients(&self) -> impl Iterator<Item = ClientId> + '_ {
        self.clients.iter().map(|c| c.spec.id)
    }

    /// Requests queued (not granted) and in flight over all clients.
    #[cfg(test)]
    pub fn backlog(&self) -> (usize, usize) {
        (self.queued_total, self.inflight_total)
    }
}

#[cfg(test)]
mod tests;
