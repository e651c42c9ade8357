//! Priority (Orion, EuroSys'24): high-priority work first; lower-priority kernels run beside
//! it only when their profiles say they will not hurt it.
//!
//! High-priority heads are always granted first, oldest first. While no high-priority
//! request is in flight everything else runs (normal before best-effort). While one is,
//! a lower-priority head is granted only if all of these hold (Orion's rule):
//! - duration budget: the expected durations of all outstanding lower-priority requests,
//!   this one included, stay within `budget_fraction` (2.5 %) of the high-priority clients'
//!   request latency (the smallest EWMA of their iteration latencies, or a default);
//! - no collision: it is not compute-bound beside an in-flight compute-bound high-priority
//!   kernel, nor memory-bound beside a memory-bound one (unknown bounds pass unless
//!   `unknown_collides`);
//! - SM room: its SM need fits in the SMs nothing in flight occupies (or, if configured, in a
//!   fixed fraction of the device). Not checked with `lower_sm_share` on a device that can
//!   partition SMs: then lower classes run on a hardware partition of that share of the SMs
//!   (a CUDA green context) while a high-priority client is connected, and the rest stay free
//!   for it whatever they queue. On a device that cannot, the setting changes nothing.
//!   On such a device the high-priority kernels then skip the scheduler altogether
//!   (`GpuScheduler::schedules`), unless a governed program, which no partition holds, is
//!   connected.
//!
//! - same context: it runs in a GPU context that high-priority work in flight runs in. The GPU
//!   time-slices between contexts (trust domains, governed programs), so a kernel of another
//!   context granted "beside" would not run beside it at all: the GPU would switch to it and
//!   the high-priority request would wait for the switch back. `beside_other_contexts`
//!   lifts this rule.
//!
//! A lower-priority kernel that can never pass (longer than the budget, say) waits for a gap
//! in the high-priority work, as in Orion: that is the price the class pays.
//!
//! The rules above decide what is granted; what was granted before a request began is on the
//! GPU already. With `gate_lower` (on by default), every lower kernel granted while a
//! high-priority client is connected waits on its stream at the device's priority gate (a
//! word of host memory, `device::gate::Gate`) before it starts, and the GPU scheduler
//! keeps the gate closed while high-priority kernels are in flight (5 ms at most at a stretch):
//! a lower kernel already running is not preempted, but the ones queued behind it wait until the request's kernels
//! are done instead of taking the SMs between two of them. On an H200, a probe of direct CUDA
//! with the colocate bench's shapes gave the request 1.34 × its dedicated p99 with the gate,
//! 1.74 × without, for 3 % of the lower client's throughput (docs/benchmarks.md).
//!
//! Lower classes take their turns oldest head first; with `lower_by_weight` they share what
//! high-priority work leaves by weight instead: the most important lower class with work is
//! served by FAIR's rules (`fair.rs`, its `[fair]` tunables) among its own clients, and
//! beside high-priority work the lower kernel that passes Orion's rule goes to the client
//! with the least virtual time.
//!
//! While a high-priority client is connected, even between its requests, each lower-priority
//! client keeps at most `lower_depth_beside_high` kernels on the GPU, or more while the
//! estimated times of all lower kernels in flight stay within `lower_queue_ns_beside_high`
//! (off by default; 100 µs with `lower_by_weight`, where the policy file sets it). Kernels
//! queued on a low-priority stream are not preempted, but between two kernels of a
//! high-priority request (a dependency gap of a few µs) they take the SMs the first one freed,
//! and the second then waits for their blocks. A shallow queue keeps what a new request finds
//! ahead of it small (docs/benchmarks.md measures the depths).

use gpushare_protocol::PriorityClass;

