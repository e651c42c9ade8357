//! FAIR (Salus): weighted fair share of measured GPU time.
//!
//! Each client carries a virtual time: GPU time charged divided by its weight (the estimate
//! at grant, corrected to the measured time at completion). The next grant goes to the
//! candidate with the least virtual time, so over any backlogged interval GPU time divides
//! in proportion to the weights. A client that becomes backlogged (new, or back from idle)
//! has its virtual time raised to at least the least backlogged one's minus `lag_ns ÷ weight`:
//! it is owed at most `lag_ns` of GPU time and cannot monopolise the device to "catch up".
//! Measured times of overlapping kernels would double-count the GPU, so by default one
//! request is in flight at a time (`max_concurrent`).
//!
//! With a `quantum_ns`, the client whose turn it is (the least virtual time when the GPU
//! drained) may queue more kernels behind its first, up to `max_run` in flight, while its
//! virtual time stays within a quantum of the next backlogged client's; nobody else is granted
//! until its kernels drain. Kernels queued on one stream run one after another, so their
//! measured times still do not overlap, and the GPU no longer idles for a round trip between
//! every two kernels of a program made of many short ones (a PyTorch training step). Shares
//! then hold to within about a quantum of GPU time. In turns a client's own kernels no longer
//! wait in gpushared's queue, so a client whose data thread is briefly off the CPU looks idle
//! between two of them; one back within `IDLE_GRACE_NS` keeps what it is owed instead of being
//! held to the lag bound like a client back from real idleness.
//!
//! A program that waits for each step (a CUDA graph, then its loss read) has nothing queued
//! while it thinks, so whoever does would get every other turn and the weights would not
//! show. A client owed GPU time (less virtual time than the one to be granted) whose last work
//! completed less than `anticipate_ns` ago is waited for that long instead: the GPU idles for
//! at most its think time per step, and only while it is owed.
//!
//! With `share_sms` (experimental), several clients' kernels run at once while their SMs fit
//! the GPU, and each is charged its share of the SMs for its time (SM·time) instead of the
//! whole GPU: the least charged client's kernel goes next if it fits beside what is in flight
//! (a client's kernels in flight run one after another on its stream, so it holds the widest
//! of them), else another's that fits while it is within `lag_ns` of SM·time of the least
//! charged, else the GPU drains for the least charged. Exclusive turns cannot run programs'
//! small kernels side by side, which FIFO does (docs/benchmarks.md, the scheduler's model).

use std::collections::HashMap;

use super::{Pick, Policy};
use crate::sched::{ClientId, Inflight, View};

/// With turns: a client idle for less than this is not "newly backlogged" (see the docs).
const IDLE_GRACE_NS: u64 = 50_000_000;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FairConfig {
    /// Requests in flight over all clients.
    pub max_concurrent: u32,
    /// Most GPU time a newly backlogged client may be owed.
    pub lag_ns: u64,
    /// GPU time a client's turn may run ahead of the next backlogged client (0: turns of one
    /// kernel, `max_concurrent` in flight over all clients).
    pub quantum_ns: u64,
    /// Kernels of one client in flight during its turn (with a quantum).
    pub max_run: u32,
    /// How long a client owed GPU time is waited for after its work completed (0: never).
    pub anticipate_ns: u64,
    /// Clients' kernels side by side while their SMs fit, charged by SM·time (see the docs).
    pub share_sms: bool,
}

impl Default for FairConfig {
    fn default() -> Self {
        FairConfig {
            max_concurrent: 1,
            lag_ns: 20_000_000,
            quantum_ns: 0,
            max_run: 32,
            anticipate_ns: 500_000,
            share_sms: false,
        }
    }
}

#[derive(Debug, Clone)]
pub struct Fair {
    cfg: FairConfig,
    vtime: HashMap<ClientId, f64>,
    /// With turns: when each idle client's last request completed.
    idle_since: HashMap<ClientId, u64>,
    /// When each client with nothing queued or in flight had its last request complete.
    done_at: HashMap<ClientId, u64>,
    /// When a wait for an owed client ends.
    wake: Option<u64>,
}

