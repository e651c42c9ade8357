//! SRTF (Salus): the job with the shortest remaining time has the GPU; switches happen only
//! at iteration boundaries.
//!
//! Salus switches jobs at iteration boundaries because that is when a job's ephemeral memory
//! is free and switching is cheap. Here one job — the current one — is granted at a time.
//! While its iteration is open (it was granted work since its last declared boundary) it
//! keeps the GPU even when its queue is momentarily empty. At a boundary (or when it leaves)
//! the backlogged job with the least remaining time, declared estimate less GPU time used,
//! becomes current; a job that arrived meanwhile with less remaining waits for that point.
//! Clients without a job profile count as endless jobs: they go after every declared job and,
//! as they declare no iterations, each of their kernels is one. Among themselves they rank
//! equal, so while no declared job runs or waits they share the GPU, kernels granted in
//! arrival order as under PACK: taking them one at a time, oldest first, ran 16 PyTorch
//! programs at 0.31 × FIFO's throughput on an H200 and left two users' trainers nothing
//! (docs/benchmarks.md, run A13).
//!
//! The same machinery ordered by arrival instead ([`Srtf::job_fifo`]) is Salus's exclusive
//! FIFO baseline: one job at a time, run to completion in arrival order.

use super::{Pick, Policy, earliest};
use crate::sched::{ClientId, ClientView, View};

/// How the next job is chosen at a switch point.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JobOrder {
    ShortestRemaining,
    Arrival,
}

/// How long the current job keeps the GPU after an iteration ends while it prepares the
/// next (a closed-loop job synchronizes between iterations). Without it a job with a longer
/// remaining time would slip in at every such gap.
pub const ITERATION_GAP_GRACE_NS: u64 = 2_000_000;

#[derive(Debug, Clone)]
pub struct Srtf {
    order: JobOrder,
    current: Option<ClientId>,
    /// When the current job was last seen between iterations with nothing queued.
    gap_since: Option<u64>,
}

impl Srtf {
    pub fn shortest_remaining() -> Srtf {
        Srtf {
            order: JobOrder::ShortestRemaining,
            current: None,
            gap_since: None,
        }
    }

    /// Exclusive FIFO over jobs: the next job is the earliest to arrive.
    pub fn job_fifo() -> Srtf {
        Srtf {
            order: JobOrder::Arrival,
            current: None,
            gap_since: None,
        }
    }

    fn key(&self, c: &ClientView<'_>) -> (u64, u64, u64) {
        let head = c.head().map_or(u64::MAX, |h| h.id);
        match self.order {
            JobOrder::ShortestRemaining => {
                (c.remaining_ns().unwrap_or(u64::MAX), c.arrival(), head)
            }
            JobOrder::Arrival => (c.arrival(), head, 0),
        }
    }

    /// Whether a declared job runs, waits, or is the current one (between its iterations):
    /// else every client is an endless job, and they share the GPU.
    fn declared_in_play(&self, view: &View<'_>) -> bool {
        view.clients().any(|c| {
            c.spec().job.is_some()
                && (c.backlogged() || !c.inflight().is_empty() || self.current == Some(c.id()))
        })
    }
}

/// Whether `c` is inside an iteration, where it may not be switched out.
fn mid_iteration(c: &ClientView<'_>) -> bool {
    if c.spec().job.is_some() {
        c.iteration_open()
    } else {
        !c.inflight().is_empty()
    }
}

