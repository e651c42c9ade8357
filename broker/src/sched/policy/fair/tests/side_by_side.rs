//! FAIR side by side (and sharing SMs) in the scheduler's model: weights kept while programs
//! run at once, measured device time charged, shares by user, and who is hungry.

use super::{MS, gpu_shares, weighted};
use crate::sched::policy::fair::{Bounds, FairConfig};
use crate::sched::simulate::{Arrivals, SimConfig, SimReport, Simulation, kernel};
use crate::sched::{Bound, PolicyKind, SchedConfig};

/// The model with FAIR's `fair` tunables, `depth` kernels in flight per client and a 20 µs
/// completion round trip.
fn model_cfg(fair: FairConfig, horizon_ns: u64, depth: u32) -> SimConfig {
    SimConfig {
        horizon_ns,
        observe_ns: 20_000,
        sched: SchedConfig {
            fair,
            max_inflight_per_client: depth,
            ..SchedConfig::default()
        },
        ..SimConfig::default()
    }
}

/// The model with FAIR's 1 ms quantum, side by side or in turns.
fn quantum_cfg(side_by_side: bool, horizon_ns: u64, depth: u32) -> SimConfig {
    let fair = FairConfig {
        side_by_side,
        quantum_ns: MS,
        ..FairConfig::default()
    };
    model_cfg(fair, horizon_ns, depth)
}

/// Four programs of 100 µs kernels on 48 SMs, one stream each, weights 1 : 2 : 3 : 2, with a
/// 20 µs completion round trip.
fn narrow_programs(policy: PolicyKind, fair: FairConfig) -> SimReport {
    let scripts = weighted(&[1, 2, 3, 2], |id| {
        vec![kernel(id, 100, 48, Bound::Compute)]
    });
    Simulation::new(model_cfg(fair, 400 * MS, 8), policy, scripts).run()
}

/// Side by side: four programs of narrow kernels (48 of 132 SMs: two fit at once, four
/// oversubscribe the GPU), weights 1 : 2 : 3 : 2. FIFO runs them all at once and gives
/// each the same; side by side their work follows the weights (charged by their kernels'
/// solo time: a kernel that shared the GPU is charged its estimate) at more than twice
/// what exclusive 1 ms turns get done. Not FIFO's total: the weight-3 program, one kernel
/// at a time on 48 SMs, cannot take 3/8 of FIFO's work, and the others are held to
/// their weights beside it.
#[test]
fn side_by_side_keeps_the_weights_and_runs_programs_at_once() {
    let run = |policy: PolicyKind, side_by_side: bool| {
        let fair = FairConfig {
            side_by_side,
            quantum_ns: MS,
            ..FairConfig::default()
        };
        narrow_programs(policy, fair)
    };
    let iterations = |r: &SimReport| r.clients.iter().map(|c| c.iterations).collect::<Vec<_>>();
    let work = |r: &SimReport| r.clients.iter().map(|c| c.iterations).sum::<u64>() as f64;
    let side = run(PolicyKind::Fair, true);
    let turns = run(PolicyKind::Fair, false);
    let fifo = run(PolicyKind::Fifo, false);
    println!(
        "fair side by side: iterations {:?} for weights 1:2:3:2, {:.3} × FIFO's {:?}; exclusive 1 ms turns {:.3} × FIFO's",
        iterations(&side),
        work(&side) / work(&fifo),
        iterations(&fifo),
        work(&turns) / work(&fifo),
    );
    for (c, weight) in side.clients.iter().zip([1.0, 2.0, 3.0, 2.0]) {
        let share = c.iterations as f64 / work(&side);
        assert!(
            (share / (weight / 8.0) - 1.0).abs() < 0.05,
            "{:?}",
            iterations(&side)
        );
    }
    assert!(work(&side) > 2.0 * work(&turns));
}