impl Fair {
    pub fn new(cfg: FairConfig) -> Fair {
        Fair {
            cfg,
            vtime: HashMap::new(),
            idle_since: HashMap::new(),
            done_at: HashMap::new(),
            wake: None,
        }
    }

    /// Until when to wait for an owed client rather than grant `next` now: one with less
    /// virtual time than `next`'s, nothing queued, and its last work done within
    /// `anticipate_ns` of `now`.
    fn owed_back_soon(&self, view: &View<'_>, next: ClientId, now: u64) -> Option<u64> {
        let v = self.vt(next);
        self.done_at
            .iter()
            .filter(|&(&id, _)| id != next && self.vt(id) < v)
            .filter(|&(&id, _)| {
                view.client(id)
                    .is_some_and(|c| !c.backlogged() && c.inflight().is_empty())
            })
            .map(|(_, &at)| at.saturating_add(self.cfg.anticipate_ns))
            .filter(|&until| until > now)
            .min()
    }

    /// Who goes first: the least virtual time, then the oldest head.
    fn owed_first(
        &self,
        a: &crate::sched::ClientView<'_>,
        b: &crate::sched::ClientView<'_>,
    ) -> std::cmp::Ordering {
        self.vt(a.id())
            .total_cmp(&self.vt(b.id()))
            .then(a.head().map(|h| h.id).cmp(&b.head().map(|h| h.id)))
    }

    /// A client's virtual time: GPU time charged over its weight.
    pub(super) fn vt(&self, id: ClientId) -> f64 {
        self.vtime.get(&id).copied().unwrap_or(0.0)
    }

    /// The part of the GPU a request is charged for: its share of the SMs when they are
    /// shared, else all of it.
    fn sm_share(&self, view: &View<'_>, request: &Inflight) -> f64 {
        if !self.cfg.share_sms {
            return 1.0;
        }
        let sms = f64::from(view.device().sms.max(1));
        (f64::from(request.profile.sm_need.max(1)) / sms).min(1.0)
    }

    /// With `share_sms`: the least charged candidate if its kernel fits beside what is in
    /// flight; else another's that fits while within `lag_ns` of it; else nothing (the GPU
    /// drains for it, so a wide kernel is never starved).
    fn pick_sharing_sms(&self, view: &View<'_>) -> Pick {
        let sms = u64::from(view.device().sms.max(1));
        let width = |sm_need: u32| u64::from(sm_need.max(1)).min(sms);
        let used: u64 = view
            .clients()
            .filter_map(|c| c.inflight().iter().map(|r| width(r.profile.sm_need)).max())
            .sum();
        let fits = |c: &crate::sched::ClientView<'_>| {
            used == 0 || used + c.head().map_or(sms, |h| width(h.profile.sm_need)) <= sms
        };
        let mut order: Vec<_> = view.candidates().collect();
        order.sort_by(|a, b| self.owed_first(a, b));
        let Some(first) = order.first() else {
            return Pick::Hold;
        };
        if fits(first) {
            return Pick::Grant(first.id());
        }
        let bound = self.vt(first.id()) + self.cfg.lag_ns as f64 / f64::from(first.weight());
        match order.iter().skip(1).find(|c| fits(c)) {
            Some(c) if self.vt(c.id()) <= bound => Pick::Grant(c.id()),
            _ => Pick::Hold,
        }
    }

    /// While a client's kernels are in flight: another of its kernels, if its turn lasts.
    fn continue_turn(&self, view: &View<'_>) -> Pick {
        let mut running = view.clients().filter(|c| !c.inflight().is_empty());
        let (Some(owner), None) = (running.next(), running.next()) else {
            return Pick::Hold; // several in flight (a policy switch): let them drain
        };
        if !owner.eligible() || owner.inflight().len() >= self.cfg.max_run.max(1) as usize {
            return Pick::Hold;
        }
        let next = view
            .clients()
            .filter(|c| c.id() != owner.id() && c.backlogged())
            .map(|c| self.vt(c.id()))
            .min_by(f64::total_cmp);
        let ahead = self.cfg.quantum_ns as f64 / f64::from(owner.weight());
        match next {
            Some(v) if self.vt(owner.id()) > v + ahead => Pick::Hold,
            _ => Pick::Grant(owner.id()),
        }
    }
}

