use super::PolicyKind;

#[test]
fn policy_kinds_parse_and_print() {
    for k in PolicyKind::ALL {
        assert_eq!(k.as_str().parse::<PolicyKind>(), Ok(k));
        assert_eq!(k.to_string(), k.as_str());
    }
    assert_eq!(" FAIR ".parse::<PolicyKind>(), Ok(PolicyKind::Fair));
    assert!("lottery".parse::<PolicyKind>().is_err());
}

/// `[priority] lower_by_weight`: high-priority work first, the lower classes sharing the rest
/// by weight.
mod priority_by_weight {
    use gpushare_protocol::PriorityClass;

    use crate::sched::simulate::{
        Arrivals, ClientScript, SimConfig, SimReport, Simulation, kernel,
    };
    use crate::sched::{Bound, ClientSpec, PolicyKind, PriorityConfig, SchedConfig};

    const MS: u64 = 1_000_000;

    /// High: requests (Poisson, mean gap 5 ms) of four 250 µs kernels on half the SMs.
    /// Best-effort 2 (weight 2) and 3 (weight 1): closed loops of 100 µs kernels on the whole
    /// GPU.
    fn run(lower_by_weight: bool, with_high: bool) -> SimReport {
        let mut scripts = Vec::new();
        if with_high {
            scripts.push(ClientScript {
                arrivals: Arrivals::Poisson {
                    mean_gap_ns: 5 * MS,
                },
                iterations: Some(300),
                ..ClientScript::new(
                    ClientSpec::new(1, PriorityClass::High, 1),
                    vec![kernel(1, 250, 66, Bound::Compute); 4],
                )
            });
        }
        for (id, weight) in [(2, 2), (3, 1)] {
            scripts.push(ClientScript::new(
                ClientSpec::new(id, PriorityClass::BestEffort, weight),
                vec![kernel(id, 100, 132, Bound::Compute)],
            ));
        }
        let sim = SimConfig {
            sched: SchedConfig {
                max_inflight_per_client: 8,
                rate: None,
                priority: PriorityConfig {
                    default_high_latency_ns: 2 * MS,
                    lower_by_weight,
                    ..PriorityConfig::default()
                },
                ..SchedConfig::default()
            },
            horizon_ns: 2_000 * MS,
            ..SimConfig::default()
        };
        Simulation::new(sim, PolicyKind::Priority, scripts).run()
    }

    fn gpu(r: &SimReport, id: u64) -> f64 {
        r.client(id).map_or(0, |c| c.gpu_ns) as f64
    }

    #[test]
    fn best_effort_clients_share_what_high_work_leaves_by_weight() {
        let by_arrival = run(false, true);
        let by_weight = run(true, true);
        let solo = run(true, false);
        let ratio = |r: &SimReport| gpu(r, 2) / gpu(r, 3);
        let done = |r: &SimReport| {
            [2, 3]
                .iter()
                .map(|&id| r.client(id).map_or(0, |c| c.completed))
                .sum::<u64>()
        };
        let high = |r: &SimReport| r.client(1).cloned().unwrap_or_default();
        println!(
            "priority with best-effort weights 2:1: GPU time {:.2}:1 by weight, {:.2}:1 oldest first, {:.2}:1 without high; best-effort kernels done {} by weight, {} oldest first; high p99 {:.3} ms by weight, {:.3} ms oldest first",
            ratio(&by_weight),
            ratio(&by_arrival),
            ratio(&solo),
            done(&by_weight),
            done(&by_arrival),
            high(&by_weight).p99() as f64 / 1e6,
            high(&by_arrival).p99() as f64 / 1e6,
        );
        for r in [&by_weight, &solo] {
            assert!((ratio(r) - 2.0).abs() < 0.1, "{:.3}", ratio(r));
        }
        assert!(
            ratio(&by_arrival) < 1.5,
            "oldest first: {:.3}",
            ratio(&by_arrival)
        );
        // High-priority work keeps its place: the same requests done, its tail no worse than
        // oldest first's plus one best-effort kernel.
        assert_eq!(high(&by_weight).iterations, 300);
        assert!(
            high(&by_weight).p99() as f64 <= high(&by_arrival).p99() as f64 + 100e3,
            "{} against {}",
            high(&by_weight).p99(),
            high(&by_arrival).p99()
        );
    }
}

/// Issue 31's first point in the scheduler's model: FAIR, SRTF and PACK against FIFO for 2 to
/// 16 programs of mixed kernels, with a completion round trip the model charges per kernel
/// (`SimConfig::observe_ns`), as the broker pays it.
mod keep_the_gpu_busy {
    use gpushare_protocol::PriorityClass;

