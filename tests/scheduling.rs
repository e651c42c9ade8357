//! The scheduler in the real broker (sim device; on a GPU too with
//! GPUSHARE_TEST_BACKEND=cuda): the policy file picks the policy, a reload switches it for
//! running clients, and FAIR gives busy clients GPU time in proportion to their weights, as
//! clients come and go.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use gpushare::{Client, Kernel, Monitor};
use gpushare_tests::{Broker, BrokerOptions};

#[path = "scheduling/by_user.rs"]
mod by_user;
#[path = "scheduling/gate.rs"]
mod gate;
#[path = "scheduling/hungry.rs"]
mod hungry;

fn broker(scheduler: &str) -> Broker {
    broker_with(&format!("scheduler = \"{scheduler}\"\n"))
}

/// A broker with this policy file, the sim device's kernels taking their time on the clock.
fn broker_with(policy: &str) -> Broker {
    Broker::start_with(BrokerOptions {
        policy: Some(policy.to_owned()),
        // Kernels take their modelled time on the wall clock too, so the GPU, not the two
        // CPUs of a CI machine, is what the clients compete for.
        extra_args: vec!["--sim-realtime".into()],
        ..Default::default()
    })
}

/// A grid wider than any GPU's SMs, for kernels that contend for the whole device: FAIR
/// divides the GPU among clients whose kernels compete for it, while a kernel that fits in
/// SMs nobody uses goes whatever its client's lead (work-conserving; one-block kernels would
/// never be held on a GPU). Still one wave: the spin kernel's blocks are small.
const FILLS_THE_GPU: u32 = 1024;

/// Keeps `client` busy with 1 ms kernels as wide as the GPU until `stop`, always with plenty
/// queued (FAIR shares GPU time among clients that have work waiting).
fn busy(client: Client, stop: Arc<AtomicBool>) -> std::thread::JoinHandle<(Client, u64)> {
    std::thread::spawn(move || {
        let stream = client.default_stream();
        let mut launched = 0;
        // No synchronization until the end: the ring stays full, so the client never stops
        // waiting for the GPU (the ring's back-pressure paces it).
        while !stop.load(Ordering::Relaxed) {
            for _ in 0..16 {
                stream
                    .launch(Kernel::Spin {
                        micros: 1000,
                        blocks: FILLS_THE_GPU,
                    })
                    .expect("launch");
                launched += 1;
            }
        }
        stream.synchronize().expect("sync");
        drop(stream);
        (client, launched)
    })
}

/// A figure of the client named `name` from the broker's status (0 if it is not there).
fn client_figure(broker: &Broker, name: &str, figure: fn(&gpushare::ClientStats) -> u64) -> u64 {
    broker.client_status(name).as_ref().map_or(0, figure)
}

fn gpu_time(broker: &Broker, name: &str) -> u64 {
    client_figure(broker, name, |c| c.gpu_time_ns)
}

fn kernels(broker: &Broker, name: &str) -> u64 {
    client_figure(broker, name, |c| c.kernels)
}

/// The GPU time each of `names` gets from now until they have had `work` of it together,
/// once each named in `busy` has run a little (polled; a loaded machine only takes longer,
/// the work judged stays the same). Panics after a minute without enough.
fn gpu_time_over(broker: &Broker, names: &[&str], busy: &[&str], work: Duration) -> Vec<u64> {
    let times = || {
        names
            .iter()
            .map(|n| gpu_time(broker, n))
            .collect::<Vec<u64>>()
    };
    let start = times();
    let settled = gpushare_tests::wait_until(Duration::from_secs(60), || {
        let now = times();
        names
            .iter()
            .zip(now.iter().zip(&start))
            .all(|(n, (t, t0))| !busy.contains(n) || t - t0 >= 20_000_000)
    });
    assert!(settled, "{busy:?} did not all run: {:?}", times());
    let before = times();
    let enough = gpushare_tests::wait_until(Duration::from_secs(60), || {
        let now = times();
        now.iter().zip(&before).map(|(t, t0)| t - t0).sum::<u64>() >= work.as_nanos() as u64
    });
    let after = times();
    assert!(enough, "only {:?} ns of GPU time in a minute", after);
    after.iter().zip(&before).map(|(t, t0)| t - t0).collect()
}