impl Policy for Fair {
    fn name(&self) -> &'static str {
        "fair"
    }

    fn pick(&mut self, view: &View<'_>, now: u64) -> Pick {
        self.wake = None;
        if self.cfg.share_sms {
            return self.pick_sharing_sms(view);
        }
        if self.cfg.quantum_ns > 0 && view.inflight_total() > 0 {
            return self.continue_turn(view);
        }
        if view.inflight_total() >= self.cfg.max_concurrent.max(1) as usize {
            return Pick::Hold;
        }
        let Some(next) = view.candidates().min_by(|a, b| self.owed_first(a, b)) else {
            return Pick::Hold;
        };
        if self.cfg.anticipate_ns > 0
            && let Some(until) = self.owed_back_soon(view, next.id(), now)
        {
            self.wake = Some(until);
            return Pick::Hold;
        }
        Pick::Grant(next.id())
    }

    fn next_wakeup(&self) -> Option<u64> {
        self.wake
    }

    fn on_submit(&mut self, view: &View<'_>, client: ClientId, now: u64) {
        self.done_at.remove(&client);
        let Some(c) = view.client(client) else { return };
        if c.queued() != 1 || !c.inflight().is_empty() {
            return; // was backlogged already
        }
        if let Some(since) = self.idle_since.remove(&client)
            && now.saturating_sub(since) < IDLE_GRACE_NS
        {
            return; // a hiccup between two kernels of a turn, not idleness
        }
        let vmin = view
            .clients()
            .filter(|o| o.id() != client && o.backlogged())
            .map(|o| self.vt(o.id()))
            .min_by(f64::total_cmp);
        let floor = vmin.map(|v| v - self.cfg.lag_ns as f64 / f64::from(c.weight()));
        let v = self.vtime.entry(client).or_insert(0.0);
        if let Some(floor) = floor {
            *v = v.max(floor);
        }
    }

    fn on_grant(&mut self, view: &View<'_>, client: ClientId, request: &Inflight, _now: u64) {
        let w = view.client(client).map_or(1, |c| c.weight());
        let share = self.sm_share(view, request);
        *self.vtime.entry(client).or_insert(0.0) +=
            request.profile.est_ns as f64 * share / f64::from(w);
    }

    fn on_complete(
        &mut self,
        view: &View<'_>,
        client: ClientId,
        request: &Inflight,
        gpu_ns: u64,
        now: u64,
    ) {
        let c = view.client(client);
        let w = c.map_or(1, |c| c.weight());
        let correction =
            (gpu_ns as f64 - request.profile.est_ns as f64) * self.sm_share(view, request);
        *self.vtime.entry(client).or_insert(0.0) += correction / f64::from(w);
        if self.cfg.quantum_ns > 0 && c.is_some_and(|c| !c.backlogged()) {
            self.idle_since.insert(client, now);
        }
        if c.is_some_and(|c| !c.backlogged() && c.inflight().is_empty()) {
            self.done_at.insert(client, now);
        }
    }

    fn on_remove(&mut self, client: ClientId) {
        self.vtime.remove(&client);
        self.idle_since.remove(&client);
        self.done_at.remove(&client);
    }
}

#[cfg(test)]
mod tests {
    use gpushare_protocol::PriorityClass;

    use super::FairConfig;
    use crate::sched::simulate::{
        Arrivals, ClientScript, SimConfig, SimReport, Simulation, kernel,
    };
    use crate::sched::{Bound, ClientSpec, DeviceShape, Dispatcher, PolicyKind, SchedConfig};

    const MS: u64 = 1_000_000;

