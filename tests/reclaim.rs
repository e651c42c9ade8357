//! A client that dies — even by SIGKILL in the middle of work — loses only its own session.

use std::io::{BufRead, BufReader};
use std::process::{Child, Stdio};
use std::time::Duration;

use gpushare_tests::{Broker, wait_until};

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
    let fds = || {
        std::fs::read_dir(format!("/proc/{}/fd", broker.pid()))
            .map(|d| d.count())
            .unwrap_or(0)
    };
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
        "broker descriptors grew from {baseline} to {after} over 100 sessions"
    );
}
