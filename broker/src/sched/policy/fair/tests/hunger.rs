//! Without `bank_unused`: a program that turns hungry after a phase of not being hungry is
//! owed nothing for that phase, so it does not hold its peers back for it.

use super::{MS, gpu_shares, weighted};
use crate::sched::policy::fair::FairConfig;
use crate::sched::simulate::{Arrivals, SimConfig, SimReport, Simulation, kernel};
use crate::sched::{Bound, PolicyKind, SchedConfig};

/// Two trainers whose steps are four 500 µs kernels on nearly the whole GPU (hungry, each step
/// waited for), and two programs that think 6 ms (longer than the quantum) between bursts of
/// sixty 100 µs kernels on 16 SMs, weights `w`, under `policy`; FAIR side by side with a 5 ms
/// quantum and `hungry_ns` = 1 ms.
fn trainers_beside_bursts(w: [u32; 4], policy: PolicyKind, bank_unused: bool) -> SimReport {
    let mut scripts = weighted(&w, |id| match id {
        1 | 2 => vec![kernel(id, 500, 124, Bound::Compute); 4],
        _ => vec![kernel(id, 100, 16, Bound::Compute); 60],
    });
    for s in &mut scripts[2..] {
        s.arrivals = Arrivals::Closed { think_ns: 6 * MS };
    }
    Simulation::new(trainers_cfg(bank_unused), policy, scripts).run()
}

/// 400 ms of the model with a 20 µs completion round trip, FAIR side by side with a 5 ms
/// quantum and `hungry_ns` = 1 ms.
fn trainers_cfg(bank_unused: bool) -> SimConfig {
    let fair = FairConfig {
        side_by_side: true,
        quantum_ns: 5 * MS,
        hungry_ns: MS,
        bank_unused,
        ..FairConfig::default()
    };
    SimConfig {
        horizon_ns: 400 * MS,
        observe_ns: 20_000,
        sched: SchedConfig {
            fair,
            max_inflight_per_client: 64,
            ..SchedConfig::default()
        },
        ..SimConfig::default()
    }
}

fn done(r: &SimReport) -> Vec<u64> {
    r.clients.iter().map(|c| c.completed).collect()
}

/// At equal weights the bursty programs use less of the GPU than the trainers (they think), so
/// by their use they fall behind. Banking that, each burst finds the trainers far ahead and
/// holds them until it is no longer hungry: the bursts do more than under FIFO (their kernels
/// wait behind the trainers' here, so holding the trainers speeds them) and the trainers less.
/// Owed nothing for its thinking, a burst starts level with the trainers, and all four do what
/// they do under FIFO.
#[test]
fn a_burst_after_a_phase_of_not_being_hungry_holds_nobody_back_without_banking() {
    let fifo = done(&trainers_beside_bursts([1; 4], PolicyKind::Fifo, true));
    let banked = done(&trainers_beside_bursts([1; 4], PolicyKind::Fair, true));
    let level = done(&trainers_beside_bursts([1; 4], PolicyKind::Fair, false));
    println!("kernels done: FIFO {fifo:?}, banking {banked:?}, level {level:?}");
    let trainers = |d: &[u64]| (d[0] + d[1]) as f64;
    let bursts = |d: &[u64]| (d[2] + d[3]) as f64;
    assert!(
        trainers(&banked) < 0.9 * trainers(&fifo) && bursts(&banked) > 1.1 * bursts(&fifo),
        "banking: {banked:?} against FIFO {fifo:?}"
    );
    for (kind, of) in [
        ("trainers", trainers as fn(&[u64]) -> f64),
        ("bursts", bursts),
    ] {
        assert!(
            (of(&level) / of(&fifo) - 1.0).abs() < 0.03,
            "the {kind} without banking: {level:?} against FIFO {fifo:?}"
        );
    }
}

/// Unequal weights still divide the GPU between the trainers, which are always hungry, with
/// banking or without.
#[test]
fn without_banking_the_weights_still_divide_the_gpu_between_hungry_programs() {
    for bank_unused in [true, false] {
        let r = trainers_beside_bursts([1, 3, 1, 3], PolicyKind::Fair, bank_unused);
        let (shares, _) = gpu_shares(&r);
        let split = shares[1] / (shares[0] + shares[1]);
        println!(
            "bank_unused {bank_unused}: shares {shares:.3?}, kernels done {:?}",
            done(&r)
        );
        assert!(
            (split - 0.75).abs() < 0.05,
            "the trainers' split {split:.3} (bank_unused {bank_unused})"
        );
    }
}

/// With `per_user`: user A runs a trainer and a bursty program, user B a trainer and two. A's
/// trainer asks for little at the end of each step (its last kernel) and A's bursts often
/// think meanwhile, while B's two rarely both do. Levelled at every such lull, A lost a sixth of
/// its share (0.415 against 0.487, when a lull of any length counted); a lull shorter than a
/// quantum keeps what it is owed, so A's share is what it is with banking.
#[test]
fn without_banking_a_trainers_lulls_between_steps_cost_its_user_nothing() {
    let user_a = |bank_unused: bool| {
        let mut scripts = weighted(&[1; 5], |id| match id {
            1 | 2 => vec![kernel(id, 500, 124, Bound::Compute); 4],
            _ => vec![kernel(id, 100, 16, Bound::Compute); 60],
        });
        for s in &mut scripts[2..] {
            s.arrivals = Arrivals::Closed { think_ns: 6 * MS };
        }
        for (s, user) in scripts.iter_mut().zip([7, 8, 7, 8, 8]) {
            s.spec.account = crate::sched::user_account(user);
        }
        let mut cfg = trainers_cfg(bank_unused);
        cfg.sched.fair.per_user = true;
        let (shares, _) = gpu_shares(&Simulation::new(cfg, PolicyKind::Fair, scripts).run());
        shares[0] + shares[2]
    };
    let (banked, level) = (user_a(true), user_a(false));
    println!("per user: user A {banked:.3} of the GPU banking, {level:.3} level");
    assert!(
        (banked - level).abs() < 0.02,
        "user A {banked:.3} banking, {level:.3} level"
    );
}
