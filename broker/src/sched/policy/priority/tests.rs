use gpushare_protocol::PriorityClass;

use crate::sched::simulate::{Arrivals, ClientScript, SimConfig, SimReport, Simulation, kernel};
use crate::sched::{
    Bound, ClientSpec, DeviceShape, Dispatcher, PolicyKind, PriorityConfig, SchedConfig,
};

const US: u64 = 1_000;
const MS: u64 = 1_000_000;
const H100: DeviceShape = DeviceShape {
    sms: 132,
    sm_partitions: true,
};

fn cfg() -> SchedConfig {
    SchedConfig {
        max_inflight_per_client: 1,
        rate: None,
        priority: PriorityConfig {
            default_high_latency_ns: 2 * MS, // budget 50 µs
            ..PriorityConfig::default()
        },
        ..SchedConfig::default()
    }
}

#[test]
fn lower_kernels_beside_high_work_follow_orions_rule() {
    let mut d = Dispatcher::with_config(PolicyKind::Priority, H100, cfg());
    for (id, class) in [
        (1, PriorityClass::High),
        (2, PriorityClass::BestEffort),
        (3, PriorityClass::BestEffort),
        (4, PriorityClass::BestEffort),
        (5, PriorityClass::Normal),
    ] {
        d.add_client(ClientSpec::new(id, class, 1))
            .expect("client registers");
    }
    let h = d
        .submit(1, kernel(1, 500, 80, Bound::Compute), 0)
        .expect("client is registered");
    let g = d.poll(0);
    assert_eq!(g.len(), 1);
    // Compute-bound beside compute-bound: collides.
    d.submit(2, kernel(2, 10, 20, Bound::Compute), 1)
        .expect("client is registered");
    // Memory-bound but wider than the 52 free SMs.
    d.submit(3, kernel(3, 10, 60, Bound::Memory), 1)
        .expect("client is registered");
    // Normal ranks before best-effort: memory-bound, 10 SMs, 30 µs of the 50 µs budget.
    let normal = d
        .submit(5, kernel(5, 30, 10, Bound::Memory), 1)
        .expect("client is registered");
    // Memory-bound, fits in the SMs left, but 30 + 30 µs would exceed the budget.
    d.submit(4, kernel(4, 30, 40, Bound::Memory), 1)
        .expect("client is registered");
    let g: Vec<_> = d.poll(1).iter().map(|g| g.request).collect();
    assert_eq!(g, vec![normal]);
    // High done: everything else runs, oldest first.
    d.complete(1, h, Some(500 * US), 500 * US)
        .expect("request is in flight");
    let g: Vec<_> = d.poll(500 * US).iter().map(|g| g.client).collect();
    assert_eq!(g, vec![2, 3, 4]);
}

#[test]
fn a_few_contexts_are_kept_and_the_rest_count_as_others() {
    let mut c = super::Contexts::default();
    for context in [7, 7, 0, 1, 2, 3, 4] {
        c.insert(context);
    }
    assert!([7, 0, 1, 2].iter().all(|&x| c.contains(x)));
    assert!(!c.contains(3) && !c.contains(4), "past four, the safe side");
}

#[test]
fn lower_kernels_of_another_gpu_context_wait_for_a_gap_in_high_work() {
    let granted = |beside_other_contexts: bool| {
        let mut cfg = cfg();
        cfg.max_inflight_per_client = 4;
        cfg.priority.beside_other_contexts = beside_other_contexts;
        let mut d = Dispatcher::with_config(PolicyKind::Priority, H100, cfg);
        // High in the default context; best-effort 2 in another trust domain's, 3 beside
        // the high client.
        for (id, class, context) in [
            (1, PriorityClass::High, 0),
            (2, PriorityClass::BestEffort, 7),
            (3, PriorityClass::BestEffort, 0),
        ] {
            d.add_client(ClientSpec {
                context,
                ..ClientSpec::new(id, class, 1)
            })
            .expect("client registers");
        }
        let h = d
            .submit(1, kernel(1, 500, 66, Bound::Compute), 0)
            .expect("client is registered");
        assert_eq!(d.poll(0).len(), 1);
        // Both small and memory-bound: within the budget, no collision, room on the SMs.
        d.submit(2, kernel(2, 5, 8, Bound::Memory), 1)
            .expect("client is registered");
        d.submit(3, kernel(3, 5, 8, Bound::Memory), 1)
            .expect("client is registered");
        let beside: Vec<_> = d.poll(1).iter().map(|g| g.client).collect();
        d.complete(1, h, Some(500 * US), 500 * US)
            .expect("request is in flight");
        let after: Vec<_> = d.poll(500 * US).iter().map(|g| g.client).collect();
        (beside, after)
    };
    assert_eq!(granted(false), (vec![3], vec![2]));
    assert_eq!(granted(true), (vec![2, 3], vec![]));
}