#[test]
fn fair_shares_follow_the_weights() {
    let broker = broker("fair");
    assert_eq!(broker.status().policy, "fair");
    let light = broker.client_named("light");
    let heavy = broker.client_named("heavy");
    let heavy_id = heavy.session().client_id;
    assert!(gpushare_tests::wait_until(Duration::from_secs(5), || {
        broker.status().clients.len() == 2
    }));
    let mut admin = Monitor::connect(&broker.socket).expect("monitor");
    admin
        .admin_set(heavy_id, None, Some(3), None)
        .expect("weight 3");

    let stop = Arc::new(AtomicBool::new(false));
    let threads = [busy(light, stop.clone()), busy(heavy, stop.clone())];
    // Measure while both are busy (once they stop submitting, whatever is still queued in
    // one ring runs alone), over 1.6 s of GPU time: 1,600 kernels.
    let (lk0, hk0) = (kernels(&broker, "light"), kernels(&broker, "heavy"));
    let names = ["light", "heavy"];
    let got = gpu_time_over(&broker, &names, &names, Duration::from_millis(1600));
    let (lk1, hk1) = (kernels(&broker, "light"), kernels(&broker, "heavy"));
    // The light client is the one held back, and `status` says so (THROTTLED). A wait counts
    // only while the client has none of its kernels on the GPU, so a run can keep the shares
    // without it for a while (once in CI, 1.6 s): polled while both are still busy.
    let held = |name: &str| client_figure(&broker, name, |c| c.throttled_ns);
    gpushare_tests::wait_until(Duration::from_secs(20), || held("light") > held("heavy"));
    stop.store(true, Ordering::Relaxed);
    let done: Vec<(Client, u64)> = threads
        .into_iter()
        .map(|t| t.join().expect("client thread"))
        .collect();
    let launched: Vec<u64> = done.iter().map(|(_, n)| *n).collect();
    let (l, h) = (got[0], got[1]);
    let share = h as f64 / (l + h) as f64;
    let (light_held, heavy_held) = (held("light"), held("heavy"));
    println!(
        "FAIR, weights 1:3: GPU time light {:.1} ms, heavy {:.1} ms; heavy's share {share:.3} (goal 0.750); kernels run meanwhile light {} heavy {}; kernels launched {launched:?}",
        l as f64 / 1e6,
        h as f64 / 1e6,
        lk1 - lk0,
        hk1 - hk0
    );
    assert!(
        (share - 0.75).abs() <= 0.05 * 0.75,
        "heavy's share {share:.3} is not within 5 % of 0.75"
    );
    println!(
        "held by the policy: light {:.1} ms, heavy {:.1} ms",
        light_held as f64 / 1e6,
        heavy_held as f64 / 1e6
    );
    assert!(
        light_held > heavy_held,
        "the light client was held {light_held} ns, the heavy one {heavy_held} ns"
    );
}

/// FAIR as clients come and go: each phase's GPU time divides by the weights of the clients
/// busy in it, within 5 %. A (weight 1) and B (1), then C (2) joins, then A leaves.
#[test]
fn fair_shares_follow_clients_joining_and_leaving() {
    let broker = broker("fair");
    let connect = |name: &str, weight: u32| {
        let client = broker.client_named(name);
        let id = client.session().client_id;
        let mut admin = Monitor::connect(&broker.socket).expect("monitor");
        admin
            .admin_set(id, None, Some(weight), None)
            .expect("set weight");
        let stop = Arc::new(AtomicBool::new(false));
        (busy(client, stop.clone()), stop)
    };
    let names = ["a", "b", "c"];
    // GPU time each client got over one phase (once the busy ones have run, over 1.2 s of
    // GPU time: 1,200 kernels, enough to judge a share to 1 %), as shares.
    let phase = |label: &str, want: [f64; 3]| {
        let busy: Vec<&str> = names
            .iter()
            .zip(want)
            .filter(|(_, w)| *w > 0.0)
            .map(|(n, _)| *n)
            .collect();
        let ran = || names.map(|n| kernels(&broker, n));
        let k0 = ran();
        let got = gpu_time_over(&broker, &names, &busy, Duration::from_millis(1200));
        let k1 = ran();
        let total: u64 = got.iter().sum();
        let shares: Vec<f64> = got
            .iter()
            .map(|&t| t as f64 / total.max(1) as f64)
            .collect();
        println!(
            "FAIR, {label}: shares a/b/c {:.3} / {:.3} / {:.3} (goal {:.3} / {:.3} / {:.3}); GPU time {:.0} ms; kernels sent meanwhile {:?}",
            shares[0],
            shares[1],
            shares[2],
            want[0],
            want[1],
            want[2],
            total as f64 / 1e6,
            [0, 1, 2].map(|i| k1[i].saturating_sub(k0[i]))
        );
        for i in 0..3 {
            assert!(
                (shares[i] - want[i]).abs() <= 0.05 * want[i].max(0.2),
                "{label}: {}'s share {:.3}, want {:.3}",
                names[i],
                shares[i],
                want[i]
            );
        }
    };
    let (a, stop_a) = connect("a", 1);
    let (b, stop_b) = connect("b", 1);
    phase("a and b, weights 1:1", [0.5, 0.5, 0.0]);
    let (c, stop_c) = connect("c", 2);
    phase("c (weight 2) joins", [0.25, 0.25, 0.5]);
    stop_a.store(true, Ordering::Relaxed);
    let _ = a.join().expect("client a");
    phase("a leaves", [0.0, 1.0 / 3.0, 2.0 / 3.0]);
    for (t, stop) in [(b, stop_b), (c, stop_c)] {
        stop.store(true, Ordering::Relaxed);
        let _ = t.join().expect("client thread");
    }
}