    use crate::sched::simulate::{ClientScript, SimConfig, SimReport, Simulation, kernel};
    use crate::sched::{Bound, ClientSpec, FairConfig, PolicyKind, SchedConfig};

    const US: u64 = 1_000;
    const MS: u64 = 1_000_000;

    /// `n` programs, weights 1 to 3: every fourth a trainer of long kernels (1 ms, the whole
    /// GPU), the rest steps of many tiny kernels (20 kernels of 30 µs on 16 SMs and one of
    /// 200 µs on the whole GPU); every third joins late and every fifth leaves early.
    fn programs(n: u64) -> Vec<ClientScript> {
        (1..=n)
            .map(|id| {
                let weight = (id % 3 + 1) as u32;
                let spec = ClientSpec::new(id, PriorityClass::Normal, weight);
                let iteration = if id % 4 == 0 {
                    vec![kernel(id, 1_000, 132, Bound::Compute)]
                } else {
                    let mut steps = vec![kernel(id, 30, 16, Bound::Memory); 20];
                    steps.push(kernel(1_000 + id, 200, 132, Bound::Compute));
                    steps
                };
                ClientScript {
                    start_ns: if id % 3 == 0 { 100 * MS } else { 0 },
                    leave_ns: (id % 5 == 0).then_some(300 * MS),
                    ..ClientScript::new(spec, iteration)
                }
            })
            .collect()
    }

    fn run(n: u64, policy: PolicyKind, quantum_ns: u64) -> SimReport {
        run_with(
            n,
            policy,
            FairConfig {
                quantum_ns,
                ..FairConfig::default()
            },
        )
    }

    /// FAIR with `share_sms`.
    fn run_sharing(n: u64) -> SimReport {
        let fair = FairConfig {
            share_sms: true,
            ..FairConfig::default()
        };
        run_with(n, PolicyKind::Fair, fair)
    }

    fn run_with(n: u64, policy: PolicyKind, fair: FairConfig) -> SimReport {
        let cfg = SimConfig {
            horizon_ns: 500 * MS,
            observe_ns: 20 * US,
            sched: SchedConfig {
                max_inflight_per_client: 8,
                rate: None,
                fair,
                ..SchedConfig::default()
            },
            ..SimConfig::default()
        };
        Simulation::new(cfg, policy, programs(n)).run()
    }

    /// Iterations done by all programs together.
    fn work(r: &SimReport) -> f64 {
        r.clients.iter().map(|c| c.iterations as f64).sum::<f64>()
    }

    /// Each program's share of the GPU time given out.
    fn shares(r: &SimReport) -> Vec<f64> {
        let total: f64 = r.clients.iter().map(|c| c.gpu_ns as f64).sum();
        r.clients
            .iter()
            .map(|c| (c.gpu_ns as f64 / total * 1000.0).round() / 1000.0)
            .collect()
    }

    #[test]
    fn turns_keep_fair_near_fifo_where_one_kernel_at_a_time_does_not() {
        let mut worst_turns: f64 = f64::INFINITY;
        let mut worst_single: f64 = f64::INFINITY;
        for n in [2, 4, 8, 16] {
            let fifo = work(&run(n, PolicyKind::Fifo, 0));
            let single = work(&run(n, PolicyKind::Fair, 0)) / fifo;
            let turns = work(&run(n, PolicyKind::Fair, MS)) / fifo;
            let srtf = work(&run(n, PolicyKind::Srtf, 0)) / fifo;
            let pack = work(&run(n, PolicyKind::Pack, 0)) / fifo;
            let wide = run_with(
                n,
                PolicyKind::Fair,
                FairConfig {
                    max_concurrent: 16,
                    ..FairConfig::default()
                },
            );
            let sharing = work(&run_sharing(n)) / fifo;
            println!(
                "{n:>2} programs, iterations against FIFO: FAIR one kernel at a time {single:.3}, FAIR 1 ms turns {turns:.3}, FAIR sharing SMs {sharing:.3}, SRTF {srtf:.3}, PACK {pack:.3}; FAIR 16 kernels in flight {:.3}, GPU time shares {:?} (weights {:?})",
                work(&wide) / fifo,
                shares(&wide),
                (1..=n).map(|id| id % 3 + 1).collect::<Vec<_>>(),
            );
            worst_turns = worst_turns.min(turns);
            worst_single = worst_single.min(single);
        }
        assert!(
            worst_single < 0.95,
            "the round trip costs one kernel at a time"
        );
        assert!(worst_turns > worst_single, "turns win it back");
    }
}
