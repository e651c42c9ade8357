//! FAIR's tests, in the scheduler's model.

use gpushare_protocol::PriorityClass;

use super::FairConfig;
use crate::sched::simulate::{Arrivals, ClientScript, SimConfig, SimReport, Simulation, kernel};
use crate::sched::{
    Bound, ClientSpec, DeviceShape, Dispatcher, KernelProfile, PolicyKind, SchedConfig,
};

const MS: u64 = 1_000_000;

/// A closed-loop client per weight (ids from 1), each iteration `iteration(id)`.
fn weighted(weights: &[u32], iteration: impl Fn(u64) -> Vec<KernelProfile>) -> Vec<ClientScript> {
    weights
        .iter()
        .zip(1..)
        .map(|(&w, id)| {
            ClientScript::new(ClientSpec::new(id, PriorityClass::Normal, w), iteration(id))
        })
        .collect()
}

/// Closed-loop clients of `weights`, kernels of different lengths, all on the whole GPU.
fn shares(weights: &[u32], horizon: u64) -> Vec<f64> {
    shares_with(weights, horizon, FairConfig::default())
}

fn shares_with(weights: &[u32], horizon: u64, fair: FairConfig) -> Vec<f64> {
    let scripts = weighted(weights, |id| vec![kernel(id, 50 * id, 132, Bound::Compute)]);
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
    let mut scripts = weighted(weights, |id| {
        vec![kernel(id, kernel_us, 132, Bound::Compute)]
    });
    for script in &mut scripts {
        script.arrivals = Arrivals::Closed {
            think_ns: think_us * 1_000,
        };
    }
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

mod free;
mod hunger;
mod side_by_side;