/// Side by side, with kernels that slow each other unevenly: a program of narrow
/// compute-bound kernels (weight 1) beside two programs of memory-bound kernels on half the
/// GPU (weights 1 and 2), which halve each other's speed when they overlap and hardly touch
/// the first. A kernel's estimate (its solo time) is then far from the device time it takes
/// (what `status` shows); charged the measured time, the device time follows the weights,
/// while more gets done than in exclusive turns.
#[test]
fn side_by_side_charges_measured_device_time() {
    let solo = |id: u64| if id == 1 { 200 } else { 100 };
    let scripts = || {
        weighted(&[1, 1, 2], |id| match id {
            1 => vec![kernel(id, solo(id), 8, Bound::Compute)],
            _ => vec![kernel(id, solo(id), 66, Bound::Memory)],
        })
    };
    let run = |policy: PolicyKind, side_by_side: bool| {
        Simulation::new(quantum_cfg(side_by_side, 400 * MS, 8), policy, scripts()).run()
    };
    // Work done: kernels completed, at their solo times.
    let work = |r: &SimReport| -> f64 {
        r.clients
            .iter()
            .map(|c| (c.completed * solo(c.id)) as f64)
            .sum()
    };
    let side = run(PolicyKind::Fair, true);
    let turns = run(PolicyKind::Fair, false);
    let fifo = run(PolicyKind::Fifo, false);
    let (got, _) = gpu_shares(&side);
    println!(
        "fair side by side, uneven slowdowns: device-time shares {got:.3?} for weights 1:1:2, work {:.3} x FIFO's (turns {:.3} x; FIFO's shares {:.3?})",
        work(&side) / work(&fifo),
        work(&turns) / work(&fifo),
        gpu_shares(&fifo).0,
    );
    for (s, want) in got.iter().zip([0.25, 0.25, 0.5]) {
        assert!((s / want - 1.0).abs() < 0.05, "shares {got:?}");
    }
    assert!(work(&side) > work(&turns));
}

/// Side by side is work-conserving: two programs of narrow kernels that fit on the GPU
/// together (48 SMs each of 132), weights 1 : 3, are never held, since holding the one ahead
/// would leave its SMs idle and give the other nothing: each gets as much done as under FIFO.
/// Weights divide the GPU only where kernels compete for it (the tests above).
#[test]
fn side_by_side_holds_nobody_whose_kernels_fit_beside_the_others() {
    let scripts = || weighted(&[1, 3], |id| vec![kernel(id, 100, 48, Bound::Compute)]);
    let run = |policy: PolicyKind| {
        Simulation::new(quantum_cfg(true, 200 * MS, 8), policy, scripts()).run()
    };
    let side = run(PolicyKind::Fair);
    let fifo = run(PolicyKind::Fifo);
    let done = |r: &SimReport| r.clients.iter().map(|c| c.completed).collect::<Vec<_>>();
    println!(
        "fair side by side, kernels that fit together: completed {:?} for weights 1:3 (FIFO {:?})",
        done(&side),
        done(&fifo)
    );
    for (s, f) in done(&side).iter().zip(done(&fifo)) {
        assert!(
            *s as f64 >= 0.98 * f as f64,
            "{:?} against FIFO's {:?}",
            done(&side),
            done(&fifo)
        );
    }
}

/// Side by side, a newcomer gets its share at once: two clients of 1 ms kernels as wide as
/// the GPU, each allowed 64 kernels in flight (as gpushared allows), then a third of weight 2
/// joins. It is owed FAIR's lag (20 ms of GPU time) and gets it at once; over the 100 ms from
/// 30 ms after it joined, device time divides by the weights: the first two keep no more than
/// a quantum queued, where a full stream's depth of their kernels (64 ms) would run on beside
/// the newcomer whatever the policy decided.
#[test]
fn side_by_side_gives_a_newcomer_its_share_within_a_quantum() {
    // Iterations of 100 kernels: each client always has plenty queued.
    let mut scripts = weighted(&[1, 1, 2], |id| {
        vec![kernel(id, 1000, 132, Bound::Compute); 100]
    });
    scripts[2].start_ns = 100 * MS;
    let mut sim = Simulation::new(quantum_cfg(true, 300 * MS, 64), PolicyKind::Fair, scripts);
    let gpu_ns = |r: &SimReport| [1, 2, 3].map(|id| r.client(id).map_or(0, |c| c.gpu_ns));
    sim.run_until(130 * MS);
    let before = gpu_ns(&sim.report());
    sim.run_until(230 * MS);
    let after = gpu_ns(&sim.report());
    let got = [0, 1, 2].map(|i| after[i] - before[i]);
    let total: u64 = got.iter().sum();
    let shares = got.map(|t| t as f64 / total as f64);
    println!(
        "fair side by side, a newcomer of weight 2: device-time shares {shares:.3?} 30-130 ms after it joined (weights 1:1:2)"
    );
    for (s, want) in shares.iter().zip([0.25, 0.25, 0.5]) {
        assert!((s / want - 1.0).abs() < 0.05, "shares {shares:.3?}");
    }
}

