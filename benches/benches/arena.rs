//! The client library's arena paths through a real `gpushared` (sim backend): module launches
//! with parameters, and copies staged through the arena. One process is one round; each
//! figure is printed on a line of its own (`name value unit`), so that two builds can be run
//! in turn and their medians compared.
//!
//! - `launch_params_async`: launches of a sim module function with its 8-byte parameter, back
//!   to back, then one stream sync: launches per second.
//! - `launch_builtin_async`: the same with a built-in kernel (nothing in the arena), for scale.
//! - `launch_params_sync`: one launch with parameters and a stream sync, again and again: the
//!   median of each pair's latency.
//! - `copy_{htod,dtoh}_{64k,4m,64m}`: pageable copies staged through the arena, GB/s.
//!
//! Build the broker first: `cargo build --release -p gpushare-broker`, then
//! `cargo bench -p gpushare-benches --bench arena`.

use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use gpushare::{Client, Function, Kernel, ModuleFormat, Stream};

/// A sim module with one function that occupies the device for its parameter's µs.
const SIM_MODULE: &[u8] = b"gpushare-sim-module 1\nkernel spin\n\0";
/// Launches timed back to back.
const ASYNC_LAUNCHES: usize = 20_000;
/// Launch + sync pairs timed one by one.
const SYNC_LAUNCHES: usize = 2_000;
/// Staged copies: (label, bytes, repetitions).
const COPIES: [(&str, usize, usize); 3] = [
    ("64k", 64 << 10, 2_000),
    ("4m", 4 << 20, 100),
    // Four times the default staging area: the pieces go round it.
    ("64m", 64 << 20, 8),
];

fn main() -> Result<()> {
    let broker = gpushare_benches::start_sim_broker();
    let client = broker.client_named("bench-arena");
    let stream = client.create_stream()?;
    let module = client
        .load_module(ModuleFormat::Ptx, SIM_MODULE)
        .context("load the sim module")?;
    let spin = module.function("spin")?;
    let zero = 0u64.to_le_bytes();

    // Settle the session (first touches of the shared pages, the data thread's start).
    launches(&client, &stream, &spin, &zero, 1_000)?;

    let t = Instant::now();
    launches(&client, &stream, &spin, &zero, ASYNC_LAUNCHES)?;
    let rate = ASYNC_LAUNCHES as f64 / t.elapsed().as_secs_f64();
    println!("launch_params_async {rate:.0} launches/s");
    let t = Instant::now();
    for _ in 0..ASYNC_LAUNCHES {
        stream.launch(Kernel::Spin {
            micros: 0,
            blocks: 1,
        })?;
    }
    stream.synchronize()?;
    let rate = ASYNC_LAUNCHES as f64 / t.elapsed().as_secs_f64();
    println!("launch_builtin_async {rate:.0} launches/s");

    let mut pairs = Vec::with_capacity(SYNC_LAUNCHES);
    for _ in 0..SYNC_LAUNCHES {
        let t = Instant::now();
        client.launch_function(&stream, &spin, [1, 1, 1], [1, 1, 1], 0, &zero)?;
        stream.synchronize()?;
        pairs.push(t.elapsed());
    }
    println!(
        "launch_params_sync {:.2} us",
        median(&mut pairs).as_secs_f64() * 1e6
    );

    for (label, bytes, reps) in COPIES {
        let dev = client.alloc::<u8>(bytes)?;
        let mut host = vec![0x5au8; bytes];
        let t = Instant::now();
        for _ in 0..reps {
            client.copy_to_device_raw(stream.id(), dev.ptr(), &host)?;
        }
        let gbps = (bytes * reps) as f64 / t.elapsed().as_secs_f64() / 1e9;
        println!("copy_htod_{label} {gbps:.3} GB/s");
        let t = Instant::now();
        for _ in 0..reps {
            client.copy_to_host_raw(stream.id(), &mut host, dev.ptr())?;
        }
        let gbps = (bytes * reps) as f64 / t.elapsed().as_secs_f64() / 1e9;
        println!("copy_dtoh_{label} {gbps:.3} GB/s");
        anyhow::ensure!(host.iter().all(|&b| b == 0x5a), "the bytes came back wrong");
    }
    Ok(())
}

/// `n` launches of `f` with `params` on `stream`, then a sync.
fn launches(client: &Client, stream: &Stream, f: &Function, params: &[u8], n: usize) -> Result<()> {
    for _ in 0..n {
        client.launch_function(stream, f, [1, 1, 1], [1, 1, 1], 0, params)?;
    }
    Ok(stream.synchronize()?)
}

fn median(samples: &mut [Duration]) -> Duration {
    samples.sort_unstable();
    samples.get(samples.len() / 2).copied().unwrap_or_default()
}