impl Policy for Srtf {
    fn name(&self) -> &'static str {
        match self.order {
            JobOrder::ShortestRemaining => "srtf",
            JobOrder::Arrival => "job-fifo",
        }
    }

    fn pick(&mut self, view: &View<'_>, now: u64) -> Pick {
        if self.order == JobOrder::ShortestRemaining && !self.declared_in_play(view) {
            self.current = None;
            self.gap_since = None;
            return earliest(view.candidates()).map_or(Pick::Hold, |c| Pick::Grant(c.id()));
        }
        if let Some(c) = self.current.and_then(|id| view.client(id))
            && mid_iteration(&c)
        {
            self.gap_since = None;
            return if c.eligible() {
                Pick::Grant(c.id())
            } else {
                Pick::Hold
            };
        }
        // A switch point: the best backlogged job takes over (possibly the same one).
        let best = view.candidates().min_by_key(|c| self.key(c));
        // The current job, between iterations and still the shortest, keeps the GPU for a
        // short gap while it prepares its next iteration. Its last kernels may still count
        // in flight: the client saw them finish before the scheduler heard.
        if let Some(c) = self.current.and_then(|id| view.client(id))
            && c.spec().job.is_some()
            && c.queued() == 0
            && best.as_ref().is_none_or(|b| self.key(&c) < self.key(b))
        {
            let since = *self.gap_since.get_or_insert(now);
            if now.saturating_sub(since) < ITERATION_GAP_GRACE_NS {
                return Pick::Hold;
            }
        }
        self.gap_since = None;
        self.current = best.map(|c| c.id());
        best.map_or(Pick::Hold, |c| Pick::Grant(c.id()))
    }

    fn next_wakeup(&self) -> Option<u64> {
        self.gap_since.map(|t| t + ITERATION_GAP_GRACE_NS)
    }

    fn on_remove(&mut self, client: ClientId) {
        if self.current == Some(client) {
            self.current = None;
        }
    }
}