#[test]
fn lower_clients_keep_a_shallow_queue_while_a_high_client_is_connected() {
    let deep = SchedConfig {
        max_inflight_per_client: 64,
        rate: None,
        ..SchedConfig::default()
    };
    let granted_to_best_effort = |with_high: bool| {
        let mut d = Dispatcher::with_config(PolicyKind::Priority, H100, deep);
        d.add_client(ClientSpec::new(2, PriorityClass::BestEffort, 1))
            .expect("client registers");
        if with_high {
            // Connected, between requests: nothing queued or in flight.
            d.add_client(ClientSpec::new(1, PriorityClass::High, 1))
                .expect("client registers");
        }
        for _ in 0..12 {
            d.submit(2, kernel(2, 200, 64, Bound::Compute), 0)
                .expect("client is registered");
        }
        d.poll(0).len()
    };
    assert_eq!(granted_to_best_effort(false), 12);
    let depth = PriorityConfig::default()
        .lower_depth_beside_high
        .expect("a default depth") as usize;
    assert_eq!(granted_to_best_effort(true), depth);
}

/// Past the depth, a queue bounded in time: a client of tiny kernels keeps as many on the GPU
/// as fit in `lower_queue_ns_beside_high`, one of long kernels no more than the depth.
#[test]
fn lower_clients_of_tiny_kernels_keep_a_queue_bounded_in_time() {
    let granted = |queue_ns: Option<u64>, us: u64| {
        let sched = SchedConfig {
            max_inflight_per_client: 64,
            rate: None,
            priority: PriorityConfig {
                lower_queue_ns_beside_high: queue_ns,
                lower_depth_beside_high: Some(2),
                ..PriorityConfig::default()
            },
            ..SchedConfig::default()
        };
        let mut d = Dispatcher::with_config(PolicyKind::Priority, H100, sched);
        d.add_client(ClientSpec::new(2, PriorityClass::BestEffort, 1))
            .expect("client registers");
        d.add_client(ClientSpec::new(1, PriorityClass::High, 1))
            .expect("client registers");
        for _ in 0..60 {
            d.submit(2, kernel(2, us, 8, Bound::Memory), 0)
                .expect("client is registered");
        }
        d.poll(0).len()
    };
    // 5 µs kernels: 20 of them make 100 µs.
    assert_eq!(granted(Some(100 * US), 5), 20);
    assert_eq!(granted(None, 5), 2, "the depth alone");
    // 1 µs kernels: the cap on how many.
    assert_eq!(granted(Some(100 * US), 1), super::LOWER_DEPTH_MAX);
    // 80 µs kernels: two, the depth, though the second passes the 100 µs.
    assert_eq!(granted(Some(100 * US), 80), 2);
}

/// The time bound is over every lower client's kernels together: two clients of tiny kernels
/// share the 100 µs (each keeps its depth), not 100 µs each.
#[test]
fn the_lower_queue_s_time_bound_holds_for_all_lower_clients_together() {
    let sched = SchedConfig {
        max_inflight_per_client: 64,
        rate: None,
        priority: PriorityConfig {
            lower_queue_ns_beside_high: Some(100 * US),
            ..PriorityConfig::default()
        },
        ..SchedConfig::default()
    };
    let mut d = Dispatcher::with_config(PolicyKind::Priority, H100, sched);
    for (id, class) in [
        (1, PriorityClass::High),
        (2, PriorityClass::BestEffort),
        (3, PriorityClass::BestEffort),
    ] {
        d.add_client(ClientSpec::new(id, class, 1))
            .expect("client registers");
    }
    for _ in 0..60 {
        for id in [2, 3] {
            d.submit(id, kernel(id, 5, 8, Bound::Memory), 0)
                .expect("client is registered");
        }
    }
    let granted = d.poll(0);
    let of = |id| granted.iter().filter(|g| g.client == id).count();
    assert!(
        of(2) >= 2 && of(3) >= 2,
        "each keeps its depth: {} {}",
        of(2),
        of(3)
    );
    assert_eq!(of(2) + of(3), 20, "100 µs of 5 µs kernels between them");
}

