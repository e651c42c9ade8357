//! The [`Dispatcher`]: clients come and go, launches are submitted, granted and completed.
//! The gates a queue head must pass before a policy may pick it live in [`super::gates`].

use gpushare_protocol::PriorityClass;

use super::client::ClientState;
use super::gates::Context;
use super::id_hash::IdMap;
use super::{
    Admit, ClientId, ClientSpec, DeadlineController, DeviceShape, Grant, Inflight, IterationReport,
    JobProfile, KernelProfile, MemoryAdmission, Pick, Policy, PolicyKind, ProfileTable,
    RateController, Request, RequestId, SchedConfig, SchedError, SharePacer, Tunables, View,
    build_policy,
};

/// A [`View`] of a dispatcher, borrowing only the fields it needs (so the policy, another
/// field, can be borrowed mutably beside it).
macro_rules! view {
    ($d:expr) => {
        View {
            device: $d.device,
            clients: &$d.clients,
            eligible: &$d.eligible,
            inflight_total: $d.inflight_total,
            only: None,
        }
    };
}

/// Per-client queues in front of one device, and the policy that drains them.
pub struct Dispatcher {
    pub(super) device: DeviceShape,
    pub(super) cfg: SchedConfig,
    pub(super) kind: PolicyKind,
    pub(super) policy: Box<dyn Policy>,
    pub(super) clients: Vec<ClientState>,
    pub(super) index: IdMap<ClientId, usize>,
    pub(super) eligible: Vec<bool>,
    pub(super) profiles: ProfileTable,
    pub(super) admission: Option<MemoryAdmission>,
    pub(super) rate: Option<RateController>,
    pub(super) deadline: DeadlineController,
    pub(super) ctx: Context,
    pub(super) next_request: RequestId,
    pub(super) next_arrival: u64,
    pub(super) queued_total: usize,
    pub(super) inflight_total: usize,
    /// Partitioned clients' SMs in flight, and how many of their requests.
    pub(super) restricted_sms: u32,
    pub(super) restricted_count: u32,
    pub(super) last_now: u64,
    /// Paces partitioned clients where the device cannot partition SMs.
    pub(super) pacer: SharePacer,
    /// A best-effort head waits for tokens / a partitioned head for partition room / for
    /// the pacer.
    pub(super) waiting_tokens: bool,
    pub(super) waiting_partition: bool,
    pub(super) waiting_pacer: bool,
    /// The latest grant's client and number (grants are numbered from 1), and the number of
    /// the latest grant to any other client: a kernel shared the GPU if another client had
    /// work in flight when it was granted, or was granted while it ran.
    pub(super) latest_grant: (ClientId, u64),
    pub(super) latest_other_grant: u64,
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
            index: IdMap::default(),
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
            latest_grant: (0, 0),
            latest_other_grant: 0,
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
    pub fn profiles_mut(&mut self) -> &mut ProfileTable {
        &mut self.profiles
    }

    pub fn profiles(&self) -> &ProfileTable {
        &self.profiles
    }

    /// The priority policy's tunables from now on (takes effect at the next `set_policy`).
    pub fn set_tunables(&mut self, t: Tunables) {
        self.cfg.priority = t.priority;
        self.cfg.fair = t.fair;
    }

