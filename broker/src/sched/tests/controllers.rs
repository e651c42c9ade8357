//! The dispatcher's controllers in closed loop with the simulator: TGS rate control, and
//! CudaMon deadlines with SM partitions and without.

use super::*;

#[test]
fn rate_control_keeps_high_near_solo_and_backs_off_under_outside_load() {
    // High: back-to-back 200 µs kernels on 100 SMs. Best-effort: 100 µs kernels of 64 blocks:
    // beside high they oversubscribe the SMs (164 of 132), slowing high by a fifth.
    let high = ClientScript::new(
        spec(1, PriorityClass::High),
        vec![kernel(1, 200, 100, Bound::Compute)],
    );
    let be = ClientScript::new(
        spec(2, PriorityClass::BestEffort),
        vec![kernel(2, 100, 64, Bound::Compute)],
    );
    let rate = RateConfig {
        period_ns: 10 * MS,
        ..RateConfig::default()
    };
    let run = |rate: Option<RateConfig>, scripts: Vec<ClientScript>, outside: bool| {
        let cfg = SimConfig {
            sched: SchedConfig {
                rate,
                ..SchedConfig::default()
            },
            horizon_ns: 3_000 * MS,
            ..SimConfig::default()
        };
        let mut sim = Simulation::new(cfg, PolicyKind::Fifo, scripts);
        if outside {
            sim.set_outside_load_at(2_000 * MS, 0.3);
        }
        sim.run_until(1_999 * MS);
        let limit = sim.dispatcher().stats(2).and_then(|s| s.rate_limit);
        sim.run_until(2_999 * MS);
        let limit_outside = sim.dispatcher().stats(2).and_then(|s| s.rate_limit);
        (sim.report(), limit, limit_outside)
    };
    let (solo, _, _) = run(Some(rate), vec![high.clone()], false);
    let (free, _, _) = run(None, vec![high.clone(), be.clone()], false);
    let (tgs, limit, limit_outside) = run(Some(rate), vec![high, be], true);
    let thr = |r: &simulate::SimReport, id, from, to| {
        r.client(id)
            .map_or(0.0, |c| c.throughput(from * MS, to * MS))
    };
    let solo_rate = thr(&solo, 1, 1_000, 2_000);
    let (h_free, b_free) = (thr(&free, 1, 1_000, 2_000), thr(&free, 2, 1_000, 2_000));
    let (h_tgs, b_tgs) = (thr(&tgs, 1, 1_000, 2_000), thr(&tgs, 2, 1_000, 2_000));
    let b_outside = thr(&tgs, 2, 2_200, 3_000);
    println!(
        "rate control: high {:.0}/s solo; unlimited best-effort: high {:.3}× solo, be {b_free:.0} kernels/s; \
         TGS: high {:.3}× solo, be {b_tgs:.0} kernels/s (limit {:.0} blocks/s); with 30 % outside load: \
         be {b_outside:.0} kernels/s (limit {:.0} blocks/s)",
        solo_rate,
        h_free / solo_rate,
        h_tgs / solo_rate,
        limit.unwrap_or(0.0),
        limit_outside.unwrap_or(0.0),
    );
    assert!(h_free / solo_rate < 0.85);
    // Within the 5 % tolerance, give or take the sawtooth's overshoot.
    assert!(h_tgs / solo_rate > 0.94, "{}", h_tgs / solo_rate);
    assert!(b_tgs > 0.1 * b_free);
    assert!(b_outside < 0.7 * b_tgs);
    assert!(limit_outside.unwrap_or(f64::MAX) < 0.7 * limit.unwrap_or(0.0));
}

/// What one run of the deadline scenario showed.
struct DeadlineRun {
    /// When (ms) the deadline client's iterations that missed ended.
    misses_at: Vec<u64>,
    iterations: u64,
    /// The best-effort client's SM share while the deadline client was there, and 200 ms
    /// after it left.
    share_during: Option<f64>,
    share_after: Option<f64>,
    be_done: u64,
}