#[cfg(test)]
mod tests {
    use gpushare_protocol::PriorityClass;
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};

    use super::{ITERATION_GAP_GRACE_NS, Srtf};
    use crate::sched::simulate::{
        Arrivals, ClientScript, SimConfig, SimReport, Simulation, kernel,
    };
    use crate::sched::{Bound, ClientSpec, JobProfile, PolicyKind};

    const MS: u64 = 1_000_000;

    /// A job of `iterations` iterations of 1 ms (ten 100 µs full-GPU kernels), arriving at
    /// `start`, declaring its whole length as its remaining time.
    fn job(id: u64, start: u64, iterations: u64) -> ClientScript {
        let spec = ClientSpec {
            job: Some(JobProfile {
                remaining_ns_estimate: iterations * MS,
                ..JobProfile::default()
            }),
            ..ClientSpec::new(id, PriorityClass::Normal, 1)
        };
        ClientScript {
            start_ns: start,
            iterations: Some(iterations),
            ..ClientScript::new(spec, vec![kernel(id, 100, 132, Bound::Compute); 10])
        }
    }

    fn run(policy: Option<PolicyKind>, scripts: Vec<ClientScript>, horizon: u64) -> SimReport {
        let cfg = SimConfig {
            horizon_ns: horizon,
            record_grants: true,
            ..SimConfig::default()
        };
        match policy {
            Some(k) => Simulation::new(cfg, k, scripts).run(),
            None => {
                Simulation::with_policy(cfg, Box::new(Srtf::job_fifo()), PolicyKind::Srtf, scripts)
                    .run()
            }
        }
    }

    #[test]
    fn shortest_remaining_first_switching_only_at_iteration_boundaries() {
        // A (30 ms) runs alone; B (10 ms) arrives at 5.5 ms, inside A's sixth iteration, and
        // C (20 ms) at 6 ms. A is switched out at its boundary at 6 ms, not at 5.5. Then B
        // (10 ms, against A's 24 left and C's 20) runs to its end, then C (20 < 24), then A.
        let r = run(
            Some(PolicyKind::Srtf),
            vec![job(1, 0, 30), job(2, 5_500_000, 10), job(3, 6 * MS, 20)],
            200 * MS,
        );
        let fin = |id| r.client(id).and_then(|c| c.finished_at);
        println!(
            "srtf: finish times A {:?} B {:?} C {:?} ms",
            fin(1).map(|t| t as f64 / 1e6),
            fin(2).map(|t| t as f64 / 1e6),
            fin(3).map(|t| t as f64 / 1e6)
        );
        assert_eq!(fin(2), Some(16 * MS));
        assert_eq!(fin(3), Some(36 * MS));
        assert_eq!(fin(1), Some(60 * MS));
        // B's first grant waits for A's boundary; A had granted six whole iterations by then.
        let first_b = r.grants.iter().find(|g| g.1 == 2).map(|g| g.0);
        assert_eq!(first_b, Some(6 * MS));
        let a_before = r.grants.iter().filter(|g| g.1 == 1 && g.0 < 6 * MS).count();
        assert_eq!(a_before, 60);
        // Exclusive: while B runs nobody else is granted.
        assert!(
            r.grants
                .iter()
                .filter(|g| g.0 >= 6 * MS && g.0 < 16 * MS)
                .all(|g| g.1 == 2)
        );
    }

    #[test]
    fn salus_style_trace_srtf_beats_fifo_on_average_jct() {
        // 24 jobs, Poisson arrivals (mean gap 30 ms), two thirds short (5–30 iterations of
        // 1 ms), one third long (100–300).
        let mut rng = StdRng::seed_from_u64(7);
        let mut t = 0u64;
        let jobs: Vec<ClientScript> = (1..=24)
            .map(|id| {
                let u: f64 = rng.random();
                t += (-(1.0 - u).ln() * 30.0 * MS as f64) as u64;
                let iterations = if rng.random_bool(2.0 / 3.0) {
                    rng.random_range(5..=30)
                } else {
                    rng.random_range(100..=300)
                };
                job(id, t, iterations)
            })
            .collect();
        let horizon = 20_000 * MS;
        let mean_jct = |r: &SimReport| {
            let j: Vec<u64> = r.clients.iter().filter_map(|c| c.jct_ns).collect();
            assert_eq!(j.len(), 24, "every job finishes");
            j.iter().sum::<u64>() as f64 / j.len() as f64 / 1e6
        };
        let srtf = mean_jct(&run(Some(PolicyKind::Srtf), jobs.clone(), horizon));
        let fifo = mean_jct(&run(Some(PolicyKind::Fifo), jobs.clone(), horizon));
        let job_fifo = mean_jct(&run(None, jobs.clone(), horizon));
        let pack = mean_jct(&run(Some(PolicyKind::Pack), jobs, horizon));
        println!(
            "salus trace (24 jobs): mean JCT srtf {srtf:.1} ms, fifo (kernel order, jobs share the GPU) {fifo:.1} ms = {:.2}× srtf, \
             exclusive job fifo {job_fifo:.1} ms = {:.2}× srtf, pack {pack:.1} ms (Salus reports 3.19× for SRTF over FIFO)",
            fifo / srtf,
            job_fifo / srtf
        );
        assert!(srtf < fifo);
        assert!(srtf < job_fifo);
    }

    /// Programs that declare no job rank equal (endless): they share the GPU as under FIFO
    /// until a declared job comes, which then has it to itself until it ends.
    #[test]
    fn programs_without_a_job_share_the_gpu_until_a_declared_job_comes() {
        let undeclared = |id| {
            ClientScript::new(
                ClientSpec::new(id, PriorityClass::Normal, 1),
                vec![kernel(id, 100, 20, Bound::Compute); 10],
            )
        };
        let scripts = || {
            let mut s: Vec<_> = (1..=4).map(undeclared).collect();
            s.push(job(5, 50 * MS, 10));
            s
        };
        let srtf = run(Some(PolicyKind::Srtf), scripts(), 100 * MS);
        let fifo = run(Some(PolicyKind::Fifo), scripts(), 100 * MS);
        let before = |r: &SimReport| {
            (1..=4)
                .filter_map(|id| r.client(id))
                .map(|c| c.iteration_ends.iter().filter(|&&t| t < 50 * MS).count())
                .sum::<usize>() as f64
        };
        let ratio = before(&srtf) / before(&fifo);
        let first = srtf.grants.iter().find(|g| g.1 == 5).map(|g| g.0);
        let done = srtf.client(5).and_then(|c| c.finished_at);
        println!(
            "srtf: programs without a job did {ratio:.3} × FIFO's iterations; the declared job ran {:?} to {:?} ms",
            first.map(|t| t as f64 / 1e6),
            done.map(|t| t as f64 / 1e6)
        );
        assert!(ratio > 0.95, "they share the GPU: {ratio}");
        let (Some(first), Some(done)) = (first, done) else {
            panic!("the declared job ran and finished");
        };
        assert_eq!(first, 50 * MS, "it goes as soon as it comes");
        assert!(
            srtf.grants
                .iter()
                .filter(|g| g.0 >= first && g.0 < done)
                .all(|g| g.1 == 5),
            "nobody else is granted while it runs"
        );
        assert!(
            srtf.grants.iter().any(|g| g.1 != 5 && g.0 > done),
            "the others go on after it"
        );
    }

    #[test]
    fn closed_loop_think_time_lets_others_in_at_the_boundary() {
        // A job that thinks longer than the grace between iterations is not backlogged then:
        // another job runs.
        let mut a = job(1, 0, 5);
        a.arrivals = Arrivals::Closed {
            think_ns: ITERATION_GAP_GRACE_NS + 3 * MS,
        };
        let r = run(Some(PolicyKind::Srtf), vec![a, job(2, 0, 50)], 200 * MS);
        let b = r.client(2).and_then(|c| c.finished_at);
        assert!(b.is_some());
        // B (longer) got grants while A was thinking, i.e. before A finished.
        let a_done = r.client(1).and_then(|c| c.finished_at).unwrap_or(0);
        assert!(r.grants.iter().any(|g| g.1 == 2 && g.0 < a_done));
    }

    #[test]
    fn a_short_gap_between_iterations_keeps_the_gpu_for_the_shortest_job() {
        // Synchronizing between iterations takes a moment; the shorter job keeps the GPU.
        let mut a = job(1, 0, 5);
        a.arrivals = Arrivals::Closed {
            think_ns: ITERATION_GAP_GRACE_NS / 4,
        };
        let r = run(Some(PolicyKind::Srtf), vec![a, job(2, 0, 50)], 200 * MS);
        let a_done = r.client(1).and_then(|c| c.finished_at).expect("A finishes");
        assert!(
            !r.grants.iter().any(|g| g.1 == 2 && g.0 < a_done),
            "the longer job slipped in between the shorter job's iterations"
        );
    }

    #[test]
    fn a_job_whose_client_saw_its_iteration_end_before_the_scheduler_keeps_the_gpu() {
        // A client's synchronization can return, and its boundary come, before the scheduler
        // hears that the iteration's last kernel finished (a release build does this often).
        // Between iterations with that kernel still counted in flight, the shorter job keeps
        // the GPU for the gap as with none.
        use crate::sched::{DeviceShape, Dispatcher, SchedConfig};
        let device = DeviceShape {
            sms: 132,
            sm_partitions: false,
        };
        let mut d = Dispatcher::with_config(PolicyKind::Srtf, device, SchedConfig::default());
        // The jobs' declarations as `job` makes them: 10 ms and 60 s left.
        for (id, iterations) in [(1, 10), (2, 60_000)] {
            d.add_client(job(id, 0, iterations).spec)
                .expect("client registers");
        }
        let k = |id| kernel(id, 1_000, 132, Bound::Compute);
        let short = d.submit(1, k(1), 0).expect("submit");
        assert_eq!(d.poll(0).iter().map(|g| g.client).collect::<Vec<_>>(), [1]);
        d.submit(2, k(2), 10).expect("submit");
        assert!(d.poll(10).is_empty(), "the short job's iteration is open");
        d.iteration_boundary(1, MS).expect("boundary");
        assert!(
            d.poll(MS).is_empty(),
            "the longer job slipped in while the shorter one's last kernel still counted"
        );
        d.complete(1, short, Some(MS), MS + 20_000)
            .expect("complete");
        assert!(d.poll(MS + 20_000).is_empty(), "still within the gap");
        d.submit(1, k(1), MS + 50_000).expect("submit");
        let next = d.poll(MS + 50_000);
        assert_eq!(next.iter().map(|g| g.client).collect::<Vec<_>>(), [1]);
        let later = MS + 50_000 + 3 * ITERATION_GAP_GRACE_NS;
        d.complete(1, next[0].request, Some(MS), later)
            .expect("complete");
        d.iteration_boundary(1, later).expect("boundary");
        assert!(d.poll(later).is_empty(), "the gap's grace begins");
        let after = later + ITERATION_GAP_GRACE_NS;
        assert_eq!(
            d.poll(after).iter().map(|g| g.client).collect::<Vec<_>>(),
            [2],
            "after the grace with nothing queued, the longer job goes"
        );
    }
}