    pub fn tunables(&self) -> Tunables {
        Tunables {
            priority: self.cfg.priority,
            fair: self.cfg.fair,
        }
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
        let spec = ClientSpec {
            weight: spec.weight.max(1),
            ..spec
        };
        self.clients
            .push(ClientState::new(spec, self.next_arrival, admitted));
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
        for f in c.inflight.iter() {
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
            let gated = self.policy.behind_gate(&view, id);
            let Some(grant) = self.grant(i, now, policy_limit, gated) else {
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

    /// Grants client `i`'s head; `policy_limit` is the SM partition its policy keeps it to, and
    /// `gated` whether it waits at the priority gate.
    fn grant(
        &mut self,
        i: usize,
        now: u64,
        policy_limit: Option<u32>,
        gated: bool,
    ) -> Option<Grant> {
        let restricted = Self::is_restricted(&self.ctx, &self.clients[i].spec);
        let cap = self.deadline.cap_sms();
        let overlapped = self.inflight_total > self.clients[i].inflight.len();
        // Everything in flight beside this one now shares the GPU with it: told by the count
        // of grants when each completes.
        let id = self.clients[i].spec.id;
        let grant_seq = self.latest_grant.1 + 1;
        if self.latest_grant.0 != id {
            self.latest_other_grant = self.latest_grant.1;
        }
        self.latest_grant = (id, grant_seq);
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
        let due_at = c
            .inflight
            .last()
            .map_or(now, |last| last.due_at.max(now))
            .saturating_add(req.profile.est_ns);
        c.inflight.push(Inflight {
            id: req.id,
            profile: req.profile,
            submitted_at: req.submitted_at,
            granted_at: now,
            due_at,
            grant_seq,
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
            gated,
        })
    }

    /// Whether the device's priority gate should hold lower-priority work back now: the
    /// policy gates it, and high-priority kernels are in flight.
    pub fn gate_wanted(&self) -> bool {
        self.policy.gates_lower()
            && self
                .clients
                .iter()
                .any(|c| c.spec.class == PriorityClass::High && !c.inflight.is_empty())
    }

    fn release_partition(&mut self, f: &Inflight) {
        if f.deadline_sms > 0 {
            self.restricted_sms = self.restricted_sms.saturating_sub(f.deadline_sms);
            self.restricted_count = self.restricted_count.saturating_sub(1);
        }
    }

    /// A granted request finished. `measured_ns` (device time from events) feeds the profile
    /// table, and is charged to the client's fair share when the kernel ran alone; a kernel
    /// that shared the GPU is charged its estimate (its span includes others' work).
    pub fn complete(
        &mut self,
        client: ClientId,
        request: RequestId,
        measured_ns: Option<u64>,
        now: u64,
    ) -> Result<(), SchedError> {
        let now = self.clamp_now(now);
        let i = self.idx(client)?;
        let Some(mut f) = self.clients[i].inflight.take(request) else {
            return Err(SchedError::UnknownRequest { client, request });
        };
        let other_since = if self.latest_grant.0 != client {
            self.latest_grant.1
        } else {
            self.latest_other_grant
        };
        f.overlapped |= other_since > f.grant_seq;
        self.inflight_total -= 1;
        self.release_partition(&f);
        let charged = measured_ns
            .filter(|_| !f.overlapped)
            .unwrap_or(f.profile.est_ns);
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

    /// Whether the policy charges measured device time ([`Dispatcher::device_time`]).
    pub fn charges_device_time(&self) -> bool {
        self.policy.charges_device_time()
    }

    /// Device time measured for `client`'s work since the last report (what `status` shows
    /// it), for a policy that charges it (FAIR side by side).
    pub fn device_time(&mut self, client: ClientId, ns: u64, now: u64) -> Result<(), SchedError> {
        let now = self.clamp_now(now);
        self.idx(client)?;
        let view = view!(self);
        self.policy.on_device_time(&view, client, ns, now);
        Ok(())
    }

    /// `client` has work on the device whose device time has not come yet.
    pub fn busy(&mut self, client: ClientId, now: u64) -> Result<(), SchedError> {
        let now = self.clamp_now(now);
        self.idx(client)?;
        let view = view!(self);
        self.policy.on_busy(&view, client, now);
        Ok(())
    }

    /// Whether the policy needs nobody held now, so that launches may skip the scheduler
    /// (FAIR's `free_lead_ns`; never for the other policies).
    pub fn free_running(&mut self, now: u64) -> bool {
        let now = self.clamp_now(now);
        let view = view!(self);
        self.policy.free_running(&view, now)
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
}