#[test]
fn a_reload_switches_the_policy_for_running_clients() {
    let broker = broker("fifo");
    let client = broker.client();
    assert_eq!(broker.status().policy, "fifo");
    std::fs::write(
        broker.dir.path().join("policy.toml"),
        "scheduler = \"priority\"\n",
    )
    .expect("rewrite policy");
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(broker.pid()),
        nix::sys::signal::Signal::SIGHUP,
    )
    .expect("SIGHUP");
    assert!(broker.wait_for_log("scheduling policy switched", Duration::from_secs(5)));
    assert_eq!(broker.status().policy, "priority");
    // The running client's kernels now go through the scheduler, and still run.
    let buf = client.alloc::<f32>(1024).expect("alloc");
    client
        .default_stream()
        .launch(Kernel::FillF32 {
            dst: buf.ptr(),
            n: 1024,
            value: 2.5,
        })
        .expect("launch");
    assert!(buf.to_vec().expect("read").iter().all(|&v| v == 2.5));

    // A policy the broker does not know is refused, and the old one stays.
    std::fs::write(
        broker.dir.path().join("policy.toml"),
        "scheduler = \"lottery\"\n",
    )
    .expect("rewrite policy");
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(broker.pid()),
        nix::sys::signal::Signal::SIGHUP,
    )
    .expect("SIGHUP");
    assert!(broker.wait_for_log("unknown scheduling policy", Duration::from_secs(5)));
    assert_eq!(broker.status().policy, "priority");
}

/// Runs iterations of four 1 ms kernels, declaring each iteration's end, until `stop` or
/// `limit` iterations; returns how many it ran.
fn iterations(client: &Client, stop: &AtomicBool, limit: u64) -> u64 {
    let stream = client.default_stream();
    let mut done = 0;
    while done < limit && !stop.load(Ordering::Relaxed) {
        for _ in 0..4 {
            stream
                .launch(Kernel::Spin {
                    micros: 1000,
                    blocks: 1,
                })
                .expect("launch");
        }
        stream.synchronize().expect("sync");
        client.end_iteration().expect("end iteration");
        done += 1;
    }
    done
}

#[test]
fn srtf_runs_the_shortest_declared_job_and_switches_only_at_iteration_ends() {
    let broker = broker("srtf");
    let long = broker.client_named("long");
    let short = broker.client_named("short");
    long.declare_job(Duration::from_secs(60), 0, 0)
        .expect("declare");
    short
        .declare_job(Duration::from_millis(80), 0, 0)
        .expect("declare");

    let stop = Arc::new(AtomicBool::new(false));
    let long_thread = {
        let (long, stop) = (long.clone(), stop.clone());
        std::thread::spawn(move || iterations(&long, &stop, u64::MAX))
    };
    // The long job runs (a few iterations) before the short one arrives.
    assert!(gpushare_tests::wait_until(Duration::from_secs(60), || {
        gpu_time(&broker, "long") >= 20_000_000
    }));
    // The short job arrives while the long one runs: it gets the GPU at the long job's next
    // iteration end and keeps it until it is done.
    let before = gpu_time(&broker, "long");
    let started = std::time::Instant::now();
    let ran = iterations(&short, &AtomicBool::new(false), 20);
    let short_took = started.elapsed();
    let during = gpu_time(&broker, "long") - before;
    stop.store(true, Ordering::Relaxed);
    let long_iterations = long_thread.join().expect("long job");
    println!(
        "SRTF: short job's 20 iterations (80 ms of GPU) took {:.0} ms; the long job got {:.1} ms of GPU meanwhile; long ran {long_iterations} iterations",
        short_took.as_secs_f64() * 1e3,
        during as f64 / 1e6
    );
    assert_eq!(ran, 20);
    // (At least the five iterations it ran before the short job came.)
    assert!(long_iterations >= 5, "the long job ran before");
    // Without SRTF the two would share the GPU about evenly (the long job getting about as
    // much as the short one's 80 ms). With it the long job runs only its iteration in progress
    // when the short one arrives (4 ms), plus one more whenever the short job has nothing
    // queued at a boundary: on an idle machine that is 4-8 ms, and on a loaded one, where the
    // short job's thread is descheduled between iterations now and then, a few more (16 ms
    // seen with a second copy of the suite beside). Half the short job's time is the bound.
    assert!(
        during < 40_000_000,
        "the long job got {during} ns while the shorter job was waiting"
    );
    // Declarations are checked.
    let e = short
        .declare_deadline(Duration::from_millis(10), Duration::from_millis(20))
        .expect_err("a deadline past its period is refused");
    assert_eq!(e.code(), Some(gpushare::ErrorCode::InvalidArgument));
    short
        .declare_deadline(Duration::from_millis(33), Duration::from_millis(20))
        .expect("a sensible deadline");
}

