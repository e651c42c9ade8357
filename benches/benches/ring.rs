//! Ring benchmarks through the real broker: one `gpushared` (sim backend) for the whole run,
//! one client, no-op commands only, so what is measured is the data plane itself —
//! submission ring → broker data thread → completion ring → client.
//!
//! - `ring/round_trip_nop`: one `nop()` after another, so both sides are spinning.
//! - `ring/round_trip_nop_idle`: one `nop()` after [`IDLE_GAP`] of silence, by which time the
//!   broker's data thread (and the client) went to sleep on their eventfds: the wake-up cost.
//! - `ring/batched_nop/{64,256,1024}`: `nop_batch(n)`, n no-ops submitted back to back and
//!   waited for together; criterion reports elements (commands) per second.
//!
//! Build the broker first: `cargo build --release -p gpushare-broker`, then
//! `cargo bench -p gpushare-benches --bench ring`.

use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::{
    BenchmarkId, Criterion, SamplingMode, Throughput, criterion_group, criterion_main,
};
use gpushare::Client;

/// Silence before each idle round trip: well past the broker's 50 µs spin (`--spin-us`) and the
/// client's 50 µs spin, so both sides are asleep when the command is submitted.
const IDLE_GAP: Duration = Duration::from_millis(1);
/// Idle round trips to measure (each also costs [`IDLE_GAP`] of wall time).
const IDLE_ITERS: u32 = 2000;
/// Batch sizes for `ring/batched_nop`.
const BATCHES: [u64; 3] = [64, 256, 1024];

/// One idle round trip: sleep, then time a single `nop()`.
fn idle_nop(client: &Client) -> Duration {
    std::thread::sleep(IDLE_GAP);
    let start = Instant::now();
    client.nop().expect("nop");
    start.elapsed()
}

fn ring(c: &mut Criterion) {
    let broker = gpushare_benches::start_sim_broker();
    let client = broker.client_named("bench-ring");
    // Settle the session (first touches of the shared pages, the data thread's start).
    for _ in 0..1000 {
        client.nop().expect("nop");
    }

    let mut group = c.benchmark_group("ring");

    group
        .sample_size(100)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(5));
    group.bench_function("round_trip_nop", |b| {
        b.iter(|| client.nop().expect("nop"));
    });

    // Criterion sizes the run from wall time (gap included) during warm-up, so these
    // budgets give about IDLE_ITERS measured round trips.
    let per_iter_wall = IDLE_GAP + IDLE_GAP / 10;
    group
        .sampling_mode(SamplingMode::Flat)
        .sample_size(20)
        .warm_up_time(per_iter_wall * (IDLE_ITERS / 10))
        .measurement_time(per_iter_wall * IDLE_ITERS);
    group.bench_function("round_trip_nop_idle", |b| {
        b.iter_custom(|iters| (0..iters).map(|_| idle_nop(&client)).sum());
    });

    group
        .sampling_mode(SamplingMode::Auto)
        .sample_size(50)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(4));
    for n in BATCHES {
        group.throughput(Throughput::Elements(n));
        group.bench_with_input(BenchmarkId::new("batched_nop", n), &n, |b, &n| {
            b.iter(|| client.nop_batch(black_box(n)).expect("nop batch"));
        });
    }
    group.finish();
}

criterion_group!(benches, ring);
criterion_main!(benches);
