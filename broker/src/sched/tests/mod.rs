//! The dispatcher's contract: gates, removal, run-time policy changes, and no starvation
//! under any policy; what it charges (`charging.rs`) and its controllers in closed loop with
//! the simulator (`controllers.rs`).

use gpushare_protocol::PriorityClass;
use proptest::prelude::*;

use super::simulate::{Arrivals, ClientScript, SimConfig, Simulation, kernel};
use super::*;

mod charging;
mod controllers;

const US: u64 = 1_000;
const MS: u64 = 1_000_000;
const H100: DeviceShape = DeviceShape {
    sms: 132,
    sm_partitions: true,
};

fn spec(id: ClientId, class: PriorityClass) -> ClientSpec {
    ClientSpec::new(id, class, 1)
}

fn dispatcher(policy: PolicyKind, cfg: SchedConfig, clients: &[ClientSpec]) -> Dispatcher {
    let mut d = Dispatcher::with_config(policy, H100, cfg);
    for c in clients {
        d.add_client(*c).expect("client registers");
    }
    d
}

fn k(us: u64) -> KernelProfile {
    kernel(1, us, 132, Bound::Compute)
}

#[test]
fn the_dispatcher_can_move_between_threads() {
    fn send<T: Send>() {}
    send::<Dispatcher>();
}

#[test]
fn fifo_grants_in_arrival_order_up_to_stream_depth() {
    let n = PriorityClass::Normal;
    let mut d = dispatcher(
        PolicyKind::Fifo,
        SchedConfig {
            fifo: FifoConfig {
                max_concurrent: Some(3),
            },
            ..SchedConfig::default()
        },
        &[spec(1, n), spec(2, n)],
    );
    let a1 = d.submit(1, k(10), 0).expect("client is registered");
    let b1 = d.submit(2, k(10), 1).expect("client is registered");
    let a2 = d.submit(1, k(10), 2).expect("client is registered");
    let a3 = d.submit(1, k(10), 3).expect("client is registered");
    let b2 = d.submit(2, k(10), 4).expect("client is registered");
    let g: Vec<_> = d.poll(5).iter().map(|g| g.request).collect();
    assert_eq!(g, vec![a1, b1, a2]); // the cap of 3 in flight
    d.complete(1, a1, None, 10).expect("request is in flight");
    // a3 is older than b2, and client 1's stream has room again.
    let g: Vec<_> = d.poll(10).iter().map(|g| g.request).collect();
    assert_eq!(g, vec![a3]);
    d.complete(2, b1, None, 11).expect("request is in flight");
    let g: Vec<_> = d.poll(11).iter().map(|g| g.request).collect();
    assert_eq!(g, vec![b2]);
    let s = d.stats(1).expect("client is registered");
    assert_eq!(
        (s.granted, s.completed, s.waiting, s.inflight),
        (3, 1, 0, 2)
    );
    assert_eq!(
        d.complete(1, a1, None, 12),
        Err(SchedError::UnknownRequest {
            client: 1,
            request: a1
        })
    );
    assert_eq!(d.submit(9, k(1), 12), Err(SchedError::UnknownClient(9)));
    assert_eq!(
        d.add_client(spec(1, n)),
        Err(SchedError::DuplicateClient(1))
    );
}