/// A client the policy holds back longer than `--kernel-timeout` (SRTF keeps a long job
/// waiting while a shorter one runs) has nothing on the GPU meanwhile: the hang watchdog must
/// not take the hold for a hung kernel and reset the GPU under everyone.
#[test]
fn a_client_held_by_the_policy_past_the_kernel_timeout_is_not_taken_for_a_hang() {
    let broker = Broker::start_with(BrokerOptions {
        policy: Some("scheduler = \"srtf\"\n".into()),
        extra_args: vec![
            "--sim-realtime".into(),
            "--kernel-timeout".into(),
            "1".into(),
        ],
        ..Default::default()
    });
    let long = broker.client_named("long");
    let short = broker.client_named("short");
    long.declare_job(Duration::from_secs(60), 0, 0)
        .expect("declare");
    short
        .declare_job(Duration::from_secs(10), 0, 0)
        .expect("declare");
    // The long job runs iterations, each queued right behind the one before (as a program
    // that does not wait for its GPU does) ...
    let stop_long = Arc::new(AtomicBool::new(false));
    let long_thread = {
        let (long, stop) = (long.clone(), stop_long.clone());
        std::thread::spawn(move || {
            let stream = long.default_stream();
            let mut done = 0u64;
            while !stop.load(Ordering::Relaxed) {
                for _ in 0..4 {
                    let k = Kernel::Spin {
                        micros: 1000,
                        blocks: 1,
                    };
                    stream.launch(k).expect("launch");
                }
                long.end_iteration().expect("end iteration");
                done += 1;
            }
            stream.synchronize().expect("sync");
            done
        })
    };
    assert!(gpushare_tests::wait_until(Duration::from_secs(60), || {
        gpu_time(&broker, "long") >= 10_000_000
    }));
    // ... until the shorter job comes and keeps the GPU (it never ends an iteration): the
    // long job's next kernel waits in the scheduler for 2.5 kernel timeouts.
    let stop_short = Arc::new(AtomicBool::new(false));
    let short_thread = busy(short, stop_short.clone());
    let before = gpu_time(&broker, "long");
    let hang_seen = gpushare_tests::wait_until(Duration::from_millis(2500), || {
        broker.log_contains("made no progress")
    });
    let during = gpu_time(&broker, "long") - before;
    stop_short.store(true, Ordering::Relaxed);
    short_thread.join().expect("short job");
    stop_long.store(true, Ordering::Relaxed);
    let ran = long_thread
        .join()
        .expect("the long job goes on, not evicted");
    assert!(
        !hang_seen,
        "a hold taken for a hang:\n{}",
        broker.log_text()
    );
    assert!(
        during < 100_000_000,
        "the long job was held ({during} ns of GPU while the short one ran)"
    );
    assert!(ran > 0);
}

/// A consolidated program's kernels (a module's functions, through gpushare's own libcuda) go
/// through the scheduler one by one as a library client's do: under FAIR (side by side, the
/// default), two such programs share the GPU by weight, each charged the device time measured
/// for it (as `status` shows it), and `gpushare set` changes a program's weight while it runs.
/// The first program queues hundreds of kernels while it is alone on the GPU, not gated, and
/// their time comes after the second has joined; it is held no longer than FAIR's lag for
/// that, and a longer window makes that count for less.
#[test]
fn fair_shares_hold_for_consolidated_programs_and_follow_a_live_weight_change() {
    if gpushare_tests::test_backend() != "sim" {
        return; // the stand-in program loads the sim's own module (tests/gpu.rs runs PTX)
    }
    consolidated_shares(broker("fair"), "FAIR", Duration::from_millis(3000), true);
}

