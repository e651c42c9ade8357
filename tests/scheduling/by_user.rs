//! FAIR's shares by user (`[fair] per_user`) in the real broker, and running free
//! (`[fair] free_lead_us`), which the README's example by user turns on.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use gpushare_tests::{Broker, BrokerOptions};

use super::{broker_with, busy, gpu_time_over};

/// `[fair] per_user = true`: shares belong to users. Root runs two busy programs and
/// `nobody` one, all of weight 1: each user gets half of the GPU time (by program root would
/// get two thirds). Needs root, to run a program as `nobody`.
#[test]
fn fair_per_user_shares_divide_the_gpu_among_users() {
    if !gpushare_tests::root_or_skip("fair_per_user_shares_divide_the_gpu_among_users") {
        return;
    }
    let broker = Broker::start_with(BrokerOptions {
        policy: Some("scheduler = \"fair\"\n[fair]\nper_user = true\n".into()),
        extra_args: vec!["--sim-realtime".into()],
        ..Default::default()
    });
    let stop = Arc::new(AtomicBool::new(false));
    let mine = [
        busy(broker.client_named("root-1"), stop.clone()),
        busy(broker.client_named("root-2"), stop.clone()),
    ];
    let mut other = std::process::Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
        .arg(gpushare_tests::binary("gpushare-testclient"))
        .arg("spin-wide")
        .env("GPUSHARE_SOCKET", &broker.socket)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("run a program as nobody");
    let mut said = String::new();
    let stdout = other.stdout.take().expect("its output");
    std::io::BufRead::read_line(&mut std::io::BufReader::new(stdout), &mut said)
        .expect("read its first line");
    assert_eq!(said.trim(), "ready", "the program run as nobody");
    // A client's default name is its process's (the kernel keeps 15 characters of it).
    let names = ["root-1", "root-2", "gpushare-testcl"];
    let got = gpu_time_over(&broker, &names, &names, Duration::from_millis(1500));
    let total = got.iter().sum::<u64>().max(1) as f64;
    let root = (got[0] + got[1]) as f64 / total;
    println!(
        "FAIR per user: root's two programs {:.3} of the GPU time ({:.3} + {:.3}), nobody's one {:.3} (goal 0.5 each)",
        root,
        got[0] as f64 / total,
        got[1] as f64 / total,
        got[2] as f64 / total
    );
    let _ = other.kill();
    let _ = other.wait();
    stop.store(true, Ordering::Relaxed);
    for t in mine {
        let _ = t.join().expect("client thread");
    }
    assert!(
        (root - 0.5).abs() <= 0.05 * 0.5,
        "root's share {root:.3}, want 0.5"
    );
}

/// `[fair] free_lead_us`: two programs of one user, so with shares by user nobody leads
/// anybody and FAIR's launches skip the scheduler; `status` says whether they do now and for
/// how long they have.
#[test]
fn status_shows_fair_running_free() {
    let broker = broker_with(
        "scheduler = \"fair\"\n[fair]\nper_user = true\nquantum_us = 500000\nlag_us = 2000000\nfree_lead_us = 1000000\n",
    );
    let free = || broker.status().free_running;
    assert_eq!(free().len(), 1, "one GPU that may run free");
    assert!(!free()[0].now, "gated before any device time");
    let stop = Arc::new(AtomicBool::new(false));
    let clients = [
        busy(broker.client_named("one"), stop.clone()),
        busy(broker.client_named("two"), stop.clone()),
    ];
    let ran_free = gpushare_tests::wait_until(Duration::from_secs(30), || {
        free().first().is_some_and(|f| f.now && f.total_ns > 0)
    });
    stop.store(true, Ordering::Relaxed);
    for t in clients {
        let _ = t.join().expect("client thread");
    }
    assert!(ran_free, "status: {:?}", free());
    assert!(
        broker_with("scheduler = \"fair\"\n")
            .status()
            .free_running
            .is_empty(),
        "not asked for, not shown"
    );
}
