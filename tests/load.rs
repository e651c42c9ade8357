//! Load: 64 concurrent clients mixing allocations, copies, launches and syncs for a bounded
//! time. No completion is lost or doubled, results stay correct, the broker's memory stays
//! bounded and everything is released at the end.

use std::time::{Duration, Instant};

use gpushare::{ConnectOptions, Kernel};
use gpushare_tests::{Broker, wait_until};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

fn rss_kib(pid: i32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

#[test]
fn sixty_four_clients_lose_no_completion_and_leave_nothing_behind() {
    let broker = Broker::start();
    let rss_before = rss_kib(broker.pid());
    let deadline = Instant::now() + Duration::from_secs(4);
    let (commands, mismatches, saw_latency) = std::thread::scope(|s| {
        let workers: Vec<_> = (0..64u64)
            .map(|i| {
                let broker = &broker;
                s.spawn(move || {
                    let opts = ConnectOptions {
                        arena_size: 256 << 10,
                        sq_entries: 64,
                        ..broker.options(&format!("load-{i}"))
                    };
                    let client = gpushare::Client::connect_with(opts).expect("connect");
                    let stream = client.create_stream().expect("stream");
                    let mut rng = StdRng::seed_from_u64(i);
                    let mut mismatches = 0u64;
                    while Instant::now() < deadline {
                        let n = rng.random_range(1..4096usize);
                        let a = client.alloc::<f32>(n).expect("alloc");
                        let b = client.alloc::<f32>(n).expect("alloc");
                        let x = rng.random_range(0..100) as f32;
                        a.copy_from_host(&vec![x; n]).expect("copy");
                        stream
                            .launch(Kernel::FillF32 {
                                dst: b.ptr(),
                                n: n as u64,
                                value: 1.0,
                            })
                            .expect("fill");
                        stream
                            .launch(Kernel::AxpyF32 {
                                x: a.ptr(),
                                y: b.ptr(),
                                n: n as u64,
                                alpha: 2.0,
                            })
                            .expect("axpy");
                        if rng.random_bool(0.5) {
                            stream.synchronize().expect("sync");
                        }
                        let got = b.to_vec().expect("read");
                        mismatches += got.iter().filter(|&&v| v != 2.0 * x + 1.0).count() as u64;
                    }
                    client.synchronize().expect("sync");
                    assert_eq!(
                        client.completions_received(),
                        client.commands_submitted(),
                        "client {i}: every command got exactly one completion"
                    );
                    (client.commands_submitted(), mismatches)
                })
            })
            .collect();
        // Mid-run: all are connected and the broker reports their command latencies.
        std::thread::sleep(Duration::from_secs(2));
        let status = broker.status();
        let saw_latency = status.clients.len() == 64
            && status
                .clients
                .iter()
                .filter(|c| c.latency_p99_ns.is_some())
                .count()
                >= 32;
        let mut total = (0, 0);
        for w in workers {
            let (c, m) = w.join().expect("worker");
            total = (total.0 + c, total.1 + m);
        }
        (total.0, total.1, saw_latency)
    });
    assert_eq!(mismatches, 0);
    assert!(commands > 64 * 20, "only {commands} commands in 4 s");
    assert!(
        saw_latency,
        "the broker reported latency percentiles for its busy clients"
    );
    assert!(wait_until(Duration::from_secs(10), || broker
        .status()
        .clients
        .is_empty()));
    assert_eq!(broker.status().memory_used, 0);
    let rss_after = rss_kib(broker.pid());
    assert!(
        rss_after < rss_before + 128 * 1024,
        "broker RSS grew from {rss_before} KiB to {rss_after} KiB"
    );
    eprintln!("64 clients: {commands} commands, broker RSS {rss_before} → {rss_after} KiB");
}
