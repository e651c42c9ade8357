//! A deterministic discrete-event simulator that drives a [`Dispatcher`] the way the broker
//! does, for the scheduler's tests.
//!
//! Clients follow scripts: they join at a time, run iterations (all of an iteration's kernels
//! are submitted at once, like an asynchronous client; the iteration ends, and is declared with
//! `iteration_boundary`, when the last completes), arriving closed-loop after a think time,
//! periodically, or as a Poisson process from a seeded RNG, and leave when their iterations
//! are done (or at a set time). The simulator submits, polls after every change, hands grants
//! to per-client streams (a stream runs its kernels one after another), completes kernels
//! with their measured times, and polls at `next_wakeup`.
//!
//! The GPU model, deliberately simple: a kernel's work is its profile's `est_ns` (its solo
//! duration on `sm_need` SMs). Every running kernel occupies `e = min(sm_need, partition)` SMs
//! and progresses at speed
//!
//! ```text
//! speed = (e / sm_need)                      a partition smaller than the grid: more waves
//!       × min(1, free_sms / Σ e)             SMs oversubscribed: all share them equally
//!       × min(1, 1 / Σ_mem min(1, 2e/sms))   memory-bound only: half the SMs saturate HBM
//! ```
//!
//! where `free_sms = sms × (1 − outside load)`. No stream priorities: a kernel already running
//! slows a newly started high-priority one as much as the reverse. Times are integer ns,
//! finishing times rounded up, so runs are exactly reproducible.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, VecDeque};

use gpushare_protocol::PriorityClass;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::{
    Bound, ClientId, ClientSpec, Dispatcher, KernelProfile, Policy, PolicyKind, RequestId,
};

mod device;
mod report;
mod script;
pub use report::{ClientReport, SimReport};
pub use script::{Arrivals, ClientScript, SimConfig};

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Event {
    Join(usize),
    Release(usize),
    Start(usize),
    Leave(usize),
    Outside(usize),
    /// The dispatcher sees client `usize`'s oldest unseen completion.
    Observe(usize),
}

#[derive(Debug, Clone, Copy)]
struct Exec {
    id: RequestId,
    profile: KernelProfile,
    sm_limit: Option<u32>,
    start: u64,
    /// Work left, in solo ns.
    left: f64,
}

struct SimClient {
    script: ClientScript,
    rng: StdRng,
    gone: bool,
    /// Submitted, not granted (to match grants against: a client's grants come in order).
    pending: VecDeque<(RequestId, KernelProfile)>,
    /// Granted, waiting on the client's stream.
    stream: VecDeque<(RequestId, KernelProfile, Option<u32>)>,
    /// Ended on the GPU, not yet seen: (request, measured ns), oldest first.
    unseen: VecDeque<(RequestId, u64)>,
    exec: Option<Exec>,
    in_iteration: bool,
    iter_left: usize,
    iter_arrival: u64,
    backlog: VecDeque<u64>,
    started: u64,
    report: ClientReport,
}

/// A simulation in progress.
pub struct Simulation {
    cfg: SimConfig,
    d: Dispatcher,
    now: u64,
    clients: Vec<SimClient>,
    by_id: HashMap<ClientId, usize>,
    events: BinaryHeap<Reverse<(u64, u64, Event)>>,
    next_seq: u64,
    outside: f64,
    outside_values: Vec<f64>,
    grants: Vec<(u64, ClientId)>,
    /// The policy runs free (FAIR's `free_lead_ns`): iterations skip the dispatcher, as the
    /// broker's launches skip its scheduler, until the device time charged says otherwise.
    free: bool,
    /// Ids for kernels that ran free (the dispatcher never saw them), counting down.
    free_ids: RequestId,
}

impl Simulation {
    pub fn new(cfg: SimConfig, policy: PolicyKind, scripts: Vec<ClientScript>) -> Simulation {
        let d = Dispatcher::with_config(policy, cfg.device(), cfg.sched);
        Simulation::with_dispatcher(cfg, d, scripts)
    }

    /// With a policy built elsewhere (e.g. [`super::policy::srtf::Srtf::job_fifo`]).
    pub fn with_policy(
        cfg: SimConfig,
        policy: Box<dyn Policy>,
        kind: PolicyKind,
        scripts: Vec<ClientScript>,
    ) -> Simulation {
        let d = Dispatcher::with_policy(policy, kind, cfg.device(), cfg.sched);
        Simulation::with_dispatcher(cfg, d, scripts)
    }