#[test]
fn remove_client_never_strands_others() {
    let (h, n, be) = (
        PriorityClass::High,
        PriorityClass::Normal,
        PriorityClass::BestEffort,
    );
    let no_rate = SchedConfig {
        rate: None,
        ..SchedConfig::default()
    };

    // SRTF: the current job leaves mid-iteration; the next job takes over at once.
    let job = |id, ms| ClientSpec {
        job: Some(JobProfile {
            remaining_ns_estimate: ms * MS,
            ..JobProfile::default()
        }),
        ..spec(id, n)
    };
    let mut d = dispatcher(PolicyKind::Srtf, no_rate, &[job(1, 1), job(2, 10)]);
    d.submit(1, k(10), 0).expect("client is registered");
    d.submit(2, k(10), 0).expect("client is registered");
    assert_eq!(
        d.poll(0).iter().map(|g| g.client).collect::<Vec<_>>(),
        vec![1]
    );
    d.remove_client(1).expect("client is registered");
    assert_eq!(
        d.poll(1).iter().map(|g| g.client).collect::<Vec<_>>(),
        vec![2]
    );

    // Priority: the high client leaves with a kernel in flight; held best-effort work runs.
    let mut d = dispatcher(PolicyKind::Priority, no_rate, &[spec(1, h), spec(2, be)]);
    d.submit(1, kernel(1, 100, 100, Bound::Compute), 0)
        .expect("client is registered");
    d.submit(2, kernel(2, 100, 100, Bound::Compute), 0)
        .expect("client is registered");
    assert_eq!(d.poll(0).len(), 1);
    d.remove_client(1).expect("client is registered");
    assert_eq!(
        d.poll(1).iter().map(|g| g.client).collect::<Vec<_>>(),
        vec![2]
    );

    // Fair with one request in flight at a time: the holder leaves.
    let mut d = dispatcher(PolicyKind::Fair, no_rate, &[spec(1, n), spec(2, n)]);
    d.submit(1, k(10), 0).expect("client is registered");
    d.submit(2, k(10), 0).expect("client is registered");
    assert_eq!(d.poll(0).len(), 1);
    d.remove_client(1).expect("client is registered");
    assert_eq!(
        d.poll(1).iter().map(|g| g.client).collect::<Vec<_>>(),
        vec![2]
    );
    assert_eq!(d.backlog(), (0, 1));

    // Admission: the job holding the memory leaves; the waiter is admitted and runs.
    let big = |id| ClientSpec {
        job: Some(JobProfile {
            persistent_bytes: 6 << 30,
            ephemeral_bytes: 2 << 30,
            ..JobProfile::default()
        }),
        ..spec(id, n)
    };
    let mut d = dispatcher(
        PolicyKind::Pack,
        SchedConfig {
            memory_capacity: Some(10 << 30),
            ..no_rate
        },
        &[big(1), big(2)],
    );
    d.submit(2, k(10), 0).expect("client is registered");
    assert!(d.poll(0).is_empty());
    assert!(!d.stats(2).expect("client is registered").admitted);
    d.remove_client(1).expect("client is registered");
    assert!(d.stats(2).expect("client is registered").admitted);
    assert_eq!(d.poll(1).len(), 1);

    // A partitioned client leaves with partition SMs in flight; the others get them back.
    let dl = ClientSpec {
        deadline: Some(DeadlineSpec {
            period_ns: MS,
            deadline_ns: MS,
        }),
        ..spec(1, n)
    };
    let mut d = dispatcher(PolicyKind::Fifo, no_rate, &[dl, spec(2, be), spec(3, be)]);
    d.submit(1, k(10), 0).expect("client is registered");
    d.iteration_boundary(1, 5 * MS)
        .expect("client is registered"); // a miss: the share halves
    d.submit(2, k(10), 5 * MS).expect("client is registered");
    d.submit(3, k(10), 5 * MS).expect("client is registered");
    let g = d.poll(5 * MS);
    assert_eq!(g.len(), 2); // client 1's kernel and one partitioned one: the partition is full
    assert_eq!(g[1].sm_limit, Some(66));
    d.remove_client(g[1].client).expect("client is registered");
    assert_eq!(d.poll(5 * MS + 1).len(), 1);
}

#[test]
fn set_policy_at_run_time_keeps_queues() {
    let n = PriorityClass::Normal;
    let mut d = dispatcher(
        PolicyKind::Fair,
        SchedConfig::default(),
        &[spec(1, n), spec(2, n)],
    );
    for t in 0..5 {
        d.submit(1, k(10), t).expect("client is registered");
        d.submit(2, k(10), t).expect("client is registered");
    }
    let first = d.poll(5);
    assert_eq!(first.len(), 1); // FAIR: one in flight
    d.set_policy(PolicyKind::Fifo);
    assert_eq!(d.policy_kind(), PolicyKind::Fifo);
    let more = d.poll(6);
    assert_eq!(more.len(), 3); // stream depth 2 each
    assert_eq!(d.backlog(), (6, 4));
    // Drain everything under a third policy: every request is granted exactly once.
    d.set_policy(PolicyKind::Priority);
    let mut inflight: Vec<Grant> = first.into_iter().chain(more).collect();
    let mut granted = inflight.len();
    let mut now = 10;
    while let Some(g) = inflight.pop() {
        d.complete(g.client, g.request, Some(10 * US), now)
            .expect("request is in flight");
        let new = d.poll(now);
        granted += new.len();
        inflight.extend(new);
        now += 10;
    }
    assert_eq!(granted, 10);
    assert_eq!(d.backlog(), (0, 0));
}

