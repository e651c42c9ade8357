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
            let fifo_run = run(n, PolicyKind::Fifo, 0);
            let fifo = work(&fifo_run);
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
            let side = run_with(
                n,
                PolicyKind::Fair,
                FairConfig {
                    quantum_ns: MS,
                    side_by_side: true,
                    ..FairConfig::default()
                },
            );
            println!(
                "{n:>2} programs: FAIR side by side {:.3} × FIFO, GPU time shares {:?}; FIFO's {:?}",
                work(&side) / fifo,
                shares(&side),
                shares(&fifo_run)
            );
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
