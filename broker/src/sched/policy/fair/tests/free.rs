//! FAIR running free (`free_lead_ns`): launches skip the scheduler while no active account
//! leads by more than that, and are gated again once one does.

use super::*;

/// Longer than the policy waits, holding nobody, before launches go free again.
const QUIET: u64 = 60 * MS;

/// Side by side with a 10 ms free lead and a 5 ms lag, two clients of `weights` (ids 1, 2),
/// `account`s as given.
fn free_dispatcher(weights: [u32; 2], accounts: [u64; 2], per_user: bool) -> Dispatcher {
    let fair = FairConfig {
        side_by_side: true,
        quantum_ns: 5 * MS,
        lag_ns: 5 * MS,
        free_lead_ns: 10 * MS,
        per_user,
        ..FairConfig::default()
    };
    dispatcher(weights, accounts, fair)
}

/// Side by side with this quantum, a lag of twice that, and this free lead.
fn free_fair(quantum_ns: u64, free_lead_ns: u64) -> FairConfig {
    FairConfig {
        side_by_side: true,
        quantum_ns,
        lag_ns: 2 * quantum_ns,
        free_lead_ns,
        ..FairConfig::default()
    }
}

/// FAIR as `fair` says, two clients of `weights` (ids 1, 2), `account`s as given.
fn dispatcher(weights: [u32; 2], accounts: [u64; 2], fair: FairConfig) -> Dispatcher {
    let mut d = Dispatcher::with_config(
        PolicyKind::Fair,
        DeviceShape {
            sms: 132,
            sm_partitions: false,
        },
        SchedConfig {
            fair,
            max_inflight_per_client: 64,
            ..SchedConfig::default()
        },
    );
    for (id, (w, account)) in (1..).zip(weights.into_iter().zip(accounts)) {
        let spec = ClientSpec {
            account,
            ..ClientSpec::new(id, PriorityClass::Normal, w)
        };
        d.add_client(spec).expect("client registers");
    }
    d
}

fn charge(d: &mut Dispatcher, client: u64, ns: u64, now: u64) -> bool {
    d.device_time(client, ns, now)
        .expect("client is registered");
    d.free_running(now)
}

#[test]
fn free_while_the_leads_stay_small_and_gated_once_one_grows() {
    let mut d = free_dispatcher([1, 1], [1, 2], false);
    assert!(
        !charge(&mut d, 1, MS, MS),
        "gated until the policy has held nobody a while"
    );
    let mut now = QUIET;
    for _ in 0..50 {
        assert!(charge(&mut d, 1, MS, now));
        assert!(charge(&mut d, 2, MS, now));
        now += MS;
    }
    // Client 1 runs 12 ms ahead: past the 10 ms lead, gated.
    assert!(!charge(&mut d, 1, 12 * MS, now));
    assert!(!charge(&mut d, 2, 12 * MS, now + MS), "gated for a while");
    assert!(
        charge(&mut d, 2, MS, now + QUIET),
        "nobody held since: free again"
    );
}

/// A light program, active but asking for less than its share, lags further and further.
/// With a quantum at most half the free lead (100 ms) it is raised to a quantum behind once
/// nobody has been held a while, and launches go free; with a longer quantum it keeps them
/// gated.
#[test]
fn a_light_account_lets_launches_go_free_only_under_a_short_quantum() {
    let free_share = |quantum_ns: u64| {
        let mut d = dispatcher([1, 1], [1, 2], free_fair(quantum_ns, 100 * MS));
        let (mut now, mut free) = (QUIET, 0);
        for step in 0..2_000 {
            now += MS;
            // Client 1 takes the GPU; client 2 a tenth of it, in bursts every 10 ms.
            let mut f = charge(&mut d, 1, MS, now);
            if step % 10 == 0 {
                f = charge(&mut d, 2, MS, now);
            }
            free += u32::from(f);
        }
        f64::from(free) / 2_000.0
    };
    // Free while the lead grows from a quantum to 100 ms, gated 50 ms: about two thirds.
    let short = free_share(5 * MS);
    assert!(short > 0.5, "5 ms quantum: free {short}");
    // Free until the lead first reaches 100 ms, then gated for good.
    let long = free_share(80 * MS);
    assert!(long < 0.1, "80 ms quantum: free {long}");
}

