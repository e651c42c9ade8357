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