    /// Closed-loop clients of `weights`, kernels of different lengths, all on the whole GPU.
    fn shares(weights: &[u32], horizon: u64) -> Vec<f64> {
        shares_with(weights, horizon, FairConfig::default())
    }

    fn shares_with(weights: &[u32], horizon: u64, fair: FairConfig) -> Vec<f64> {
        let scripts = weights
            .iter()
            .enumerate()
            .map(|(i, &w)| {
                let id = i as u64 + 1;
                let spec = ClientSpec::new(id, PriorityClass::Normal, w);
                ClientScript::new(spec, vec![kernel(id, 50 * id, 132, Bound::Compute)])
            })
            .collect();
        let cfg = SimConfig {
            horizon_ns: horizon,
            sched: SchedConfig {
                fair,
                max_inflight_per_client: 8,
                ..SchedConfig::default()
            },
            ..SimConfig::default()
        };
        gpu_shares(&Simulation::new(cfg, PolicyKind::Fair, scripts).run()).0
    }

    /// Each client's share of the GPU time given out, and that time.
    fn gpu_shares(r: &SimReport) -> (Vec<f64>, u64) {
        let total: u64 = r.clients.iter().map(|c| c.gpu_ns).sum();
        let shares = r
            .clients
            .iter()
            .map(|c| c.gpu_ns as f64 / total as f64)
            .collect();
        (shares, total)
    }

    #[test]
    fn weighted_shares_within_five_percent() {
        for weights in [vec![1, 2, 3, 4], vec![1, 1, 1, 1], vec![5, 1]] {
            let got = shares(&weights, 1_000 * MS);
            let sum: u32 = weights.iter().sum();
            println!("fair: weights {weights:?} → GPU shares {got:.4?}");
            for (w, s) in weights.iter().zip(&got) {
                let want = f64::from(*w) / f64::from(sum);
                assert!((s / want - 1.0).abs() < 0.05, "weight {w}: {s} vs {want}");
            }
        }
    }

    #[test]
    fn turns_of_a_quantum_keep_the_weighted_shares() {
        let fair = FairConfig {
            quantum_ns: MS,
            ..FairConfig::default()
        };
        for weights in [vec![1, 2, 3, 4], vec![5, 1]] {
            let got = shares_with(&weights, 1_000 * MS, fair);
            let sum: u32 = weights.iter().sum();
            println!("fair, 1 ms turns: weights {weights:?} → GPU shares {got:.4?}");
            for (w, s) in weights.iter().zip(&got) {
                let want = f64::from(*w) / f64::from(sum);
                assert!((s / want - 1.0).abs() < 0.05, "weight {w}: {s} vs {want}");
            }
        }
    }

    /// Closed-loop clients of `weights` that each wait for their one kernel (`kernel_us`) and
    /// think `think_us` before the next, as a program that synchronizes every step does (a
    /// CUDA graph and its loss read): GPU shares, and the GPU's busy fraction.
    fn synchronous_shares(weights: &[u32], kernel_us: u64, think_us: u64) -> (Vec<f64>, f64) {
        let horizon = 2_000 * MS;
        let scripts = weights
            .iter()
            .enumerate()
            .map(|(i, &w)| {
                let id = i as u64 + 1;
                let spec = ClientSpec::new(id, PriorityClass::Normal, w);
                let mut script =
                    ClientScript::new(spec, vec![kernel(id, kernel_us, 132, Bound::Compute)]);
                script.arrivals = Arrivals::Closed {
                    think_ns: think_us * 1_000,
                };
                script
            })
            .collect();
        let cfg = SimConfig {
            horizon_ns: horizon,
            ..SimConfig::default()
        };
        let (shares, total) = gpu_shares(&Simulation::new(cfg, PolicyKind::Fair, scripts).run());
        (shares, total as f64 / horizon as f64)
    }