/// Running free, client 2's work waits on the device behind client 1's: nothing is charged to
/// it, but it is told busy, so it stays active and its lag gates the launches; untold, it
/// would have gone inactive after 100 ms and left client 1 free.
#[test]
fn an_account_with_work_waiting_on_the_device_gates_the_launches() {
    for told in [false, true] {
        let mut d = free_dispatcher([1, 1], [1, 2], false);
        charge(&mut d, 2, MS, QUIET);
        let mut now = QUIET;
        let mut free = true;
        for _ in 0..200 {
            now += MS;
            if told {
                d.busy(2, now).expect("client is registered");
            }
            free = charge(&mut d, 1, MS, now);
        }
        assert_eq!(free, !told, "told busy: {told}");
    }
}

#[test]
fn weights_divide_the_lead_by_device_time() {
    // Weight 3 against 1: 3 ms of device time is 1 ms of virtual time.
    let mut d = free_dispatcher([3, 1], [1, 2], false);
    let mut now = QUIET;
    for _ in 0..20 {
        assert!(
            charge(&mut d, 1, 3 * MS, now),
            "3 : 1 is the weights' split"
        );
        assert!(charge(&mut d, 2, MS, now));
        now += MS;
    }
    for _ in 0..20 {
        charge(&mut d, 1, MS, now);
        charge(&mut d, 2, MS, now);
        now += MS;
    }
    assert!(
        !d.free_running(now),
        "1 : 1 leaves the weight-1 client 13 ms ahead in virtual time"
    );
}

#[test]
fn an_account_back_from_idleness_is_owed_at_most_the_lag() {
    let mut d = free_dispatcher([1, 1], [1, 2], false);
    charge(&mut d, 2, MS, QUIET);
    // Client 1 alone for a second, client 2 idle (no device time for more than 100 ms).
    let mut now = QUIET;
    for _ in 0..1_000 {
        now += MS;
        charge(&mut d, 1, MS, now);
    }
    // Back, client 2 starts 5 ms (the lag) behind, not a second: within the 10 ms lead.
    assert!(
        charge(&mut d, 2, MS, now),
        "owed the lag only, not its idle second"
    );
}

#[test]
fn by_user_the_accounts_come_from_device_time_without_a_submission() {
    // Two clients of one user: one account, whatever each charges.
    let mut d = free_dispatcher([1, 1], [7, 7], true);
    let mut now = QUIET;
    for _ in 0..30 {
        assert!(
            charge(&mut d, 1, 2 * MS, now),
            "one account has no lead over itself"
        );
        now += MS;
    }
    // Apart, the same charges put client 1 ahead.
    let mut d = free_dispatcher([1, 1], [7, 8], true);
    assert!(charge(&mut d, 2, MS, QUIET));
    let mut now = QUIET;
    for _ in 0..30 {
        charge(&mut d, 1, 2 * MS, now);
        now += MS;
    }
    assert!(!d.free_running(now));
}

#[test]
fn running_free_grants_what_side_by_side_would_hold() {
    // Client 1 leads by 8 ms: past the 5 ms quantum, within the 10 ms free lead.
    let granted_to_the_leader = |free_lead_ns: u64| {
        let mut d = free_dispatcher([1, 1], [1, 2], false);
        let tunables = d.tunables();
        d.set_tunables(crate::sched::Tunables {
            fair: FairConfig {
                free_lead_ns,
                ..tunables.fair
            },
            ..tunables
        });
        d.set_policy(PolicyKind::Fair);
        charge(&mut d, 2, MS, QUIET);
        charge(&mut d, 1, 9 * MS, QUIET);
        let p = kernel(2, 100, 132, Bound::Compute);
        d.submit(2, p, QUIET).expect("registered");
        let q = kernel(1, 100, 132, Bound::Compute);
        let leader = d.submit(1, q, QUIET).expect("registered");
        d.poll(QUIET).iter().any(|g| g.request == leader)
    };
    assert!(!granted_to_the_leader(0), "held side by side");
    assert!(granted_to_the_leader(10 * MS), "granted running free");
}

