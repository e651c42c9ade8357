//! `gpushared --high-nice N`: the threads that serve a high-priority client (its data thread in
//! gpushared, its channel's thread in the device worker) have their nice value moved by N,
//! and those of other clients do not. A positive N is used here: moving a thread's nice up
//! needs no privilege, so the test means the same as root and as anyone else.

use std::time::Duration;

use gpushare::{Client, ConnectOptions, Kernel, PriorityClass};
use gpushare_tests::{Broker, BrokerOptions, wait_until};

/// The nice value of each thread of `pid` whose name starts with `name` (the kernel keeps 15
/// characters of a thread's name).
fn nice_of_threads(pid: i32, name: &str) -> Vec<i32> {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return Vec::new();
    };
    tasks
        .filter_map(|t| {
            let dir = t.ok()?.path();
            let comm = std::fs::read_to_string(dir.join("comm")).ok()?;
            if !comm.trim_end().starts_with(name) {
                return None;
            }
            nice_in_stat(&std::fs::read_to_string(dir.join("stat")).ok()?)
        })
        .collect()
}

/// The nice field of a `/proc/.../stat` line: the 19th, the 17th after the command's `)`.
fn nice_in_stat(stat: &str) -> Option<i32> {
    let (_, rest) = stat.rsplit_once(')')?;
    rest.split_whitespace().nth(16)?.parse().ok()
}

fn work(client: &Client) {
    let stream = client.default_stream();
    stream
        .launch(Kernel::Spin {
            micros: 10,
            blocks: 1,
        })
        .expect("launch");
    stream.synchronize().expect("sync");
}

#[test]
fn the_threads_that_serve_a_high_priority_client_get_its_nice_and_no_others() {
    let broker = Broker::start_with(BrokerOptions {
        policy: Some("scheduler = \"priority\"\n[defaults]\nclass = \"high\"\n".into()),
        extra_args: vec!["--high-nice".into(), "3".into()],
        backend: Some("sim".into()),
        ..Default::default()
    });
    broker.dump_log_if_stuck(Duration::from_secs(60));
    let base = nice_in_stat(
        &std::fs::read_to_string(format!("/proc/{}/stat", broker.pid())).expect("gpushared"),
    )
    .expect("gpushared's nice");
    if base + 3 > 19 {
        eprintln!("gpushared runs at nice {base}: no room to move it by 3");
        return;
    }
    let high = broker.client_named("high");
    let low = Client::connect_with(ConnectOptions {
        class: Some(PriorityClass::BestEffort),
        ..broker.options("best-effort")
    })
    .expect("connect");
    // A worker's thread takes its client's nice from its next request on: work until both
    // sides show it.
    let (mut data, mut device) = (Vec::new(), Vec::new());
    let shown = wait_until(Duration::from_secs(20), || {
        work(&high);
        work(&low);
        data = nice_of_threads(broker.pid(), "gpushare-client");
        device = broker
            .worker_pids()
            .into_iter()
            .flat_map(|pid| nice_of_threads(pid, "gpushare-worker"))
            .collect();
        let count = |of: &[i32], nice: i32| of.iter().filter(|&&n| n == nice).count();
        count(&data, base + 3) == 1
            && count(&data, base) == 1
            && count(&device, base + 3) >= 1
            && count(&device, base) >= 1
    });
    assert!(
        shown,
        "gpushared at nice {base}: the high client's threads at {}, the other's at {base}; \
         the data threads' nice values were {data:?}, the worker threads' {device:?}",
        base + 3
    );
}