    #[test]
    fn weights_hold_between_programs_that_wait_for_each_step() {
        for (kernel_us, think_us) in [(1_000, 100), (2_000, 300), (300, 50)] {
            let (got, busy) = synchronous_shares(&[2, 1], kernel_us, think_us);
            println!(
                "fair, synchronous {kernel_us} us steps, {think_us} us think: shares {got:.4?}, GPU busy {busy:.3}"
            );
            assert!((got[0] / (2.0 / 3.0) - 1.0).abs() < 0.05, "{got:?}");
            assert!((got[1] / (1.0 / 3.0) - 1.0).abs() < 0.05, "{got:?}");
            // Waiting for the owed program costs at most its think time per step.
            let bound = kernel_us as f64 / (kernel_us + think_us) as f64;
            assert!(busy > bound * 0.95, "busy {busy} against {bound}");
        }
    }

    /// A fair dispatcher with clients 1 and 2, weight 1, and deep client queues.
    fn two_clients(fair: FairConfig) -> Dispatcher {
        let cfg = SchedConfig {
            max_inflight_per_client: 64,
            fair,
            ..SchedConfig::default()
        };
        let h100 = DeviceShape {
            sms: 132,
            sm_partitions: false,
        };
        let mut d = Dispatcher::with_config(PolicyKind::Fair, h100, cfg);
        for id in [1, 2] {
            d.add_client(ClientSpec::new(id, PriorityClass::Normal, 1))
                .expect("client registers");
        }
        d
    }

    #[test]
    fn a_turn_queues_a_clients_kernels_back_to_back_until_its_quantum_is_spent() {
        let granted = |quantum_ns| {
            let mut d = two_clients(FairConfig {
                quantum_ns,
                ..FairConfig::default()
            });
            for id in [1, 2] {
                for _ in 0..20 {
                    d.submit(id, kernel(id, 100, 132, Bound::Compute), 0)
                        .expect("client is registered");
                }
            }
            let first: Vec<_> = d.poll(0).iter().map(|g| g.client).collect();
            first
        };
        // One kernel at a time without a quantum.
        assert_eq!(granted(0), vec![1]);
        // 100 µs kernels, a 1 ms quantum: client 1's turn is ten or so kernels ahead of
        // client 2 (whose virtual time is 0), and client 2 waits for them.
        let turn = granted(MS);
        assert!(turn.iter().all(|&c| c == 1), "{turn:?}");
        assert!((10..=12).contains(&turn.len()), "{turn:?}");
    }

    #[test]
    fn in_turns_a_client_back_within_the_idle_grace_keeps_what_it_is_owed() {
        // Client 1 runs a 1 ms kernel and goes idle; client 2 then runs alone, 1 ms kernels
        // back to back, for `alone_ms`; then both queue plenty. Returns how many kernels
        // client 1 is granted in a row before client 2's next.
        let first_turn = |alone_ms: u64| {
            let mut d = two_clients(FairConfig {
                quantum_ns: MS,
                max_run: 64,
                ..FairConfig::default()
            });
            let k = |id| kernel(id, 1000, 132, Bound::Compute);
            let r = d.submit(1, k(1), 0).expect("client is registered");
            assert_eq!(d.poll(0).len(), 1);
            d.complete(1, r, Some(MS), MS)
                .expect("request is in flight");
            let mut t = MS;
            for _ in 0..alone_ms {
                let r = d.submit(2, k(2), t).expect("client is registered");
                assert_eq!(d.poll(t).len(), 1);
                t += MS;
                d.complete(2, r, Some(MS), t).expect("request is in flight");
            }
            for id in [2, 1] {
                for _ in 0..60 {
                    d.submit(id, k(id), t).expect("client is registered");
                }
            }
            let turn: Vec<_> = d.poll(t).iter().map(|g| g.client).collect();
            assert!(turn.iter().all(|&c| c == 1), "{turn:?}");
            turn.len()
        };
        // Idle 30 ms (within the grace): owed 29 ms, more than the 20 ms lag bound, and all
        // of it is granted, plus a quantum (its virtual time 1 ms against client 2's 30).
        assert_eq!(first_turn(30), 31);
        // Idle 60 ms: really idle, so held to the lag bound: owed 20 ms, plus a quantum.
        assert_eq!(first_turn(60), 22);
    }