/// `per_user`: shares belong to users. User A runs three programs and user B one, all of
/// weight 1, kernels that compete for the whole GPU: by program each gets a quarter (A three
/// quarters); by user A's three together get half, as B's one does, with as much done.
#[test]
fn per_user_shares_divide_the_gpu_among_users_not_programs() {
    let run = |per_user: bool| {
        let mut scripts = weighted(&[1, 1, 1, 1], |id| {
            vec![kernel(id, 200, 132, Bound::Compute); 10]
        });
        for (s, user) in scripts.iter_mut().zip([7, 7, 7, 8]) {
            s.spec.account = crate::sched::user_account(user);
        }
        let mut cfg = quantum_cfg(true, 300 * MS, 64);
        cfg.sched.fair.per_user = per_user;
        Simulation::new(cfg, PolicyKind::Fair, scripts).run()
    };
    let user_a = |r: &SimReport| {
        let (shares, _) = gpu_shares(r);
        shares[..3].iter().sum::<f64>()
    };
    let (by_program, by_user) = (run(false), run(true));
    let done = |r: &SimReport| r.clients.iter().map(|c| c.completed).sum::<u64>();
    println!(
        "fair per user: user A (3 programs) {:.3} of the GPU by program, {:.3} by user; kernels done {} and {}",
        user_a(&by_program),
        user_a(&by_user),
        done(&by_program),
        done(&by_user)
    );
    assert!((user_a(&by_program) - 0.75).abs() < 0.0375);
    assert!((user_a(&by_user) - 0.5).abs() < 0.025);
    assert!(done(&by_user) as f64 >= 0.98 * done(&by_program) as f64);
}

