//! A client that dies — even by SIGKILL in the middle of work — loses only its own session.

use std::io::{BufRead, BufReader};
use std::process::{Child, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use gpushare::Kernel;
use gpushare_tests::{Broker, wait_until};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

fn spawn_ready(broker: &Broker, args: &[&str]) -> Child {
    let mut child = broker
        .command("gpushare-testclient")
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn test client");
    let stdout = child.stdout.take().expect("stdout");
    let mut line = String::new();
    BufReader::new(stdout).read_line(&mut line).expect("read");
    assert_eq!(line.trim(), "ready", "test client did not start");
    child
}

#[test]
fn killed_clients_release_everything_at_once_and_others_carry_on() {
    let broker = Broker::start();
    let survivor = broker.client_named("survivor");
    let keep = survivor.alloc::<f32>(1024).expect("alloc");
    let stream = survivor.create_stream().expect("stream");

    let mut holder = spawn_ready(&broker, &["hold", &(8u64 << 20).to_string()]);
    let mut busy = spawn_ready(&broker, &["busy"]);
    let status = broker.status();
    assert_eq!(status.clients.len(), 3);
    let held = status
        .clients
        .iter()
        .find(|c| c.pid == holder.id() as i32)
        .expect("holder listed");
    assert_eq!(held.memory_used, 8 << 20);

    // SIGKILL both in the middle of their work.
    holder.kill().expect("kill");
    busy.kill().expect("kill");
    let _ = holder.wait();
    let _ = busy.wait();
    assert!(
        wait_until(Duration::from_secs(5), || broker.status().clients.len()
            == 1),
        "dead clients still listed: {:?}",
        broker.status().clients
    );
    let status = broker.status();
    assert_eq!(
        status.memory_used, 4096,
        "only the survivor's buffer is left"
    );
    assert!(broker.wait_for_log(
        "released everything the client held",
        Duration::from_secs(5)
    ));

    // The survivor keeps getting correct results.
    for i in 0..20 {
        stream
            .launch(gpushare::Kernel::FillF32 {
                dst: keep.ptr(),
                n: 1024,
                value: i as f32,
            })
            .expect("fill");
        stream.synchronize().expect("sync");
        assert!(keep.to_vec().expect("read").iter().all(|&v| v == i as f32));
    }
}

#[test]
fn a_client_that_floods_the_ring_without_reading_only_blocks_itself() {
    let broker = Broker::start();
    let mut flooder = spawn_ready(&broker, &["flood"]);
    std::thread::sleep(Duration::from_millis(200));
    let other = broker.client_named("neighbour");
    let buf = other.alloc::<f32>(256).expect("alloc");
    for i in 0..50 {
        other
            .launch(
                &other.default_stream(),
                gpushare::Kernel::FillF32 {
                    dst: buf.ptr(),
                    n: 256,
                    value: i as f32,
                },
            )
            .expect("launch");
        assert!(buf.to_vec().expect("read").iter().all(|&v| v == i as f32));
    }
    flooder.kill().expect("kill");
    let _ = flooder.wait();
    assert!(wait_until(Duration::from_secs(5), || broker
        .status()
        .clients
        .len()
        == 1));
}

#[test]
fn many_connect_disconnect_cycles_leave_nothing_behind() {
    let broker = Broker::start();
    let fds = || broker.fd_count();
    // One cycle first, so lazily created things (device handles, thread pools) exist.
    drop(broker.client_named("warm-up"));
    assert!(wait_until(Duration::from_secs(5), || broker
        .status()
        .clients
        .is_empty()));
    let baseline = fds();
    for i in 0..1000 {
        let c = broker.client_named(&format!("cycle-{i}"));
        // Give up the buffer without freeing it: the disconnect must reclaim it.
        let _leaked = c.alloc::<u8>(4096).expect("alloc").into_raw();
    }
    assert!(wait_until(Duration::from_secs(5), || broker
        .status()
        .clients
        .is_empty()));
    assert_eq!(broker.status().memory_used, 0);
    let after = fds();
    assert!(
        after <= baseline + 2,
        "broker descriptors grew from {baseline} to {after} over 1000 sessions"
    );
    assert!(
        wait_until(Duration::from_secs(5), || broker.mapped_client_regions()
            == 0),
        "{} shared regions still mapped",
        broker.mapped_client_regions()
    );
}

/// What a victim of the kill loop does before it dies.
const VICTIM_MODES: [&str; 5] = ["hold", "busy", "flood", "full-ring", "churn"];

#[test]
fn randomly_killed_clients_never_leak_and_never_hurt_a_survivor() {
    let seed: u64 = std::env::var("GPUSHARE_TEST_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos() as u64)
                .unwrap_or(1)
        });
    // Straight to stderr: the harness captures eprintln!, and a failure must be reproducible.
    let _ = std::io::Write::write_all(
        &mut std::io::stderr(),
        format!("kill loop seed {seed} (GPUSHARE_TEST_SEED={seed} repeats it)\n").as_bytes(),
    );
    let mut rng = StdRng::seed_from_u64(seed);
    let broker = Broker::start();
    let survivor = broker.client_named("survivor");
    let keep = survivor.alloc::<f32>(4096).expect("alloc");
    let stream = survivor.create_stream().expect("stream");
    survivor.synchronize().expect("sync");

    // One victim lives and dies first, so that lazily created things exist at the baseline.
    let mut warm = spawn_ready(&broker, &["churn", "0"]);
    std::thread::sleep(Duration::from_millis(50));
    warm.kill().expect("kill");
    let _ = warm.wait();
    assert!(wait_until(Duration::from_secs(5), || broker
        .status()
        .clients
        .len()
        == 1));
    // The warm-up's session is gone from the list a moment before its region and descriptors.
    assert!(
        wait_until(Duration::from_secs(5), || broker.mapped_client_regions()
            == 1),
        "the survivor's region only"
    );
    // Descriptors first: a status query's own connection lingers in the broker for a moment.
    std::thread::sleep(Duration::from_millis(50));
    let base_fds = broker.fd_count();
    let base_memory = broker.status().memory_used;
    let base_regions = broker.mapped_client_regions();

    let stop = AtomicBool::new(false);
    let (kills, spawned) = std::thread::scope(|s| {
        // The survivor: random sizes and values, every result checked.
        let checker = s.spawn(|| {
            let mut rng = StdRng::seed_from_u64(seed ^ 0x5eed);
            let (mut verified, mut wrong) = (0u64, 0u64);
            while !stop.load(Ordering::Relaxed) {
                let n = rng.random_range(1..=4096usize);
                let x = rng.random_range(0..1000) as f32;
                let tmp = survivor.alloc::<f32>(n).expect("survivor alloc");
                tmp.copy_from_host(&vec![x; n]).expect("survivor copy");
                stream
                    .launch(Kernel::FillF32 {
                        dst: keep.ptr(),
                        n: n as u64,
                        value: 1.0,
                    })
                    .expect("survivor fill");
                stream
                    .launch(Kernel::AxpyF32 {
                        x: tmp.ptr(),
                        y: keep.ptr(),
                        n: n as u64,
                        alpha: 2.0,
                    })
                    .expect("survivor axpy");
                stream.synchronize().expect("survivor sync");
                let got = keep.to_vec().expect("survivor read");
                wrong += got[..n].iter().filter(|&&v| v != 2.0 * x + 1.0).count() as u64;
                verified += 1;
            }
            (verified, wrong)
        });

        // The victims: up to four at a time, each SIGKILLed at a random moment — during its
        // start and handshake, in the middle of its work, with its rings full.
        let mut live: Vec<(Child, Instant)> = Vec::new();
        let (mut kills, mut spawned) = (0u64, [0u64; VICTIM_MODES.len()]);
        let end = Instant::now() + Duration::from_secs(8);
        while Instant::now() < end {
            let now = Instant::now();
            for (mut child, _) in live.extract_if(.., |(_, at)| *at <= now) {
                child.kill().expect("kill");
                let _ = child.wait();
                kills += 1;
            }
            while live.len() < rng.random_range(1..=4) {
                let mode = rng.random_range(0..VICTIM_MODES.len());
                spawned[mode] += 1;
                let mut cmd = broker.command("gpushare-testclient");
                cmd.arg(VICTIM_MODES[mode]);
                match VICTIM_MODES[mode] {
                    "hold" => cmd.arg((rng.random_range(1..=8u64) << 20).to_string()),
                    "churn" => cmd.arg(rng.random::<u32>().to_string()),
                    _ => &mut cmd,
                };
                let child = cmd
                    .stdout(Stdio::null())
                    .stderr(Stdio::null())
                    .spawn()
                    .expect("spawn a victim");
                let dies_at = now + Duration::from_millis(rng.random_range(0..400));
                live.push((child, dies_at));
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        for (mut child, _) in live {
            child.kill().expect("kill");
            let _ = child.wait();
            kills += 1;
        }
        stop.store(true, Ordering::Relaxed);
        let (verified, wrong) = checker.join().expect("survivor");
        assert_eq!(
            wrong, 0,
            "the survivor got {wrong} wrong values (seed {seed})"
        );
        assert!(
            verified >= 20,
            "the survivor verified only {verified} rounds (seed {seed})"
        );
        eprintln!(
            "kill loop (seed {seed}): {kills} clients SIGKILLed; the survivor verified {verified} rounds, {} commands",
            survivor.commands_submitted()
        );
        (kills, spawned)
    });
    survivor
        .synchronize()
        .expect("the survivor's frees are done");

    assert!(
        wait_until(Duration::from_secs(10), || broker.status().clients.len()
            == 1),
        "dead clients still listed (seed {seed}): {:?}",
        broker.status().clients
    );
    assert!(
        wait_until(Duration::from_secs(5), || broker.status().memory_used
            == base_memory),
        "broker memory {} B, was {base_memory} B before the loop (seed {seed})",
        broker.status().memory_used
    );
    assert!(
        wait_until(Duration::from_secs(5), || broker.fd_count() <= base_fds + 2),
        "broker descriptors {} after the loop, {base_fds} before (seed {seed})",
        broker.fd_count()
    );
    assert!(
        wait_until(Duration::from_secs(5), || broker.mapped_client_regions()
            == base_regions),
        "{} shared regions mapped after the loop, {base_regions} before (seed {seed})",
        broker.mapped_client_regions()
    );
    assert!(kills >= 20, "only {kills} kills in 8 s");
    let status = broker.status();
    let log = broker.log_text();
    // Minus the survivor and the warm-up victim.
    let sessions = log.matches("client connected").count().saturating_sub(2);
    let released = log
        .matches("released everything the client held")
        .count()
        .saturating_sub(1);
    eprintln!(
        "kill loop: {sessions} victims were connected when killed; the broker released {released} victim sessions (those plus the ones killed between session set-up and Welcome); the other {} died before the broker set a session up",
        kills.saturating_sub(released as u64)
    );
    assert!(
        sessions >= 10,
        "only {sessions} victims got as far as a session"
    );
    eprintln!(
        "kill loop: victims by mode {:?}; after: memory {} B (baseline {base_memory}), descriptors {} (baseline {base_fds}), regions mapped {} (baseline {base_regions}), clients {}",
        VICTIM_MODES.iter().zip(spawned).collect::<Vec<_>>(),
        status.memory_used,
        broker.fd_count(),
        broker.mapped_client_regions(),
        status.clients.len()
    );
    // And the survivor still works.
    keep.copy_from_host(&[5.0; 4096]).expect("copy");
    assert!(keep.to_vec().expect("read").iter().all(|&v| v == 5.0));
}