/// Deadline client: every 5 ms, six 500 µs whole-GPU kernels (3 ms solo), deadline 4 ms,
/// leaving at 300 ms. Best-effort: back-to-back 1 ms whole-GPU kernels. Sharing SMs equally,
/// the deadline client would take 6 ms.
fn deadline_scenario(sm_partitions: bool) -> DeadlineRun {
    let dl = ClientScript {
        arrivals: Arrivals::Periodic { period_ns: 5 * MS },
        leave_ns: Some(300 * MS),
        ..ClientScript::new(
            ClientSpec {
                deadline: Some(DeadlineSpec {
                    period_ns: 5 * MS,
                    deadline_ns: 4 * MS,
                }),
                ..spec(1, PriorityClass::Normal)
            },
            vec![kernel(1, 500, 132, Bound::Compute); 6],
        )
    };
    let be = ClientScript::new(
        spec(2, PriorityClass::BestEffort),
        vec![kernel(2, 1_000, 132, Bound::Compute)],
    );
    let cfg = SimConfig {
        sched: SchedConfig {
            max_inflight_per_client: 1,
            rate: None,
            deadline: DeadlineConfig {
                period_ns: 5 * MS,
                ..DeadlineConfig::default()
            },
            ..SchedConfig::default()
        },
        horizon_ns: 500 * MS,
        sm_partitions,
        ..SimConfig::default()
    };
    let mut sim = Simulation::new(cfg, PolicyKind::Fifo, vec![dl, be]);
    sim.run_until(299 * MS);
    let share_during = sim.dispatcher().stats(2).map(|s| s.sm_share);
    let r = sim.report();
    let c = r.client(1).cloned().unwrap_or_default();
    let misses_at: Vec<u64> = c
        .latencies_ns
        .iter()
        .zip(&c.iteration_ends)
        .filter(|(l, _)| **l > 4 * MS)
        .map(|(_, t)| t / MS)
        .collect();
    let be_done = r.client(2).map_or(0, |c| c.completed);
    sim.run_until(500 * MS);
    let run = DeadlineRun {
        misses_at,
        iterations: c.iterations,
        share_during,
        share_after: sim.dispatcher().stats(2).map(|s| s.sm_share),
        be_done,
    };
    println!(
        "deadline ({}): misses at {:?} ms of {} iterations, none after; best-effort share {:.3} with the \
         deadline client ({} kernels done), {:.3} 200 ms after it left",
        if sm_partitions {
            "SM partitions"
        } else {
            "no SM partitions: paced"
        },
        run.misses_at,
        run.iterations,
        run.share_during.unwrap_or(0.0),
        run.be_done,
        run.share_after.unwrap_or(0.0)
    );
    run
}

/// Misses at first, none after 150 ms; best-effort cut below half yet progressing; the whole
/// device back once the deadline client left.
fn assert_recovers(run: &DeadlineRun) {
    assert!(!run.misses_at.is_empty());
    assert!(
        run.misses_at.iter().all(|&t| t < 150),
        "{:?}",
        run.misses_at
    );
    assert!(run.share_during.is_some_and(|s| s < 0.5));
    assert!(run.be_done > 20, "best-effort work still progresses");
    assert_eq!(run.share_after, Some(1.0));
}

#[test]
fn deadline_partitions_recover_from_misses_and_grow_back() {
    assert_recovers(&deadline_scenario(true));
}

/// Where the device cannot partition SMs (the sim device, a GPU without green contexts), the
/// same controller holds the lower clients by rate control: their kernels run on the whole
/// device, paced to the share's SM-time, and the deadline client's misses stop as well.
#[test]
fn without_sm_partitions_rate_control_holds_the_share_and_deadlines_recover() {
    assert_recovers(&deadline_scenario(false));
}
