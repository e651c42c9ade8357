//! FAIR's `hungry_us` and `waited_us` in the real broker: who a busy client is held for.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use gpushare::Kernel;

use super::{broker_with, busy, client_figure, gpu_time_over, kernels};

/// What a loop of small kernels (20 µs, one block), each waited for, gets beside a busy client
/// under `policy`, over 500 ms of the busy client's GPU time: how long the busy client was held
/// with nothing on the GPU, and the loop's steps. Its kernels wait on the device behind the
/// busy client's queued work unless that client is held for it.
fn loop_beside_busy(policy: &str) -> (u64, u64) {
    let broker = broker_with(policy);
    let looping = broker.client_named("loop");
    let busy_client = broker.client_named("busy");
    assert!(gpushare_tests::wait_until(Duration::from_secs(5), || {
        broker.status().clients.len() == 2
    }));
    let stop = Arc::new(AtomicBool::new(false));
    let busy_thread = busy(busy_client, stop.clone());
    let loop_thread = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let stream = looping.default_stream();
            while !stop.load(Ordering::Relaxed) {
                stream
                    .launch(Kernel::Spin {
                        micros: 20,
                        blocks: 1,
                    })
                    .expect("launch");
                stream.synchronize().expect("sync");
            }
            drop(stream);
            looping
        })
    };
    // Over 500 ms of GPU time, once the busy client has run, and until the loop has run too.
    let steps = || kernels(&broker, "loop");
    let first = steps();
    let got = gpu_time_over(
        &broker,
        &["busy", "loop"],
        &["busy"],
        Duration::from_millis(500),
    );
    let looped = gpushare_tests::wait_until(Duration::from_secs(20), || steps() >= first + 20);
    let held = client_figure(&broker, "busy", |c| c.throttled_ns);
    // Read before the loop's client goes away, when its figures leave the status.
    let stepped = steps().saturating_sub(first);
    stop.store(true, Ordering::Relaxed);
    busy_thread.join().expect("busy thread");
    loop_thread.join().expect("loop thread");
    println!(
        "{policy:?} beside a loop of small kernels: busy {:.1} ms of GPU, held {:.1} ms; the loop {stepped} steps",
        got[0] as f64 / 1e6,
        held as f64 / 1e6,
    );
    assert!(looped, "the loop ran {stepped} steps");
    (held, stepped)
}

const HUNGRY: &str = "scheduler = \"fair\"\n[fair]\nhungry_us = 1000\n";

/// `[fair] hungry_us`: a client with less than that much estimated GPU time of work waiting
/// holds nobody back. A client that waits for each small kernel (20 µs) beside a busy one is
/// such a client, so the busy one is never held for it, and the loop's kernels wait on the
/// device behind the busy client's queued work. Without `hungry_us` (the default) the busy
/// client is held for the loop: about 33 ms of 0.5 s here, the loop ten times as fast
/// (`waited_us` gives it some of that back, below).
#[test]
fn with_hungry_us_a_client_with_little_work_waiting_holds_nobody_back() {
    let (held, _) = loop_beside_busy(HUNGRY);
    assert_eq!(held, 0, "the busy client was held {held} ns for the loop");
}

/// `[fair] waited_us` beside `hungry_us`: a loop is hungry when its kernels wait on the device
/// behind a busy client's work. The sim device runs one kernel at a time, so there they wait,
/// and the busy client is held for the loop. A GPU runs the loop's one block beside the busy
/// client's kernels (one wave of small blocks), so they are not late and nobody is held for it
/// (run H15 in docs/benchmarks.md).
#[test]
fn with_waited_us_a_loop_is_held_for_only_while_its_kernels_wait_behind_a_busy_client() {
    let waited_policy = format!("{HUNGRY}waited_us = 1000\n");
    if gpushare_tests::test_backend() == "sim" {
        let (_, by_estimates) = loop_beside_busy(HUNGRY);
        let (_, waited) = loop_beside_busy(&waited_policy);
        assert!(
            waited as f64 >= 1.5 * by_estimates as f64,
            "the loop ran {waited} steps with waited_us, {by_estimates} by estimates alone"
        );
    } else {
        let (held, _) = loop_beside_busy(&waited_policy);
        assert_eq!(
            held, 0,
            "the busy client was held {held} ns for a loop whose kernels ran beside its own"
        );
    }
}