/// The same in FAIR's exclusive turns (`side_by_side = false`), charged by kernel.
#[test]
fn fair_turns_hold_for_consolidated_programs_and_follow_a_live_weight_change() {
    if gpushare_tests::test_backend() != "sim" {
        return; // as above
    }
    let broker = Broker::start_with(BrokerOptions {
        policy: Some("scheduler = \"fair\"\n[fair]\nside_by_side = false\n".into()),
        extra_args: vec!["--sim-realtime".into()],
        ..Default::default()
    });
    consolidated_shares(broker, "FAIR turns", Duration::from_millis(1200), true);
}

/// Two consolidated programs of 1 ms kernels as wide as the GPU under `broker`'s FAIR: even shares over `window`
/// of GPU time, then (with `live_change`) 3 : 1 once one's weight is set to 3 while it runs.
fn consolidated_shares(broker: Broker, policy: &str, window: Duration, live_change: bool) {
    use gpushare_tests::cuda_program::{CudaProgram, Running};
    let dir = tempfile::tempdir().expect("temp dir");
    let program = CudaProgram::build(dir.path(), false);
    let start = |name: &str| {
        let blocks = FILLS_THE_GPU.to_string();
        let mut cmd = program.command(&broker.socket, &["spin", "100000", "1000", &blocks]);
        cmd.env("GPUSHARE_NAME", name);
        let mut running = Running::spawn(cmd);
        running.wait_for_line("ready", Duration::from_secs(30));
        running
    };
    let names = ["cons-a", "cons-b"];
    let programs: Vec<Running> = names.iter().map(|n| start(n)).collect();
    let id_of = |name: &str| {
        broker
            .status()
            .clients
            .iter()
            .find(|c| c.name == name && c.consolidated)
            .map(|c| c.client_id)
            .unwrap_or_else(|| panic!("{name} is a consolidated client"))
    };
    let shares = |label: &str, want: f64| {
        let got = gpu_time_over(&broker, &names, &names, window);
        let share = got[0] as f64 / (got[0] + got[1]).max(1) as f64;
        println!(
            "{policy}, consolidated programs, {label}: cons-a's share {share:.3} (goal {want:.3}); GPU time {:.0} ms",
            (got[0] + got[1]) as f64 / 1e6
        );
        assert!(
            (share - want).abs() <= 0.05 * want,
            "{label}: cons-a's share {share:.3}, want {want:.3}"
        );
    };
    shares("weights 1:1", 0.5);
    if live_change {
        let mut admin = Monitor::connect(&broker.socket).expect("monitor");
        admin
            .admin_set(id_of("cons-a"), None, Some(3), None)
            .expect("set cons-a's weight to 3");
        shares("cons-a's weight set to 3 while it runs", 0.75);
    }
    drop(programs);
}

/// A consolidated program's CUDA graph launch is one unit for the scheduler, held and granted
/// as a kernel is and timed as one: under FAIR, a program launching graphs of a kernel and one
/// launching the same kernel directly share the GPU evenly.
#[test]
fn fair_shares_hold_between_a_program_of_graphs_and_one_of_kernels() {
    if gpushare_tests::test_backend() != "sim" {
        return; // the stand-in program loads the sim's own module (tests/gpu.rs runs PTX)
    }
    use gpushare_tests::cuda_program::{CudaProgram, Running};
    let broker = broker("fair");
    let dir = tempfile::tempdir().expect("temp dir");
    let program = CudaProgram::build(dir.path(), false);
    let start = |name: &str, mode: &str| {
        let blocks = FILLS_THE_GPU.to_string();
        let mut cmd = program.command(&broker.socket, &[mode, "100000", "1000", &blocks]);
        cmd.env("GPUSHARE_NAME", name);
        let mut running = Running::spawn(cmd);
        running.wait_for_line("ready", Duration::from_secs(30));
        running
    };
    let names = ["graphs", "kernels"];
    let programs = [start(names[0], "graph-spin"), start(names[1], "spin")];
    let got = gpu_time_over(&broker, &names, &names, Duration::from_millis(1200));
    let share = got[0] as f64 / (got[0] + got[1]).max(1) as f64;
    println!(
        "FAIR, graphs against kernels: the graph program's share {share:.3} (goal 0.5); GPU time {:.0} ms",
        (got[0] + got[1]) as f64 / 1e6
    );
    assert!(
        (share - 0.5).abs() <= 0.05 * 0.5,
        "the graph program's share is {share:.3}, want 0.5"
    );
    drop(programs);
}