    #[test]
    fn a_newcomer_is_owed_at_most_the_lag_bound() {
        let lag = 20 * MS;
        let mut scripts: Vec<_> = (1..=3)
            .map(|id| {
                let spec = ClientSpec::new(id, PriorityClass::Normal, 1);
                ClientScript::new(spec, vec![kernel(id, 100, 132, Bound::Compute)])
            })
            .collect();
        let spec = ClientSpec::new(4, PriorityClass::Normal, 1);
        scripts.push(ClientScript {
            start_ns: 500 * MS,
            ..ClientScript::new(spec, vec![kernel(4, 100, 132, Bound::Compute)])
        });
        let cfg = SimConfig {
            horizon_ns: 700 * MS,
            ..SimConfig::default()
        };
        let r = Simulation::new(cfg, PolicyKind::Fair, scripts).run();
        // GPU time in the 100 ms after it joins: each iteration is one 100 µs kernel.
        let window = |id| {
            r.client(id).map_or(0.0, |c| {
                c.throughput(500 * MS, 600 * MS) * 0.1 * 100e-6 * 1e9
            })
        };
        let newcomer = window(4);
        let fair = 100.0 * MS as f64 / 4.0;
        println!(
            "fair: newcomer got {:.1} ms of the 100 ms after joining (fair {:.1} ms, lag {} ms); others {:.1}, {:.1}, {:.1} ms",
            newcomer / 1e6,
            fair / 1e6,
            lag / MS,
            window(1) / 1e6,
            window(2) / 1e6,
            window(3) / 1e6
        );
        // At most its fair share of what is left after the lag, plus the lag, plus a kernel.
        assert!(newcomer <= lag as f64 + (100 * MS - lag) as f64 / 4.0 + 100e3 + 1.0);
        assert!(newcomer >= fair);
        for id in 1..=3 {
            assert!(window(id) > 10.0 * MS as f64);
        }
    }

    /// `share_sms`: four programs of 48-SM kernels (two or three fit side by side), weights
    /// 1 : 2 : 3 : 2, each one stream. Their SM·time follows the weights, and they get more
    /// done than one kernel at a time, which leaves the rest of the GPU idle.
    #[test]
    fn sharing_sms_keeps_the_weights_in_sm_time_and_runs_kernels_side_by_side() {
        let run = |share_sms: bool| {
            let scripts = [1u32, 2, 3, 2]
                .iter()
                .enumerate()
                .map(|(i, &w)| {
                    let id = i as u64 + 1;
                    let spec = ClientSpec::new(id, PriorityClass::Normal, w);
                    ClientScript::new(spec, vec![kernel(id, 100, 48, Bound::Compute)])
                })
                .collect();
            let cfg = SimConfig {
                horizon_ns: 400 * MS,
                observe_ns: 20_000,
                sched: SchedConfig {
                    fair: FairConfig {
                        share_sms,
                        ..FairConfig::default()
                    },
                    max_inflight_per_client: 8,
                    ..SchedConfig::default()
                },
                ..SimConfig::default()
            };
            Simulation::new(cfg, PolicyKind::Fair, scripts).run()
        };
        let shared = run(true);
        let single = run(false);
        let total: f64 = shared.clients.iter().map(|c| c.sm_gpu_ns as f64).sum();
        let shares: Vec<f64> = shared
            .clients
            .iter()
            .map(|c| c.sm_gpu_ns as f64 / total)
            .collect();
        let done = |r: &SimReport| r.clients.iter().map(|c| c.completed).sum::<u64>();
        println!(
            "sharing SMs: SM-time shares {shares:.3?} for weights 1:2:3:2; kernels done {} sharing, {} one at a time",
            done(&shared),
            done(&single)
        );
        for (share, weight) in shares.iter().zip([1.0, 2.0, 3.0, 2.0]) {
            assert!((share - weight / 8.0).abs() < 0.02, "{shares:?}");
        }
        assert!(done(&shared) as f64 > 1.5 * done(&single) as f64);
    }
}
