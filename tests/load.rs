//! Load: 64 concurrent clients mixing allocations, copies, launches and syncs for a bounded
//! time. No completion is lost or doubled, results stay correct, the broker's memory stays
//! bounded and everything is released at the end.
//!
//! It also reports (never asserts: CI machines are noisy) a latency histogram of the client
//! library's calls, measured in each client around each call, merged over all clients, and
//! beside the counts a command's latency (an allocation's round trip) p50/p99/max and the
//! broker's own service-time percentiles.

use std::time::{Duration, Instant};

use gpushare::{ConnectOptions, Kernel};
use gpushare_tests::{Broker, wait_until};
use hdrhistogram::Histogram;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// What each histogram measures: the wall time of one client-library call, from the call to
/// its return, in the calling thread (each client is one thread of this process, with its own
/// session, rings and broker thread).
const CALLS: [(&str, &str); 6] = [
    (
        "alloc",
        "Client::alloc: one Alloc entry, waits for its completion (one round trip)",
    ),
    (
        "copy-in",
        "DeviceBuffer::copy_from_host, <= 16 KiB: arena copy, CopyHtoD + EventRecord, then a stream sync round trip",
    ),
    (
        "launch",
        "Stream::launch (fill or axpy): submission only, returns once the entry is in the ring (waits only for ring room)",
    ),
    (
        "sync",
        "Stream::synchronize after the two launches (half the iterations): a round trip that includes the kernels' modelled device time",
    ),
    (
        "read-back",
        "DeviceBuffer::to_vec: CopyDtoH + EventRecord, an EventSync round trip, arena copy out",
    ),
    (
        "iteration",
        "one whole iteration: 2 allocs, copy-in, 2 launches, maybe sync, read-back, 2 (asynchronous) frees",
    ),
];

fn histograms() -> Vec<Histogram<u64>> {
    (0..CALLS.len())
        .map(|_| Histogram::new_with_bounds(1, 60_000_000_000, 3).expect("histogram bounds"))
        .collect()
}

/// Runs `f`, recording its wall time in ns into `h`.
fn timed<T>(h: &mut Histogram<u64>, f: impl FnOnce() -> T) -> T {
    let start = Instant::now();
    let out = f();
    h.saturating_record(start.elapsed().as_nanos() as u64);
    out
}

fn us(ns: u64) -> String {
    format!("{:.1}", ns as f64 / 1e3)
}

/// The merged histograms as a table, in µs.
fn report(hists: &[Histogram<u64>]) -> String {
    let mut out = format!(
        "{:<10} {:>9} {:>9} {:>9} {:>9} {:>9} {:>10}  (µs, client side)\n",
        "call", "count", "p50", "p90", "p99", "p99.9", "max"
    );
    for ((name, _), h) in CALLS.iter().zip(hists) {
        out.push_str(&format!(
            "{:<10} {:>9} {:>9} {:>9} {:>9} {:>9} {:>10}\n",
            name,
            h.len(),
            us(h.value_at_quantile(0.5)),
            us(h.value_at_quantile(0.9)),
            us(h.value_at_quantile(0.99)),
            us(h.value_at_quantile(0.999)),
            us(h.max()),
        ));
    }
    for (name, what) in CALLS {
        out.push_str(&format!("  {name}: {what}\n"));
    }
    out
}

/// The broker's own figures for its clients' commands (its time to serve one, from status):
/// the median of their medians and the largest of their 99th percentiles.
fn served(clients: &[gpushare::ClientStats]) -> String {
    let mut p50: Vec<u64> = clients.iter().filter_map(|c| c.latency_p50_ns).collect();
    let p99 = clients.iter().filter_map(|c| c.latency_p99_ns).max();
    p50.sort_unstable();
    match (p50.get(p50.len() / 2), p99) {
        (Some(m), Some(p)) => format!(
            "p50 {} µs (median client), p99 {} µs (worst client)",
            us(*m),
            us(p)
        ),
        _ => "not reported".into(),
    }
}

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
    let (commands, mismatches, saw_latency, hists) = std::thread::scope(|s| {
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
                    let mut h = histograms();
                    let [alloc, copy_in, launch, sync, read_back, iteration] = &mut h[..] else {
                        unreachable!("one histogram per call")
                    };
                    while Instant::now() < deadline {
                        let started = Instant::now();
                        let n = rng.random_range(1..4096usize);
                        let a = timed(alloc, || client.alloc::<f32>(n)).expect("alloc");
                        let b = timed(alloc, || client.alloc::<f32>(n)).expect("alloc");
                        let x = rng.random_range(0..100) as f32;
                        let data = vec![x; n];
                        timed(copy_in, || a.copy_from_host(&data)).expect("copy");
                        timed(launch, || {
                            stream.launch(Kernel::FillF32 {
                                dst: b.ptr(),
                                n: n as u64,
                                value: 1.0,
                            })
                        })
                        .expect("fill");
                        timed(launch, || {
                            stream.launch(Kernel::AxpyF32 {
                                x: a.ptr(),
                                y: b.ptr(),
                                n: n as u64,
                                alpha: 2.0,
                            })
                        })
                        .expect("axpy");
                        // Read back after a sync half the time, else on the kernels' own stream
                        // (streams are not ordered with each other: reading on the default
                        // stream without a sync races the kernels on a real GPU).
                        let got = if rng.random_bool(0.5) {
                            timed(sync, || stream.synchronize()).expect("sync");
                            timed(read_back, || b.to_vec()).expect("read")
                        } else {
                            let mut bytes = vec![0u8; n * 4];
                            timed(read_back, || {
                                client.copy_to_host_raw(stream.id(), &mut bytes, b.ptr())
                            })
                            .expect("read on the stream");
                            bytes
                                .chunks_exact(4)
                                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                                .collect()
                        };
                        mismatches += got.iter().filter(|&&v| v != 2.0 * x + 1.0).count() as u64;
                        drop((a, b));
                        iteration.saturating_record(started.elapsed().as_nanos() as u64);
                    }
                    client.synchronize().expect("sync");
                    assert_eq!(
                        client.completions_received(),
                        client.commands_submitted(),
                        "client {i}: every command got exactly one completion"
                    );
                    (client.commands_submitted(), mismatches, h)
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
        let served = served(&status.clients);
        let mut total = (0, 0);
        let mut merged = histograms();
        for w in workers {
            let (c, m, h) = w.join().expect("worker");
            total = (total.0 + c, total.1 + m);
            for (into, from) in merged.iter_mut().zip(&h) {
                into.add(from).expect("same bounds");
            }
        }
        (total.0, total.1, (saw_latency, served), merged)
    });
    let (saw_latency, served) = saw_latency;
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
    // A command's latency: an allocation is one command and its completion, nothing else.
    let alloc = &hists[0];
    eprintln!(
        "64 clients: {commands} commands, completions = commands for every client, {mismatches} wrong results; command latency (an allocation's round trip, client side) p50 {} µs, p99 {} µs, max {} µs over {} commands; broker's service time mid-run {served}; broker RSS {rss_before} → {rss_after} KiB",
        us(alloc.value_at_quantile(0.5)),
        us(alloc.value_at_quantile(0.99)),
        us(alloc.max()),
        alloc.len()
    );
    eprintln!(
        "latency of client-library calls, 64 clients × 4 s, merged:\n{}",
        report(&hists)
    );
}