use super::fair::{Fair, FairConfig};
use super::{Pick, Policy};
use crate::sched::{Bound, ClientId, Inflight, View};

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PriorityConfig {
    /// Outstanding lower-priority work allowed beside high-priority work, as a fraction of
    /// the high-priority request latency.
    pub budget_fraction: f64,
    /// High-priority request latency assumed until iterations have been measured.
    pub default_high_latency_ns: u64,
    /// `None`: a lower-priority kernel must fit in the SMs left free; `Some(f)`: its SM need
    /// must be at most `f × sms`.
    pub sm_threshold_fraction: Option<f64>,
    /// Treat kernels of unknown bound as colliding with everything.
    pub unknown_collides: bool,
    /// Kernels a lower-priority client may have in flight while a high-priority client is
    /// connected (`None`: no limit beyond the dispatcher's own).
    pub lower_depth_beside_high: Option<u32>,
    /// Past that depth, a lower-priority client may still queue kernels while the estimated
    /// (solo) times of every lower-priority kernel in flight together stay within this many
    /// ns (`None`: the depth alone), up to [`LOWER_DEPTH_MAX`] of its own: what a new
    /// high-priority request can find ahead of it is bounded in time, so clients of tiny
    /// kernels are not held to two.
    pub lower_queue_ns_beside_high: Option<u64>,
    /// Fraction of the SMs lower-priority kernels may run on while a high-priority client is
    /// connected (`None`: all of them). The device enforces it with a hardware partition
    /// (a CUDA green context), so their blocks never occupy the rest.
    pub lower_sm_share: Option<f64>,
    /// Grant lower kernels beside high-priority work that runs in another GPU context too
    /// (the GPU then switches contexts in the middle of a high-priority request).
    pub beside_other_contexts: bool,
    /// Lower classes share the GPU by weight (FAIR among each class) instead of in arrival
    /// order.
    pub lower_by_weight: bool,
    /// While a high-priority client is connected, lower kernels wait on the device at the
    /// priority gate, which is closed while high-priority kernels are in flight.
    pub gate_lower: bool,
}

impl Default for PriorityConfig {
    fn default() -> Self {
        PriorityConfig {
            budget_fraction: 0.025,
            default_high_latency_ns: 10_000_000,
            sm_threshold_fraction: None,
            unknown_collides: false,
            lower_depth_beside_high: Some(LOWER_DEPTH_GATED),
            lower_queue_ns_beside_high: None,
            lower_sm_share: None,
            beside_other_contexts: false,
            lower_by_weight: false,
            gate_lower: true,
        }
    }
}

#[derive(Debug, Clone)]
pub struct Priority {
    cfg: PriorityConfig,
    /// With `lower_by_weight`: FAIR over the lower classes.
    fair: Option<Fair>,
}

impl Priority {
    pub fn new(cfg: PriorityConfig, fair: FairConfig) -> Priority {
        Priority {
            fair: cfg.lower_by_weight.then(|| Fair::new(fair)),
            cfg,
        }
    }

    /// The lower class that `client` is in, if it is a lower one and weights count.
    fn weighted(
        &mut self,
        view: &View<'_>,
        client: ClientId,
    ) -> Option<(&mut Fair, PriorityClass)> {
        let class = view.client(client)?.class();
        let fair = self.fair.as_mut()?;
        (class != PriorityClass::High).then_some((fair, class))
    }

    fn collides(&self, a: Bound, b: Bound) -> bool {
        a.collides(b) || (self.cfg.unknown_collides && (a == Bound::Unknown || b == Bound::Unknown))
    }
}

/// What is in flight, summed once per pick.
#[derive(Default)]
struct InFlight {
    high: bool,
    high_bounds: [bool; 3],
    high_latency_ns: u64,
    lower_outstanding_ns: u64,
    sms: u64,
    /// The contexts high-priority work in flight runs in.
    high_contexts: Contexts,
}

/// A few GPU contexts, without allocating on the scheduling path: high-priority work is in
/// one or two (a trust domain, a governed program). Past `N`, a context not kept is treated
/// as another one (its lower kernels wait for a gap: the safe side).
#[derive(Default)]
struct Contexts {
    kept: [u64; Contexts::N],
    len: usize,
}

impl Contexts {
    const N: usize = 4;

    fn insert(&mut self, context: u64) {
        if !self.contains(context) && self.len < Self::N {
            self.kept[self.len] = context;
            self.len += 1;
        }
    }

    fn contains(&self, context: u64) -> bool {
        self.kept[..self.len].contains(&context)
    }
}

/// Kernels a lower-priority client may have in flight beside a high-priority client, however
/// short.
pub const LOWER_DEPTH_MAX: usize = 32;