/// `share_sms`: four programs of 48-SM kernels (two or three fit side by side), weights
/// 1 : 2 : 3 : 2, each one stream. Their SM·time follows the weights, and they get more
/// done than one kernel at a time, which leaves the rest of the GPU idle.
#[test]
fn sharing_sms_keeps_the_weights_in_sm_time_and_runs_kernels_side_by_side() {
    let run = |share_sms: bool| {
        let fair = FairConfig {
            share_sms,
            ..FairConfig::default()
        };
        narrow_programs(PolicyKind::Fair, fair)
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

/// Side by side with `hungry_ns`: two programs with work always waiting on the device (ten
/// 500 µs kernels on 124 of 132 SMs an iteration), weights `w[0]` and `w[1]`, beside a program
/// of weight `w[2]` held back by its own CPU loop (a 10 µs kernel on 8 SMs, then 40 µs of
/// thinking). Device-time shares and kernels done, then FIFO's kernels done on the same
/// programs.
fn beside_a_cpu_loop(w: [u32; 3], hungry_ns: u64) -> (Vec<f64>, Vec<u64>, Vec<u64>) {
    beside_a_loop(w, 8, hungry_ns, 0)
}

/// [`beside_a_cpu_loop`], the loop's kernel on `loop_sms` SMs, and `waited_ns`.
fn beside_a_loop(
    w: [u32; 3],
    loop_sms: u32,
    hungry_ns: u64,
    waited_ns: u64,
) -> (Vec<f64>, Vec<u64>, Vec<u64>) {
    let scripts = || {
        let mut s = weighted(&w, |id| match id {
            3 => vec![kernel(id, 10, loop_sms, Bound::Compute)],
            _ => vec![kernel(id, 500, 124, Bound::Compute); 10],
        });
        s[2].arrivals = Arrivals::Closed { think_ns: 40_000 };
        s
    };
    let fair = FairConfig {
        side_by_side: true,
        quantum_ns: MS,
        hungry_ns,
        waited_ns,
        ..FairConfig::default()
    };
    let run = |policy| Simulation::new(model_cfg(fair, 400 * MS, 64), policy, scripts()).run();
    let done = |r: &SimReport| r.clients.iter().map(|c| c.completed).collect::<Vec<_>>();
    let (side, fifo) = (run(PolicyKind::Fair), run(PolicyKind::Fifo));
    (gpu_shares(&side).0, done(&side), done(&fifo))
}

/// With `hungry_ns`, the CPU loop's slow pace of device time no longer bounds the lead of
/// those of its weight: it gets what it asks for, the two with work waiting divide the rest by
/// weight, and at equal weights they get as much done as under FIFO (without it they are held
/// to the loop's pace). A loop of a greater weight holds them as before: unequal weights ask
/// for the split.
#[test]
fn side_by_side_holds_nobody_for_a_program_its_cpu_loop_holds_back() {
    let (_, held, fifo) = beside_a_cpu_loop([1, 1, 1], 0);
    let (shares, done, _) = beside_a_cpu_loop([1, 1, 1], 200_000);
    println!(
        "fair side by side beside a CPU loop: done {done:?} with hungry_ns, {held:?} without (FIFO {fifo:?}); shares {shares:.3?}"
    );
    for i in 0..3 {
        assert!(
            done[i] as f64 >= 0.98 * fifo[i] as f64,
            "{done:?} against FIFO's {fifo:?}"
        );
    }
    assert!(
        done[0] + done[1] > held[0] + held[1],
        "{done:?} against {held:?}"
    );
    let (shares, done, _) = beside_a_cpu_loop([1, 3, 1], 200_000);
    let heavy = shares[1] / (shares[0] + shares[1]);
    println!("the same at weights 1 : 3: shares {shares:.3?}, done {done:?}");
    assert!((heavy / 0.75 - 1.0).abs() < 0.05, "shares {shares:.3?}");
    assert!(
        done[2] as f64 >= 0.95 * fifo[2] as f64,
        "{done:?} against FIFO's {fifo:?}"
    );
    let (_, heavy_loop, _) = beside_a_cpu_loop([1, 1, 3], 200_000);
    let (_, before, _) = beside_a_cpu_loop([1, 1, 3], 0);
    println!("a loop of weight 3: done {heavy_loop:?} with hungry_ns, {before:?} without");
    assert_eq!(heavy_loop, before);
}

/// With `waited_ns` too, a loop whose kernels run as soon as they come (they fit beside the
/// others') is never hungry: it holds nobody, as by estimates alone. (The model shares SMs
/// among the kernels that come, so no kernel waits behind another's here: that case is the
/// end-to-end test
/// `with_waited_us_a_loop_is_held_for_only_while_its_kernels_wait_behind_a_busy_client`, on
/// the sim device.)
#[test]
fn with_waited_ns_a_loop_whose_kernels_run_at_once_still_holds_nobody() {
    for w in [[1, 1, 1], [1, 3, 1]] {
        let (shares, done, _) = beside_a_loop(w, 8, 200_000, 200_000);
        let (shares_before, done_before, _) = beside_a_cpu_loop(w, 200_000);
        assert_eq!(
            (done, shares),
            (done_before, shares_before),
            "weights {w:?}"
        );
    }
}

/// A hungry client bounds everyone's lead; one with nothing waiting only that of the clients
/// of a lesser weight than its own.
#[test]
fn a_client_with_nothing_waiting_bounds_only_lighter_clients() {
    let idle_by_weight = [(3, 10.0), (1, 5.0)];
    let bounds = Bounds {
        hungry: 20.0,
        idle_by_weight: &idle_by_weight,
    };
    assert_eq!(
        bounds.of(1),
        10.0,
        "the idle weight-3 client bounds a weight-1 one"
    );
    assert_eq!(bounds.of(2), 10.0);
    assert_eq!(
        bounds.of(3),
        20.0,
        "equals and lighter ones with nothing waiting do not"
    );
    let nobody = Bounds {
        hungry: f64::INFINITY,
        idle_by_weight: &[],
    };
    assert_eq!(nobody.of(1), f64::INFINITY, "nobody hungry: nobody is held");
}