#[test]
fn lower_clients_run_on_a_partition_only_while_a_high_client_is_connected() {
    let partitioned = SchedConfig {
        rate: None,
        priority: PriorityConfig {
            lower_sm_share: Some(0.5),
            ..PriorityConfig::default()
        },
        ..SchedConfig::default()
    };
    let mut d = Dispatcher::with_config(PolicyKind::Priority, H100, partitioned);
    d.add_client(ClientSpec::new(2, PriorityClass::BestEffort, 1))
        .expect("client registers");
    d.submit(2, kernel(2, 200, 132, Bound::Compute), 0)
        .expect("client is registered");
    let alone = d.poll(0);
    assert_eq!(alone.len(), 1);
    assert_eq!(
        alone[0].sm_limit, None,
        "alone, best-effort has the whole GPU"
    );
    d.complete(2, alone[0].request, None, 1)
        .expect("request is in flight");

    d.add_client(ClientSpec::new(1, PriorityClass::High, 1))
        .expect("client registers");
    // Memory-bound beside compute-bound, within the budget: only the SM room would have
    // held it, and the partition leaves the high client its SMs instead.
    d.submit(2, kernel(2, 200, 132, Bound::Memory), 2)
        .expect("client is registered");
    d.submit(1, kernel(1, 50, 132, Bound::Compute), 2)
        .expect("client is registered");
    let both = d.poll(2);
    let limit = |id| both.iter().find(|g| g.client == id).map(|g| g.sm_limit);
    assert_eq!(
        limit(1),
        Some(None),
        "high-priority work is never partitioned"
    );
    assert_eq!(limit(2), Some(Some(66)), "best-effort gets half the SMs");

    // On a device without partitions the SM room holds instead: the same best-effort
    // kernel waits beside the high one, and nothing is sent with a partition.
    let no_partitions = DeviceShape {
        sm_partitions: false,
        ..H100
    };
    let mut d = high_and_best_effort(no_partitions, partitioned);
    d.submit(1, kernel(1, 50, 132, Bound::Compute), 0)
        .expect("client is registered");
    d.submit(2, kernel(2, 200, 132, Bound::Memory), 0)
        .expect("client is registered");
    let both = d.poll(0);
    assert_eq!(both.len(), 1, "{both:?}");
    assert_eq!((both[0].client, both[0].sm_limit), (1, None));

    // Without the setting, nothing is partitioned.
    let mut d = high_and_best_effort(H100, deep());
    d.submit(2, kernel(2, 200, 8, Bound::Compute), 0)
        .expect("client is registered");
    assert!(d.poll(0).iter().all(|g| g.sm_limit.is_none()));
}

/// A priority dispatcher with client 1 high and client 2 best-effort.
fn high_and_best_effort(device: DeviceShape, cfg: SchedConfig) -> Dispatcher {
    let mut d = Dispatcher::with_config(PolicyKind::Priority, device, cfg);
    d.add_client(ClientSpec::new(1, PriorityClass::High, 1))
        .expect("client registers");
    d.add_client(ClientSpec::new(2, PriorityClass::BestEffort, 1))
        .expect("client registers");
    d
}

fn deep() -> SchedConfig {
    SchedConfig {
        max_inflight_per_client: 64,
        rate: None,
        ..SchedConfig::default()
    }
}

/// Client 1, high: 300 requests (Poisson, mean gap 5 ms) of four 250 µs compute-bound kernels
/// on half the SMs — 1 ms solo.
fn high_requests() -> ClientScript {
    ClientScript {
        arrivals: Arrivals::Poisson {
            mean_gap_ns: 5 * MS,
        },
        iterations: Some(300),
        ..ClientScript::new(
            ClientSpec::new(1, PriorityClass::High, 1),
            vec![kernel(1, 250, 66, Bound::Compute); 4],
        )
    }
}

/// High: requests (Poisson, mean gap 5 ms) of four 250 µs compute-bound kernels on half
/// the SMs — 1 ms solo. Best-effort: a stream of 20 µs memory-bound kernels on 40 SMs and
/// one of 300 µs compute-bound kernels on the whole GPU.
fn scenario(policy: PolicyKind, with_be: bool) -> SimReport {
    let mut scripts = vec![high_requests()];
    if with_be {
        scripts.push(ClientScript::new(
            ClientSpec::new(2, PriorityClass::BestEffort, 1),
            vec![kernel(2, 20, 40, Bound::Memory)],
        ));
        scripts.push(ClientScript::new(
            ClientSpec::new(3, PriorityClass::BestEffort, 1),
            vec![kernel(3, 300, 132, Bound::Compute)],
        ));
    }
    let sim = SimConfig {
        sched: cfg(),
        horizon_ns: 2_000 * MS,
        ..SimConfig::default()
    };
    Simulation::new(sim, policy, scripts).run()
}