/// `lower_depth_beside_high` where the policy file says nothing of it, with the gate and
/// without. Beside the gate what is queued waits at the gate, so a deeper queue mostly feeds
/// the lower classes: on the H200 a best-effort client beside the colocate bench's requests
/// ran at 0.81 of its standalone rate with 8 and 0.60 with 2, the requests' p99 alike (run
/// G2); four consolidated PyTorch transformer trainers ran 1.9 × faster with 8, the
/// high-priority loop's p99 beside them 1.15-1.36 × its p99 alone against 0.93-1.06 × with 2
/// (runs I2, I4 in docs/benchmarks.md). Without the gate, what is queued runs between a
/// request's kernels.
pub const LOWER_DEPTH_GATED: u32 = 8;
pub const LOWER_DEPTH_UNGATED: u32 = 2;

/// `lower_queue_ns_beside_high` where the policy file turns `lower_by_weight` on and says
/// nothing of it: FAIR's turns leave one lower client's queue on the GPU, which this lets
/// reach 100 µs (on the H200, 2.5-3 × the throughput with the high client's tail unchanged:
/// docs/benchmarks.md).
pub const LOWER_QUEUE_NS_BY_WEIGHT: u64 = 100_000;

const BOUNDS: [Bound; 3] = [Bound::Compute, Bound::Memory, Bound::Unknown];