#[test]
fn work_held_while_gated_is_granted_once_free() {
    let mut d = free_dispatcher([1, 1], [1, 2], false);
    let now = QUIET;
    assert!(charge(&mut d, 2, MS, now));
    assert!(!charge(&mut d, 1, 21 * MS, now), "client 1 leads by 20 ms");
    let p = kernel(2, 100, 132, Bound::Compute);
    d.submit(2, p, now).expect("registered");
    let q = kernel(1, 100, 132, Bound::Compute);
    let held = d.submit(1, q, now).expect("registered");
    let granted: Vec<_> = d.poll(now).iter().map(|g| g.request).collect();
    assert!(!granted.contains(&held), "held while 20 ms ahead");
    // Client 2 catches up; once nobody has been held for a while, free, and it goes.
    assert!(!charge(&mut d, 2, 20 * MS, now + MS), "held just now");
    assert!(charge(&mut d, 2, MS, now + QUIET + MS));
    let granted: Vec<_> = d.poll(now + QUIET + MS).iter().map(|g| g.request).collect();
    assert!(granted.contains(&held), "granted once free: {granted:?}");
}

/// Two programs that keep the GPU busy, weights 2 : 1. Running free they split it as FIFO
/// does, 1 : 1, until the weight-1 program leads by the free lead; then it is held until the
/// other has caught up, and so on: over time the device time follows the weights, and part of
/// the time the launches skip the scheduler.
#[test]
fn busy_programs_of_unequal_weights_still_share_by_weight() {
    let (share, free) = busy_pair([2, 1], 5 * MS);
    assert!((share / (2.0 / 3.0) - 1.0).abs() < 0.05, "share {share}");
    assert!(free < 0.5, "free {free}");
    // At equal weights nobody needs holding: free nearly all the time.
    let (share, free) = busy_pair([1, 1], 5 * MS);
    assert!((share - 0.5).abs() < 0.025, "share {share}");
    assert!(free > 0.9, "free {free}");
}

/// A quantum longer than the free lead: side by side holds nobody while the lead is between
/// the two, which must not count as the laggard asking for less than its share (H200 run L1:
/// 16 programs of users weighted 2 : 1 : 3 : 2 got a quarter each with a 500 ms quantum and a
/// 200 ms free lead).
#[test]
fn a_quantum_longer_than_the_free_lead_keeps_the_weights() {
    let (share, _) = busy_pair([2, 1], 40 * MS);
    assert!((share / (2.0 / 3.0) - 1.0).abs() < 0.05, "share {share}");
}

/// Two busy programs of `weights` for 10 s, side by side with a 10 ms free lead and a
/// `quantum_ns` quantum (and a lag of twice that): the first one's share of the device time,
/// and the share of the time the launches ran free.
fn busy_pair(weights: [u32; 2], quantum_ns: u64) -> (f64, f64) {
    let mut d = dispatcher(weights, [1, 2], free_fair(quantum_ns, 10 * MS));
    let step = MS / 2;
    let mut now = QUIET;
    let mut free = false;
    let (mut got, mut free_steps) = ([0u64; 2], 0);
    let mut running: Vec<(u64, u64)> = Vec::new();
    for _ in 0..20_000 {
        now += step;
        // What ran during the last step ends now: charged its device time.
        for (client, request) in std::mem::take(&mut running) {
            d.complete(client, request, None, now).expect("in flight");
            got[client as usize - 1] += step;
            free = charge(&mut d, client, step, now);
        }
        if free {
            // Ungated, the GPU is shared evenly.
            free_steps += 1;
            for client in [1, 2] {
                got[client as usize - 1] += step / 2;
                free = charge(&mut d, client, step / 2, now);
            }
            continue;
        }
        for client in [1, 2] {
            let s = d.stats(client).expect("registered");
            if s.waiting + s.inflight == 0 {
                d.submit(client, kernel(client, 500, 132, Bound::Compute), now)
                    .expect("registered");
            }
        }
        running = d.poll(now).iter().map(|g| (g.client, g.request)).collect();
    }
    let share = got[0] as f64 / (got[0] + got[1]) as f64;
    let free = f64::from(free_steps) / 20_000.0;
    println!(
        "fair running free, busy programs {weights:?}: the first's device-time share {share:.3}, free {:.1} % of the time",
        100.0 * free
    );
    (share, free)
}