    fn with_dispatcher(cfg: SimConfig, d: Dispatcher, scripts: Vec<ClientScript>) -> Simulation {
        let mut sim = Simulation {
            cfg,
            d,
            now: 0,
            clients: Vec::new(),
            by_id: HashMap::new(),
            events: BinaryHeap::new(),
            next_seq: 0,
            outside: 0.0,
            outside_values: Vec::new(),
            free: false,
            free_ids: RequestId::MAX,
            grants: Vec::new(),
        };
        for (i, script) in scripts.into_iter().enumerate() {
            let seed = cfg.seed ^ script.spec.id.wrapping_mul(0x9e37_79b9_7f4a_7c15);
            sim.by_id.insert(script.spec.id, i);
            sim.schedule(script.start_ns, Event::Join(i));
            if let Some(t) = script.leave_ns {
                sim.schedule(t, Event::Leave(i));
            }
            sim.clients.push(SimClient {
                report: ClientReport {
                    id: script.spec.id,
                    class: Some(script.spec.class),
                    ..ClientReport::default()
                },
                script,
                rng: StdRng::seed_from_u64(seed),
                gone: false,
                pending: VecDeque::new(),
                stream: VecDeque::new(),
                unseen: VecDeque::new(),
                exec: None,
                in_iteration: false,
                iter_left: 0,
                iter_arrival: 0,
                backlog: VecDeque::new(),
                started: 0,
            });
        }
        sim
    }

    fn schedule(&mut self, at: u64, ev: Event) {
        self.events.push(Reverse((at, self.next_seq, ev)));
        self.next_seq += 1;
    }

    /// Outside load (fraction of the GPU busy with non-broker work) from time `at` on.
    pub fn set_outside_load_at(&mut self, at: u64, busy: f64) {
        self.outside_values.push(busy.clamp(0.0, 0.95));
        let i = self.outside_values.len() - 1;
        self.schedule(at, Event::Outside(i));
    }

    pub fn dispatcher(&self) -> &Dispatcher {
        &self.d
    }

    /// Runs to the horizon (or until nothing is left to happen) and reports.
    pub fn run(mut self) -> SimReport {
        self.run_until(self.cfg.horizon_ns);
        self.report()
    }

    pub fn report(&self) -> SimReport {
        SimReport {
            end_ns: self.now,
            clients: self.clients.iter().map(|c| c.report.clone()).collect(),
            grants: self.grants.clone(),
        }
    }

    /// Advances the simulation to `until` (or the horizon, if earlier).
    pub fn run_until(&mut self, until: u64) {
        let until = until.min(self.cfg.horizon_ns);
        loop {
            let speeds = self.speeds();
            let finish = self
                .clients
                .iter()
                .zip(&speeds)
                .filter_map(|(c, &s)| {
                    let e = c.exec?;
                    Some(self.now + (e.left.max(0.0) / s).ceil() as u64)
                })
                .min();
            let event = self.events.peek().map(|Reverse((t, _, _))| *t);
            let wake = self.d.next_wakeup();
            let Some(t) = [finish, event, wake].into_iter().flatten().min() else {
                self.now = self.now.max(until);
                return;
            };
            if t > until {
                self.progress(until - self.now, &speeds);
                self.now = until;
                return;
            }
            self.progress(t - self.now, &speeds);
            self.now = t;
            self.finish_kernels();
            while let Some(&Reverse((at, _, ev))) = self.events.peek() {
                if at > t {
                    break;
                }
                self.events.pop();
                self.handle(ev);
            }
            self.poll();
        }
    }

    fn finish_kernels(&mut self) {
        for i in 0..self.clients.len() {
            let Some(e) = self.clients[i].exec else {
                continue;
            };
            if e.left > 1e-6 {
                continue;
            }
            let measured = self.now - e.start;
            let c = &mut self.clients[i];
            c.exec = None;
            c.report.completed += 1;
            c.report.gpu_ns += measured;
            let sms = u64::from(self.cfg.sms.max(1));
            let held = e
                .sm_limit
                .map_or(e.profile.sm_need, |l| l.min(e.profile.sm_need));
            c.report.sm_gpu_ns += measured * u64::from(held).clamp(1, sms) / sms;
            self.start_stream(i);
            if self.cfg.observe_ns == 0 {
                self.observed(i, e.id, measured);
            } else {
                self.clients[i].unseen.push_back((e.id, measured));
                let at = self.now + self.cfg.observe_ns;
                self.schedule(at, Event::Observe(i));
            }
        }
    }

    /// The dispatcher and the program see that `request` of client `i` completed.
    fn observed(&mut self, i: usize, request: RequestId, measured: u64) {
        let id = self.clients[i].script.spec.id;
        // A removed client's completion is refused, as the broker would drop it.
        let _ = self.d.complete(id, request, Some(measured), self.now);
        // The device time of its stream, as a span would measure it.
        let _ = self.d.device_time(id, measured, self.now);
        self.free = self.d.free_running(self.now);
        let c = &mut self.clients[i];
        c.iter_left = c.iter_left.saturating_sub(1);
        if c.in_iteration && c.iter_left == 0 && !c.gone {
            self.end_iteration(i);
        }
    }

