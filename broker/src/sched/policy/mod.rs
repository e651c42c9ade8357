//! Scheduling policies: each decides, from a [`View`] of the clients, whose queue head runs
//! next. The dispatcher has already applied the gates every policy shares (memory admission,
//! stream depth, best-effort tokens, deadline partitions): a policy picks among
//! [`View::candidates`] and may hold back more, never less.
//!
//! - [`fifo`]: global arrival order (Salus's baseline);
//! - [`priority`]: Orion's high-priority-first with budgeted best-effort co-location;
//! - [`fair`]: Salus FAIR, weighted fair share of measured GPU time;
//! - [`srtf`]: Salus SRTF, shortest remaining job, switching at iteration boundaries;
//! - [`pack`]: Salus PACK, every job whose memory fits runs at once.

pub mod fair;
pub mod fifo;
pub mod pack;
pub mod priority;
pub mod srtf;

use super::{ClientId, Inflight, SchedConfig, View};

pub use self::fair::FairConfig;
pub use self::fifo::FifoConfig;
pub use self::priority::PriorityConfig;

/// A policy's decision.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pick {
    /// Grant the queue head of this client (it must be a candidate).
    Grant(ClientId),
    /// Nothing more now.
    Hold,
}

/// One scheduling policy. `pick` is called once per grant and must be cheap (a scan of the
/// clients); the hooks keep whatever state the policy needs.
pub trait Policy: Send {
    fn name(&self) -> &'static str;

    fn pick(&mut self, view: &View<'_>, now: u64) -> Pick;

    /// `client` queued a request (it is at the tail of its queue in `view`).
    fn on_submit(&mut self, _view: &View<'_>, _client: ClientId, _now: u64) {}

    /// `request` of `client` was granted (it is in its in-flight list in `view`).
    fn on_grant(&mut self, _view: &View<'_>, _client: ClientId, _request: &Inflight, _now: u64) {}

    /// `request` of `client` completed and was charged `gpu_ns`.
    fn on_complete(
        &mut self,
        _view: &View<'_>,
        _client: ClientId,
        _request: &Inflight,
        _gpu_ns: u64,
        _now: u64,
    ) {
    }

    /// The device time measured for `client`'s work since the last report (all of its
    /// streams' work, as `gpushare status` shows it), known once that work has ended: after
    /// its kernels completed, or even before the scheduler hears they did.
    fn on_device_time(&mut self, _view: &View<'_>, _client: ClientId, _ns: u64, _now: u64) {}

    /// Whether `on_device_time` matters to this policy (the sessions report device time
    /// only then).
    fn charges_device_time(&self) -> bool {
        false
    }

    /// `client` declared an iteration boundary after an iteration of `latency_ns`.
    fn on_iteration(&mut self, _view: &View<'_>, _client: ClientId, _latency_ns: u64, _now: u64) {}

    /// `client` left; forget it.
    fn on_remove(&mut self, _client: ClientId) {}

    /// `client` has work on the device whose device time has not come yet (told while
    /// launches may skip the scheduler: a client whose work waits behind others' is still
    /// there, though nothing is charged to it).
    fn on_busy(&mut self, _view: &View<'_>, _client: ClientId, _now: u64) {}

    /// Whether nobody needs holding now, so that launches may skip the scheduler until the
    /// next look (asked as device time is charged; FAIR's `free_lead_ns`).
    fn free_running(&mut self, _view: &View<'_>, _now: u64) -> bool {
        false
    }

    /// When a decision of this policy changes with time alone (a hold that expires).
    fn next_wakeup(&self) -> Option<u64> {
        None
    }

    /// The SMs a request of `client` granted now may run on (a hardware partition), if the
    /// policy keeps it off part of the GPU.
    fn sm_limit(&self, _view: &View<'_>, _client: ClientId) -> Option<u32> {
        None
    }

    /// Whether the policy holds lower-priority work back on the device while high-priority
    /// kernels are in flight (the device's priority gate, closed by the GPU scheduler).
    fn gates_lower(&self) -> bool {
        false
    }

    /// Whether a request of `client` granted now waits at the priority gate before it starts.
    fn behind_gate(&self, _view: &View<'_>, _client: ClientId) -> bool {
        false
    }
}

/// The policies the broker can be configured with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PolicyKind {
    Fifo,
    Priority,
    Fair,
    Srtf,
    Pack,
    /// Exclusive FIFO over jobs (Salus's baseline, a plain queue for the GPU): one job at a
    /// time in arrival order; the job holding the GPU keeps it while it works (pauses under
    /// 2 ms between iterations).
    JobFifo,
}

impl PolicyKind {
    pub const ALL: [PolicyKind; 6] = [
        PolicyKind::Fifo,
        PolicyKind::Priority,
        PolicyKind::Fair,
        PolicyKind::Srtf,
        PolicyKind::Pack,
        PolicyKind::JobFifo,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            PolicyKind::Fifo => "fifo",
            PolicyKind::Priority => "priority",
            PolicyKind::Fair => "fair",
            PolicyKind::Srtf => "srtf",
            PolicyKind::Pack => "pack",
            PolicyKind::JobFifo => "job-fifo",
        }
    }
}

impl std::fmt::Display for PolicyKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for PolicyKind {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        PolicyKind::ALL
            .into_iter()
            .find(|k| k.as_str().eq_ignore_ascii_case(s.trim()))
            .ok_or_else(|| {
                format!(
                    "unknown scheduling policy `{s}` (expected fifo, priority, fair, srtf, pack or job-fifo)"
                )
            })
    }
}

/// A policy of `kind` with its part of `cfg`.
pub fn build_policy(kind: PolicyKind, cfg: &SchedConfig) -> Box<dyn Policy> {
    match kind {
        PolicyKind::Fifo => Box::new(fifo::Fifo::new(cfg.fifo)),
        PolicyKind::Priority => Box::new(priority::Priority::new(cfg.priority, cfg.fair)),
        PolicyKind::Fair => Box::new(fair::Fair::new(cfg.fair)),
        PolicyKind::Srtf => Box::new(srtf::Srtf::shortest_remaining()),
        PolicyKind::Pack => Box::new(pack::Pack::new()),
        PolicyKind::JobFifo => Box::new(srtf::Srtf::job_fifo()),
    }
}

/// The candidate whose head arrived first (ties: earlier client).
fn earliest<'a>(
    candidates: impl Iterator<Item = super::ClientView<'a>>,
) -> Option<super::ClientView<'a>> {
    candidates.min_by_key(|c| (c.head().map_or(u64::MAX, |h| h.id), c.arrival()))
}

#[cfg(test)]
mod tests;
