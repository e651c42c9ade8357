//! Clean shutdown, single instance per socket, stale sockets.

use std::io::{BufRead, BufReader};
use std::process::Stdio;
use std::time::Duration;

use gpushare_tests::Broker;

#[test]
fn sigterm_tells_clients_releases_everything_and_removes_the_socket() {
    let mut broker = Broker::start();
    let mut waiter = broker
        .command("gpushare-testclient")
        .arg("wait-shutdown")
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn");
    let mut lines = BufReader::new(waiter.stdout.take().expect("stdout")).lines();
    assert_eq!(lines.next().and_then(Result::ok).as_deref(), Some("ready"));
    let in_process = broker.client();
    let buf = in_process.alloc::<f32>(16).expect("alloc");

    let status = broker
        .terminate(Duration::from_secs(10))
        .expect("broker exits within 10 s");
    assert!(status.success(), "exit status {status:?}");
    assert!(!broker.socket.exists(), "socket file removed");
    assert!(broker.wait_for_log("shutting down", Duration::from_secs(5)));

    // The other process saw a clear error.
    let said = lines.next().and_then(Result::ok).unwrap_or_default();
    assert!(said.contains("broker shutting down"), "client said: {said}");
    let _ = waiter.wait();
    // And so does a client in this process, on its next call.
    let err = buf.to_vec().expect_err("broker is gone");
    assert!(err.is_fatal(), "{err}");
    assert!(
        err.to_string().contains("shutting down") || err.to_string().contains("lost"),
        "{err}"
    );
}

#[test]
fn a_second_broker_on_the_same_socket_is_refused_and_stale_sockets_are_replaced() {
    let mut first = Broker::start();
    let out = std::process::Command::new(gpushare_tests::binary("gpushared"))
        .arg("--socket")
        .arg(&first.socket)
        .arg("--backend")
        .arg("sim")
        .output()
        .expect("run");
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("already serving"), "{stderr}");
    first.client().nop().expect("first broker unharmed");

    // SIGKILL leaves the socket file behind; the next broker replaces it.
    let socket = first.socket.clone();
    first.child.kill().expect("kill");
    let _ = first.child.wait();
    assert!(socket.exists(), "SIGKILL leaves a stale socket");
    let mut second = std::process::Command::new(gpushare_tests::binary("gpushared"))
        .arg("--socket")
        .arg(&socket)
        .arg("--backend")
        .arg("sim")
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    let mut lines = BufReader::new(second.stderr.take().expect("stderr")).lines();
    let mut saw_stale = false;
    for line in lines.by_ref().map_while(Result::ok) {
        saw_stale |= line.contains("removed stale socket");
        if line.contains("gpushared ready") {
            break;
        }
    }
    assert!(saw_stale);
    let client = gpushare::Client::connect_with(gpushare::ConnectOptions {
        socket: socket.clone(),
        ..Default::default()
    })
    .expect("connect to the new broker");
    client.nop().expect("nop");
    drop(client);
    let _ = second.kill();
    let _ = second.wait();
}

#[test]
fn connecting_without_a_broker_says_what_to_do() {
    let dir = tempfile::tempdir().expect("tmp");
    let opts = gpushare::ConnectOptions {
        socket: dir.path().join("none.sock"),
        ..Default::default()
    };
    let err = gpushare::Client::connect_with(opts)
        .err()
        .expect("no broker");
    let msg = err.to_string();
    assert!(
        msg.contains("none.sock") && msg.contains("is gpushared running"),
        "{msg}"
    );
}

#[test]
fn after_a_broker_restart_the_client_gets_a_typed_error_and_can_reconnect() {
    let mut first = Broker::start();
    let socket = first.socket.clone();
    let client = first.client_named("survivor");
    let buf = client.alloc::<f32>(64).expect("alloc");
    assert!(
        first
            .terminate(Duration::from_secs(10))
            .is_some_and(|s| s.success())
    );
    let err = buf.to_vec().expect_err("the broker is gone");
    assert!(err.is_fatal(), "{err}");
    drop(buf);

    let _second = Broker::start_with(gpushare_tests::BrokerOptions {
        socket: Some(socket),
        ..Default::default()
    });
    let again = client.reconnect().expect("reconnect to the new broker");
    assert_eq!(again.session().backend, gpushare_tests::test_backend());
    let buf = again.alloc::<f32>(64).expect("alloc");
    again
        .launch(
            &again.default_stream(),
            gpushare::Kernel::FillF32 {
                dst: buf.ptr(),
                n: 64,
                value: 9.0,
            },
        )
        .expect("launch");
    assert_eq!(buf.to_vec().expect("read"), vec![9.0; 64]);
}

/// gpushared's device workers (the one serving each GPU and its spare) end with gpushared,
/// however it ends: stopped with SIGTERM, or killed outright.
#[test]
fn device_workers_never_outlive_gpushared() {
    let gone = |pid: i32| {
        !std::path::Path::new(&format!("/proc/{pid}")).exists()
            || std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
                s.rsplit_once(')')
                    .is_some_and(|(_, r)| r.trim_start().starts_with('Z'))
            })
    };
    for kill in [false, true] {
        let mut broker = Broker::start();
        let mut workers = Vec::new();
        assert!(
            gpushare_tests::wait_until(Duration::from_secs(10), || {
                workers = broker.worker_pids();
                workers.len() == 2
            }),
            "a worker and its spare: {workers:?}"
        );
        verified(&broker);
        if kill {
            broker.child.kill().expect("SIGKILL");
            let _ = broker.child.wait();
        } else {
            assert!(broker.terminate(Duration::from_secs(10)).is_some());
        }
        for &w in &workers {
            assert!(
                gpushare_tests::wait_until(Duration::from_secs(5), || gone(w)),
                "worker {w} outlived gpushared (killed: {kill})"
            );
        }
    }
}

/// A client's work is served (through the device worker).
fn verified(broker: &Broker) {
    let client = broker.client();
    let buf = client.alloc::<f32>(256).expect("alloc");
    buf.copy_from_host(&[2.5; 256]).expect("upload");
    assert_eq!(buf.to_vec().expect("download"), vec![2.5; 256]);
}