    fn start_stream(&mut self, i: usize) {
        let now = self.now;
        let c = &mut self.clients[i];
        if c.exec.is_none()
            && let Some((id, profile, sm_limit)) = c.stream.pop_front()
        {
            c.exec = Some(Exec {
                id,
                profile,
                sm_limit,
                start: now,
                left: profile.est_ns as f64,
            });
        }
    }

    fn handle(&mut self, ev: Event) {
        match ev {
            Event::Join(i) => self.join(i),
            Event::Release(i) => self.release(i),
            Event::Start(i) => {
                let now = self.now;
                self.start_iteration(i, now);
            }
            Event::Leave(i) => {
                if !self.clients[i].gone {
                    self.leave(i);
                    self.clients[i].report.left_early = true;
                }
            }
            Event::Outside(k) => {
                self.outside = self.outside_values[k];
                self.d.set_outside_load(self.now, self.outside);
            }
            Event::Observe(i) => {
                if let Some((request, measured)) = self.clients[i].unseen.pop_front() {
                    self.observed(i, request, measured);
                }
            }
        }
    }

    fn join(&mut self, i: usize) {
        let now = self.now;
        let spec = self.clients[i].script.spec;
        if self.clients[i].script.iteration.is_empty() || self.d.add_client(spec).is_err() {
            self.clients[i].report.refused = true;
            self.clients[i].gone = true;
            return;
        }
        self.clients[i].report.joined_at = Some(now);
        match self.clients[i].script.arrivals {
            Arrivals::Closed { .. } => self.start_iteration(i, now),
            Arrivals::Periodic { .. } => self.release(i),
            Arrivals::Poisson { .. } => {
                let gap = self.gap(i);
                self.schedule(now + gap, Event::Release(i));
            }
        }
    }

    fn gap(&mut self, i: usize) -> u64 {
        let c = &mut self.clients[i];
        match c.script.arrivals {
            Arrivals::Closed { think_ns } => think_ns,
            Arrivals::Periodic { period_ns } => period_ns.max(1),
            Arrivals::Poisson { mean_gap_ns } => {
                let u: f64 = c.rng.random();
                ((-(1.0 - u).ln()) * mean_gap_ns as f64).round().max(1.0) as u64
            }
        }
    }

    fn limit_reached(c: &SimClient) -> bool {
        c.script.iterations.is_some_and(|n| c.started >= n)
    }

    /// An open-loop arrival.
    fn release(&mut self, i: usize) {
        let now = self.now;
        let c = &mut self.clients[i];
        if c.gone || Self::limit_reached(c) {
            return;
        }
        c.backlog.push_back(now);
        c.started += 1;
        let more = !Self::limit_reached(c);
        let gap = self.gap(i);
        if more && now + gap <= self.cfg.horizon_ns {
            self.schedule(now + gap, Event::Release(i));
        }
        if !self.clients[i].in_iteration
            && let Some(arrival) = self.clients[i].backlog.pop_front()
        {
            self.start_iteration(i, arrival);
        }
    }

    fn start_iteration(&mut self, i: usize, arrival: u64) {
        let now = self.now;
        let closed = matches!(self.clients[i].script.arrivals, Arrivals::Closed { .. });
        {
            let c = &mut self.clients[i];
            if c.gone || c.in_iteration || (closed && Self::limit_reached(c)) {
                return;
            }
            if closed {
                c.started += 1;
            }
            c.in_iteration = true;
            c.iter_arrival = arrival;
            c.iter_left = c.script.iteration.len();
        }
        let id = self.clients[i].script.spec.id;
        if self.free {
            // Straight to its stream, as an ungated launch goes.
            for k in 0..self.clients[i].script.iteration.len() {
                let profile = self.clients[i].script.iteration[k];
                let r = self.free_ids;
                self.free_ids -= 1;
                let c = &mut self.clients[i];
                c.stream.push_back((r, profile, None));
                c.report.submitted += 1;
                c.report.granted += 1;
            }
            self.start_stream(i);
            return;
        }
        for k in 0..self.clients[i].script.iteration.len() {
            let profile = self.clients[i].script.iteration[k];
            if let Ok(r) = self.d.submit(id, profile, now) {
                let c = &mut self.clients[i];
                c.pending.push_back((r, profile));
                c.report.submitted += 1;
            }
        }
    }