#[test]
fn jobs_that_do_not_fit_wait_and_oversized_ones_are_refused() {
    let job = |id, gib: u64| ClientSpec {
        job: Some(JobProfile {
            remaining_ns_estimate: MS,
            persistent_bytes: gib << 30,
            ephemeral_bytes: 0,
        }),
        ..spec(id, PriorityClass::Normal)
    };
    let cfg = SchedConfig {
        memory_capacity: Some(16 << 30),
        ..SchedConfig::default()
    };
    let mut d = dispatcher(
        PolicyKind::Pack,
        cfg,
        &[job(1, 10), job(2, 4), job(3, 8), job(4, 1)],
    );
    assert!(matches!(
        d.add_client(job(5, 17)),
        Err(SchedError::TooLarge { client: 5, .. })
    ));
    for id in 1..=4 {
        d.submit(id, k(10), 0).expect("client is registered");
    }
    // 1 and 2 fit (14 GiB); 3 waits, and 4 queues behind it although 1 GiB would fit.
    let mut g: Vec<_> = d.poll(0).iter().map(|g| g.client).collect();
    g.sort_unstable();
    assert_eq!(g, vec![1, 2]);
    // Learned: 2 really holds 1 GiB; now 3 fits (10 + 1 + 8 ≤ 16 → no: 19) — still waits.
    d.observe_memory(2, 1 << 30).expect("client is registered");
    assert!(!d.stats(3).expect("client is registered").admitted);
    d.remove_client(1).expect("client is registered");
    let mut g: Vec<_> = d.poll(1).iter().map(|g| g.client).collect();
    g.sort_unstable();
    assert_eq!(g, vec![3, 4]);
}

#[test]
fn iteration_boundaries_report_latency_and_deadline_misses() {
    let dl = ClientSpec {
        deadline: Some(DeadlineSpec {
            period_ns: 10 * MS,
            deadline_ns: 3 * MS,
        }),
        ..spec(1, PriorityClass::High)
    };
    let mut d = dispatcher(PolicyKind::Fifo, SchedConfig::default(), &[dl]);
    assert_eq!(
        d.iteration_boundary(1, 0).expect("client is registered"),
        None
    );
    let r = d.submit(1, k(10), MS).expect("client is registered");
    d.poll(MS);
    d.complete(1, r, Some(2 * MS), 3 * MS)
        .expect("request is in flight");
    let rep = d
        .iteration_boundary(1, 3 * MS)
        .expect("client is registered");
    assert_eq!(
        rep,
        Some(IterationReport {
            latency_ns: 2 * MS,
            deadline_missed: false
        })
    );
    let r = d.submit(1, k(10), 10 * MS).expect("client is registered");
    d.poll(10 * MS);
    d.complete(1, r, Some(4 * MS), 14 * MS)
        .expect("request is in flight");
    let rep = d
        .iteration_boundary(1, 14 * MS)
        .expect("client is registered");
    assert!(rep.is_some_and(|r| r.deadline_missed));
    let s = d.stats(1).expect("client is registered");
    assert_eq!(s.deadline_misses, 1);
    assert_eq!(s.gpu_ns, 6 * MS);
    // Measured times taught the profile table (the kernel ran alone: solo samples).
    let learned = d.profiles().get(k(10).key).map(|p| p.est_ns);
    assert_eq!(learned, Some(2_400_000)); // EWMA 0.2: 2 ms then 4 ms
}