#[test]
fn high_priority_latency_stays_within_budget_while_best_effort_progresses() {
    let solo = scenario(PolicyKind::Priority, false);
    let prio = scenario(PolicyKind::Priority, true);
    let fifo = scenario(PolicyKind::Fifo, true);
    let h = |r: &SimReport| r.client(1).cloned().unwrap_or_default();
    let (s, p, f) = (h(&solo), h(&prio), h(&fifo));
    assert_eq!(p.iterations, 300);
    let be = |r: &SimReport, id| r.client(id).map_or(0, |c| c.completed);
    println!(
        "priority: high p50/p99 solo {:.3}/{:.3} ms, priority {:.3}/{:.3} ms, fifo {:.3}/{:.3} ms; \
         best-effort kernels done under priority: {} × 20 µs memory-bound, {} × 300 µs compute-bound \
         (solo-time work {:.0} % of the {:.0} ms run; the two streams overlap)",
        s.p50() as f64 / 1e6,
        s.p99() as f64 / 1e6,
        p.p50() as f64 / 1e6,
        p.p99() as f64 / 1e6,
        f.p50() as f64 / 1e6,
        f.p99() as f64 / 1e6,
        be(&prio, 2),
        be(&prio, 3),
        100.0 * (be(&prio, 2) * 20_000 + be(&prio, 3) * 300_000) as f64
            / p.finished_at.unwrap_or(1) as f64,
        p.finished_at.unwrap_or(0) as f64 / 1e6,
    );
    // The bound: solo latency, plus the budget (2.5 %: what admitted best-effort work
    // could cost if it fully serialised with high; in this model it costs nothing), plus
    // the best-effort kernels already running when a high request arrives after an idle
    // spell — at most one per best-effort client at stream depth 1 (20 + 300 µs).
    let bound = s.p99() as f64 * 1.025 + 320e3;
    assert!((p.p99() as f64) <= bound, "{} > {bound}", p.p99());
    assert!(f.p99() > p.p99());
    // Best-effort still gets real work done in high's gaps.
    assert!(be(&prio, 2) > 1_000 && be(&prio, 3) > 1_000);
}

/// `[priority] lower_by_weight`: high-priority work first, the lower classes sharing the rest
/// by weight.
mod priority_by_weight {
    use gpushare_protocol::PriorityClass;

    use super::{MS, high_requests};
    use crate::sched::simulate::{ClientScript, SimConfig, SimReport, Simulation, kernel};
    use crate::sched::{Bound, ClientSpec, FairConfig, PolicyKind, PriorityConfig, SchedConfig};

    /// High: [`high_requests`]. Best-effort 2 (weight 2) and 3 (weight 1): closed loops of 100 µs kernels on the whole
    /// GPU; FAIR among them in turns of `quantum_ns` (0: one kernel at a time).
    fn run(lower_by_weight: bool, with_high: bool, quantum_ns: u64) -> SimReport {
        let mut scripts = Vec::new();
        if with_high {
            scripts.push(high_requests());
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
                fair: FairConfig {
                    quantum_ns,
                    ..FairConfig::default()
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

    /// One kernel at a time among the lower classes, and 1 ms turns (the policy file's
    /// default).
    #[test]
    fn best_effort_clients_share_what_high_work_leaves_by_weight() {
        for quantum_ns in [0, MS] {
            shares_by_weight_with_high_first(quantum_ns);
        }
    }

    fn shares_by_weight_with_high_first(quantum_ns: u64) {
        let by_arrival = run(false, true, quantum_ns);
        let by_weight = run(true, true, quantum_ns);
        let solo = run(true, false, quantum_ns);
        let ratio = |r: &SimReport| gpu(r, 2) / gpu(r, 3);
        let done = |r: &SimReport| {
            [2, 3]
                .iter()
                .map(|&id| r.client(id).map_or(0, |c| c.completed))
                .sum::<u64>()
        };
        let high = |r: &SimReport| r.client(1).cloned().unwrap_or_default();
        println!(
            "priority with best-effort weights 2:1, FAIR quantum {quantum_ns} ns: GPU time {:.2}:1 by weight, {:.2}:1 oldest first, {:.2}:1 without high; best-effort kernels done {} by weight, {} oldest first; high p99 {:.3} ms by weight, {:.3} ms oldest first",
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