    fn end_iteration(&mut self, i: usize) {
        let now = self.now;
        let id = self.clients[i].script.spec.id;
        let _ = self.d.iteration_boundary(id, now);
        let c = &mut self.clients[i];
        c.in_iteration = false;
        c.report.iterations += 1;
        c.report.latencies_ns.push(now - c.iter_arrival);
        c.report.iteration_ends.push(now);
        let finished = c
            .script
            .iterations
            .is_some_and(|n| c.report.iterations >= n);
        if finished {
            c.report.finished_at = Some(now);
            c.report.jct_ns = Some(now - c.script.start_ns);
            self.leave(i);
            return;
        }
        match c.script.arrivals {
            Arrivals::Closed { think_ns } => {
                if think_ns == 0 {
                    self.start_iteration(i, now);
                } else if now + think_ns <= self.cfg.horizon_ns {
                    self.schedule(now + think_ns, Event::Start(i));
                }
            }
            _ => {
                if let Some(arrival) = c.backlog.pop_front() {
                    self.start_iteration(i, arrival);
                }
            }
        }
    }

    fn leave(&mut self, i: usize) {
        let id = self.clients[i].script.spec.id;
        let _ = self.d.remove_client(id);
        let c = &mut self.clients[i];
        c.gone = true;
        c.pending.clear();
        c.stream.clear();
        c.unseen.clear();
        c.exec = None;
        c.backlog.clear();
    }

    fn poll(&mut self) {
        let now = self.now;
        for g in self.d.poll(now) {
            let Some(&i) = self.by_id.get(&g.client) else {
                continue;
            };
            let c = &mut self.clients[i];
            // Grants of one client come in its submission order.
            let Some(pos) = c.pending.iter().position(|&(r, _)| r == g.request) else {
                continue;
            };
            debug_assert_eq!(pos, 0, "client {} granted out of order", g.client);
            let Some((r, profile)) = c.pending.remove(pos) else {
                continue;
            };
            c.stream.push_back((r, profile, g.sm_limit));
            c.report.granted += 1;
            if self.cfg.record_grants {
                self.grants.push((now, g.client));
            }
            self.start_stream(i);
        }
    }
}

/// A kernel profile for scripts: `function` id, `est_us` µs, `sm_need` SMs (= blocks).
pub fn kernel(function: u64, est_us: u64, sm_need: u32, bound: Bound) -> KernelProfile {
    KernelProfile {
        key: super::KernelKey {
            function,
            blocks: sm_need,
        },
        est_ns: est_us * 1_000,
        bound,
        sm_need,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(id: ClientId) -> ClientSpec {
        ClientSpec::new(id, PriorityClass::Normal, 1)
    }

    #[test]
    fn a_lone_kernel_takes_its_estimate_and_concurrent_ones_share_sms() {
        let cfg = SimConfig {
            horizon_ns: 10_000_000,
            ..SimConfig::default()
        };
        let one = |id| ClientScript {
            iterations: Some(1),
            ..ClientScript::new(spec(id), vec![kernel(id, 100, 132, Bound::Compute)])
        };
        let r = Simulation::new(cfg, PolicyKind::Fifo, vec![one(1)]).run();
        assert_eq!(r.clients[0].latencies_ns, vec![100_000]);
        // Two full-device kernels at once: each at half speed.
        let r = Simulation::new(cfg, PolicyKind::Fifo, vec![one(1), one(2)]).run();
        assert_eq!(r.clients[0].latencies_ns, vec![200_000]);
        assert_eq!(r.clients[1].latencies_ns, vec![200_000]);
        // Two small ones fit side by side.
        let small = |id| ClientScript {
            iterations: Some(1),
            ..ClientScript::new(spec(id), vec![kernel(id, 100, 60, Bound::Compute)])
        };
        let r = Simulation::new(cfg, PolicyKind::Fifo, vec![small(1), small(2)]).run();
        assert_eq!(r.clients[1].latencies_ns, vec![100_000]);
        // Two memory-bound ones on 66 SMs each saturate HBM together: half speed.
        let mem = |id| ClientScript {
            iterations: Some(1),
            ..ClientScript::new(spec(id), vec![kernel(id, 100, 66, Bound::Memory)])
        };
        let r = Simulation::new(cfg, PolicyKind::Fifo, vec![mem(1), mem(2)]).run();
        assert_eq!(r.clients[1].latencies_ns, vec![200_000]);
    }

    #[test]
    fn runs_are_reproducible() {
        let cfg = SimConfig {
            horizon_ns: 50_000_000,
            ..SimConfig::default()
        };
        let scripts = || {
            (1..=3)
                .map(|id| ClientScript {
                    arrivals: Arrivals::Poisson {
                        mean_gap_ns: 300_000,
                    },
                    ..ClientScript::new(spec(id), vec![kernel(id, 50 * id, 80, Bound::Compute)])
                })
                .collect::<Vec<_>>()
        };
        let a = Simulation::new(cfg, PolicyKind::Fifo, scripts()).run();
        let b = Simulation::new(cfg, PolicyKind::Fifo, scripts()).run();
        for (x, y) in a.clients.iter().zip(&b.clients) {
            assert_eq!(x.latencies_ns, y.latencies_ns);
        }
        assert!(a.clients[0].iterations > 100);
    }
}