/// Random scripts: up to five clients of random class, weight, job, deadline, arrivals and
/// kernels, some leaving early, some outside load.
fn scripts() -> impl Strategy<Value = (Vec<ClientScript>, Option<(u64, f64)>)> {
    let bound = prop_oneof![
        Just(Bound::Compute),
        Just(Bound::Memory),
        Just(Bound::Unknown)
    ];
    let kern = (1u64..400, 1u32..=132, bound);
    let class = prop_oneof![
        Just(PriorityClass::High),
        Just(PriorityClass::Normal),
        Just(PriorityClass::BestEffort)
    ];
    let arrivals = prop_oneof![
        (0u64..2_000).prop_map(|t| Arrivals::Closed { think_ns: t * US }),
        (100u64..3_000).prop_map(|p| Arrivals::Periodic { period_ns: p * US }),
        (100u64..3_000).prop_map(|m| Arrivals::Poisson {
            mean_gap_ns: m * US
        }),
    ];
    let client = (
        class,
        1u32..5,
        proptest::option::of((1u64..50, 0u64..=1_000)),
        proptest::option::of((1u64..5, 1u64..5)),
        0u64..5_000,
        proptest::option::weighted(0.2, 1u64..30),
        arrivals,
        proptest::collection::vec(kern, 1..4),
        1u64..8,
    );
    (
        proptest::collection::vec(client, 1..=5),
        proptest::option::weighted(0.3, (0u64..20, 0.0f64..0.9)),
    )
        .prop_map(|(clients, outside)| {
            let scripts = clients
                .into_iter()
                .enumerate()
                .map(
                    |(i, (class, weight, job, deadline, start, leave, arrivals, ks, iters))| {
                        let id = i as u64 + 1;
                        let spec = ClientSpec {
                            id,
                            class,
                            weight,
                            job: job.map(|(ms, bytes)| JobProfile {
                                remaining_ns_estimate: ms * MS,
                                persistent_bytes: bytes / 2,
                                ephemeral_bytes: bytes - bytes / 2,
                            }),
                            deadline: deadline.map(|(p, d)| DeadlineSpec {
                                period_ns: p * MS,
                                deadline_ns: d * MS,
                            }),
                            // Two GPU contexts (two trust domains), alternating.
                            context: id % 2,
                            // Three users.
                            account: crate::sched::user_account((id % 3) as u32),
                        };
                        ClientScript {
                            spec,
                            start_ns: start * US,
                            leave_ns: leave.map(|ms| start * US + ms * MS),
                            arrivals,
                            iteration: ks
                                .into_iter()
                                .enumerate()
                                .map(|(j, (us, sms, b))| kernel(id * 10 + j as u64, us, sms, b))
                                .collect(),
                            iterations: Some(iters),
                        }
                    },
                )
                .collect();
            (scripts, outside.map(|(ms, f)| (ms * MS, f)))
        })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    /// Every request submitted is eventually granted, under every policy: clients that stay
    /// finish all their iterations, and nothing is left queued.
    #[test]
    fn no_policy_starves_a_client(
        (scripts, outside) in scripts(),
        sm_partitions in proptest::bool::ANY,
    ) {
        for policy in PolicyKind::ALL {
            let cfg = SimConfig {
                sched: SchedConfig {
                    memory_capacity: Some(1_000),
                    ..SchedConfig::default()
                },
                horizon_ns: 60_000 * MS,
                // Without partitions, partitioned clients are paced instead.
                sm_partitions,
                ..SimConfig::default()
            };
            let mut sim = Simulation::new(cfg, policy, scripts.clone());
            if let Some((at, f)) = outside {
                sim.set_outside_load_at(at, f);
            }
            let r = sim.run();
            for c in &r.clients {
                if c.left_early {
                    continue;
                }
                let want = scripts.iter().find(|s| s.spec.id == c.id).and_then(|s| s.iterations);
                prop_assert_eq!(Some(c.iterations), want, "{} under {}", c.id, policy);
                prop_assert_eq!(c.granted, c.submitted, "{} under {}", c.id, policy);
            }
        }
    }
}