impl Policy for Priority {
    fn name(&self) -> &'static str {
        "priority"
    }

    fn pick(&mut self, view: &View<'_>, now: u64) -> Pick {
        let order = |c: &crate::sched::ClientView<'_>| {
            (c.class(), c.head().map_or(u64::MAX, |h| h.id), c.arrival())
        };
        if let Some(c) = view
            .candidates()
            .filter(|c| c.class() == PriorityClass::High)
            .min_by_key(order)
        {
            return Pick::Grant(c.id());
        }
        let high_present = view.clients().any(|c| c.class() == PriorityClass::High);
        let mut f = InFlight {
            high_latency_ns: u64::MAX,
            ..InFlight::default()
        };
        for c in view.clients() {
            let high = c.class() == PriorityClass::High;
            f.sms += c.inflight_sms();
            if high {
                for b in BOUNDS {
                    f.high_bounds[b.index()] |= c.inflight_has(b);
                }
            } else {
                f.lower_outstanding_ns = f.lower_outstanding_ns.saturating_add(c.inflight_est_ns());
            }
            if high && !c.inflight().is_empty() {
                f.high = true;
                f.high_contexts.insert(c.context());
                let l = c
                    .iteration_latency_ns()
                    .unwrap_or(self.cfg.default_high_latency_ns);
                f.high_latency_ns = f.high_latency_ns.min(l);
            }
        }
        // What a new high-priority request may find queued ahead of it: each lower client's
        // first `lower_depth` kernels, and beyond those only while all lower kernels in flight
        // together stay within `lower_queue_ns_beside_high` of estimated time.
        let lower_queued_ns = f.lower_outstanding_ns;
        let depth_ok = |c: &crate::sched::ClientView<'_>| match self.cfg.lower_depth_beside_high {
            Some(depth) if high_present => {
                c.inflight().len() < depth as usize
                    || self.cfg.lower_queue_ns_beside_high.is_some_and(|room| {
                        c.inflight().len() < LOWER_DEPTH_MAX
                            && c.head().is_some_and(|h| {
                                lower_queued_ns.saturating_add(h.profile.est_ns) <= room
                            })
                    })
            }
            _ => true,
        };
        let lower = view
            .candidates()
            .filter(|c| c.class() != PriorityClass::High && depth_ok(c));
        if !f.high {
            if let Some(fair) = &mut self.fair {
                // The most important lower class with work, by its weights.
                let Some(class) = lower.map(|c| c.class()).min() else {
                    return Pick::Hold;
                };
                // Its turns stay within the lower depth while a high client is connected.
                return match fair.pick(&view.of_class(class), now) {
                    Pick::Grant(id) if view.client(id).is_some_and(|c| depth_ok(&c)) => {
                        Pick::Grant(id)
                    }
                    _ => Pick::Hold,
                };
            }
            return lower
                .min_by_key(order)
                .map_or(Pick::Hold, |c| Pick::Grant(c.id()));
        }
        let budget = (self.cfg.budget_fraction * f.high_latency_ns as f64) as u64;
        // On a partition, lower kernels cannot take the SMs left to high-priority work. A
        // device that cannot partition leaves them the whole GPU: the SM room still holds.
        let partitioned =
            view.device().sm_partitions && self.cfg.lower_sm_share.is_some_and(|s| s < 1.0);
        let sms = u64::from(view.device().sms);
        let threshold = match self.cfg.sm_threshold_fraction {
            Some(frac) => (frac.clamp(0.0, 1.0) * sms as f64) as u64,
            None => sms.saturating_sub(f.sms),
        };
        lower
            .filter(|c| {
                let Some(h) = c.head() else { return false };
                let p = h.profile;
                f.lower_outstanding_ns.saturating_add(p.est_ns) <= budget
                    && (self.cfg.beside_other_contexts || f.high_contexts.contains(c.context()))
                    && (partitioned || u64::from(p.sm_need) <= threshold)
                    && !BOUNDS
                        .iter()
                        .any(|&b| f.high_bounds[b.index()] && self.collides(p.bound, b))
            })
            .min_by(|a, b| {
                let vt = |c: &crate::sched::ClientView<'_>| {
                    self.fair.as_ref().map_or(0.0, |fair| fair.vt(c.id()))
                };
                a.class()
                    .cmp(&b.class())
                    .then(vt(a).total_cmp(&vt(b)))
                    .then(order(a).cmp(&order(b)))
            })
            .map_or(Pick::Hold, |c| Pick::Grant(c.id()))
    }

    fn next_wakeup(&self) -> Option<u64> {
        self.fair.as_ref().and_then(|fair| fair.next_wakeup())
    }

    fn on_submit(&mut self, view: &View<'_>, client: ClientId, now: u64) {
        if let Some((fair, class)) = self.weighted(view, client) {
            fair.on_submit(&view.of_class(class), client, now);
        }
    }

    fn on_grant(&mut self, view: &View<'_>, client: ClientId, request: &Inflight, now: u64) {
        if let Some((fair, class)) = self.weighted(view, client) {
            fair.on_grant(&view.of_class(class), client, request, now);
        }
    }

    fn on_complete(
        &mut self,
        view: &View<'_>,
        client: ClientId,
        request: &Inflight,
        gpu_ns: u64,
        now: u64,
    ) {
        if let Some((fair, class)) = self.weighted(view, client) {
            fair.on_complete(&view.of_class(class), client, request, gpu_ns, now);
        }
    }

    fn charges_device_time(&self) -> bool {
        self.fair.as_ref().is_some_and(|f| f.charges_device_time())
    }

    fn on_device_time(&mut self, view: &View<'_>, client: ClientId, ns: u64, now: u64) {
        if let Some((fair, class)) = self.weighted(view, client) {
            fair.on_device_time(&view.of_class(class), client, ns, now);
        }
    }

    fn on_remove(&mut self, client: ClientId) {
        if let Some(fair) = &mut self.fair {
            fair.on_remove(client);
        }
    }

    fn gates_lower(&self) -> bool {
        self.cfg.gate_lower
    }

    fn behind_gate(&self, view: &View<'_>, client: ClientId) -> bool {
        self.cfg.gate_lower && lower_beside_high(view, client)
    }

    fn sm_limit(&self, view: &View<'_>, client: ClientId) -> Option<u32> {
        let share = self.cfg.lower_sm_share?;
        let sms = view.device().sms;
        (share < 1.0 && lower_beside_high(view, client))
            .then(|| ((share.max(0.0) * f64::from(sms)) as u32).clamp(1, sms))
    }
}

/// Whether `client` is of a lower class while a high-priority client is connected: what the
/// gate and the SM partition hold.
fn lower_beside_high(view: &View<'_>, client: ClientId) -> bool {
    view.client(client)
        .is_some_and(|c| c.class() != PriorityClass::High)
        && view.clients().any(|c| c.class() == PriorityClass::High)
}

#[cfg(test)]
mod tests;