#[test]
fn off_by_default() {
    let mut d = free_dispatcher([1, 1], [1, 2], false);
    d.set_tunables(crate::sched::Tunables {
        fair: FairConfig {
            side_by_side: true,
            ..FairConfig::default()
        },
        ..d.tunables()
    });
    d.set_policy(PolicyKind::Fair);
    assert!(!charge(&mut d, 1, MS, MS));
    assert!(!charge(&mut d, 2, MS, MS));
}

/// The model for 2 s, side by side with a 1 ms quantum and a 10 ms free lead: each client's
/// share of the device time, and the share of the kernels that skipped the dispatcher.
fn run_free_model(scripts: Vec<ClientScript>, per_user: bool) -> (Vec<f64>, f64) {
    let cfg = SimConfig {
        horizon_ns: 2_000 * MS,
        observe_ns: 20_000,
        record_grants: true,
        sched: SchedConfig {
            fair: FairConfig {
                side_by_side: true,
                quantum_ns: MS,
                per_user,
                free_lead_ns: 10 * MS,
                ..FairConfig::default()
            },
            max_inflight_per_client: 8,
            ..SchedConfig::default()
        },
        ..SimConfig::default()
    };
    let r = Simulation::new(cfg, PolicyKind::Fair, scripts).run();
    let done: u64 = r.clients.iter().map(|c| c.completed).sum();
    let free = (1.0 - r.grants.len() as f64 / done as f64).max(0.0);
    let (shares, _) = gpu_shares(&r);
    println!(
        "fair running free in the model: GPU shares {shares:.4?}, {:.1} % of kernels ungated",
        100.0 * free
    );
    (shares, free)
}

/// In the scheduler's model: four closed-loop programs of whole-GPU kernels. With weights
/// 1 : 2 : 3 : 4 and kernels of 50, 100, 150 and 200 µs, the device time still follows the
/// weights (someone is always held: no kernel skips the dispatcher). At equal weights with the
/// same kernels, which FIFO already divides evenly, it divides evenly and nearly every kernel
/// skips the dispatcher.
#[test]
fn in_the_model_running_free_keeps_the_weights_and_skips_the_scheduler_between_equals() {
    let run = |weights: &[u32], us: fn(u64) -> u64| {
        let scripts = weighted(weights, |id| vec![kernel(id, us(id), 132, Bound::Compute)]);
        run_free_model(scripts, false)
    };
    let (got, _) = run(&[1, 2, 3, 4], |id| 50 * id);
    for (want, s) in [0.1, 0.2, 0.3, 0.4].iter().zip(&got) {
        assert!((s / want - 1.0).abs() < 0.05, "shares {got:?}");
    }
    let (got, free) = run(&[1, 1, 1, 1], |_| 100);
    for s in &got {
        assert!((s / 0.25 - 1.0).abs() < 0.05, "shares {got:?}");
    }
    assert!(free > 0.9, "equal weights: only {free} ungated");
}

/// By user in the model: two users, each running a program of 200 µs kernels and one of
/// 50 µs kernels on half the GPU. The programs' device time differs, but the users' is even
/// under FIFO already, so nearly every kernel skips the dispatcher, and the users still get
/// half each.
#[test]
fn in_the_model_users_of_the_same_mix_run_free() {
    let scripts: Vec<ClientScript> = [(1, 100, 200), (2, 100, 50), (3, 200, 200), (4, 200, 50)]
        .into_iter()
        .map(|(id, user, us)| {
            let spec = ClientSpec {
                account: user,
                ..ClientSpec::new(id, PriorityClass::Normal, 1)
            };
            ClientScript::new(spec, vec![kernel(id, us, 66, Bound::Compute)])
        })
        .collect();
    let (shares, free) = run_free_model(scripts, true);
    let user = shares[0] + shares[1];
    assert!((user - 0.5).abs() < 0.025, "shares {shares:?}");
    assert!(free > 0.9, "only {free} ungated");
}
